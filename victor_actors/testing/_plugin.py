"""The pytest plugin: ``state_manager`` and ``recorder`` fixtures, the ``victor_store`` marker.

Registered through the ``pytest11`` entry point, so it is active as soon as
victor_actors is installed. The rest of the kit imports no pytest.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from victor_actors._manager import GlobalStateManager
from victor_actors.testing._kit import Recorder

__all__ = ["pytest_configure", "recorder", "state_manager"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "victor_store: give the state_manager fixture an LMDB store in a temporary directory"
    )


@pytest.fixture
def state_manager(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GlobalStateManager]:
    """A manager for one test: in memory, or on LMDB with ``@pytest.mark.victor_store``."""
    durable = request.node.get_closest_marker("victor_store") is not None
    path = tmp_path_factory.mktemp("victor-store") if durable else None
    manager = GlobalStateManager.open(path)
    try:
        yield manager
    finally:
        manager.close()


@pytest.fixture
def recorder(state_manager: GlobalStateManager) -> Iterator[Recorder]:
    """A :class:`Recorder` attached to ``state_manager`` for the whole test, detached afterwards."""
    with Recorder(state_manager) as rec:
        yield rec
