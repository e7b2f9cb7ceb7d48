"""The pytest plugin: the ``state_manager``, ``recorder`` and ``victor_seed`` fixtures, ``victor_store``.

Registered through the ``pytest11`` entry point, so it is active as soon as
victor_actors is installed. The rest of the kit imports no pytest.
"""

from __future__ import annotations

import random
from collections.abc import Generator, Iterator

import pytest

from victor_actors._manager import GlobalStateManager
from victor_actors.testing._kit import Recorder

__all__ = [
    "pytest_addoption",
    "pytest_configure",
    "pytest_runtest_makereport",
    "recorder",
    "state_manager",
    "victor_seed",
]

_SEED = pytest.StashKey[int]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("victor_actors").addoption(
        "--victor-seed",
        type=int,
        default=None,
        help="the seed the victor_seed fixture gives (default: a new one per test, printed on failure)",
    )


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


@pytest.fixture
def victor_seed(request: pytest.FixtureRequest) -> int:
    """A seed for a simulation: ``--victor-seed N`` if given, else a fresh one per test.

    When the test fails, its report names the seed and the option that replays it
    (with ``Simulation(..., seed=victor_seed, deterministic=True)``, step for step).
    """
    seed = request.config.getoption("--victor-seed")
    if seed is None:
        seed = random.SystemRandom().randrange(1 << 32)
    request.node.stash[_SEED] = seed
    return int(seed)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test that used ``victor_seed`` says which seed, and how to replay it."""
    report = yield
    seed = item.stash.get(_SEED, None)
    if seed is not None and report.failed:
        report.sections.append(("victor_actors", f"victor_seed was {seed}: replay with --victor-seed {seed}"))
    return report
