"""A run's timeout bounds how long ``run``/``arun`` take to return, whatever ``request_timeout`` is.

Issue 31, item 5. The rollback of a run that timed out used to wait up to
``request_timeout`` for each scope it had to undo: one busy scope made an
asyncio run with a 0.15 s timeout return after 5.16 s. These are the only
timed assertions in the suite besides the bench scripts: the issue asks for
the bound itself, so they check it with a generous margin.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
from helpers import Gate

from victor_actors import DeadlineExceededError, GlobalStateManager, TransitionBatch
from victor_actors._runs import ROLLBACK_GRACE

MARGIN = 1.5  # seconds of slack on a loaded 2-core machine, on top of the timeout and the grace
TIMEOUT = 0.2


@pytest.fixture
def slow_manager() -> Iterator[GlobalStateManager]:
    """A manager whose requests may wait 10 s: the run's timeout must win over it."""
    m = GlobalStateManager.open(request_timeout=10.0)
    try:
        yield m
    finally:
        m.close()


def _run_then_hold_team(
    manager: GlobalStateManager, gate: Gate, mode: str
) -> tuple[float, BaseException | None]:
    """A run writes its conversation and its team, then the team is held until after the run ends.

    Another writer's request to the team takes the gate, so the run's rollback of the team waits
    in the team's mailbox behind it. Returns how long the run took, and what it raised.
    """
    conv = manager.get_conversation_state("s", team_id="t")
    team = manager.get_team_state("t")
    other = threading.Thread(target=lambda: team.set("other", 1))

    def hold() -> None:
        gate.hold(manager, team.ref)
        other.start()
        gate.wait_held()

    started = time.monotonic()
    raised: BaseException | None = None
    try:
        if mode == "sync":
            with manager.run("s", timeout=TIMEOUT):
                conv.apply(TransitionBatch().update_state("mine", 1).update_state("t", 1, scope="team"))
                hold()
                team.set("late", 1, timeout=30)  # held: waits only until the run's deadline, then raises
        else:

            async def body() -> None:
                async with manager.arun("s", timeout=TIMEOUT):
                    batch = TransitionBatch().update_state("mine", 1).update_state("t", 1, scope="team")
                    await conv.aapply(batch)
                    hold()
                    await asyncio.sleep(30)  # the timeout cancels it

            asyncio.run(body())
    except DeadlineExceededError as exc:
        raised = exc
    took = time.monotonic() - started
    gate.open()
    other.join(10)
    return took, raised


@pytest.mark.parametrize("mode", ["sync", "asyncio"])
def test_a_busy_scope_does_not_hold_a_timed_out_run_past_its_deadline(
    slow_manager: GlobalStateManager, mode: str
) -> None:
    """Failed before the fix: the run returned after request_timeout (10 s), not 0.2 s plus the grace.

    The rollback of the held team is reported as not confirmed, stays queued, and is applied once
    the team is free: the run's write to the team is gone, the other writer's stays.
    """
    with Gate(timeout=20) as gate:
        took, raised = _run_then_hold_team(slow_manager, gate, mode)
    assert raised is not None, "the run did not time out"
    assert took < TIMEOUT + ROLLBACK_GRACE + MARGIN, f"the run took {took:.2f} s to return"
    scopes = {str(s.ref): s for s in raised.rollback_report.scopes}  # type: ignore[attr-defined]
    assert scopes["conversation:s"].keys_restored == ("mine",)
    (note,) = scopes["team:t"].conflicts
    assert "not confirmed" in note and scopes["team:t"].version is None
    slow_manager.quiesce()
    assert slow_manager.get_team_state("t").to_dict() == {"other": 1}  # the queued rollback applied
    assert slow_manager.get_conversation_state("s").to_dict() == {}


def test_the_deadline_holds_for_many_runs_under_load(slow_manager: GlobalStateManager) -> None:
    """Twelve asyncio runs that time out while three threads keep the team busy with ``transact``.

    Each run must return within its timeout and the grace. This one passed before the fix too on
    this machine (the team's queue stays short here); the regression test is the gated one above.
    It guards the bound under contention, where a rollback meets other writers' transactions.
    """
    team = slow_manager.get_team_state("t")
    team.set("n", 0)
    stop = threading.Event()

    def hammer(name: str) -> None:
        conv = slow_manager.get_conversation_state(name, team_id="t")
        while not stop.is_set():
            conv.transact(
                lambda s: TransitionBatch().update_state("n", s.get_state("n", 0) + 1, scope="team")
            )

    workers = [threading.Thread(target=hammer, args=(f"w{i}",)) for i in range(3)]
    for w in workers:
        w.start()

    async def one(i: int) -> float:
        conv = slow_manager.get_conversation_state(f"r{i}", team_id="t")
        started = time.monotonic()
        with pytest.raises(DeadlineExceededError):
            async with slow_manager.arun(f"r{i}", timeout=TIMEOUT):
                await conv.atransact(
                    lambda s: TransitionBatch().update_state(f"run{i}", 1, scope="team"), lock=["team"]
                )
                await asyncio.sleep(30)
        return time.monotonic() - started

    async def main() -> list[float]:
        return await asyncio.gather(*(one(i) for i in range(12)))

    try:
        took = asyncio.run(main())
    finally:
        stop.set()
        for w in workers:
            w.join(10)
    assert max(took) < TIMEOUT + ROLLBACK_GRACE + MARGIN, f"slowest run took {max(took):.2f} s"
    slow_manager.quiesce()
    assert not any(k.startswith("run") for k in team.to_dict()), team.to_dict()
