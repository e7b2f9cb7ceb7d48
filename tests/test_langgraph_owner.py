"""The saver's side paths go through the owner too (issue 28, items 1, 2 and part of 10; docs/adr/0022).

Puts racing whole-thread work (``delete_for_runs``, ``prune``,
``delete_thread``), segment roll-overs every other put, and two savers on one
manager; then a restart, after which every acknowledged checkpoint must be
readable. A namespace too long for a segment id, and text UTF-8 cannot
encode, refused at the edge with nothing written.

What each test guards, and whether it failed before the change (checked by
running this file against the code before it):

- puts racing whole-thread work on two savers, in threads and in asyncio,
  with ``segment_keys=8``: no call raises, and after a restart every
  acknowledged checkpoint (and its writes) is readable and the newest is the
  namespace's latest (failed before, every run: puts raised
  ``CheckpointCorruptError`` and the reopened store could not rebuild
  segments, since the saver compacted a segment by writing checkpoints
  beside the segment's actor, twice for a segment rolled over or deleted
  twice);
- four savers on one manager writing one namespace: every checkpoint kept,
  the newest the latest (failed before, most runs: the same corruption);
- whole-thread work and puts of every saver on a manager take one lane: a
  delete called while a put commits runs after it, a put called meanwhile
  after the delete (new: lanes were per saver and whole-thread work ran
  beside them, so the outcome depended on timing);
- a namespace too long for its segment ids is refused with a typed error and
  is not listed in its thread (failed before: at 400 bytes it was listed,
  then refused, and every later ``list`` or delete of the thread, and
  ``list(None)`` for every tenant, raised; at 382 and 390 the first put
  worked and the roll-over, about a hundred steps later, failed);
- a namespace an older saver listed but whose scope cannot exist is skipped
  by ``list``, ``list(None)``, ``delete_for_runs`` and ``prune``, and
  unlisted by ``delete_thread`` (failed before: all of them raised);
- text UTF-8 cannot encode (a lone surrogate) in a ``run_id``, a metadata
  key, a thread id, a namespace, a checkpoint or parent id, a task id or
  path, a write's channel, is refused with ``TransitionValidationError`` and
  nothing is written (failed before for the ``run_id``, the metadata key,
  the parent id, the task path and the channel: a bare ``TypeError`` from the
  encoder; ``get_tuple`` of such an id returned None).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import Gate, wait_for
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointMetadata, create_checkpoint, empty_checkpoint

from victor_actors import GlobalStateManager, ScopeRef, StateScope, TransitionValidationError
from victor_actors.langgraph import ThreadDeletedError, VictorActorsSaver
from victor_actors.langgraph import _layout as layout
from victor_actors.langgraph._lanes import WHOLE

KEYS = 8  # a new segment every other put: roll-overs (and compactions) all the time
PUTTERS = 3
STEPS = 40


def cfg(thread: str, ns: str = "", cid: str | None = None) -> RunnableConfig:
    conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ns}
    if cid is not None:
        conf["checkpoint_id"] = cid
    return {"configurable": conf}


class Calls:
    """The saver calls a worker makes: the blocking ones (``threads``) or their asyncio twins."""

    def __init__(self, runtime: str) -> None:
        self.runtime = runtime

    async def __call__(
        self, sync: Callable[..., Any], coro: Callable[..., Awaitable[Any]], *args: Any
    ) -> Any:
        if self.runtime == "threads":
            return sync(*args)  # each worker runs on a thread of its own: blocking is the point
        return await coro(*args)


class Ledger:
    """What was acknowledged, in one order: puts, their writes, and the whole-thread calls' ends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clock = itertools.count(1)
        # cid -> (thread, ns, the tick before the put was called, values)
        self.puts: dict[str, tuple[str, str, int, dict[str, Any]]] = {}
        self.writes: set[str] = set()
        self.cleared: dict[str, int] = {}  # thread -> tick at which its last delete or prune returned
        self.errors: list[BaseException] = []
        self.refused: list[str] = []  # checkpoint ids of late puts a delete_thread's tombstone refused

    def now(self) -> int:
        with self._lock:
            return next(self._clock)

    def put(self, thread: str, ns: str, cid: str, tick: int, values: dict[str, Any]) -> None:
        with self._lock:
            self.puts[cid] = (thread, ns, tick, values)

    def wrote(self, cid: str) -> None:
        with self._lock:
            self.writes.add(cid)

    def clear(self, thread: str) -> None:
        with self._lock:
            self.cleared[thread] = next(self._clock)


async def putter(
    call: Calls, saver: VictorActorsSaver, ledger: Ledger, thread: str, ns: str, w: int, run_id: str = "keep"
) -> None:
    """A graph's loop: a checkpoint, then its task's writes, ``STEPS`` times."""
    config, cp = cfg(thread, ns), empty_checkpoint()
    version: Any = None
    for i in range(STEPS):
        cp = create_checkpoint(cp, None, i)
        version = saver.get_next_version(version, None)
        values = {"x": f"{w}-{i}", "pad": "p" * (i % 5) * 30}
        cp["channel_values"] = values
        cp["channel_versions"] = {"x": version, "pad": version}
        meta: CheckpointMetadata = {"source": "loop", "step": i, "parents": {}, "run_id": run_id}
        try:
            tick = ledger.now()
            config = await call(saver.put, saver.aput, config, cp, meta, {"x": version, "pad": version})
            ledger.put(thread, ns, config["configurable"]["checkpoint_id"], tick, values)
            await call(saver.put_writes, saver.aput_writes, config, [("x", i)], f"task-{w}", "")
            ledger.wrote(config["configurable"]["checkpoint_id"])
        except ThreadDeletedError:  # a late write to a thread deleted meanwhile: the run starts afresh
            if cp["id"] not in ledger.puts:
                ledger.refused.append(cp["id"])
            config = cfg(thread, ns)
        except Exception as exc:
            ledger.errors.append(exc)
            return


async def disruptor(
    call: Calls, savers: list[VictorActorsSaver], ledger: Ledger, busy: Callable[[], bool]
) -> None:
    """Whole-thread work while the putters run: junk puts deleted by run, prunes, deletes."""
    a, b = savers
    junk = cfg("T")
    cp = empty_checkpoint()
    turn = 0
    try:
        while busy() or turn < 3:
            turn += 1
            cp = create_checkpoint(cp, None, turn)
            meta: CheckpointMetadata = {"source": "loop", "step": turn, "parents": {}, "run_id": "junk"}
            junk = await call(b.put, b.aput, junk, cp, meta, {})
            await call(a.delete_for_runs, a.adelete_for_runs, ["junk"])
            if turn % 2:
                await call(b.prune, b.aprune, ["D"])
            else:
                await call(a.delete_thread, a.adelete_thread, "D")
            ledger.clear("D")
        await call(a.delete_for_runs, a.adelete_for_runs, ["junk"])
    except Exception as exc:
        ledger.errors.append(exc)


def _stress(path: Path, runtime: str) -> Ledger:
    ledger = Ledger()
    manager = GlobalStateManager.open(path, checkpoint_every=5, keep_checkpoints=2)
    savers = [VictorActorsSaver(manager, segment_keys=KEYS) for _ in range(2)]
    call = Calls(runtime)
    left = [PUTTERS + 1]
    lock = threading.Lock()

    def busy() -> bool:
        with lock:
            return left[0] > 0

    async def counted(work: Awaitable[None]) -> None:
        try:
            await work
        finally:
            with lock:
                left[0] -= 1

    workers = [
        counted(putter(call, savers[w % 2], ledger, "T", "" if w < 2 else "child:1", w))
        for w in range(PUTTERS)
    ]
    workers.append(counted(putter(call, savers[1], ledger, "D", "", 9)))
    side = disruptor(call, savers, ledger, busy)
    try:
        if runtime == "threads":
            threads = [threading.Thread(target=asyncio.run, args=(w,)) for w in [*workers, side]]
            for th in threads:
                th.start()
            for th in threads:
                th.join(300)
            assert not any(th.is_alive() for th in threads)
        else:

            async def main() -> None:
                await asyncio.gather(*workers, side)

            asyncio.run(main())
    finally:
        manager.close()
    return ledger


@pytest.mark.parametrize("runtime", ["threads", "asyncio"])
@pytest.mark.parametrize("round_", range(3))
def test_puts_racing_whole_thread_work_keep_every_acknowledged_checkpoint(
    tmp_path: Path, runtime: str, round_: int
) -> None:
    path = tmp_path / "store"
    ledger = _stress(path, runtime)
    assert not ledger.errors, ledger.errors[:3]
    assert len(ledger.puts) + len(ledger.refused) == (PUTTERS + 1) * STEPS
    with VictorActorsSaver.open(path, segment_keys=KEYS) as saver:  # the restart
        assert not saver.manager.recovery_reports
        last_clear = ledger.cleared["D"]
        expected = {
            cid: entry
            for cid, entry in ledger.puts.items()
            # D's puts called before its last delete or prune returned may be gone
            if entry[0] == "T" or entry[2] > last_clear
        }
        for cid, (thread, ns, _tick, values) in expected.items():
            got = saver.get_tuple(cfg(thread, ns, cid))
            assert got is not None, (thread, ns, cid)
            assert got.checkpoint["channel_values"] == values
            if cid in ledger.writes:
                assert [w[1:] for w in got.pending_writes or []] == [("x", int(values["x"].split("-")[1]))]
        for cid in ledger.refused:  # a late put refused by delete_thread's tombstone wrote nothing
            assert saver.get_tuple(cfg("D", "", cid)) is None
        for ns in ("", "child:1"):
            acked = sorted(cid for cid, e in ledger.puts.items() if e[:2] == ("T", ns))
            listed = [t.checkpoint["id"] for t in saver.list(cfg("T", ns))]
            assert listed == acked[::-1]  # every one, no junk left, newest first
            latest = saver.get_tuple(cfg("T", ns))
            assert latest is not None and latest.checkpoint["id"] == acked[-1]
        assert not [t for t in saver.list(None, filter={"run_id": "junk"})]
        assert saver._segments.count("T", "") > 10  # the puts met a long chain of roll-overs


def test_four_savers_on_one_manager_keep_every_checkpoint_and_the_newest_as_latest(tmp_path: Path) -> None:
    """Failed before: puts raised CheckpointCorruptError (two compactions of one segment, beside its
    actor, rewrote a values record a stored checkpoint still used)."""
    with GlobalStateManager.open(tmp_path / "store") as manager:
        savers = [VictorActorsSaver(manager, segment_keys=KEYS) for _ in range(4)]
        ledger = Ledger()
        call = Calls("threads")
        threads = [
            threading.Thread(target=asyncio.run, args=(putter(call, savers[w], ledger, "R", "", w),))
            for w in range(4)
        ]
        for th in threads:
            th.start()
        for th in threads:
            th.join(300)
        assert not ledger.errors, ledger.errors[:3]
        saver = savers[0]
        count = saver._segments.count("R", "")
        for k in range(count - 1):  # every frozen segment was filled before the next opened
            handle = manager.scope(ScopeRef(StateScope.CONVERSATION, layout.segment_id("R", "", k)))
            assert len(handle.snapshot().state) >= KEYS
        acked = sorted(ledger.puts)
        latest = saver.get_tuple(cfg("R"))
        assert latest is not None and latest.checkpoint["id"] == acked[-1]
        assert [t.checkpoint["id"] for t in saver.list(cfg("R"))] == acked[::-1]


@pytest.mark.parametrize("runtime", ["threads", "asyncio"])
def test_whole_thread_work_and_puts_of_every_saver_take_one_lane(tmp_path: Path, runtime: str) -> None:
    """A delete called while a put is in its commit runs after it; a put called meanwhile runs after
    the delete, whichever saver on the manager makes each call, and whether the lane's leader is a
    blocking caller or an asyncio task (new: before, each saver had lanes of its own and
    whole-thread work ran beside them, so the outcome depended on timing)."""
    with GlobalStateManager.open(tmp_path / "store") as manager:
        a, b = VictorActorsSaver(manager), VictorActorsSaver(manager)
        assert a._writer.lanes is b._writer.lanes
        first = _one_put(a, cfg("T"))
        lane = a._writer.lanes.get(("T", ""))
        assert lane is not None
        seg = manager.scope(ScopeRef(StateScope.CONVERSATION, layout.segment_id("T", "", 0)))
        got: dict[str, Any] = {}
        with Gate().hold(manager, seg.ref) as gate:
            if runtime == "threads":
                held = threading.Thread(target=lambda: got.update(p1=_one_put(a, first, 1)))
            else:

                async def aput() -> None:
                    cp = create_checkpoint(empty_checkpoint(), None, 1)
                    got["p1"] = await a.aput(first, cp, {"step": 1}, {})

                held = threading.Thread(target=asyncio.run, args=(aput(),))
            held.start()
            gate.wait_held()  # P1's commit is inside the segment's actor, its lane led by this call
            deleter = threading.Thread(target=b.delete_thread, args=("T",))
            deleter.start()
            assert wait_for(lambda: [j.kind for j in lane.queue] == [WHOLE])
            later = threading.Thread(target=lambda: got.update(p2=_one_put(b, cfg("T"), 2)))
            later.start()
            assert wait_for(lambda: [j.kind for j in lane.queue] == [WHOLE, "put"])
        for th in (held, deleter, later):
            th.join(30)
        assert [t.config for t in a.list(cfg("T"))] == [got["p2"]]  # P1 deleted, P2 after the delete


# -- item 2: a namespace too long for its segment ids ---------------------------------


def _versions(saver: VictorActorsSaver) -> dict[ScopeRef, int]:
    return {ref: saver.manager.scope(ref).version for ref in saver.manager.scopes()}


def _one_put(saver: VictorActorsSaver, config: RunnableConfig, step: int = 0, **meta: Any) -> RunnableConfig:
    cp = create_checkpoint(empty_checkpoint(), None, step)
    cp["channel_values"], cp["channel_versions"] = {"a": step}, {"a": step + 1}
    return saver.put(config, cp, {"source": "loop", "step": step, "parents": {}, **meta}, {"a": step + 1})


@pytest.mark.parametrize("length", [400, 390, 382])
def test_a_namespace_too_long_for_its_segments_is_refused_and_not_listed(tmp_path: Path, length: int) -> None:
    """Failed before: at 400 the namespace was listed, then refused, and every later read of the
    thread (and ``list(None)``) raised; at 390 and 382 the first put worked and the roll-over
    to segment 1 (whose id is longer) failed after about a hundred steps."""
    long = "n" * length
    with VictorActorsSaver.open(tmp_path / "store", segment_keys=KEYS) as saver:
        good = _one_put(saver, cfg("T"))
        before = _versions(saver)
        with pytest.raises(TransitionValidationError, match="too long") as caught:
            _one_put(saver, cfg("T", long))
        assert caught.value.field == "checkpoint_ns"
        with pytest.raises(TransitionValidationError, match="too long"):
            saver.put_writes(cfg("T", long, good["configurable"]["checkpoint_id"]), [("a", 1)], "task")
        assert _versions(saver) == before  # nothing written, nothing listed
        assert saver._listed("T") == [""]
        assert saver.get_tuple(cfg("T", long)) is None
        assert [t.config for t in saver.list(cfg("T"))] == [good]
        assert [t.config for t in saver.list(None)] == [good]
        saver.copy_thread("T", "T2")
        assert [t.checkpoint["id"] for t in saver.list(cfg("T2"))] == [good["configurable"]["checkpoint_id"]]
        saver.delete_for_runs(["nobody"])
        saver.delete_thread("T")
        assert not list(saver.list(cfg("T")))


def test_a_namespace_listed_by_an_older_saver_that_cannot_exist_is_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Failed before: every list of the thread, delete_thread, delete_for_runs and list(None) raised."""
    long = "n" * 400
    with VictorActorsSaver.open(tmp_path / "store") as saver:
        good = _one_put(saver, cfg("T"), run_id="r")
        other = _one_put(saver, cfg("U"))
        team = saver.manager.get_team_state(layout.team_id("T"))
        team.update({layout.NS_PREFIX + long: True})  # what the saver before this change left behind
        assert saver._listed("T") == ["", long]
        with caplog.at_level("WARNING", logger="victor_actors"):
            assert [t.config for t in saver.list({"configurable": {"thread_id": "T"}})] == [good]
        assert "cannot exist" in caplog.text
        assert {t.config["configurable"]["thread_id"] for t in saver.list(None)} == {"T", "U"}
        saver.delete_for_runs(["r"])
        assert not list(saver.list(cfg("T"))) and [t.config for t in saver.list(cfg("U"))] == [other]
        saver.prune(["T"])
        saver.delete_thread("T")
        assert saver._listed("T") == [""]  # delete_thread unlists what can hold nothing


# -- item 10 (part): text UTF-8 cannot encode -------------------------------------------

BAD = "bad\ud800text"


def _bad_call(saver: VictorActorsSaver, where: str, good: RunnableConfig) -> Any:
    if where == "run_id":
        return _one_put(saver, cfg("T"), 1, run_id=BAD)
    if where == "metadata key":
        return _one_put(saver, cfg("T"), 1, **{BAD: 1})
    if where == "thread_id":
        return _one_put(saver, cfg(BAD), 1)
    if where == "checkpoint_ns":
        return _one_put(saver, cfg("T", BAD), 1)
    if where == "parent checkpoint_id":
        return _one_put(saver, cfg("T", "", BAD), 1)
    if where == "checkpoint id":
        cp = create_checkpoint(empty_checkpoint(), None, 1)
        return saver.put(cfg("T"), {**cp, "id": BAD}, {}, {})
    if where == "task_id":
        return saver.put_writes(good, [("a", 1)], BAD)
    if where == "task_path":
        return saver.put_writes(good, [("a", 1)], "task", BAD)
    if where == "write channel":
        return saver.put_writes(good, [(BAD, 1)], "task")
    if where == "get_tuple":
        return saver.get_tuple(cfg("T", "", BAD))
    if where == "delete_thread":
        return saver.delete_thread(BAD)
    assert where == "copy_thread"
    return saver.copy_thread("T", BAD)


@pytest.mark.parametrize(
    "where",
    [
        "run_id",
        "metadata key",
        "thread_id",
        "checkpoint_ns",
        "parent checkpoint_id",
        "checkpoint id",
        "task_id",
        "task_path",
        "write channel",
        "get_tuple",
        "delete_thread",
        "copy_thread",
    ],
)
def test_text_utf8_cannot_encode_is_refused_with_a_typed_error(tmp_path: Path, where: str) -> None:
    """Failed before for run_id, the metadata key, the parent id, task_path and the write channel:
    a bare TypeError from the record's encoder (the others were already typed, and are kept so)."""
    with VictorActorsSaver.open(tmp_path / "store") as saver:
        good = _one_put(saver, cfg("T"))
        before = _versions(saver)
        with pytest.raises(TransitionValidationError, match="cannot"):
            _bad_call(saver, where, good)
        assert _versions(saver) == before  # nothing written
        got = saver.get_tuple(cfg("T"))
        assert got is not None and got.config == good and got.pending_writes == []
