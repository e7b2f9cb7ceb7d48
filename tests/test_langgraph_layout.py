"""The saver's layout and write path: segments, the lane, shared transactions, listing.

What each test guards, and whether it fails on the saver before segments and
lanes (checked by running this file against that version of
``victor_actors/langgraph``):

- the conformance suite with tiny segments: every capability across many
  segments (fails before: ``segment_keys`` did not exist);
- a stored checkpoint of a namespace stays bounded however long its history
  (fails before: the namespace's one scope was checkpointed whole, growing
  with every step);
- a graph run meets no version conflict (fails before: one per step, the
  checkpoint built on the snapshot the step's writes had just changed);
- a step's ``put_writes`` and the ``put`` that follows it share one commit
  (fails before: two commits, and ``writes_linger`` did not exist);
- many graphs on many threads share store transactions (held before too:
  a guard against losing it);
- a store written in the layout before segments (plain records and
  ``(type, bytes)`` values in one scope) is read, continued and pruned (the
  compatibility promise of ADR 0019);
- an empty newest segment (a crash right after a roll-over) is stepped over;
- listing every thread pages through the store's team scopes by prefix,
  not through every scope (fails before: it iterated ``manager.scopes()``);
- a cancelled ``aput`` waiting in a lane does not stall the lane;
- bad options and damaged stored records raise typed errors at the edge;
- the put path's shortcuts (issue 27, item 4) build what the checked path
  builds: transitions equal to the core's validated ones, refused text still
  refused; a checkpoint's own fields stored as plain msgpack read back equal,
  and fields that are not plain (a tuple, a datetime) still go through the
  serializer.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypedDict

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointMetadata, create_checkpoint, empty_checkpoint
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES
from langgraph.graph import END, START, StateGraph

from victor_actors import (
    CheckpointCorruptError,
    GlobalStateManager,
    ScopeRef,
    StateScope,
    StateTransition,
    TransitionType,
    TransitionValidationError,
    VersionConflictError,
)
from victor_actors import _trace as trace
from victor_actors.langgraph import VictorActorsSaver
from victor_actors.langgraph import _layout as layout
from victor_actors.langgraph._lanes import Lane


def cfg(thread: str, ns: str = "", cid: str | None = None) -> RunnableConfig:
    conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ns}
    if cid is not None:
        conf["checkpoint_id"] = cid
    return {"configurable": conf}


def put_chain(saver: VictorActorsSaver, thread: str, steps: int, *, big: str = "") -> list[RunnableConfig]:
    """``steps`` checkpoints like a graph's, each followed by its task's writes."""
    out: list[RunnableConfig] = []
    config = cfg(thread)
    cp = empty_checkpoint()
    for i in range(steps):
        cp = create_checkpoint(cp, None, i)
        new: dict[str, Any] = {"step": i + 1, "notes": i + 1} | ({"big": 1} if i == 0 else {})
        cp["channel_values"] = {"step": i, "notes": [f"note {i}"], "big": big}
        cp["channel_versions"] = {**cp["channel_versions"], **new}
        meta: CheckpointMetadata = {"source": "loop", "step": i, "parents": {}}
        config = saver.put(config, cp, meta, new)
        saver.put_writes(config, [("step", i + 1)], f"task-{i}")
        out.append(config)
    return out


def segment(saver: VictorActorsSaver, thread: str, index: int, ns: str = "") -> Any:
    return saver.manager.scope(ScopeRef(StateScope.CONVERSATION, layout.segment_id(thread, ns, index)))


# -- every capability, across many segments ------------------------------------------


def test_conformance_with_tiny_segments(tmp_path: Path) -> None:
    counter = iter(range(1_000))

    @checkpointer_test(name="VictorActorsSaver-tiny-segments")
    async def factory() -> AsyncIterator[VictorActorsSaver]:
        async with VictorActorsSaver.open(tmp_path / f"s-{next(counter)}", segment_keys=8) as saver:
            yield saver

    report = asyncio.run(validate(factory))
    assert {c.value for c in ALL_CAPABILITIES} == set(report.results)
    failures = {name: r.failures for name, r in report.results.items() if r.failures}
    for result in report.results.values():
        assert result.detected and result.passed is True and result.tests_failed == 0, failures


# -- a put costs what the step changed ------------------------------------------------


def test_stored_checkpoints_stay_bounded_as_history_grows(tmp_path: Path) -> None:
    big = "d" * 4_000
    with VictorActorsSaver.open(tmp_path / "store", segment_keys=64, checkpoint_every=10) as saver:
        configs = put_chain(saver, "long", 300, big=big)
        store = saver.manager.store
        assert store is not None
        count = saver._segments.count("long", "")
        assert count >= 20  # 300 steps of about 4 keys each, 64 keys a segment
        sizes = [info.size for k in range(count) for info in store.checkpoints(segment(saver, "long", k).ref)]
        # One segment holds at most 64 keys (the big value once, about 16 steps): a full checkpoint
        # of it is bounded by that, not by the 300 steps behind it.
        assert max(sizes) < 64 * 400 + len(big), sizes
        for k in range(count - 1):  # a frozen segment is compacted: one checkpoint, no log
            ref = segment(saver, "long", k).ref
            assert len(store.checkpoints(ref)) == 1 and store.log_versions(ref) == []
        # every checkpoint is readable, whole, with its writes, from whichever segment holds it
        for i in (0, 1, 150, 299):
            got = saver.get_tuple(configs[i])
            assert got is not None and got.checkpoint["channel_values"] == {
                "step": i,
                "notes": [f"note {i}"],
                "big": big,
            }
            assert got.pending_writes == [(f"task-{i}", "step", i + 1)]
        listed = [t.checkpoint["id"] for t in saver.list(cfg("long"))]
        assert listed == sorted((c["configurable"]["checkpoint_id"] for c in configs), reverse=True)
        latest = saver.get_tuple(cfg("long"))
        assert latest is not None and latest.config == configs[-1]


# -- the lane: no conflicts, shared transactions ---------------------------------------


class _Call:
    def __init__(self, hooks: CountingHooks) -> None:
        self.hooks = hooks

    def actor(self, work: Callable[[Any], Any], cell: Any) -> Callable[[Any], Any]:
        return work

    def bind(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        return fn

    def deliver(self, subscribers: tuple[Any, ...], event: Any) -> None:
        for subscriber in subscribers:
            subscriber.deliver(event)

    def tool(self, fn: Callable[[Any], Any], call: Any, is_async: bool) -> Callable[[Any], Any]:
        return fn

    def end(self, record: Any, error: BaseException | None) -> None:
        with self.hooks.lock:
            self.hooks.calls += 1
            if isinstance(error, VersionConflictError):
                self.hooks.conflicts += 1


class _Run:
    def rolled_back(self, report: Any) -> None:
        pass

    def end(self, status: str) -> None:
        pass


class CountingHooks:
    """Trace hooks that count the runtime's apply calls and the version conflicts among them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls = 0
        self.conflicts = 0

    def call(self, name: str, ref: Any, request: Any, cross_scope: bool, names: Any) -> _Call:
        return _Call(self)

    def capture(self, names: Any) -> _Call:
        return _Call(self)

    def run(self, run: Any, names: Any) -> _Run:
        return _Run()

    def restart(self, cell: Any, reason: str) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

    def group_commit(self, size: int) -> None:
        pass

    def store_transaction(self, size: int) -> None:
        pass

    def backpressure(self, ref: Any) -> None:
        pass


class Loop(TypedDict):
    step: int
    notes: list[str]


def loop_graph(saver: VictorActorsSaver, steps: int) -> Any:
    def work(state: Loop) -> dict[str, Any]:
        i = state["step"]
        return {"step": i + 1, "notes": [*state["notes"], f"note {i}"][-3:]}

    g = StateGraph(Loop).add_node("work", work).add_edge(START, "work")
    g.add_conditional_edges("work", lambda s: "work" if s["step"] < steps else END, ["work", END])
    return g.compile(checkpointer=saver)


def test_a_graph_run_meets_no_version_conflict(tmp_path: Path) -> None:
    hooks = CountingHooks()
    with VictorActorsSaver.open(tmp_path / "store") as saver:
        graph = loop_graph(saver, 40)
        old = trace.install(hooks)
        try:
            for run in range(2):
                config: Any = {"configurable": {"thread_id": f"t{run}"}, "recursion_limit": 200}
                assert graph.invoke({"step": 0, "notes": []}, config, durability="sync")["step"] == 40
        finally:
            trace.install(old)
    assert hooks.calls >= 2 * 40  # every step committed (its writes and its checkpoint, often together)
    assert hooks.conflicts == 0


def test_a_steps_put_writes_and_put_share_one_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """put_writes leads its lane and lingers; the put that arrives meanwhile joins its commit."""
    lingering = threading.Event()
    linger = Lane.linger

    def spy(self: Lane, seconds: float) -> None:
        lingering.set()
        linger(self, seconds)

    monkeypatch.setattr(Lane, "linger", spy)
    with VictorActorsSaver.open(tmp_path / "store", writes_linger=0.1) as saver:
        first = put_chain(saver, "step", 1)[0]
        store = saver.manager.store
        assert store is not None
        commits = store.commits
        writer = threading.Thread(target=saver.put_writes, args=(first, [("step", 5)], "task-x"))
        writer.start()
        assert lingering.wait(10)
        cp = create_checkpoint(empty_checkpoint(), None, 1)
        after = saver.put(first, cp, {"step": 1}, {})
        writer.join(10)
        assert store.commits - commits == 1  # one commit for both
        got = saver.get_tuple(first)
        assert got is not None and ("task-x", "step", 5) in (got.pending_writes or [])
        latest = saver.get_tuple(cfg("step"))
        assert latest is not None and latest.config == after


def test_graphs_on_many_threads_share_store_transactions(tmp_path: Path) -> None:
    n, steps = 16, 10
    with VictorActorsSaver.open(tmp_path / "store") as saver:
        graph = loop_graph(saver, steps)
        store = saver.manager.store
        assert store is not None
        for i in range(n):  # open every namespace first: the timed part is the graphs' commits
            saver.put(cfg(f"g{i}"), create_checkpoint(empty_checkpoint(), None, -1), {"step": -1}, {})
        commits, txns = store.commits, store.transactions
        barrier = threading.Barrier(n)
        errors: list[BaseException] = []

        def one(i: int) -> None:
            barrier.wait()
            try:
                config: Any = {"configurable": {"thread_id": f"g{i}"}, "recursion_limit": 100}
                graph.invoke({"step": 0, "notes": []}, config, durability="sync")
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(120)
        assert not errors, errors
        done_commits, done_txns = store.commits - commits, store.transactions - txns
        assert done_commits >= n * steps
        assert done_txns < done_commits, (done_txns, done_commits)
        for i in range(n):
            got = saver.get_tuple(cfg(f"g{i}"))
            assert got is not None and got.checkpoint["channel_values"]["step"] == steps


# -- compatibility and crashes --------------------------------------------------------


def old_layout_put(saver: VictorActorsSaver, thread: str, i: int, cp: Any) -> RunnableConfig:
    """Write one checkpoint as the saver before segments did: plain records, (type, bytes) values."""
    team = saver.manager.get_team_state(layout.team_id(thread))
    if layout.NS_PREFIX not in team.snapshot().state:
        team.set(layout.NS_PREFIX, True)
    scope = saver.manager.get_conversation_state(layout.conv_id(thread, ""), team_id=layout.team_id(thread))
    dumps = saver.serde.dumps_typed
    rest = {k: v for k, v in cp.items() if k not in ("channel_values", "channel_versions")}
    record = {"c": dumps(rest), "m": dumps({"step": i}), "p": None, "r": None, "v": cp["channel_versions"]}
    values = {
        layout.blob_key(ch, cp["channel_versions"][ch]): dumps(v) for ch, v in cp["channel_values"].items()
    }
    writes = {"p": "", "w": ((0, "step", *dumps(i + 1)),)}
    cid = cp["id"]
    scope.update(
        values
        | {layout.record_key(cid): record, layout.LATEST: cid}
        | {layout.write_tasks_key(cid): ("task",), layout.write_key(cid, "task"): writes}
    )
    return cfg(thread, cid=cid)


def test_a_store_written_before_segments_is_read_and_continued(tmp_path: Path) -> None:
    path = tmp_path / "store"
    before: list[RunnableConfig] = []
    with VictorActorsSaver.open(path) as saver:
        cp = empty_checkpoint()
        for i in range(30):
            cp = create_checkpoint(cp, None, i)
            cp["channel_values"] = {"step": i, "notes": [f"note {i}"]}
            cp["channel_versions"] = {"step": i + 1, "notes": 1}
            before.append(old_layout_put(saver, "old", i, cp))
    with VictorActorsSaver.open(path, segment_keys=16) as saver:
        got = saver.get_tuple(before[3])
        assert got is not None and got.checkpoint["channel_values"] == {"step": 3, "notes": ["note 29"]}
        assert got.pending_writes == [("task", "step", 4)] and got.metadata == {"step": 3}
        latest = saver.get_tuple(cfg("old"))
        assert latest is not None and latest.config == cfg(
            "old", cid=before[-1]["configurable"]["checkpoint_id"]
        )
        assert len(list(saver.list(cfg("old")))) == 30
        # continue the thread: the full segment 0 is frozen and new checkpoints go to segment 1
        cp = create_checkpoint(latest.checkpoint, None, 30)
        cp["channel_values"]["step"] = 30
        cp["channel_versions"]["step"] = 31
        after = saver.put(latest.config, cp, {"step": 30}, {"step": 31})
        assert saver.manager.get_team_state(layout.team_id("old")).get(layout.NS_PREFIX) == 2
        got = saver.get_tuple(cfg("old"))
        assert got is not None and got.config == after
        # the value the new checkpoint kept but did not announce was copied into the new segment
        assert got.checkpoint["channel_values"]["notes"] == ["note 29"]
        assert len(list(saver.list(cfg("old")))) == 31
        saver.prune(["old"])  # whole-thread operations read both forms
        assert [t.config for t in saver.list(cfg("old"))] == [after]


def test_an_empty_newest_segment_is_stepped_over(tmp_path: Path) -> None:
    with VictorActorsSaver.open(tmp_path / "store", segment_keys=16) as saver:
        configs = put_chain(saver, "crash", 10)
        segments = saver._segments.for_write("crash", "")
        saver._segments.roll("crash", "", segments)  # as if the process died right after a roll-over
        fresh = VictorActorsSaver(saver.manager, segment_keys=16)  # no lane, no cached handles
        latest = fresh.get_tuple(cfg("crash"))
        assert latest is not None and latest.config == configs[-1]
        assert len(list(fresh.list(cfg("crash")))) == 10
        more = put_chain(fresh, "crash2", 1)
        assert fresh.get_tuple(cfg("crash2")) is not None and more


# -- listing threads ------------------------------------------------------------------


def test_listing_every_thread_pages_by_prefix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with VictorActorsSaver.open(tmp_path / "store") as saver:
        for i in range(5):
            put_chain(saver, f"lg-{i}", 1)
        for i in range(50):  # scopes that are not LangGraph threads
            saver.manager.get_team_state(f"other-{i}")

        def every_scope() -> Any:
            raise AssertionError("listing threads read every scope")

        monkeypatch.setattr(saver.manager, "scopes", every_scope)
        assert saver._threads() == [f"lg-{i}" for i in range(5)]
        assert len(list(saver.list(None))) == 5


def test_listing_threads_in_memory(tmp_path: Path) -> None:
    saver = VictorActorsSaver(GlobalStateManager.open(), close_manager=True)
    with saver:
        put_chain(saver, "a", 2)
        put_chain(saver, "b", 1)
        assert saver._threads() == ["a", "b"]


# -- asyncio --------------------------------------------------------------------------


def test_a_cancelled_aput_does_not_stall_the_lane(tmp_path: Path) -> None:
    with VictorActorsSaver.open(tmp_path / "store") as saver:

        async def main() -> None:
            cps = [create_checkpoint(empty_checkpoint(), None, i) for i in range(30)]
            tasks = [
                asyncio.create_task(saver.aput(cfg("c"), cp, {"step": i}, {})) for i, cp in enumerate(cps)
            ]
            await asyncio.sleep(0)
            for task in tasks[1::2]:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            # the lane still takes writes, and the newest id is latest
            last = create_checkpoint(empty_checkpoint(), None, 99)
            await asyncio.wait_for(saver.aput(cfg("c"), last, {"step": 99}, {}), 10)
            got = await saver.aget_tuple(cfg("c"))
            assert got is not None and got.checkpoint["id"] == last["id"]
            kept = {t.checkpoint["id"] for t in saver.list(cfg("c"))}
            assert {cp["id"] for cp in cps[0::2]} <= kept

        asyncio.run(main())


# -- bad input --------------------------------------------------------------------------


def test_bad_options_are_refused_and_nothing_stays_open(tmp_path: Path) -> None:
    for options in ({"segment_keys": 2}, {"segment_keys": 10.5}, {"writes_linger": -1}, {"writes_linger": 5}):
        with pytest.raises(ValueError, match=r"segment_keys|writes_linger"):
            VictorActorsSaver.open(tmp_path / "store", **options)
    with VictorActorsSaver.open(tmp_path / "store") as saver:  # the store was closed each time: not locked
        assert saver.get_tuple(cfg("none")) is None


def test_a_damaged_stored_record_raises_a_typed_error(tmp_path: Path) -> None:
    with VictorActorsSaver.open(tmp_path / "store") as saver:
        stored = put_chain(saver, "bad", 1)[0]
        cid = stored["configurable"]["checkpoint_id"]
        scope = segment(saver, "bad", 0)
        scope.set(layout.record_key(cid), b"\xc1 not msgpack")
        with pytest.raises(CheckpointCorruptError, match="does not decode"):
            saver.get_tuple(stored)
        scope.set(layout.record_key(cid), layout.pack({"c": ("msgpack", b"\x80"), "m": ("msgpack", b"\x80"),
                                                        "p": None, "r": None, "v": {"step": 1}}))  # fmt: skip
        scope.set(layout.blob_key("step", 1), 42)
        with pytest.raises(CheckpointCorruptError, match="no known form"):
            saver.get_tuple(stored)


# -- the put path's shortcuts (issue 27, item 4) ------------------------------------------


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("b/ch/1", b"\x01payload"),
        ("latest", "1f0-abc"),
        ("c/x", None),
        ("k", 2.5),
        ("k", True),
        ("b/é/1", b""),
    ],
)
def test_transitions_built_without_checks_equal_the_checked_ones(key: str, value: Any) -> None:
    fast, checked = (
        layout.update(key, value),
        StateTransition(TransitionType.UPDATE_STATE, {"key": key, "value": value}),
    )
    assert fast == checked and hash(fast) == hash(checked) and fast.data._height == checked.data._height
    assert layout.delete(key) == StateTransition(TransitionType.DELETE_STATE, {"key": key})


@pytest.mark.parametrize("value", ["\ud800", ("a", 1)])
def test_what_the_core_refuses_or_converts_still_goes_through_its_checks(value: Any) -> None:
    if value == "\ud800":
        with pytest.raises(TransitionValidationError):
            layout.update("k", value)
        with pytest.raises(TransitionValidationError):
            layout.update("k\ud800", b"x")
    else:
        assert layout.update("k", value) == StateTransition(
            TransitionType.UPDATE_STATE, {"key": "k", "value": value}
        )


def test_a_checkpoint_own_fields_are_stored_plain_when_plain_and_read_back_equal(
    manager: GlobalStateManager,
) -> None:
    import datetime

    saver = VictorActorsSaver(manager)
    cp = create_checkpoint(empty_checkpoint(), None, 1)
    cp["versions_seen"] = {"node": {"ch": 3}}
    config = saver.put(cfg("plain"), cp, {"step": 1}, {})
    odd = create_checkpoint(cp, None, 2)
    odd["versions_seen"] = {"node": {"ch": 4}}
    odd["pending_sends"] = [("x", datetime.datetime(2026, 1, 2, tzinfo=datetime.UTC))]  # type: ignore[typeddict-unknown-key]
    config2 = saver.put(config, odd, {"step": 2}, {})
    state = saver._segments.lookup("plain", "").snapshot().state
    first = layout.record_of(state[layout.record_key(config["configurable"]["checkpoint_id"])])
    second = layout.record_of(state[layout.record_key(config2["configurable"]["checkpoint_id"])])
    assert first["c"].__class__ is bytes and second["c"].__class__ is not bytes  # the second through serde
    got = saver.get_tuple(config)
    assert (
        got is not None
        and got.checkpoint["versions_seen"] == cp["versions_seen"]
        and got.checkpoint["id"] == cp["id"]
    )
    got2 = saver.get_tuple(config2)
    assert got2 is not None  # the datetime is read back as one (tuples as lists: the serializer's, as before)
    sent = got2.checkpoint["pending_sends"]  # type: ignore[typeddict-item]
    assert sent == [["x", datetime.datetime(2026, 1, 2, tzinfo=datetime.UTC)]]
