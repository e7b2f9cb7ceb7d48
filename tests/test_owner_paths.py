"""Every write to a scope's records goes through its owner (docs/adr/0022, issue 28).

Checkpoints written outside a commit (``save_checkpoint``, ``compact``,
leaving ``manual``), restores and forks reach a scope's records through the
scope's actor, in order with its commits, or under the kernel's lock that
guards a new scope's creation. Real LMDB stores in temporary directories,
real actors, threads and asyncio.

What each test guards, and whether it failed before the change (checked by
running it against the code before it):

- a ``save_checkpoint`` called while the actor is inside a request is
  written after it, by the actor (failed before: it read the state on the
  caller's thread and wrote the version before);
- compaction racing commits (threads, and asyncio) loses nothing, leaves
  every stored checkpoint readable after a reopen, and a final compaction
  leaves one checkpoint and no log (new: ``manager.compact`` did not exist;
  the saver's own compaction, which it replaces, is attacked in
  tests/test_langgraph_owner.py);
- a fork while scopes are being evicted (``max_live_actors=1``) returns the
  fork's handle every time (failed before: a bare ``KeyError`` in 2 to 9 of
  10 forks, the fork already written);
- leaving ``manual`` while commits go on loses no commit after a reopen
  (failed before: the checkpoint and the switch were two steps on the
  caller's thread, and a commit between them was in neither the checkpoint
  nor the log);
- a restore or fork to a version committed in ``async`` mode and not yet
  flushed works (failed before: the target was read from the store before
  the commit reached it);
- compaction without a store, or read-only, raises a typed error.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from helpers import Gate, wait_for

from victor_actors import (
    GlobalStateManager,
    ScopeAccessError,
    ScopeRef,
    TransitionBatch,
    VictorActorsError,
)
from victor_actors.store import Store
from victor_actors.testing import Recorder

WRITERS = 3
STEPS = 60


def _check_every_checkpoint(store: Store, ref: ScopeRef) -> None:
    for info in store.checkpoints(ref):
        assert info.readable, info
        store.checkpoint(ref, info.version)  # rebuilds, or raises CheckpointCorruptError


def _write(t: int, i: int) -> TransitionBatch:
    """One writer's step: a key of its own, a key rewritten with a varying size, a message."""
    return (
        TransitionBatch()
        .update_state(f"w{t}", i)
        .update_state(f"w{t}.{i % 5}", "x" * (i % 7) * 40)
        .add_message({"role": "user", "content": f"{t}:{i}"})
    )


@pytest.mark.parametrize("runtime", ["threads", "asyncio"])
def test_compaction_racing_commits_loses_nothing(tmp_path: Path, runtime: str) -> None:
    path = tmp_path / "store"
    with GlobalStateManager.open(path, checkpoint_every=4, keep_checkpoints=2) as manager:
        conv = manager.get_conversation_state("busy")
        ids: list[str] = []
        if runtime == "threads":
            done = threading.Event()

            def writer(t: int) -> None:
                for i in range(STEPS):
                    conv.apply(_write(t, i))

            def compactor() -> None:
                while not done.is_set():
                    ids.append(manager.compact(conv.ref))
                    ids.append(manager.save_checkpoint(conv.ref, label="between"))

            writers = [threading.Thread(target=writer, args=(t,)) for t in range(WRITERS)]
            side = threading.Thread(target=compactor)
            side.start()
            for th in writers:
                th.start()
            for th in writers:
                th.join(60)
            done.set()
            side.join(60)
            assert not side.is_alive() and not any(th.is_alive() for th in writers)
        else:

            async def main() -> None:
                stop = asyncio.Event()

                async def writer(t: int) -> None:
                    for i in range(STEPS):
                        await conv.aapply(_write(t, i))

                async def compactor() -> None:
                    while not stop.is_set():
                        ids.append(await manager.acompact(conv.ref))
                        ids.append(await manager.asave_checkpoint(conv.ref, label="between"))

                side = asyncio.create_task(compactor())
                await asyncio.gather(*(writer(t) for t in range(WRITERS)))
                stop.set()
                await side

            asyncio.run(main())
        assert len(ids) >= 2
        final = conv.snapshot()
        assert final.version == WRITERS * STEPS
        store = manager.store
        assert store is not None
        _check_every_checkpoint(store, conv.ref)
    with GlobalStateManager.open(path) as manager:
        again = manager.get_conversation_state("busy").snapshot()
        assert again.version == final.version
        assert dict(again.state.items()) == dict(final.state.items())
        assert list(again.messages) == list(final.messages)
        assert not manager.recovery_reports
        store = manager.store
        assert store is not None
        _check_every_checkpoint(store, again.ref)
        cid = manager.compact(again.ref, label="last")
        assert cid == f"{again.ref}@{again.version}"
        assert [i.version for i in store.checkpoints(again.ref)] == [again.version]
        assert store.log_versions(again.ref) == []
        conv = manager.get_conversation_state("busy")
        conv.update({"after": True})  # the next commits build on the compacted base
        for _ in range(5):
            conv.update({"n": conv.snapshot().version})
        _check_every_checkpoint(store, conv.ref)
        last = conv.snapshot()
    with GlobalStateManager.open(path) as manager:
        assert manager.get_conversation_state("busy").snapshot().state == last.state


def test_a_checkpoint_is_written_by_the_scopes_actor_between_its_commits(tmp_path: Path) -> None:
    """Failed before: save_checkpoint read the state on the caller's thread, so a checkpoint called
    while the actor was inside a request wrote the state before it, ordered with nothing."""
    with GlobalStateManager.open(tmp_path / "store") as manager:
        conv = manager.get_conversation_state("c")
        conv.update({"n": 1})
        got: dict[str, str] = {}
        recorder = Recorder(manager)
        with Gate().hold(manager, conv.ref) as gate:
            writer = threading.Thread(target=conv.update, args=({"n": 2},))
            writer.start()
            gate.wait_held()  # the actor is inside the request that commits version 2
            saver = threading.Thread(target=lambda: got.update(cid=manager.save_checkpoint(conv.ref)))
            saver.start()
            wait_for(lambda: manager.stats()["mailbox_depth_max"] >= 1 or not saver.is_alive())
        writer.join(10)
        saver.join(10)
        assert got["cid"] == f"{conv.ref}@2"  # the state the actor committed before it took the request
        assert manager.load_checkpoint(conv.ref).state["n"] == 2
        compacted = manager.compact(conv.ref)
        assert compacted == f"{conv.ref}@2"
        assert [r.kind for r in recorder.received(conv.ref)] == ["apply", "checkpoint", "checkpoint"]
        recorder.detach()


def test_a_fork_while_scopes_are_evicted_returns_the_fork(tmp_path: Path) -> None:
    """Failed before: the fork's parent was evicted between writing the fork and registering it."""
    with GlobalStateManager.open(tmp_path / "store", max_live_actors=1) as manager:
        for i in range(20):
            source = manager.get_conversation_state(f"c{i}", workflow_id=f"w{i}", team_id="t")
            source.update({"k": i})
            cid = manager.save_checkpoint(source.ref)
            for j in range(4):  # pressure: other scopes take the one live actor and the resident set
                manager.get_conversation_state(f"other{i}.{j}", team_id=f"t{j}").update({"z": j})
            fork = manager.fork(source.ref, cid, f"c{i}.fork")
            assert fork.ref == ScopeRef("conversation", f"c{i}.fork")
            assert fork.snapshot().state["k"] == i
            assert fork.snapshot().parent == ScopeRef("workflow", f"w{i}")
            with pytest.raises(ScopeAccessError, match="already exists"):
                manager.fork(source.ref, cid, f"c{i}.fork")
            fork.update({"forked": True})
        manager.quiesce()
        for i in range(20):
            got = manager.get_conversation_state(f"c{i}.fork").snapshot().state
            assert got["k"] == i and got["forked"] is True


def test_leaving_manual_while_commits_go_on_loses_no_commit(tmp_path: Path) -> None:
    """Failed before: a commit between the checkpoint and the switch was in neither."""
    path = tmp_path / "store"
    rounds = 40
    with GlobalStateManager.open(path, durability="manual") as manager:
        finals = {}
        for r in range(rounds):
            conv = manager.get_conversation_state(f"m{r}")
            conv.update({"n": 0})
            started, stop = threading.Event(), threading.Event()

            def writer(conv: Any, started: threading.Event, stop: threading.Event) -> None:
                n = 0
                while not stop.is_set() or n < 5:
                    n += 1
                    conv.update({"n": n})
                    started.set()

            th = threading.Thread(target=writer, args=(conv, started, stop))
            th.start()
            assert started.wait(10)
            manager.set_durability(conv.ref, "sync")  # while the writer commits
            stop.set()
            th.join(30)
            finals[r] = conv.snapshot().state["n"]
    with GlobalStateManager.open(path) as manager:
        lost = {
            r: n
            for r, n in finals.items()
            if manager.get_conversation_state(f"m{r}").snapshot().state.get("n") != n
        }
        assert not lost and not manager.recovery_reports


def test_restore_and_fork_to_a_version_not_yet_flushed(tmp_path: Path) -> None:
    """Failed before: in async mode the target was read before the commit reached the store."""
    with GlobalStateManager.open(tmp_path / "store", durability="async", flush_interval=5.0) as manager:
        conv = manager.get_conversation_state("late")
        for i in range(1, 4):
            conv.update({"i": i})
        fork = manager.fork(conv.ref, 2, "late.fork")
        assert fork.snapshot().state["i"] == 2
        manager.restore(conv.ref, 2)
        assert conv.snapshot().state["i"] == 2 and conv.snapshot().version == 4


def test_compaction_needs_a_writable_store(tmp_path: Path) -> None:
    with GlobalStateManager.open() as manager:
        manager.get_conversation_state("c").update({"a": 1})
        with pytest.raises(VictorActorsError, match="need a store"):
            manager.compact("conversation:c")
    path = tmp_path / "store"
    with GlobalStateManager.open(path) as manager:
        manager.get_conversation_state("c").update({"a": 1})
    with GlobalStateManager.open(path, read_only=True) as manager:
        with pytest.raises(ScopeAccessError, match="read-only"):
            manager.compact("conversation:c")
        with pytest.raises(ScopeAccessError):
            manager.compact("conversation:nobody")
