"""A testing kit for code built on victor_actors, registered as a pytest plugin.

Fixtures:

- ``state_manager``: a :class:`GlobalStateManager` in memory, closed after the
  test. Mark a test ``@pytest.mark.victor_store`` to get one on an LMDB store
  in a temporary directory instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from victor_actors._manager import GlobalStateManager

__all__ = ["state_manager"]


def pytest_configure(config: Any) -> None:
    config.addinivalue_line(
        "markers", "victor_store: give the state_manager fixture an LMDB store in a temporary directory"
    )


@pytest.fixture
def state_manager(request: Any, tmp_path_factory: Any) -> Iterator[GlobalStateManager]:
    """A manager for one test: in memory, or on LMDB with ``@pytest.mark.victor_store``."""
    durable = request.node.get_closest_marker("victor_store") is not None
    path = tmp_path_factory.mktemp("victor-store") if durable else None
    manager = GlobalStateManager.open(path)
    try:
        yield manager
    finally:
        manager.close()
