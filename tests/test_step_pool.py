"""An asyncio caller's request to an idle scope is stepped on the runtime's step pool (ADR 0036).

A scope touched once from an event loop should not need a thread of its
own: when its commit never waits for the disk (in memory, or ``async`` or
``manual`` durability), a pool thread takes the scope's step token and runs
the step, as a blocking caller does on its own thread (ADR 0032); the loop
never runs it. Scopes in ``sync`` durability keep the hand-off to their
actor, which groups an asyncio burst into one transaction. These tests use
real actors, a real LMDB store and real event loops.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from victor_actors import GlobalStateManager, RuntimeClosedError, ScopeRef, StateChanged, TransitionBatch
from victor_actors.testing import set_observer
from victor_actors.testing._hooks import kernel_of


def _append(item: Any) -> TransitionBatch:
    return TransitionBatch().add_message(item)


def _stepping_threads(manager: GlobalStateManager) -> list[str]:
    names: list[str] = []

    def observer(kind: str, _ref: ScopeRef, _obj: object) -> None:
        if kind == "received":
            names.append(threading.current_thread().name)

    set_observer(manager, observer)
    return names


def _scope_threads() -> set[int | None]:
    return {t.ident for t in threading.enumerate() if t.name.startswith("victor-actors-scope")}


async def _touch_all(handles: list[Any]) -> list[StateChanged]:
    return list(await asyncio.gather(*(h.aapply(_append("hi")) for h in handles)))


def test_asyncio_requests_to_idle_in_memory_scopes_start_no_scope_thread(manager: GlobalStateManager) -> None:
    """Before ADR 0036 each of these requests went to its scope's actor and started its thread."""
    handles = [manager.get_conversation_state(f"c{i}") for i in range(40)]
    names = _stepping_threads(manager)
    before = _scope_threads()
    records = asyncio.run(_touch_all(handles))
    assert [r.new_version for r in records] == [1] * 40
    assert names and all(n.startswith("victor-actors-step") for n in names), set(names)
    assert _scope_threads() - before == set()
    kernel = kernel_of(manager)
    for h in handles:
        cell = kernel.cell(h.ref)
        assert cell is not None and cell.actor is not None
        assert cell.actor.actor_inbox.launch is not None  # type: ignore[attr-defined]  # never started
        assert list(h.snapshot().messages) == ["hi"]


def test_async_durability_steps_on_the_pool_and_keeps_every_acknowledged_commit(tmp_path: Path) -> None:
    with GlobalStateManager.open(tmp_path / "s", durability="async", max_live_actors=8) as manager:
        handles = [manager.get_conversation_state(f"c{i}") for i in range(30)]
        names = _stepping_threads(manager)
        for _ in range(3):
            asyncio.run(_touch_all(handles))
        assert all(n.startswith("victor-actors-step") for n in names), set(names)
    with GlobalStateManager.open(tmp_path / "s") as again:
        for i in range(30):
            assert list(again.get_conversation_state(f"c{i}").snapshot().messages) == ["hi"] * 3


def test_sync_durability_keeps_the_hand_off_to_the_actor(tmp_path: Path) -> None:
    """A burst to a synced scope is grouped by its actor into one transaction: no pool there."""
    with GlobalStateManager.open(tmp_path / "s", durability="sync") as manager:
        conv = manager.get_conversation_state("c")
        names = _stepping_threads(manager)
        asyncio.run(conv.aapply(_append(1)))
        assert len(names) == 1 and names[0].startswith("victor-actors-scope"), names


def test_a_request_sent_while_a_pool_step_runs_waits_for_it(manager: GlobalStateManager) -> None:
    """The pool holds the step token: a second request queues behind it and commits after it."""
    conv = manager.get_conversation_state("c")
    conv.apply(_append("warm"))
    in_step, finish = threading.Event(), threading.Event()

    def observer(kind: str, _ref: ScopeRef, _obj: object) -> None:
        if kind == "received" and threading.current_thread().name.startswith("victor-actors-step"):
            if not in_step.is_set():
                in_step.set()
                assert finish.wait(30)

    set_observer(manager, observer)
    inbox = kernel_of(manager).cell(conv.ref).actor.actor_inbox  # type: ignore[union-attr]

    async def both() -> list[StateChanged]:
        first = asyncio.ensure_future(conv.aapply(_append("first")))
        while not in_step.is_set():  # the pool thread is inside the first step
            await asyncio.sleep(0)
        second = asyncio.ensure_future(conv.aapply(_append("second")))
        while inbox.qsize() + inbox.waiting < 1:  # the second is queued (or its actor waits)
            await asyncio.sleep(0)
        finish.set()
        return [await first, await second]

    first, second = asyncio.run(both())
    assert (first.new_version, second.new_version) == (2, 3)
    assert list(conv.snapshot().messages) == ["warm", "first", "second"]


def test_threads_and_event_loops_racing_over_scopes_lose_nothing(manager: GlobalStateManager) -> None:
    """Blocking callers, two event loops (pool steps and queued requests) and events, over 6 scopes."""
    handles = [manager.get_conversation_state(f"c{i}") for i in range(6)]
    events: dict[str, list[int]] = {str(h.ref): [] for h in handles}
    for h in handles:
        h.subscribe(lambda ev: events[str(ev.ref)].append(ev.new_version))
    start = threading.Barrier(4)
    per = 40

    def blocking(n: int) -> None:
        start.wait()
        for i in range(per):
            handles[(n + i) % 6].apply(_append(f"t{n}-{i}"))

    def looping(n: int) -> None:
        async def main() -> None:
            async def one(k: int) -> None:
                for i in range(per):
                    await handles[(k + i) % 6].aapply(_append(f"a{n}.{k}-{i}"))

            await asyncio.gather(*(one(k) for k in range(3)))

        start.wait()
        asyncio.run(main())

    pool = [threading.Thread(target=blocking, args=(n,)) for n in range(2)]
    pool += [threading.Thread(target=looping, args=(n,)) for n in range(2)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    manager.quiesce()
    total = 0
    for h in handles:
        snap = h.snapshot()
        total += len(snap.messages)
        assert snap.version == len(snap.messages)
        assert events[str(h.ref)] == list(range(1, snap.version + 1))  # events in commit order
    assert total == 2 * per + 2 * 3 * per
    every = [m for h in handles for m in h.snapshot().messages]
    assert len(set(every)) == total


def test_closing_waits_for_pool_steps_and_keeps_what_it_acknowledged(tmp_path: Path) -> None:
    """Close while asyncio requests are in flight: each is answered or refused, and every
    acknowledged commit is in the store after a reopen (the pool is shut before the store)."""
    acked: list[str] = []
    refused: list[BaseException] = []
    in_step = threading.Event()
    manager = GlobalStateManager.open(tmp_path / "s", durability="async")
    handles = [manager.get_conversation_state(f"c{i}") for i in range(20)]

    def observer(kind: str, _ref: ScopeRef, _obj: object) -> None:
        if kind == "received" and threading.current_thread().name.startswith("victor-actors-step"):
            in_step.set()

    set_observer(manager, observer)

    async def flood() -> None:
        async def one(k: int) -> None:
            for i in range(50):
                item = f"{k}-{i}"
                try:
                    await handles[k].aapply(_append(item))
                except (RuntimeClosedError, Exception) as exc:  # closed under it: refused, not lost
                    refused.append(exc)
                    return
                acked.append(item)

        await asyncio.gather(*(one(k) for k in range(20)))

    runner = threading.Thread(target=lambda: asyncio.run(flood()))
    runner.start()
    assert in_step.wait(30)
    manager.close()
    runner.join(60)
    assert not runner.is_alive()
    with GlobalStateManager.open(tmp_path / "s") as again:
        stored = {m for i in range(20) for m in again.get_conversation_state(f"c{i}").snapshot().messages}
    assert set(acked) <= stored, sorted(set(acked) - stored)[:5]
