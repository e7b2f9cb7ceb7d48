"""manager.quiesce and handle.modify: waiting for a quiet runtime, and read-modify-write without lost updates.

Each test that takes ``mode`` runs twice: once with the blocking calls from plain threads, once with
their asyncio twins on one event loop (``aquiesce``, ``amodify`` with an async ``fn``). Threads are
ordered with gates and barriers (``helpers.Gate`` holds an actor inside its next request until the
test opens it), never with sleeps.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import pytest
from helpers import Gate
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from victor_actors import (
    ContextSnapshot,
    DeadlineExceededError,
    GlobalStateManager,
    ScopeAccessError,
    ScopeHandle,
    StateChanged,
    ToolCall,
    TransitionBatch,
    VersionConflictError,
)

Fn = Callable[[ContextSnapshot], TransitionBatch]


@attrs.frozen
class Commit:
    """What one modify call returned, and every snapshot its ``fn`` was called with, in order."""

    record: StateChanged
    seen: tuple[ContextSnapshot, ...]


class SyncMode:
    """The blocking API, called from plain threads."""

    name = "sync"

    def quiesce(self, manager: GlobalStateManager, timeout: float = 10.0) -> None:
        manager.quiesce(timeout)

    def modify(self, handle: ScopeHandle, fn: Fn, **kwargs: Any) -> StateChanged:
        return handle.modify(fn, **kwargs)

    def race(self, jobs: list[tuple[ScopeHandle, Fn]], each: int, **kwargs: Any) -> list[list[Commit]]:
        """One thread per job, each calling ``modify`` ``each`` times.

        The first call of every thread waits at a barrier after reading its
        snapshot, so all of them read the same versions and all but one must
        conflict and retry: the retry path is always exercised.
        """
        barrier = threading.Barrier(len(jobs))
        out: list[list[Commit]] = [[] for _ in jobs]
        errors: list[BaseException] = []

        def worker(w: int) -> None:
            handle, fn = jobs[w]
            try:
                for n in range(each):
                    seen: list[ContextSnapshot] = []

                    def call(snap: ContextSnapshot, n: int = n, seen: list[ContextSnapshot] = seen) -> Any:
                        seen.append(snap)
                        if n == 0 and len(seen) == 1:
                            barrier.wait(10)
                        return fn(snap)

                    out[w].append(Commit(handle.modify(call, **kwargs), tuple(seen)))
            except BaseException as exc:  # pragma: no cover - reported below
                barrier.abort()
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(w,)) for w in range(len(jobs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads), "a modify never returned"
        assert not errors, errors
        return out


class AsyncMode:
    """The asyncio twins, awaited by tasks on one event loop."""

    name = "asyncio"

    def quiesce(self, manager: GlobalStateManager, timeout: float = 10.0) -> None:
        asyncio.run(manager.aquiesce(timeout))

    @staticmethod
    def _async(fn: Fn, seen: list[ContextSnapshot] | None = None) -> Callable[[ContextSnapshot], Any]:
        """``fn`` as a coroutine function that yields to the loop between its read and its write."""

        async def call(snap: ContextSnapshot) -> TransitionBatch:
            if seen is not None:
                seen.append(snap)
            await asyncio.sleep(0)  # a yield, not a wait: every other task runs its read now
            return fn(snap)

        return call

    def modify(self, handle: ScopeHandle, fn: Fn, **kwargs: Any) -> StateChanged:
        return asyncio.run(handle.amodify(self._async(fn), **kwargs))

    def race(self, jobs: list[tuple[ScopeHandle, Fn]], each: int, **kwargs: Any) -> list[list[Commit]]:
        """One task per job, each awaiting ``amodify`` ``each`` times.

        Every ``fn`` yields to the loop after its read, so the tasks read in
        lockstep and all but one of each round conflict and retry.
        """

        async def worker(handle: ScopeHandle, fn: Fn) -> list[Commit]:
            commits = []
            for _ in range(each):
                seen: list[ContextSnapshot] = []
                record = await handle.amodify(self._async(fn, seen), **kwargs)
                commits.append(Commit(record, tuple(seen)))
            return commits

        async def main() -> list[list[Commit]]:
            return list(await asyncio.wait_for(asyncio.gather(*(worker(h, f) for h, f in jobs)), 60))

        return asyncio.run(main())


Mode = SyncMode | AsyncMode


@pytest.fixture(params=[SyncMode, AsyncMode], ids=lambda cls: cls.name)
def mode(request: pytest.FixtureRequest) -> Mode:
    mode_class: type[Mode] = request.param
    return mode_class()


# -- modify: no lost update ------------------------------------------------------------------------


def _bump(snap: ContextSnapshot) -> TransitionBatch:
    """Increment this conversation's counter and, in the same batch, the team's."""
    team = snap.ancestor_state("team")
    return (
        TransitionBatch()
        .update_state("mine", snap.state.get("mine", 0) + 1)
        .update_state("team_n", (team or {}).get("team_n", 0) + 1, scope="team")
    )


def _bump_own(snap: ContextSnapshot) -> TransitionBatch:
    return TransitionBatch().update_state("mine", snap.state.get("mine", 0) + 1)


def _check_each_commit_is_based_on_fns_last_snapshot(commits: list[Commit], with_team: bool) -> None:
    """A commit applies what ``fn`` computed from the snapshot it was last given: no stale write."""
    for commit in commits:
        last = commit.seen[-1]
        assert commit.record.old_version == last.version, (commit.record, last.version)
        if with_team:
            (team_record,) = commit.record.related
            assert team_record.old_version == last.versions()[team_record.ref]


def test_many_writers_of_one_counter_lose_no_update(manager: GlobalStateManager, mode: Mode) -> None:
    team = manager.get_team_state("t")
    conv = manager.get_conversation_state("c", team_id="t")
    workers, each = 8, 25
    commits = mode.race([(conv, _bump_own)] * workers, each, retries=workers * each)
    flat = [c for per in commits for c in per]
    assert conv.get("mine") == workers * each
    assert conv.version == workers * each
    assert team.version == 0
    _check_each_commit_is_based_on_fns_last_snapshot(flat, with_team=False)
    # the first reads all overlapped, so at least workers - 1 of them conflicted and were retried
    assert sum(len(c.seen) for c in flat) >= workers * each + workers - 1


def test_a_team_counter_written_in_the_same_batch_loses_no_update(
    manager: GlobalStateManager, mode: Mode
) -> None:
    team = manager.get_team_state("t")
    convs = [manager.get_conversation_state(f"c{i}", team_id="t") for i in range(3)]
    workers, each = 6, 15
    jobs = [(convs[w % len(convs)], _bump) for w in range(workers)]
    commits = mode.race(jobs, each, retries=workers * each)
    flat = [c for per in commits for c in per]
    assert team.get("team_n") == workers * each and team.version == workers * each
    for i, conv in enumerate(convs):
        writers = sum(1 for w in range(workers) if w % len(convs) == i)
        assert conv.get("mine") == writers * each and conv.version == writers * each
    _check_each_commit_is_based_on_fns_last_snapshot(flat, with_team=True)
    assert all(set(c.record.involved) == {c.record.ref, team.ref} for c in flat)
    assert sum(len(c.seen) for c in flat) >= workers * each + workers - 1


@settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    workers=st.integers(1, 5),
    each=st.integers(1, 8),
    n_convs=st.integers(1, 3),
    with_team=st.booleans(),
)
def test_concurrent_modifies_equal_a_serial_count(
    mode: Mode, workers: int, each: int, n_convs: int, with_team: bool
) -> None:
    """Whatever the writers and scopes, the counters end where a serial run would put them."""
    with GlobalStateManager.open() as manager:
        team = manager.get_team_state("t")
        convs = [manager.get_conversation_state(f"c{i}", team_id="t") for i in range(n_convs)]
        fn = _bump if with_team else _bump_own
        jobs = [(convs[w % n_convs], fn) for w in range(workers)]
        commits = mode.race(jobs, each, retries=workers * each)
        flat = [c for per in commits for c in per]
        for i, conv in enumerate(convs):
            writers = sum(1 for w in range(workers) if w % n_convs == i)
            assert conv.get("mine", 0) == writers * each
            assert conv.version == writers * each
        assert team.get("team_n", 0) == (workers * each if with_team else 0)
        assert team.version == (workers * each if with_team else 0)
        _check_each_commit_is_based_on_fns_last_snapshot(flat, with_team)


# -- modify: giving up, errors, arguments ----------------------------------------------------------


@pytest.mark.parametrize("retries", [0, 2])
@pytest.mark.parametrize("where", ["own", "team"])
def test_retries_exhausted_raise_with_a_note_and_apply_nothing(
    manager: GlobalStateManager, mode: Mode, retries: int, where: str
) -> None:
    """Another writer commits between every read and write; modify gives up after retries + 1 tries.

    With ``where="team"`` only the team moves under it: the conflict is caught because the batch
    also writes the team, and the team's version from the snapshot is checked with the commit.
    """
    team = manager.get_team_state("t")
    conv = manager.get_conversation_state("c", team_id="t")
    interloper = conv if where == "own" else team
    seen: list[int] = []

    def fn(snap: ContextSnapshot) -> TransitionBatch:
        seen.append(snap.versions()[interloper.ref])
        interloper.set("interloper", len(seen))  # someone else commits first, every time
        return (
            TransitionBatch()
            .add_message("from the last attempt")
            .update_state("mine", len(seen))
            .update_state("team_k", len(seen), scope="team")
        )

    with pytest.raises(VersionConflictError) as info:
        mode.modify(conv, fn, retries=retries)
    attempts = retries + 1
    assert seen == list(range(attempts)), "each attempt must start from a fresh snapshot"
    assert f"modify gave up after {attempts} attempts" in " ".join(getattr(info.value, "__notes__", []))
    assert info.value.ref == interloper.ref
    assert info.value.current_version == attempts
    # Nothing of any attempt was applied, the last one included: only the interloper's writes.
    snap = conv.snapshot()
    assert snap.messages == () and "mine" not in snap.state and team.get("team_k") is None
    assert interloper.version == attempts and interloper.get("interloper") == attempts
    assert (conv.version, team.version) == ((attempts, 0) if where == "own" else (0, attempts))


def test_an_error_in_fn_propagates_and_applies_nothing(manager: GlobalStateManager, mode: Mode) -> None:
    conv = manager.get_conversation_state("c", team_id="t")
    conv.set("k", 1)
    calls: list[int] = []

    def fn(snap: ContextSnapshot) -> TransitionBatch:
        calls.append(snap.version)
        if len(calls) == 1:
            conv.set("k", 2)  # the first attempt conflicts ...
            return TransitionBatch().update_state("k", "first attempt").add_message("first")
        raise LookupError("fn gives up")  # ... and the retry raises

    with pytest.raises(LookupError, match="fn gives up"):
        mode.modify(conv, fn)
    assert calls == [1, 2]  # retried once after the conflict, not again after the error
    snap = conv.snapshot()
    assert snap.version == 2 and snap.get_state("k") == 2 and snap.messages == ()


def test_a_rejected_batch_is_not_retried(manager: GlobalStateManager, mode: Mode) -> None:
    conv = manager.get_conversation_state("c", team_id="t")
    calls: list[int] = []

    def fn(snap: ContextSnapshot) -> TransitionBatch:
        calls.append(snap.version)
        return TransitionBatch().add_message("m").update_state("k", 1, scope="workflow")  # no workflow

    with pytest.raises(ScopeAccessError):
        mode.modify(conv, fn)
    assert calls == [0] and conv.version == 0


@pytest.mark.parametrize("retries", [-1, 1.5, "3", True, None])
def test_bad_retries_raise_value_error_before_anything_runs(
    manager: GlobalStateManager, mode: Mode, retries: Any
) -> None:
    conv = manager.get_conversation_state("c")
    calls: list[int] = []

    def fn(snap: ContextSnapshot) -> TransitionBatch:
        calls.append(1)
        return TransitionBatch().update_state("k", 1)

    with pytest.raises(ValueError, match="retries"):
        mode.modify(conv, fn, retries=retries)
    assert calls == [] and conv.version == 0


def test_modify_takes_only_a_callable(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c")
    batch = TransitionBatch().update_state("k", 1)
    with pytest.raises(TypeError, match="modify takes a callable"):
        conv.modify(batch)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="modify takes a callable"):
        asyncio.run(conv.amodify(batch))  # type: ignore[arg-type]
    assert conv.version == 0


def test_amodify_takes_a_sync_or_an_async_fn_and_modify_an_async_one(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c")

    async def abump(snap: ContextSnapshot) -> TransitionBatch:
        await asyncio.sleep(0)
        return _bump_own(snap)

    async def main() -> list[StateChanged]:
        return [await conv.amodify(_bump_own), await conv.amodify(abump)]

    records = asyncio.run(main())
    assert [r.new_version for r in records] == [1, 2]
    assert conv.modify(abump).new_version == 3  # no loop running here: modify runs the coroutine
    assert conv.get("mine") == 3


# -- quiesce --------------------------------------------------------------------------------------


def test_quiesce_waits_for_subscribers_that_write_back(manager: GlobalStateManager, mode: Mode) -> None:
    """a's subscriber writes b, b's writes a: twenty commits in a chain, each caused by the one before.

    Every hop is published after the previous one's events were queued, so a single pass through the
    mailboxes and the event thread is never enough: quiesce must repeat until a pass saw no commit.
    """
    a = manager.get_conversation_state("a")
    b = manager.get_conversation_state("b")
    delivered: list[tuple[str, int]] = []
    a.subscribe(lambda e: (delivered.append(("a", e.new_version)), b.add_message(e.new_version)))
    b.subscribe(
        lambda e: (
            delivered.append(("b", e.new_version)),
            e.new_version < 10 and a.add_message(e.new_version),
        )
    )
    a.add_message(0)
    mode.quiesce(manager)
    assert (a.version, b.version) == (10, 10)
    assert b.snapshot().messages == tuple(range(1, 11))
    assert delivered == [(name, v) for v in range(1, 11) for name in ("a", "b")]  # every event, in order


def test_quiesce_waits_for_tool_results(manager: GlobalStateManager, mode: Mode) -> None:
    """Tool results, and the requests their results cause: a chain of three tool calls per scope."""
    convs = [manager.get_conversation_state(f"c{i}") for i in range(6)]
    calls: list[tuple[str, int]] = []
    lock = threading.Lock()

    def step(call: ToolCall) -> int:
        with lock:
            calls.append((call.scope.id, call.arguments["n"]))
        return int(call.arguments["n"]) + 1

    async def astep(call: ToolCall) -> int:
        await asyncio.sleep(0)
        return step(call)

    manager.register_tool("step", step)
    manager.register_tool("astep", astep)

    def follow_up(event: StateChanged) -> None:
        for message in event.added_messages:
            if isinstance(message, Mapping) and message.get("role") == "tool" and message["content"] < 3:
                tool = "astep" if message["tool_name"] == "step" else "step"
                manager.scope(event.ref).apply(
                    TransitionBatch().execute_tool(tool, {"n": message["content"]}, request_id=f"r{tool}")
                )

    for conv in convs:
        conv.subscribe(follow_up)
        conv.apply(TransitionBatch().execute_tool("step", {"n": 0}, request_id="first"))
    mode.quiesce(manager)
    assert sorted(calls) == sorted((c.ref.id, n) for c in convs for n in range(3))
    for conv in convs:
        snap = conv.snapshot()
        assert dict(snap.pending_tool_requests) == {}
        assert [m["content"] for m in snap.messages] == [1, 2, 3]


def test_quiesce_waits_for_queued_requests_on_many_scopes(manager: GlobalStateManager, mode: Mode) -> None:
    """Thirty scopes held with requests queued behind each; quiesce returns once every one is applied.

    The requests come from tasks on an event loop in another thread, which send and move on
    (``aapply`` does not block its loop), so nobody but quiesce waits for them here.
    """
    convs = [manager.get_conversation_state(f"c{i}", team_id="t") for i in range(30)]
    per_scope = 10
    queued = threading.Event()
    results: list[Any] = []

    async def senders() -> None:
        tasks = [
            asyncio.ensure_future(c.aadd_message(j, timeout=30)) for j in range(per_scope) for c in convs
        ]
        await asyncio.sleep(0)  # one turn of the loop: every task has put its request in a mailbox
        queued.set()
        results.extend(await asyncio.gather(*tasks))

    with Gate() as gate:
        gate.hold(manager, *(c.ref for c in convs))
        loop_thread = threading.Thread(target=asyncio.run, args=(senders(),))
        loop_thread.start()
        assert queued.wait(10)
        gate.wait_held(len(convs))
        assert manager.stats()["mailbox_depth_max"] == per_scope - 1  # the first of each is held
        with pytest.raises(DeadlineExceededError, match="still busy"):
            mode.quiesce(manager, timeout=0.1)
    mode.quiesce(manager)
    for conv in convs:
        assert conv.snapshot().messages == tuple(range(per_scope))
    assert manager.stats()["mailbox_depth_max"] == 0
    loop_thread.join(10)
    assert len(results) == per_scope * len(convs) and all(r.committed for r in results)


@pytest.mark.parametrize("held", ["actor", "subscriber", "tool"])
def test_quiesce_raises_at_its_timeout_while_anything_is_held(
    manager: GlobalStateManager, mode: Mode, held: str
) -> None:
    """An actor inside a request, a subscriber inside a callback, a tool still running: each keeps the
    runtime busy, so quiesce raises DeadlineExceededError, and not before its timeout. Once released,
    quiesce returns and the held work is done."""
    conv = manager.get_conversation_state("c")
    entered = threading.Event()
    release = threading.Event()
    writer: threading.Thread | None = None
    gate = Gate()
    if held == "actor":
        gate.hold(manager, conv.ref)
        writer = threading.Thread(target=conv.set, args=("k", "held write"))
        writer.start()
        gate.wait_held()
    elif held == "subscriber":

        def slow_subscriber(event: StateChanged) -> None:
            if event.new_version == 1:
                entered.set()
                release.wait(10)
                conv.set("k", "written back")

        conv.subscribe(slow_subscriber)
        conv.set("k", "first")
        assert entered.wait(5)
    else:

        def slow_tool(call: ToolCall) -> str:
            entered.set()
            release.wait(10)
            return "tool result"

        manager.register_tool("slow", slow_tool)
        conv.apply(TransitionBatch().execute_tool("slow", {}, request_id="r"))
        assert entered.wait(5)

    timeout = 0.2
    started = time.monotonic()
    try:
        with pytest.raises(DeadlineExceededError, match=f"still busy after {timeout} s"):
            mode.quiesce(manager, timeout=timeout)
        assert time.monotonic() - started >= timeout  # measured, not ordering: it waited the whole time
    finally:
        gate.open()
        release.set()
    mode.quiesce(manager)
    if held == "actor":
        assert writer is not None
        writer.join(5)
        assert conv.get("k") == "held write"
    elif held == "subscriber":
        assert conv.get("k") == "written back" and conv.version == 2
    else:
        assert [m["content"] for m in conv.snapshot().messages] == ["tool result"]


def test_quiesce_from_many_threads_at_once(manager: GlobalStateManager) -> None:
    """Four threads quiesce while an actor is held and subscribers chain writes; all return, and each
    sees the final state when its own call returns."""
    convs = [manager.get_conversation_state(f"c{i}") for i in range(4)]
    for i, conv in enumerate(convs[:-1]):
        conv.subscribe(lambda e, nxt=convs[i + 1]: nxt.add_message(e.new_version))
    start = threading.Barrier(5)
    seen: list[tuple[int, ...]] = []
    errors: list[BaseException] = []

    def waiter() -> None:
        try:
            start.wait(5)
            manager.quiesce(10)
            seen.append(tuple(c.version for c in convs))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    with Gate() as gate:
        gate.hold(manager, convs[0].ref)
        first = threading.Thread(target=convs[0].add_message, args=("held",))
        first.start()
        gate.wait_held()
        threads = [threading.Thread(target=waiter) for _ in range(4)]
        for t in threads:
            t.start()
        start.wait(5)
    for t in (first, *threads):
        t.join(15)
    assert not errors, errors
    assert seen == [(1, 1, 1, 1)] * 4


def test_aquiesce_leaves_the_event_loop_free(manager: GlobalStateManager) -> None:
    """The gate is opened by a task on the same loop, after it has ticked twenty times while aquiesce
    waited. Were aquiesce to block the loop, nothing would open the gate and it would time out."""
    conv = manager.get_conversation_state("c")
    gate = Gate().hold(manager, conv.ref)
    writer = threading.Thread(target=conv.set, args=("k", 1))
    writer.start()
    gate.wait_held()

    async def main() -> int:
        ticks = 0
        waiting = asyncio.ensure_future(manager.aquiesce(5))

        async def ticker() -> None:
            nonlocal ticks
            while not waiting.done():
                await asyncio.sleep(0)  # a yield: the loop is free if this task gets to run at all
                ticks += 1
                if ticks == 20:
                    gate.open()

        tick = asyncio.ensure_future(ticker())
        await waiting
        await tick
        return ticks

    try:
        ticks = asyncio.run(main())
    finally:
        gate.open()
    writer.join(5)
    assert ticks >= 20
    assert conv.get("k") == 1


def test_quiesce_on_a_quiet_runtime_returns(manager: GlobalStateManager, mode: Mode) -> None:
    convs = [manager.get_conversation_state(f"c{i}") for i in range(20)]
    for conv in convs:
        conv.set("k", 1)
    mode.quiesce(manager, timeout=2.0)
    mode.quiesce(manager, timeout=2.0)  # and again: nothing to wait for
    assert all(c.version == 1 for c in convs)
    assert manager.stats()["commits"] == 20


# -- runtime bugs found while writing these tests (both failed before their fixes) ---------------


def test_quiesce_with_no_time_left_on_a_quiet_runtime_returns(manager: GlobalStateManager) -> None:
    """Before the fix quiesce(0) raised "still busy": its barriers got no time to be answered."""
    for i in range(5):
        manager.get_conversation_state(f"c{i}").set("k", 1)
    manager.quiesce(1.0)  # quiet now, by quiesce's own account
    manager.quiesce(0.0)  # so a check with no time to spare should find it quiet too


def test_quiesce_from_inside_a_subscriber_fails_at_once(manager: GlobalStateManager) -> None:
    """Before the fix it waited for itself until its timeout, then blamed a busy runtime."""
    conv = manager.get_conversation_state("c")
    outcome: list[tuple[type[BaseException] | None, float]] = []

    def subscriber(event: StateChanged) -> None:
        started = time.monotonic()
        try:
            manager.quiesce(1.0)
            outcome.append((None, time.monotonic() - started))
        except Exception as exc:
            outcome.append((type(exc), time.monotonic() - started))

    conv.subscribe(subscriber)
    conv.set("k", 1)
    manager.quiesce(5.0)
    ((error, elapsed),) = outcome
    assert error is not None and error is not DeadlineExceededError  # a clear "called from inside"
    assert elapsed < 0.5  # at once, not at its timeout


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_quiesce_from_inside_a_tool_executor_fails_at_once(manager: GlobalStateManager, kind: str) -> None:
    """Like the subscriber case: a tool that waits for the runtime to be quiet waits for itself."""
    outcome: list[type[BaseException] | None] = []

    def tool(call: ToolCall) -> str:
        try:
            manager.quiesce(2.0)
            outcome.append(None)
        except Exception as exc:
            outcome.append(type(exc))
        return "done"

    async def atool(call: ToolCall) -> str:
        return tool(call)

    manager.register_tool("t", tool if kind == "sync" else atool)
    conv = manager.get_conversation_state("c")
    started = time.monotonic()
    conv.apply(TransitionBatch().execute_tool("t", {}))
    manager.quiesce(5.0)
    assert outcome and outcome[0] is not None and outcome[0] is not DeadlineExceededError
    assert time.monotonic() - started < 1.5
