"""Deleted threads stay deleted (tombstones), and checkpoint TTL with a clock the test moves.

What each test guards (and whether it failed before, checked by running this
file against the code before the change):

- a late ``put`` or ``put_writes`` naming a checkpoint of a thread deleted
  since is refused with ``ThreadDeletedError`` and writes nothing, while a
  new run on the same thread id is accepted (failed before: the late write
  recreated the thread);
- ``delete_thread`` racing late writes (to a listed namespace and to one not
  listed yet), threads and asyncio: after both, no late checkpoint is in the
  thread (failed before, most rounds);
- a ``ttl`` config with an unknown key or a bad value is refused at the edge;
- a thread idle for ``default_ttl`` minutes is expired by a sweep and the
  others are not; reads refresh it with ``refresh_on_read`` and not without;
  ``strategy="keep_latest"`` keeps each namespace's newest checkpoint;
  activity and read refreshes survive a restart; the background sweeper
  expires threads by itself; a sweep held inside one thread's expiry does
  not hold up a put to another thread (all new);
- the bytes the store holds for a thread shrink after its deletion and after
  its expiry (measured: the figures are in docs/langgraph.md).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import Gate, wait_for
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import Checkpoint, create_checkpoint, empty_checkpoint

from victor_actors import GlobalStateManager, ScopeRef, StateScope, TransitionValidationError
from victor_actors.langgraph import ThreadDeletedError, VictorActorsSaver
from victor_actors.langgraph import _layout as layout


class Clock:
    """Seconds, moved by the test."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, minutes: float) -> None:
        self.now += minutes * 60


def cfg(thread: str, cid: str | None = None, ns: str = "") -> RunnableConfig:
    conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ns}
    if cid is not None:
        conf["checkpoint_id"] = cid
    return {"configurable": conf}


def checkpoint(step: int = 0) -> Checkpoint:
    cp = create_checkpoint(empty_checkpoint(), None, step)
    cp["channel_values"], cp["channel_versions"] = {"a": f"value {step}"}, {"a": step + 1}
    return cp


def put(saver: VictorActorsSaver, config: RunnableConfig, cp: Checkpoint | None = None) -> RunnableConfig:
    cp = cp or checkpoint()
    return saver.put(config, cp, {"source": "loop", "step": 0, "parents": {}}, dict(cp["channel_versions"]))


def ids(saver: VictorActorsSaver, thread: str, ns: str | None = "") -> list[str]:
    conf: dict[str, Any] = {"thread_id": thread}
    if ns is not None:
        conf["checkpoint_ns"] = ns
    return [t.checkpoint["id"] for t in saver.list({"configurable": conf})]


@pytest.fixture(params=["sync", "asyncio"])
def late(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """Make a write as a call or through its asyncio twin: ``late(saver, "put" | "put_writes", *args)``."""

    def call(saver: VictorActorsSaver, name: str, *args: Any) -> Any:
        if request.param == "sync":
            return getattr(saver, name)(*args)
        return asyncio.run(getattr(saver, "a" + name)(*args))

    return call


# -- tombstones ----------------------------------------------------------------------


def test_a_late_write_to_a_deleted_thread_is_refused_and_a_new_run_is_not(
    tmp_path: Path, late: Callable[..., Any]
) -> None:
    """Failed before: the late put recreated the thread with a checkpoint whose parent was gone."""
    with VictorActorsSaver.open(tmp_path / "store") as saver:
        first = put(saver, cfg("t"))
        stale = checkpoint(1)  # made before the delete, as a cancelled run's next step is
        saver.delete_thread("t")
        versions = {ref: saver.manager.scope(ref).version for ref in saver.manager.scopes()}
        with pytest.raises(ThreadDeletedError) as refused:
            late(saver, "put", first, stale, {"source": "loop", "step": 1, "parents": {}}, {"a": 2})
        assert refused.value.thread_id == "t" and "nothing was written" in str(refused.value)
        with pytest.raises(ThreadDeletedError):
            late(saver, "put_writes", first, [("a", "late")], "task-1", "")
        with pytest.raises(ThreadDeletedError):  # a late run's first checkpoint, made before the delete
            late(
                saver, "put", cfg("t", ns="child:1"), stale, {"source": "loop", "step": 1, "parents": {}}, {}
            )
        assert {ref: saver.manager.scope(ref).version for ref in saver.manager.scopes()} == versions
        assert ids(saver, "t", None) == []
        # a new run on the same thread id starts from no checkpoint, and goes on
        fresh = put(saver, cfg("t"))
        after = late(saver, "put", fresh, checkpoint(2), {"source": "loop", "step": 2, "parents": {}}, {})
        late(saver, "put_writes", after, [("a", "new")], "task-2", "")
        with pytest.raises(ThreadDeletedError):  # the old run is still refused
            late(saver, "put_writes", first, [("a", "later still")], "task-1", "")
        assert ids(saver, "t") == [
            after["configurable"]["checkpoint_id"],
            fresh["configurable"]["checkpoint_id"],
        ]
    with VictorActorsSaver.open(tmp_path / "store") as saver:  # the tombstone is stored
        with pytest.raises(ThreadDeletedError):
            put(saver, first, stale)


@pytest.mark.parametrize("runtime", ["threads", "asyncio"])
def test_delete_thread_racing_late_writes_never_leaves_one_behind(tmp_path: Path, runtime: str) -> None:
    """Each round starts a delete and a late put (half to a namespace the thread already lists, half
    to one it does not) at one barrier. After both: the late checkpoint is not in the thread, and the
    put either raised ThreadDeletedError or was acknowledged before the delete removed it (failed
    before: in most rounds the late put was still there)."""
    rounds = 12
    with GlobalStateManager.open(tmp_path / "store") as manager:
        saver = VictorActorsSaver(manager)
        outcomes: dict[str, int] = {"refused": 0, "deleted": 0}
        for i in range(rounds):
            thread, ns = f"r{i}", "" if i % 2 else f"child:{i}"
            parent = put(saver, cfg(thread))
            stale = checkpoint(1)
            gate = threading.Barrier(2)
            result: dict[str, Any] = {}

            def delete(thread: str = thread, gate: threading.Barrier = gate) -> None:
                gate.wait()
                saver.delete_thread(thread)

            def late_put(
                config: RunnableConfig, stale: Checkpoint, gate: threading.Barrier, result: dict[str, Any]
            ) -> None:
                meta: Any = {"source": "loop", "step": 1, "parents": {}}
                gate.wait()
                try:
                    if runtime == "threads":
                        saver.put(config, stale, meta, {"a": 2})
                    else:
                        asyncio.run(saver.aput(config, stale, meta, {"a": 2}))
                    result["acked"] = True
                except ThreadDeletedError:
                    result["acked"] = False

            config: RunnableConfig = {"configurable": {**parent["configurable"], "checkpoint_ns": ns}}
            args = (config, stale, gate, result)
            workers = [threading.Thread(target=delete), threading.Thread(target=late_put, args=args)]
            for w in workers:
                w.start()
            for w in workers:
                w.join(60)
            assert stale["id"] not in ids(saver, thread, None), (i, result)
            outcomes["deleted" if result["acked"] else "refused"] += 1
        assert sum(outcomes.values()) == rounds


# -- TTL -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ttl",
    [
        {"default_ttl": 5, "sweep_every": 1},
        {"default_ttl": 0},
        {"default_ttl": -1},
        {"default_ttl": "5"},
        {"default_ttl": True},
        {"sweep_interval_minutes": float("inf")},
        {"refresh_on_read": "yes"},
        {"strategy": "archive"},
    ],
)
def test_a_bad_ttl_config_is_refused_before_anything_runs(manager: GlobalStateManager, ttl: Any) -> None:
    with pytest.raises(TransitionValidationError) as refused:
        VictorActorsSaver(manager, ttl=ttl)
    assert refused.value.field == "ttl" and list(manager.scopes()) == list(GlobalStateManager.open().scopes())


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def ttl_saver(tmp_path: Path, clock: Clock) -> Iterator[VictorActorsSaver]:
    with VictorActorsSaver.open(tmp_path / "store", ttl={"default_ttl": 60}, clock=clock) as saver:
        yield saver


def test_a_thread_idle_for_its_ttl_is_expired_by_a_sweep_and_no_other(
    ttl_saver: VictorActorsSaver, clock: Clock
) -> None:
    old = put(ttl_saver, cfg("old"))
    clock.advance(30)
    put(ttl_saver, cfg("young"))
    ttl_saver.put_writes(put(ttl_saver, cfg("young", ns="child:1")), [("a", 1)], "task", "")
    clock.advance(29.9)
    assert ttl_saver.sweep() == 0
    clock.advance(0.1)  # "old" was last written 60 minutes ago
    assert ttl_saver.sweep() == 1
    assert ids(ttl_saver, "old", None) == [] and len(ids(ttl_saver, "young", None)) == 2
    with pytest.raises(ThreadDeletedError):  # expiry is a delete: its late writes are refused
        put(ttl_saver, old, checkpoint(1))
    clock.advance(59.9)  # the list above was a read of "young": it lives 60 minutes from then
    assert ttl_saver.sweep() == 0
    clock.advance(0.1)
    assert ttl_saver.sweep() == 1 and ids(ttl_saver, "young", None) == []
    assert ttl_saver.sweep() == 0


@pytest.mark.parametrize("refresh", [True, False])
def test_reads_refresh_a_thread_only_with_refresh_on_read(
    tmp_path: Path, clock: Clock, refresh: bool
) -> None:
    ttl = {"default_ttl": 60, "refresh_on_read": refresh}
    with VictorActorsSaver.open(tmp_path / "store", ttl=ttl, clock=clock) as saver:
        put(saver, cfg("read"))
        put(saver, cfg("listed"))
        clock.advance(50)
        assert saver.get_tuple(cfg("read")) is not None
        assert len(ids(saver, "listed")) == 1
        clock.advance(20)
        assert saver.sweep() == (0 if refresh else 2)
        clock.advance(40)
        assert saver.sweep() == (2 if refresh else 0)


def test_keep_latest_keeps_each_namespace_newest_checkpoint(tmp_path: Path, clock: Clock) -> None:
    ttl = {"default_ttl": 10, "strategy": "keep_latest"}
    with VictorActorsSaver.open(tmp_path / "store", ttl=ttl, clock=clock) as saver:
        config = cfg("t")
        for step in range(4):
            config = put(saver, config, checkpoint(step))
        sub = put(saver, put(saver, cfg("t", ns="child:1")), checkpoint(9))
        clock.advance(10)
        assert saver.sweep() == 1
        assert ids(saver, "t") == [config["configurable"]["checkpoint_id"]]
        assert ids(saver, "t", "child:1") == [sub["configurable"]["checkpoint_id"]]
        put(saver, config, checkpoint(5))  # not deleted: the thread goes on
        assert saver.sweep() == 0


def test_activity_and_read_refreshes_survive_a_restart(tmp_path: Path, clock: Clock) -> None:
    ttl = {"default_ttl": 60}
    with VictorActorsSaver.open(tmp_path / "store", ttl=ttl, clock=clock) as saver:
        put(saver, cfg("written"))
        put(saver, cfg("read"))
        clock.advance(50)
        put(saver, cfg("written", ns="child:1"))
        assert saver.get_tuple(cfg("read")) is not None
        assert saver.sweep() == 0  # writes the read down
    clock.advance(55)  # 105 minutes since the first puts, 55 since the last activity of either
    with VictorActorsSaver.open(tmp_path / "store", ttl=ttl, clock=clock) as saver:
        assert saver.sweep() == 0
        clock.advance(5)
        assert saver.sweep() == 2


def test_the_background_sweeper_expires_threads_by_itself(tmp_path: Path, clock: Clock) -> None:
    # a sweep every 30 ms of real time; the test's reads refresh nothing
    ttl = {"default_ttl": 1, "sweep_interval_minutes": 0.0005, "refresh_on_read": False}
    with VictorActorsSaver.open(tmp_path / "store", ttl=ttl, clock=clock) as saver:
        put(saver, cfg("t"))
        clock.advance(1)
        assert wait_for(lambda: ids(saver, "t") == [])
    assert saver._retention._thread is not None and not saver._retention._thread.is_alive()


def test_a_sweep_held_inside_one_expiry_does_not_hold_up_a_put_to_another_thread(
    tmp_path: Path, clock: Clock
) -> None:
    with VictorActorsSaver.open(tmp_path / "store", ttl={"default_ttl": 1}, clock=clock) as saver:
        put(saver, cfg("idle"))
        clock.advance(2)
        busy = put(saver, cfg("busy"))
        segment = ScopeRef(StateScope.CONVERSATION, layout.segment_id("idle", "", 0))
        with Gate().hold(saver.manager, segment) as gate:
            sweeper = threading.Thread(target=saver.sweep)
            sweeper.start()
            gate.wait_held()  # the sweep is inside the idle thread's delete
            for step in range(3):
                busy = put(saver, busy, checkpoint(step))
            assert len(ids(saver, "busy")) == 4
            assert sweeper.is_alive()  # still held in the idle thread's delete
        sweeper.join(30)
        assert ids(saver, "idle") == [] and len(ids(saver, "busy")) == 4


def _stored_bytes(saver: VictorActorsSaver, thread: str) -> int:
    store = saver.manager.store
    assert store is not None
    saver.manager.flush()
    return sum(store.size_of(ref) for ref in saver.manager.scopes() if thread in ref.id)


def test_a_thread_stored_bytes_shrink_after_its_delete_and_after_its_expiry(
    tmp_path: Path, clock: Clock
) -> None:
    with VictorActorsSaver.open(
        tmp_path / "store", ttl={"default_ttl": 60}, clock=clock, segment_keys=32
    ) as saver:
        for thread in ("deleted", "expired"):
            config = cfg(thread)
            for step in range(40):
                cp = checkpoint(step)
                cp["channel_values"]["a"] = os.urandom(1000).hex()  # 2 KB the store cannot compress
                config = put(saver, config, cp)
        before = {t: _stored_bytes(saver, t) for t in ("deleted", "expired")}
        saver.delete_thread("deleted")
        clock.advance(60)
        assert saver.sweep() == 1
        after = {t: _stored_bytes(saver, t) for t in ("deleted", "expired")}
    for thread in before:  # what stays: the scopes' records, one empty checkpoint each, the tombstone
        assert after[thread] < before[thread] / 20, (before, after)
