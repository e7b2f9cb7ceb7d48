"""Runs: every request tagged with the run's id, bounded by its timeout, rolled back if it fails.

Real managers, real actors, real threads and event loops.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import wait_for as _wait_for

from victor_actors import (
    DeadlineExceededError,
    GlobalStateManager,
    RollbackReport,
    Run,
    RunFailedError,
    RunTimeoutError,
    ScopeHandle,
    StateChanged,
    TransitionBatch,
    current_run_id,
)
from victor_actors.lowlevel import ScopeRollback
from victor_actors.testing import inject_fault


class Events:
    """A subscription that keeps what it receives, and the run id its callback saw."""

    def __init__(self, handle: ScopeHandle) -> None:
        self._lock = threading.Lock()
        self.items: list[tuple[StateChanged, str | None]] = []
        self.sub = handle.subscribe(self._add)

    def _add(self, event: StateChanged) -> None:
        with self._lock:
            self.items.append((event, current_run_id()))

    def wait(self, count: int) -> list[tuple[StateChanged, str | None]]:
        assert _wait_for(lambda: len(self.items) >= count), f"expected {count} events, got {len(self.items)}"
        with self._lock:
            return list(self.items)


def _scopes(report: RollbackReport) -> dict[str, ScopeRollback]:
    return {str(s.ref): s for s in report.scopes}


# -- tagging ------------------------------------------------------------------------


def test_a_run_tags_its_commits_its_context_its_actors_and_its_subscribers(
    manager: GlobalStateManager,
) -> None:
    team = manager.get_team_state("t")
    conv = manager.get_conversation_state("s1", team_id="t")
    conv_events, team_events = Events(conv), Events(team)
    in_actor: list[tuple[str, str | None]] = []

    def recorder(where: str) -> Callable[[], None]:
        return lambda: in_actor.append((where, current_run_id()))

    assert current_run_id() is None
    with manager.run("s1", timeout=10) as run:
        assert isinstance(run, Run) and run.id.startswith("s1:")
        assert current_run_id() == run.id
        inject_fault(manager, conv.ref, recorder("conversation"))
        first = conv.set("k", 1)
        inject_fault(manager, team.ref, recorder("team, preparing its part"))
        inject_fault(manager, conv.ref, recorder("conversation, preparing its part"))
        cross = conv.apply(TransitionBatch().add_message("m").update_state("tk", 1, scope="team"))
        locked = conv.transact(lambda snap: TransitionBatch().update_state("n", snap.get_state("tk")))
        assert current_run_id() == run.id
    assert current_run_id() is None
    inject_fault(manager, conv.ref, recorder("conversation, after the run"))
    after = conv.set("k", 2)

    assert run.status == "succeeded" and run.rollback_report is None
    team_part = cross.related[0]
    assert team_part.ref == team.ref
    assert first.run_id == cross.run_id == team_part.run_id == locked.run_id == run.id
    assert after.run_id is None
    assert in_actor == [
        ("conversation", run.id),
        ("team, preparing its part", run.id),
        ("conversation, preparing its part", run.id),
        ("conversation, after the run", None),
    ]
    # each scope's commits in its own order (scopes may interleave: actors report as they publish)
    assert [c.version for c in run.commits if c.ref == conv.ref] == [1, 2, 3]
    assert [c.version for c in run.commits if c.ref == team.ref] == [1]
    seen = [(e.version, e.run_id, in_callback) for e, in_callback in conv_events.wait(4)]
    assert seen == [(1, run.id, run.id), (2, run.id, run.id), (3, run.id, run.id), (4, None, None)]
    assert [(e.run_id, in_callback) for e, in_callback in team_events.wait(1)] == [(run.id, run.id)]


def test_arun_tags_like_run_across_awaits(manager: GlobalStateManager) -> None:
    team = manager.get_team_state("t")
    conv = manager.get_conversation_state("s1", team_id="t")
    events = Events(conv)
    in_actor: list[str | None] = []

    async def main() -> tuple[str, list[StateChanged]]:
        async with manager.arun("s1", timeout=10) as run:
            inject_fault(manager, conv.ref, lambda: in_actor.append(current_run_id()))
            records = [await conv.aset("k", 1)]
            await asyncio.sleep(0)
            assert current_run_id() == run.id
            records.append(
                await conv.aapply(TransitionBatch().add_message("m").update_state("t", 1, scope="team"))
            )
            records.append(await conv.atransact(lambda snap: TransitionBatch().update_state("n", 2)))
            assert current_run_id() == run.id
        assert current_run_id() is None
        assert run.status == "succeeded"
        return run.id, records

    run_id, records = asyncio.run(main())
    assert in_actor == [run_id]
    assert [r.run_id for r in records] == [run_id] * 3
    assert records[1].related[0].run_id == run_id and team.get("t") == 1
    assert [(e.run_id, seen) for e, seen in events.wait(3)] == [(run_id, run_id)] * 3


# -- rollback ------------------------------------------------------------------------


def test_a_failed_run_is_rolled_back_in_every_scope_it_touched(manager: GlobalStateManager) -> None:
    team = manager.get_team_state("t")
    conv = manager.get_conversation_state("s1", team_id="t")
    peer = manager.get_conversation_state("s2", team_id="t")
    conv.apply(
        TransitionBatch().update_state("shared", "before").add_message("pre").update_capability("search")
    )
    team.apply(TransitionBatch().update_state("tk", "team-before").add_message("team-pre"))
    conv_events, team_events = Events(conv), Events(team)

    def outsider() -> None:  # a plain thread: not part of the run
        assert current_run_id() is None
        conv.apply(TransitionBatch().add_message("other").update_state("outside", 1))
        team.apply(TransitionBatch().add_message("team-other").update_state("ok", 1))

    def other_run() -> None:  # another run, which succeeds, meanwhile
        with manager.run("s2", timeout=10):
            peer.apply(
                TransitionBatch()
                .update_state("p", 1)
                .add_message("peer")
                .add_message("peer-team", scope="team")
                .update_state("ptk", 1, scope="team")
            )

    with pytest.raises(RunFailedError, match="agent crashed") as info:
        with manager.run("s1", timeout=10) as run:
            conv.apply(
                TransitionBatch()
                .update_state("shared", "run")
                .update_state("new", 1)
                .add_message("r1")
                .update_capability("search", False)
                .update_capability("code", True)
                .update_stage("acting")
                .execute_tool("grep", {"q": 1}, request_id="tool-1")
            )
            conv.apply(
                TransitionBatch()
                .update_state("tk", "run", scope="team")
                .update_state("tnew", 1, scope="team")
                .add_message("r-team", scope="team")
                .add_message("r2")
            )
            for target in (outsider, other_run):
                helper = threading.Thread(target=target)
                helper.start()
                helper.join()
            conv.apply(TransitionBatch().add_message("r3").update_state("new", 2))
            assert "tool-1" in conv.snapshot().pending_tool_requests
            versions = (conv.version, team.version)
            raise RuntimeError("agent crashed")

    exc = info.value
    report = exc.rollback_report
    assert isinstance(report, RollbackReport) and report is run.rollback_report
    assert run.status == "rolled_back"
    assert report.run_id == run.id and "agent crashed" in report.reason and report.conflicts == ()
    assert f"run {run.id} failed" in str(exc) and "rolled back" in str(exc)
    assert isinstance(exc.error, RuntimeError) and exc.__cause__ is exc.error
    assert not hasattr(exc.error, "rollback_report")  # the caller's own exception is left untouched
    scopes = _scopes(report)
    assert set(scopes) == {"conversation:s1", "team:t"}
    mine, shared = scopes["conversation:s1"], scopes["team:t"]
    assert set(mine.keys_restored) == {"shared", "new"} and mine.messages_removed == 3
    assert set(mine.capabilities_restored) == {"search", "code"} and mine.stage_restored
    assert mine.tool_requests_released == ("tool-1",)
    assert set(shared.keys_restored) == {"tk", "tnew"} and shared.messages_removed == 1
    # Rollbacks are ordinary commits: the versions keep rising.
    assert (mine.version, shared.version) == (versions[0] + 1, versions[1] + 1)
    assert (conv.version, team.version) == (versions[0] + 1, versions[1] + 1)

    snap = conv.snapshot()
    assert snap.state == {"shared": "before", "outside": 1}
    assert snap.messages == ("pre", "other")
    assert snap.capabilities == {"search": True}
    assert snap.conversation_stage == "initial"
    assert "tool-1" not in snap.pending_tool_requests and len(snap.pending_tool_requests) == 0
    tsnap = team.snapshot()
    assert tsnap.state == {"tk": "team-before", "ok": 1, "ptk": 1}
    assert tsnap.messages == ("team-pre", "team-other", "peer-team")
    assert peer.snapshot().state == {"p": 1} and peer.snapshot().messages == ("peer",)

    # Subscribers see the rollbacks as commits with reset=True, tagged with the run.
    last, seen = conv_events.wait(versions[0])[-1]
    assert (last.version, last.reset, last.run_id, seen) == (versions[0] + 1, True, run.id, run.id)
    team_last, _seen = team_events.wait(versions[1])[-1]
    assert (team_last.version, team_last.reset, team_last.run_id) == (versions[1] + 1, True, run.id)


def test_a_key_another_writer_changed_is_left_alone_and_reported(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("s")
    conv.update({"k": "v0", "j": "j0"})

    with pytest.raises(RunFailedError, match="tool failed") as info:
        with manager.run("s", timeout=10):
            conv.update({"k": "run", "j": "run"})
            conv.add_message("run-msg")
            helper = threading.Thread(target=lambda: conv.set("k", "other"))
            helper.start()
            helper.join()
            raise ValueError("tool failed")

    report = info.value.rollback_report
    assert conv.get("k") == "other" and conv.get("j") == "j0"
    assert conv.snapshot().messages == ()
    assert len(report.conflicts) == 1 and "'k'" in report.conflicts[0]
    (scope,) = report.scopes
    assert (
        scope.keys_restored == ("j",) and scope.conflicts == report.conflicts and scope.messages_removed == 1
    )
    message = str(info.value)
    assert "'k'" in message and "another writer" in message


def test_a_rollback_is_durable(tmp_path: Path) -> None:
    with GlobalStateManager.open(tmp_path) as manager:
        conv = manager.get_conversation_state("s", team_id="t")
        conv.set("keep", 1)
        with contextlib.suppress(RunFailedError):
            with manager.run("s", timeout=10):
                conv.apply(
                    TransitionBatch()
                    .update_state("keep", 2)
                    .add_message("m")
                    .update_state("t", 1, scope="team")
                )
                raise RuntimeError("crash")
        assert conv.version == 3
    with GlobalStateManager.open(tmp_path) as manager:
        conv = manager.get_conversation_state("s")
        assert (conv.version, conv.to_dict(), conv.snapshot().messages) == (3, {"keep": 1}, ())
        assert manager.get_team_state("t").to_dict() == {}


def test_a_runs_team_messages_are_removed_after_an_earlier_rollback_shifted_them(
    manager: GlobalStateManager,
) -> None:
    """Run A and run B each add one message to the team; A fails first, then B.

    A's rollback removes message 0, so B's message moves from index 1 to 0. B's rollback
    must still remove it: it is B's, and nobody changed it.
    """
    team = manager.get_team_state("t")
    a = manager.get_conversation_state("a", team_id="t")
    b = manager.get_conversation_state("b", team_id="t")
    a_wrote, b_wrote = threading.Event(), threading.Event()

    def run_a() -> None:
        with contextlib.suppress(RunFailedError):
            with manager.run("a", timeout=10):
                a.apply(TransitionBatch().add_message("from a", scope="team"))
                a_wrote.set()
                assert b_wrote.wait(5)
                raise RuntimeError("a fails")

    thread = threading.Thread(target=run_a)
    thread.start()
    with pytest.raises(RunFailedError, match="b fails") as info:
        with manager.run("b", timeout=10):
            assert a_wrote.wait(5)
            b.apply(TransitionBatch().add_message("from b", scope="team"))
            b_wrote.set()
            thread.join(10)
            assert team.snapshot().messages == ("from b",)  # A's rollback is done
            raise RuntimeError("b fails")

    report = info.value.rollback_report
    assert team.snapshot().messages == (), f"B's message was left in the team; report: {report}"
    assert report.conflicts == ()


# -- deadlines ------------------------------------------------------------------------


def test_a_run_past_its_timeout_raises_and_is_rolled_back(manager: GlobalStateManager) -> None:
    team = manager.get_team_state("t")
    conv = manager.get_conversation_state("s", team_id="t")
    with pytest.raises(DeadlineExceededError, match="exceeded its timeout") as info:
        with manager.run("s", timeout=0.3) as run:
            conv.apply(TransitionBatch().update_state("a", 1).add_message("m"))
            assert _wait_for(lambda: run.remaining <= 0)
            version = conv.version
            # Every request made after the run's deadline fails and applies nothing.
            with pytest.raises(DeadlineExceededError):
                conv.set("b", 2)
            with pytest.raises(DeadlineExceededError):
                conv.apply(TransitionBatch().update_state("b", 2).update_state("c", 3, scope="team"))
            with pytest.raises(DeadlineExceededError):
                conv.transact(lambda snap: TransitionBatch().update_state("b", 2))
            with pytest.raises(DeadlineExceededError):
                asyncio.run(conv.aset("b", 2))
            assert (conv.version, team.version) == (version, 0)

    report = info.value.rollback_report
    assert report is run.rollback_report and report.reason == "timed out"
    (scope,) = report.scopes
    assert scope.keys_restored == ("a",) and scope.messages_removed == 1 and scope.version == 2
    assert conv.to_dict() == {} and conv.snapshot().messages == () and conv.version == 2
    assert run.status == "rolled_back"


def test_the_runs_timeout_bounds_each_requests_deadline(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("s")
    busy = threading.Event()

    def hang() -> None:
        busy.set()
        time.sleep(1.0)

    inject_fault(manager, conv.ref, hang)  # the next request keeps the actor busy for a second
    blocker = threading.Thread(target=lambda: conv.set("first", 1))
    blocker.start()
    assert busy.wait(5)
    with pytest.raises(DeadlineExceededError) as info:
        with manager.run("s", timeout=0.3):
            conv.set("late", 1, timeout=30)  # asks for 30 s; the run allows 0.3
    blocker.join(10)
    assert isinstance(info.value.rollback_report, RollbackReport)
    conv.set("probe", 1)  # handled after the late request, which expired in the mailbox
    assert conv.get("late") is None
    assert conv.to_dict() == {"first": 1, "probe": 1} and conv.version == 2


def test_a_write_the_actor_accepted_before_the_deadline_is_rolled_back_even_if_answered_after(
    manager: GlobalStateManager,
) -> None:
    """A slow commit (a slow disk, say) that lands after the run gave up waiting is still the run's."""
    conv = manager.get_conversation_state("s")
    events = Events(conv)
    inject_fault(manager, conv.ref, lambda: time.sleep(0.6))  # accepted in time, committed late
    with pytest.raises(DeadlineExceededError) as info:
        with manager.run("s", timeout=0.3) as run:
            conv.set("slow", 1)
    (event, _seen) = events.wait(1)[0]
    assert event.run_id == run.id  # the commit is the run's own write
    assert _wait_for(lambda: conv.get("slow") is None, 2.0), (
        f"the run's write survived its rollback: {conv.to_dict()}, report {info.value.rollback_report}"
    )


def test_an_async_run_timeout_cancels_the_body_and_rolls_back(manager: GlobalStateManager) -> None:
    team = manager.get_team_state("t")
    conv = manager.get_conversation_state("s", team_id="t")
    reached: list[str] = []

    async def main() -> Run:
        async with manager.arun("s", timeout=0.3) as run:
            await conv.aapply(TransitionBatch().update_state("a", 1).add_message("m"))
            await conv.aapply(TransitionBatch().update_state("t", 1, scope="team"))
            await asyncio.sleep(10)
            reached.append("after the sleep")
        return run

    with pytest.raises(DeadlineExceededError, match="exceeded its timeout") as info:
        asyncio.run(main())
    assert reached == []
    assert isinstance(info.value.__cause__, TimeoutError)
    scopes = _scopes(info.value.rollback_report)
    assert scopes["conversation:s"].keys_restored == ("a",) and scopes["team:t"].keys_restored == ("t",)
    assert conv.to_dict() == {} and team.to_dict() == {} and conv.snapshot().messages == ()


def test_an_async_run_that_raises_is_rolled_back(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("s", team_id="t")

    async def main() -> None:
        async with manager.arun("s", timeout=10):
            await conv.aapply(TransitionBatch().update_state("a", 1).update_state("t", 1, scope="team"))
            await conv.aadd_message("m")
            raise KeyError("lost tool")

    with pytest.raises(RunFailedError) as info:
        asyncio.run(main())
    report = info.value.rollback_report
    assert set(_scopes(report)) == {"conversation:s", "team:t"}
    assert conv.to_dict() == {} and manager.get_team_state("t").to_dict() == {}
    assert conv.snapshot().messages == ()


# -- subscriptions ---------------------------------------------------------------------


@pytest.mark.parametrize("fails", [False, True], ids=["succeeds", "fails"])
def test_subscriptions_made_through_a_run_end_with_it(manager: GlobalStateManager, fails: bool) -> None:
    conv = manager.get_conversation_state("s")
    got: list[int] = []
    with contextlib.suppress(RunFailedError):
        with manager.run("s", timeout=10) as run:
            sub = run.subscribe(conv, lambda e: got.append(e.version))
            conv.set("k", 1)
            assert _wait_for(lambda: got == [1])
            assert not sub.closed
            if fails:
                raise RuntimeError("fails")
    assert sub.closed
    before = list(got)
    barrier = Events(conv)
    conv.set("k", 2)
    barrier.wait(1)  # the event thread has delivered this commit's event
    assert got == before


# -- fifty concurrent runs ----------------------------------------------------------------

RUNS = 50
SEED = 20_240_917


def test_fifty_concurrent_runs_sharing_a_team_leave_exactly_the_succeeded_runs_effects(
    manager: GlobalStateManager,
) -> None:
    rng = random.Random(SEED)
    team = manager.get_team_state("shared")
    convs = [manager.get_conversation_state(f"agent{i}", team_id="shared") for i in range(RUNS)]
    failing = set(rng.sample(range(RUNS), RUNS // 5))
    plan = {
        i: (rng.choice(["raise", "timeout"]) if i in failing else "ok", rng.randint(1, 4))
        for i in range(RUNS)
    }
    in_asyncio = set(rng.sample(range(RUNS), 20))
    outcome: dict[int, BaseException | None] = {}
    team_commit: dict[int, int] = {}  # run -> the team version its team message got
    runs: dict[int, Run] = {}
    start = threading.Event()

    def batch(i: int, step: int) -> TransitionBatch:
        if step == 0:
            return TransitionBatch().update_state("k0", i).add_message(f"a{i}-0")
        if step == 1:
            return TransitionBatch().update_state(f"run{i}", i, scope="team").add_message(f"a{i}-1")
        if step == 2:
            return TransitionBatch().add_message(f"t{i}", scope="team").update_state("k1", i)
        return TransitionBatch().add_message(f"a{i}-3").update_capability(f"cap{i}")

    def note(i: int, step: int, record: StateChanged) -> None:
        if step == 2:
            team_commit[i] = next(r.version for r in record.related if r.ref == team.ref)

    def timeout_of(i: int) -> float:
        return 1.5 if plan[i][0] == "timeout" else 30.0

    def thread_agent(i: int) -> None:
        mode, fail_at = plan[i]
        pause = random.Random(SEED + i)
        start.wait(10)
        try:
            with manager.run(f"agent{i}", timeout=timeout_of(i)) as run:
                runs[i] = run
                for step in range(5):
                    if step == fail_at and mode == "raise":
                        raise RuntimeError(f"injected failure in run {i} after {step} steps")
                    if step == fail_at and mode == "timeout":
                        while run.remaining > 0:
                            time.sleep(0.02)
                    if step == 4:
                        break
                    time.sleep(pause.uniform(0, 0.01))
                    note(i, step, convs[i].apply(batch(i, step)))
            outcome[i] = None
        except BaseException as exc:
            outcome[i] = exc

    async def task_agent(i: int) -> None:
        mode, fail_at = plan[i]
        pause = random.Random(SEED + i)
        try:
            async with manager.arun(f"agent{i}", timeout=timeout_of(i)) as run:
                runs[i] = run
                for step in range(5):
                    if step == fail_at and mode == "raise":
                        raise RuntimeError(f"injected failure in run {i} after {step} steps")
                    if step == fail_at and mode == "timeout":
                        await asyncio.sleep(10)  # cancelled by the run's timeout
                    if step == 4:
                        break
                    await asyncio.sleep(pause.uniform(0, 0.01))
                    note(i, step, await convs[i].aapply(batch(i, step)))
            outcome[i] = None
        except BaseException as exc:
            outcome[i] = exc

    def loop_thread() -> None:
        async def main() -> None:
            await asyncio.gather(*(task_agent(i) for i in sorted(in_asyncio)))

        start.wait(10)
        asyncio.run(main())

    threads = [threading.Thread(target=thread_agent, args=(i,)) for i in range(RUNS) if i not in in_asyncio]
    threads.append(threading.Thread(target=loop_thread))
    for t in threads:
        t.start()
    start.set()
    for t in threads:
        t.join(30)
    assert len(outcome) == RUNS

    succeeded = sorted(i for i in range(RUNS) if outcome[i] is None)
    failed = sorted(i for i in range(RUNS) if outcome[i] is not None)
    reports = {i: getattr(outcome[i], "rollback_report", None) for i in failed}
    team_snap = team.snapshot()
    lost = 0
    for i in succeeded:
        snap = convs[i].snapshot()
        expected: list[bool] = [
            snap.state.get("k0") == i,
            snap.state.get("k1") == i,
            snap.has_capability(f"cap{i}"),
            team_snap.state.get(f"run{i}") == i,
            f"t{i}" in team_snap.messages,
            *(f"a{i}-{s}" in snap.messages for s in (0, 1, 3)),
        ]
        lost += expected.count(False)
    leftover = [m for m in team_snap.messages if int(m[1:]) in failed]
    rollbacks = sum(1 for r in reports.values() if r is not None for s in r.scopes if s.version is not None)
    conflicts = sum(len(r.conflicts) for r in reports.values() if r is not None)
    timed_out = sum(1 for i in failing if plan[i][0] == "timeout")
    print(
        f"\nruns={RUNS} (threads={RUNS - len(in_asyncio)}, asyncio={len(in_asyncio)}) "
        f"failures_injected={len(failing)} (raised={len(failing) - timed_out}, timed_out={timed_out}) "
        f"rollbacks={rollbacks} conflicts_reported={conflicts} lost_commits={lost} "
        f"failed_runs_team_messages_left={len(leftover)}"
    )

    assert failed == sorted(failing)
    for i in failed:
        failure = outcome[i]
        if plan[i][0] == "timeout":
            assert isinstance(failure, RunTimeoutError), (i, failure)
        else:  # the body's own error, untouched, inside the run's error
            assert isinstance(failure, RunFailedError) and isinstance(failure.error, RuntimeError), (
                i,
                failure,
            )
            assert failure.__cause__ is failure.error
        report = reports[i]
        assert isinstance(report, RollbackReport) and report.run_id == runs[i].id
        assert any(s.version is not None for s in report.scopes), f"run {i} reported nothing rolled back"
    assert lost == 0
    for i in failed:
        snap = convs[i].snapshot()
        assert (snap.state, snap.messages, snap.capabilities) == ({}, (), {}), i
        assert f"run{i}" not in team_snap.state
    assert team_snap.state == {f"run{i}": i for i in succeeded}
    in_commit_order = [f"t{i}" for i in sorted(succeeded, key=team_commit.__getitem__)]
    assert team_snap.messages == tuple(in_commit_order), f"failed runs' team messages left: {leftover}"
    assert conflicts == 0


# -- run ids never leak ----------------------------------------------------------------------


def test_run_ids_never_leak_between_concurrent_runs(manager: GlobalStateManager) -> None:
    problems: list[tuple[str, str | None, str | None]] = []
    lock = threading.Lock()

    def check(expected: str | None, where: str) -> None:
        got = current_run_id()
        if got != expected:
            with lock:
                problems.append((where, expected, got))

    subscribed = []
    for name in [f"th{i}" for i in range(12)] + [f"as{i}" for i in range(12)]:
        conv = manager.get_conversation_state(name, team_id="t")
        subscribed.append(conv.subscribe(lambda e: check(e.run_id, "subscriber")))
    start = threading.Event()

    def thread_agent(i: int) -> None:
        conv = manager.scope(f"conversation:th{i}")
        start.wait(10)
        with manager.run(f"th{i}", timeout=30) as run:
            inject_fault(manager, conv.ref, lambda: check(run.id, "actor"))
            for j in range(8):
                check(run.id, "thread body")
                if conv.set("j", j).run_id != run.id:
                    problems.append(("commit", run.id, None))
                time.sleep(0.001)
            helper = run.thread(lambda: (check(run.id, "run.thread"), conv.add_message("helper")))
            helper.start()
            helper.join()
            with ThreadPoolExecutor(2) as pool:
                pool.submit(run.bind(check), run.id, "run.bind in a pool").result()
            plain = threading.Thread(target=lambda: (check(None, "plain thread"), conv.set("plain", 1)))
            plain.start()
            plain.join()
            check(run.id, "thread body, end")
        check(None, "after a thread's run")
        if conv.snapshot().messages != ("helper",):
            problems.append(("helper write", run.id, None))

    async def task_agent(i: int) -> None:
        conv = manager.scope(f"conversation:as{i}")
        async with manager.arun(f"as{i}", timeout=30) as run:
            inject_fault(manager, conv.ref, lambda: check(run.id, "actor"))
            for j in range(8):
                check(run.id, "task body")
                record = await conv.aset("j", j)
                check(run.id, "after an await")
                if record.run_id != run.id:
                    problems.append(("commit", run.id, record.run_id))
                await asyncio.sleep(0.001 * (j % 3))
                check(run.id, "after a sleep")

            async def child() -> str | None:
                await asyncio.sleep(0)
                return current_run_id()

            if await asyncio.create_task(child()) != run.id:
                problems.append(("child task", run.id, None))
            await asyncio.to_thread(check, run.id, "to_thread")
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, run.bind(check), run.id, "run.bind in the loop's executor")
            helper = run.thread(check, run.id, "run.thread from a task")
            helper.start()
            await asyncio.to_thread(helper.join)
            check(run.id, "task body, end")
        check(None, "after a task's run")

    def loop_thread() -> None:
        async def main() -> None:
            check(None, "a task outside any run")
            await asyncio.gather(*(task_agent(i) for i in range(12)))

        start.wait(10)
        asyncio.run(main())

    threads = [threading.Thread(target=thread_agent, args=(i,)) for i in range(12)]
    threads.append(threading.Thread(target=loop_thread))
    for t in threads:
        t.start()
    start.set()
    for t in threads:
        t.join(30)
    last = manager.scope("conversation:th0")
    barrier = Events(last)
    last.set("done", True)
    barrier.wait(1)  # every earlier event has reached its subscribers
    assert problems == []
    assert current_run_id() is None
    for sub in subscribed:
        sub.close()


def test_a_key_written_twice_around_another_writer_is_left_and_reported(manager: GlobalStateManager) -> None:
    """Undoing by value alone would put the counter back to 5 and erase the other writer's +1."""
    team = manager.get_team_state("t")
    team.set("counter", 5)
    with pytest.raises(RunFailedError) as info:
        with manager.run("r", timeout=10):
            team.set("counter", 6)  # the run: 5 -> 6
            other = threading.Thread(target=lambda: team.set("counter", 7))  # someone else: 6 -> 7
            other.start()
            other.join()
            team.set("counter", 8)  # the run again: 7 -> 8
            raise RuntimeError("the agent failed")
    report = info.value.rollback_report
    assert team.get("counter") == 8  # left as it is: no value would undo only the run's share
    assert any("between the run's writes" in c for c in report.conflicts)


def test_active_runs_lists_the_runs_in_progress(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("s")
    assert manager.active_runs() == ()
    with manager.run("s", timeout=10) as run:
        conv.set("k", 1)
        assert manager.active_runs() == (run,)
        with manager.run("t", timeout=10) as inner:
            assert set(manager.active_runs()) == {run, inner}
    assert manager.active_runs() == ()
