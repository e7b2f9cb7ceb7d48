"""The pytest plugin: the ``state_manager``, ``recorder`` and ``victor_seed`` fixtures, ``victor_store``.

Registered through the ``pytest11`` entry point, so it is active as soon as
victor_actors is installed. The rest of the kit imports no pytest.

A test that runs a deterministic ``victor_actors.sim.Simulation`` which
fails is reported with the run's seed and replay token; with
``--victor-shrink`` the plugin also shrinks the failing schedule and prints
the shortest one it found, with its own token. It listens only when the test's
module has imported the simulation (it never imports it itself).
"""

from __future__ import annotations

import random
import sys
from collections.abc import Generator, Iterator
from typing import Any

import pytest

from victor_actors._manager import GlobalStateManager
from victor_actors.testing._kit import Recorder

__all__ = [
    "pytest_addoption",
    "pytest_configure",
    "pytest_runtest_call",
    "pytest_runtest_makereport",
    "recorder",
    "state_manager",
    "victor_seed",
]

_SEED = pytest.StashKey[int]()
_FAILED_RUNS = pytest.StashKey[
    list[tuple[Any, Any]]
]()  # (Simulation, SimReport) of failing deterministic runs
_SIMULATION = "victor_actors.sim._simulation"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("victor_actors").addoption(
        "--victor-seed",
        type=int,
        default=None,
        help="the seed the victor_seed fixture gives (default: a new one per test, printed on failure)",
    )
    parser.getgroup("victor_actors").addoption(
        "--victor-shrink",
        action="store_true",
        default=False,
        help="when a test fails after a deterministic Simulation failed, shrink its schedule and print "
        "the shortest that still fails, with a replay token",
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
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """Note every deterministic Simulation that fails during the test (when the test uses them)."""
    module = sys.modules.get(_SIMULATION)
    if module is None:
        return (yield)
    failing: list[tuple[Any, Any]] = []
    item.stash[_FAILED_RUNS] = failing

    def watch(sim: Any, report: Any) -> None:
        if not report.ok:
            failing.append((sim, report))

    module._watchers.append(watch)
    try:
        return (yield)
    finally:
        module._watchers.remove(watch)


def _failed_runs(item: pytest.Item, shrink: bool) -> list[str]:
    lines = []
    for sim, report in item.stash.get(_FAILED_RUNS, []):
        schedule = report.extra.get("schedule", {})
        lines.append(
            f"a deterministic Simulation failed {', '.join(report.failed)} (seed {report.seed}, "
            f"{schedule.get('steps')} steps): replay it with "
            f"Simulation(..., replay={schedule.get('token')!r})"
        )
        if shrink:
            try:
                lines.append(sim.shrink(report).describe())
            except Exception as exc:  # the report must still be written
                lines.append(f"shrinking it failed: {type(exc).__name__}: {exc}")
    return lines


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test that used ``victor_seed`` says which seed, and how to replay it.

    Its failing deterministic simulations are listed with their replay tokens
    (and shrunk, with ``--victor-shrink``).
    """
    report = yield
    if not report.failed or call.when != "call":
        return report
    lines = []
    seed = item.stash.get(_SEED, None)
    if seed is not None:
        lines.append(f"victor_seed was {seed}: replay with --victor-seed {seed}")
    lines += _failed_runs(item, bool(item.config.getoption("--victor-shrink")))
    if lines:
        report.sections.append(("victor_actors", "\n".join(lines)))
    return report
