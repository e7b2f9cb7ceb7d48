"""A caller's thread runs an idle scope's step (ADR 0032), raced against the actor's thread.

One owner per scope means one step at a time in commit order, not one
thread: a blocking ``apply`` to a scope with nothing queued and nothing in
hand is handled on the caller's thread; anything queued (asyncio callers,
cross-scope prepares, barriers, restarts, injected faults) keeps the actor's
thread, and a step in progress holds those back. These tests race threads,
an event loop and the passivator against each other, with real actors and a
real LMDB store, and check order, isolation, events and durability.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from helpers import Gate
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from victor_actors import (
    GlobalStateManager,
    ScopeFailedError,
    ScopeRef,
    StateChanged,
    TransitionBatch,
)
from victor_actors.testing import set_observer
from victor_actors.testing._hooks import kernel_of


def _append(item: Any) -> TransitionBatch:
    return TransitionBatch().add_message(item)


def _items(handle: Any) -> tuple[Any, ...]:
    return tuple(handle.snapshot().messages)


def _bump(scope: str | None = None) -> TransitionBatch:
    return TransitionBatch().add_message("+1", scope=scope)


def _threads_taking_steps(manager: GlobalStateManager) -> list[threading.Thread]:
    """The thread that ran each step from now on, in order (the observer's "received" call)."""
    seen: list[threading.Thread] = []

    def observer(kind: str, ref: ScopeRef, obj: object) -> None:
        if kind == "received":
            seen.append(threading.current_thread())

    set_observer(manager, observer)
    return seen


def test_an_idle_scope_takes_a_blocking_apply_on_the_callers_thread(manager: GlobalStateManager) -> None:
    """The step runs here: the observer sees the request on the calling thread.

    Before ADR 0032 every request was handed to the scope's actor thread, so
    this failed (the observer saw a ``victor-actors-scope-*`` thread).
    """
    conv = manager.get_conversation_state("c")
    seen = _threads_taking_steps(manager)
    conv.apply(_append(1))
    conv.apply(_append(2))
    assert seen == [threading.current_thread(), threading.current_thread()]
    assert _items(conv) == (1, 2)


def test_asyncio_callers_keep_the_hand_off(manager: GlobalStateManager) -> None:
    """An event loop never runs a step (it would block the loop): aapply goes to the actor."""
    conv = manager.get_conversation_state("c")
    seen = _threads_taking_steps(manager)
    asyncio.run(conv.aapply(_append(1)))
    assert len(seen) == 1 and seen[0] is not threading.current_thread()


def test_a_busy_scope_queues_the_caller_behind_what_is_in_hand(manager: GlobalStateManager) -> None:
    """While the actor holds a request, a blocking apply does not overtake it: it queues behind."""
    conv = manager.get_conversation_state("c")
    results: dict[str, StateChanged] = {}
    with Gate() as gate:
        gate.hold(manager, conv.ref)
        first = threading.Thread(target=lambda: results.__setitem__("first", conv.apply(_append("a"))))
        first.start()
        gate.wait_held(1)
        second = threading.Thread(target=lambda: results.__setitem__("second", conv.apply(_append("b"))))
        second.start()
        # the second request is queued (counted) before the gate opens: wait until it is
        inbox = kernel_of(manager).cell(conv.ref).actor.actor_inbox  # type: ignore[union-attr]
        while inbox.qsize() < 1:
            second.join(0.001)
        gate.open()
        first.join()
        second.join()
    assert results["first"].new_version == 1
    assert results["second"].new_version == 2
    assert _items(conv) == ("a", "b")


def _hammer(manager: GlobalStateManager, path: str | None) -> None:
    conv = manager.get_conversation_state("c", team_id="t")
    events: list[int] = []
    conv.subscribe(lambda ev: events.append(ev.new_version))
    threads, per_thread, per_task = 4, 60, 60
    records: list[StateChanged] = []
    lock = threading.Lock()
    start = threading.Barrier(threads + 1)

    def worker(n: int) -> None:
        start.wait()
        for i in range(per_thread):
            rec = conv.apply(_append(f"t{n}-{i}"))
            with lock:
                records.append(rec)

    async def tasks() -> None:
        async def one(n: int) -> None:
            for i in range(per_task):
                rec = await conv.aapply(_append(f"a{n}-{i}"))
                with lock:
                    records.append(rec)

        start.wait()
        await asyncio.gather(*(one(n) for n in range(2)))

    pool = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for t in pool:
        t.start()
    asyncio.run(tasks())
    for t in pool:
        t.join()
    manager.quiesce()
    total = threads * per_thread + 2 * per_task
    items = _items(conv)
    assert len(items) == total and len(set(items)) == total
    # every commit got its own version, contiguous, and events arrived in commit order
    assert sorted(r.new_version for r in records) == list(range(1, total + 1))
    assert events == list(range(1, total + 1))
    # each thread's own writes are in its program order
    for n in range(threads):
        mine = [x for x in items if x.startswith(f"t{n}-")]
        assert mine == [f"t{n}-{i}" for i in range(per_thread)]


def test_threads_and_an_event_loop_racing_on_one_scope_lose_nothing(manager: GlobalStateManager) -> None:
    _hammer(manager, None)


def test_the_same_race_on_a_durable_store_survives_a_reopen(tmp_path: Path) -> None:
    with GlobalStateManager.open(tmp_path / "s", durability="sync") as manager:
        _hammer(manager, str(tmp_path))
        items = _items(manager.get_conversation_state("c"))
    with GlobalStateManager.open(tmp_path / "s") as again:
        assert _items(again.get_conversation_state("c")) == items


def test_the_passivator_never_stops_an_actor_under_a_callers_step(tmp_path: Path) -> None:
    """Threads step scopes inline while a cap of 2 live actors passivates and evicts the rest."""
    with GlobalStateManager.open(tmp_path / "s", durability="sync", max_live_actors=2) as manager:
        refs = [manager.get_conversation_state(f"c{i}").ref for i in range(12)]
        counts = [[0] * len(refs) for _ in range(4)]

        def worker(n: int) -> None:
            for i in range(90):
                k = (i * 7 + n * 3) % len(refs)
                manager.scope(refs[k]).apply(_bump())
                counts[n][k] += 1

        pool = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        manager.quiesce()
        want = [sum(c[k] for c in counts) for k in range(len(refs))]
        got = [manager.scope(r).snapshot().message_count for r in refs]
        assert got == want
        assert manager.stats()["passivations"] > 0
    with GlobalStateManager.open(tmp_path / "s") as again:
        assert [again.scope(r).snapshot().message_count for r in refs] == want


def test_a_real_fault_in_a_callers_step_is_supervised_on_the_actors_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store fails under a step run on the caller's thread: the caller gets ScopeFailedError,
    the scope is restarted (on its actor's thread, before the caller's error is raised) and
    nothing of the request was applied."""
    with GlobalStateManager.open(tmp_path / "s", durability="sync") as manager:
        conv = manager.get_conversation_state("c")
        conv.apply(_append(1))
        store = kernel_of(manager).store
        assert store is not None
        real_submit = store.submit
        calls = {"n": 0}

        def failing_submit(ops: Any, *, wait: bool) -> None:
            calls["n"] += 1
            if calls["n"] == 1:
                raise OSError("disk on fire")
            real_submit(ops, wait=wait)

        monkeypatch.setattr(store, "submit", failing_submit)
        restarted_on: list[threading.Thread] = []
        supervision = kernel_of(manager).cell(conv.ref)
        assert supervision is not None
        sub = manager.subscribe_supervision(lambda ev: restarted_on.append(threading.current_thread()))
        with pytest.raises(ScopeFailedError, match="disk on fire"):
            conv.apply(_append(2))
        assert manager.stats()["restarts"] == 1  # supervised before the caller's error was raised
        assert _items(conv) == (1,)
        conv.apply(_append(3))
        manager.quiesce()
        sub.close()
        assert _items(conv) == (1, 3)
    with GlobalStateManager.open(tmp_path / "s") as again:
        assert _items(again.get_conversation_state("c")) == (1, 3)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    program=st.lists(
        st.tuples(st.sampled_from(["sync", "async", "team"]), st.integers(0, 2)), min_size=1, max_size=30
    )
)
def test_any_mix_of_callers_matches_the_sequential_model(program: list[tuple[str, int]]) -> None:
    """Sync steps on callers' threads, aapply on the actor and cross-scope batches (which go
    through prepares on the actors), all at once from three threads: every count matches a
    model that applies the same requests one by one."""
    with GlobalStateManager.open() as manager:
        convs = [manager.get_conversation_state(f"c{i}", team_id="t") for i in range(3)]
        team = manager.get_team_state("t")
        want = {"c0": 0, "c1": 0, "c2": 0, "team": 0}

        def run(part: list[tuple[str, int]]) -> None:
            async def go() -> None:
                for kind, k in part:
                    conv = convs[k]
                    if kind == "sync":
                        conv.apply(_bump())
                    elif kind == "async":
                        await conv.aapply(_bump())
                    else:
                        conv.apply(_bump().add_message("+1", scope="team"))

            asyncio.run(go())

        for kind, k in program:
            want[f"c{k}"] += 1
            if kind == "team":
                want["team"] += 1
        parts = [program[i::3] for i in range(3)]
        pool = [threading.Thread(target=run, args=(p,)) for p in parts]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        manager.quiesce()
        got = {f"c{i}": convs[i].snapshot().message_count for i in range(3)}
        got["team"] = team.snapshot().message_count
        assert got == want
        assert team.snapshot().version == want["team"]


def test_a_scope_only_blocking_callers_touch_never_starts_a_thread(tmp_path: Path) -> None:
    """Created, applied to and evicted without its actor's thread ever starting; an asyncio
    caller's request (a queued message) is what starts it. Before ADR 0032 every activation
    started the thread (``launch`` did not exist; the thread was started in ``start``)."""
    with GlobalStateManager.open(tmp_path / "s", durability="sync", max_live_actors=4) as manager:
        kernel = kernel_of(manager)
        started_before = {t.ident for t in threading.enumerate()}
        handles = [manager.get_conversation_state(f"c{i}") for i in range(40)]
        for h in handles:
            h.apply(_append("hello"))
        cell = kernel.cell(handles[-1].ref)
        assert cell is not None and cell.actor is not None
        assert cell.actor.actor_inbox.launch is not None  # type: ignore[attr-defined]  # never started
        new_scope_threads = [
            t
            for t in threading.enumerate()
            if t.ident not in started_before and t.name.startswith("victor-actors-scope")
        ]
        assert new_scope_threads == []
        asyncio.run(handles[-1].aapply(_append("from a loop")))
        assert cell.actor is None or cell.actor.actor_inbox.launch is None  # type: ignore[attr-defined]
        manager.quiesce()
        assert manager.stats()["passivations"] > 0
    with GlobalStateManager.open(tmp_path / "s") as again:
        assert all(_items(again.get_conversation_state(f"c{i}")) == ("hello",) for i in range(39))
