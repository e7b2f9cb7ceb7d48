from __future__ import annotations

from collections.abc import Iterator

import pytest

from victor_actors import GlobalStateManager


@pytest.fixture
def manager() -> Iterator[GlobalStateManager]:
    m = GlobalStateManager.open()
    try:
        yield m
    finally:
        m.close()
