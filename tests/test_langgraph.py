"""The LangGraph checkpointer: the conformance suite with every capability, and what the suite does not check.

Durability (SIGKILL during puts), concurrent writers, storage that grows
linearly, the strict serializer (refused types raise and import nothing),
real graphs that interrupt and resume after a reopen, and the store view.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import operator
import os
import pickle
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import ormsgpack
import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointMetadata, create_checkpoint, empty_checkpoint
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES
from langgraph.checkpoint.serde.jsonplus import EXT_CONSTRUCTOR_SINGLE_ARG, JsonPlusSerializer
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from victor_actors import GlobalStateManager, ScopeRef, StateScope, StoreLockedError, VictorActorsError
from victor_actors.langgraph import DisallowedTypeError, StrictSerializer, VictorActorsSaver
from victor_actors.langgraph import _layout as layout

ROOT = Path(__file__).resolve().parent.parent


# -- the conformance suite ------------------------------------------------------------


def _conformance(tmp_path: Path, durable: bool) -> Any:
    counter = iter(range(1_000))

    @checkpointer_test(name=f"VictorActorsSaver-{'lmdb' if durable else 'memory'}")
    async def factory() -> AsyncIterator[VictorActorsSaver]:
        if durable:
            saver = VictorActorsSaver.open(tmp_path / f"store-{next(counter)}")
        else:
            saver = VictorActorsSaver(GlobalStateManager.open(), close_manager=True)
        async with saver:
            yield saver

    return asyncio.run(validate(factory))


@pytest.mark.parametrize("durable", [True, False], ids=["lmdb-store", "in-memory"])
def test_conformance_every_capability_passes(tmp_path: Path, durable: bool) -> None:
    report = _conformance(tmp_path, durable)
    summary = {
        name: (r.detected, r.passed, r.tests_passed, r.tests_failed) for name, r in report.results.items()
    }
    failures = {name: r.failures for name, r in report.results.items() if r.failures}
    assert {c.value for c in ALL_CAPABILITIES} == set(report.results), summary
    for name, result in report.results.items():
        assert result.detected, f"{name} not detected: {summary}"
        assert result.passed is True and result.tests_failed == 0, failures
        assert result.tests_passed > 0 and result.tests_skipped == 0, summary
    assert report.passed_all_base() and report.passed_all() and report.conformance_level() == "FULL"


# -- helpers --------------------------------------------------------------------------


def cfg(thread: str, ns: str = "", cid: str | None = None) -> RunnableConfig:
    conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ns}
    if cid is not None:
        conf["checkpoint_id"] = cid
    return {"configurable": conf}


def put_chain(
    saver: VictorActorsSaver, thread: str, steps: int, *, ns: str = "", big: str = "", run_id: str = ""
) -> list[RunnableConfig]:
    """``steps`` checkpoints like a graph's: ``big`` set once, ``step`` and ``notes`` every time."""
    out: list[RunnableConfig] = []
    config = cfg(thread, ns)
    cp = empty_checkpoint()
    for i in range(steps):
        cp = create_checkpoint(cp, None, i)
        new = {"step": i + 1, "notes": i + 1} | ({"big": 1} if i == 0 else {})
        cp["channel_values"] = {"step": i, "notes": [f"note {i}"], "big": big}
        cp["channel_versions"] = {**cp["channel_versions"], **new}
        meta: CheckpointMetadata = {"source": "loop", "step": i, "parents": {}}
        if run_id:
            meta["run_id"] = run_id
        config = saver.put(config, cp, meta, new)
        out.append(config)
    return out


def scope_of(saver: VictorActorsSaver, thread: str, ns: str = "") -> Any:
    return saver.manager.scope(ScopeRef(StateScope.CONVERSATION, layout.conv_id(thread, ns)))


@pytest.fixture
def saver(tmp_path: Path) -> Iterator[VictorActorsSaver]:
    with VictorActorsSaver.open(tmp_path / "store") as s:
        yield s


# -- graphs ---------------------------------------------------------------------------


class Review(TypedDict):
    topic: str
    draft: str
    log: Annotated[list[str], operator.add]


def review_graph(saver: VictorActorsSaver) -> Any:
    def write(s: Review) -> dict[str, Any]:
        return {"draft": f"draft about {s['topic']}", "log": ["write"]}

    def approve(s: Review) -> dict[str, Any]:
        answer = interrupt({"question": "publish?", "draft": s["draft"]})
        return {"log": [f"approved={answer}"]}

    g = StateGraph(Review).add_node("write", write).add_node("approve", approve)
    g.add_edge(START, "write").add_edge("write", "approve").add_edge("approve", END)
    return g.compile(checkpointer=saver)


def test_graph_interrupts_and_resumes_after_reopen(tmp_path: Path) -> None:
    config: Any = {"configurable": {"thread_id": "review-1"}}
    with VictorActorsSaver.open(tmp_path / "store") as saver:
        out = review_graph(saver).invoke({"topic": "actors", "log": []}, config)
        assert out["__interrupt__"][0].value["question"] == "publish?"
        with pytest.raises(StoreLockedError):  # one owner per store, as for every store
            VictorActorsSaver.open(tmp_path / "store")
    with VictorActorsSaver.open(tmp_path / "store") as saver:
        graph = review_graph(saver)
        assert graph.get_state(config).next == ("approve",)
        out = graph.invoke(Command(resume="yes"), config)
        assert out["log"] == ["write", "approved=yes"]
        history = list(graph.get_state_history(config))
        assert len(history) >= 4 and history[0].next == ()


def test_async_graph_and_the_event_loop_stays_free(saver: VictorActorsSaver) -> None:
    async def main() -> tuple[list[str], int]:
        ticks = 0
        done = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(ticker())
        graph = review_graph(saver)
        config: Any = {"configurable": {"thread_id": "async-1"}}
        await graph.ainvoke({"topic": "loops", "log": []}, config)
        out = await graph.ainvoke(Command(resume="ok"), config)
        for i in range(20):  # bare aputs: the loop ticks while the actor commits
            await saver.aput(cfg("async-2"), create_checkpoint(empty_checkpoint(), None, i), {"step": i}, {})
        done.set()
        await task
        return out["log"], ticks

    log, ticks = asyncio.run(main())
    assert log == ["write", "approved=ok"]
    assert ticks > 200, ticks


# -- storage is linear ----------------------------------------------------------------


def test_values_are_stored_once_per_version_not_per_checkpoint(saver: VictorActorsSaver) -> None:
    big = "x" * 20_000
    configs = put_chain(saver, "linear", 200, big=big)
    count = saver._segments.count("linear", "")
    assert count == 2  # 512 keys a segment: about 170 steps in the first
    states = [
        saver.manager.scope(ScopeRef(StateScope.CONVERSATION, layout.segment_id("linear", "", k)))
        .snapshot()
        .state
        for k in range(count)
    ]
    blobs = [k for state in states for k in state if k.startswith("b/")]
    # big once per segment (a segment holds every value its checkpoints use); step and notes once
    # per version
    assert len([k for k in blobs if k.startswith("b/big/")]) == count
    assert len(blobs) == count + 2 * 200
    first, last = saver.get_tuple(configs[0]), saver.get_tuple(cfg("linear"))
    assert first is not None and last is not None
    assert first.checkpoint["channel_values"]["big"] == big == last.checkpoint["channel_values"]["big"]
    store = saver.manager.store
    assert store is not None
    # The log holds each value once; the runtime's full checkpoints (every 100 commits, 3 kept) add a
    # bounded number of copies of one segment, and a frozen segment is compacted to one. 200 copies
    # of `big` would be 4 MB.
    held = sum(
        store.size_of(ScopeRef(StateScope.CONVERSATION, layout.segment_id("linear", "", k)))
        for k in range(count)
    )
    assert held < 8 * len(big) + 200 * 2_000


# -- serialization --------------------------------------------------------------------


@dataclasses.dataclass
class Point:
    x: int
    y: int


def test_a_type_outside_the_allowlist_is_refused_when_written(saver: VictorActorsSaver) -> None:
    cp = create_checkpoint(empty_checkpoint(), None, 0)
    cp["channel_values"], cp["channel_versions"] = {"p": Point(1, 2)}, {"p": 1}
    with pytest.raises(DisallowedTypeError, match=r"test_langgraph\.Point") as info:
        saver.put(cfg("refused"), cp, {"step": 0}, {"p": 1})
    assert isinstance(info.value, VictorActorsError) and info.value.type_name.endswith("test_langgraph.Point")
    assert saver.get_tuple(cfg("refused")) is None
    with pytest.raises(DisallowedTypeError):
        saver.put_writes(cfg("refused", cid="x"), [("p", Point(0, 0))], "task")


def test_allowed_types_round_trip(tmp_path: Path) -> None:
    with VictorActorsSaver.open(tmp_path / "store", allowed_types=[Point]) as saver:
        cp = create_checkpoint(empty_checkpoint(), None, 0)
        cp["channel_values"], cp["channel_versions"] = {"p": Point(1, 2)}, {"p": 1}
        stored = saver.put(cfg("allowed"), cp, {"step": 0}, {"p": 1})
        saver.put_writes(stored, [("p", Point(3, 4))], "task")
        got = saver.get_tuple(stored)
        assert got is not None and got.checkpoint["channel_values"]["p"] == Point(1, 2)
        assert got.pending_writes == [("task", "p", Point(3, 4))]
        # LangGraph's strict mode widens the allowlist through with_allowlist(); the clone stays strict.
        clone = saver.with_allowlist({("mod", "Other")})
        assert isinstance(clone.serde, StrictSerializer) and ("mod", "Other") in clone.serde.allowed_types
        assert ("mod", "Other") not in saver.serde.allowed_types  # type: ignore[attr-defined]


def _evil_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    marker = tmp_path / "imported"
    (tmp_path / "lg_evil_mod.py").write_text(
        f"open({str(marker)!r}, 'w').close()\nclass Boom:\n    def __init__(self, *a):\n        pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return marker


def _ext(module: str, name: str, arg: Any) -> bytes:
    inner = ormsgpack.packb((module, name, arg))
    return ormsgpack.packb({"v": ormsgpack.Ext(EXT_CONSTRUCTOR_SINGLE_ARG, inner)})


def test_a_stored_type_outside_the_allowlist_raises_and_imports_nothing(
    saver: VictorActorsSaver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = _evil_module(tmp_path, monkeypatch)
    cp = create_checkpoint(empty_checkpoint(), None, 0)
    cp["channel_values"], cp["channel_versions"] = {"x": "fine"}, {"x": 1}
    stored = saver.put(cfg("tampered"), cp, {"step": 0}, {"x": 1})
    handle = scope_of(saver, "tampered")
    for module, name, arg in [
        ("lg_evil_mod", "Boom", 1),
        ("os", "system", f"touch {tmp_path / 'pwned'}"),
    ]:
        handle.set(layout.blob_key("x", 1), ("msgpack", _ext(module, name, arg)))
        with pytest.raises(DisallowedTypeError, match=rf"{module}\.{name}.*nothing was imported") as info:
            saver.get_tuple(stored)
        assert info.value.type_name == f"{module}.{name}"
    assert "lg_evil_mod" not in sys.modules and not marker.exists() and not (tmp_path / "pwned").exists()
    # LangGraph's own permissive default would have imported (and run) the module.
    JsonPlusSerializer(allowed_msgpack_modules=True).loads_typed(("msgpack", _ext("lg_evil_mod", "Boom", 1)))
    assert marker.exists()
    sys.modules.pop("lg_evil_mod", None)


def test_pickle_and_json_payloads_are_refused(saver: VictorActorsSaver) -> None:
    cp = create_checkpoint(empty_checkpoint(), None, 0)
    cp["channel_values"], cp["channel_versions"] = {"x": "fine"}, {"x": 1}
    stored = saver.put(cfg("pickled"), cp, {"step": 0}, {"x": 1})
    handle = scope_of(saver, "pickled")
    for payload in [("pickle", pickle.dumps({"a": 1})), ("json", json.dumps({"a": 1}).encode())]:
        handle.set(layout.blob_key("x", 1), payload)
        with pytest.raises(DisallowedTypeError, match=payload[0]):
            saver.get_tuple(stored)


def test_nested_and_method_records_are_checked() -> None:
    serde = StrictSerializer()
    import datetime
    import uuid

    safe = {"when": datetime.datetime(2024, 1, 2, 3, 4), "id": uuid.uuid4(), "s": {1, 2}}
    assert serde.loads_typed(serde.dumps_typed(safe)) == safe
    nested = ormsgpack.packb(
        ormsgpack.Ext(EXT_CONSTRUCTOR_SINGLE_ARG, ormsgpack.packb(("builtins", "set", [_ext_obj()])))
    )
    with pytest.raises(DisallowedTypeError, match=r"lg_evil_mod\.Boom"):
        serde.loads_typed(("msgpack", nested))


def _ext_obj() -> ormsgpack.Ext:
    return ormsgpack.Ext(EXT_CONSTRUCTOR_SINGLE_ARG, ormsgpack.packb(("lg_evil_mod", "Boom", 1)))


# -- concurrency ----------------------------------------------------------------------


def in_threads(fn: Callable[[int], object], n: int) -> None:
    """Run ``fn(0)``, ..., ``fn(n - 1)`` on ``n`` threads released together; fail on any error."""
    barrier = threading.Barrier(n)
    errors: list[BaseException] = []

    def target(i: int) -> None:
        barrier.wait()
        try:
            fn(i)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=target, args=(i,)) for i in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not any(th.is_alive() for th in threads)
    assert not errors, errors


def test_concurrent_put_writes_lose_nothing(saver: VictorActorsSaver) -> None:
    stored = put_chain(saver, "busy", 1)[0]
    n_threads, tasks_each = 8, 25

    def worker(t: int) -> None:
        for k in range(tasks_each):
            saver.put_writes(stored, [("a", f"{t}.{k}"), ("b", t * 1000 + k)], f"task-{t}-{k}")

    in_threads(worker, n_threads)
    got = saver.get_tuple(stored)
    assert got is not None
    expected: set[tuple[str, str, object]] = {
        (f"task-{t}-{k}", "a", f"{t}.{k}") for t in range(n_threads) for k in range(tasks_each)
    }
    expected |= {(f"task-{t}-{k}", "b", t * 1000 + k) for t in range(n_threads) for k in range(tasks_each)}
    assert set(got.pending_writes or []) == expected and len(got.pending_writes or []) == len(expected)


def test_concurrent_aput_writes_lose_nothing(saver: VictorActorsSaver) -> None:
    stored = put_chain(saver, "abusy", 1)[0]

    async def main() -> None:
        await asyncio.gather(*(saver.aput_writes(stored, [("a", k)], f"task-{k}") for k in range(60)))

    asyncio.run(main())
    got = saver.get_tuple(stored)
    assert got is not None and sorted(w[2] for w in got.pending_writes or []) == list(range(60))


def test_concurrent_puts_keep_every_checkpoint_and_the_newest_as_latest(saver: VictorActorsSaver) -> None:
    ids: list[str] = []
    lock = threading.Lock()

    def worker(_: int) -> None:
        for i in range(15):
            cp = create_checkpoint(empty_checkpoint(), None, i)
            with lock:
                ids.append(cp["id"])
            saver.put(cfg("racing"), cp, {"step": i}, {})

    in_threads(worker, 6)
    listed = [t.checkpoint["id"] for t in saver.list(cfg("racing"))]
    assert listed == sorted(ids, reverse=True)
    latest = saver.get_tuple(cfg("racing"))
    assert latest is not None and latest.checkpoint["id"] == max(ids)


# -- crash safety ---------------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import sys
    from langgraph.checkpoint.base import create_checkpoint, empty_checkpoint
    from victor_actors.langgraph import VictorActorsSaver

    path, start, keys = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    saver = VictorActorsSaver.open(path, segment_keys=keys)
    last = saver.get_tuple({"configurable": {"thread_id": "crash", "checkpoint_ns": ""}})
    config = {"configurable": {"thread_id": "crash", "checkpoint_ns": ""}}
    cp = empty_checkpoint()
    if last is not None:
        config, cp = last.config, last.checkpoint
    for i in range(start, start + 100_000):
        cp = create_checkpoint(cp, None, i)
        cp["channel_values"] = {"big": bytes([i % 251]) * 150_000, "step": i}
        cp["channel_versions"] = {"big": i + 1, "step": i + 1}
        config = saver.put(config, cp, {"source": "loop", "step": i}, {"big": i + 1, "step": i + 1})
        print("put", i, cp["id"], flush=True)
        saver.put_writes(config, [("a", i), ("b", bytes([i % 251]) * 50_000), ("c", str(i))], "task")
        print("writes", i, flush=True)
    """
)


def _crash_round(
    path: Path, start: int, min_puts: int, delay: float, keys: int
) -> tuple[int, set[str], set[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path), str(start), str(keys)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    puts: set[str] = set()
    writes: set[str] = set()
    by_step: dict[str, int] = {}

    def acknowledged(line: str) -> None:
        kind, i, *rest = line.split()
        if kind == "put":
            puts.add(rest[0])
            by_step[rest[0]] = int(i)
        else:
            writes.add(next(c for c, s in by_step.items() if s == int(i)))

    while len(puts) < min_puts:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"the child stopped early: {proc.stderr.read() if proc.stderr else ''}")
        acknowledged(line)
    time.sleep(delay)  # mid-put or mid-put_writes, most likely: they are most of the child's time
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    for line in proc.stdout:  # acknowledged before the kill landed
        if line.endswith("\n") and len(line.split()) >= 2:  # a line the kill cut short acknowledged nothing
            acknowledged(line)
    assert proc.returncode == -signal.SIGKILL
    return max(by_step.values()), puts, writes


@pytest.mark.parametrize("keys", [512, 8], ids=["one-segment", "rolling-over"])
def test_sigkill_during_puts_leaves_whole_checkpoints_and_writes_or_none(tmp_path: Path, keys: int) -> None:
    """With 8 keys a segment, a new segment opens every other put: kills land in roll-overs too."""
    path = tmp_path / "store"
    acked_puts: set[str] = set()
    acked_writes: set[str] = set()
    start = 0
    for delay in (0.013, 0.031):
        last, puts, writes = _crash_round(path, start, 6, delay, keys)
        acked_puts |= puts
        acked_writes |= writes
        start = last + 10  # steps the next child writes start well past anything in flight
    with VictorActorsSaver.open(path, segment_keys=keys) as saver:
        found = list(saver.list(cfg("crash")))
        ids = {t.checkpoint["id"] for t in found}
        assert acked_puts <= ids  # every acknowledged put survived
        assert len(ids - acked_puts) <= 2  # at most the one in flight at each kill
        for t in found:  # ... and each one is whole
            i = t.metadata["step"]
            assert t.checkpoint["channel_values"] == {"big": bytes([i % 251]) * 150_000, "step": i}
            assert t.pending_writes in ([], [("task", "a", i), ("task", "b", bytes([i % 251]) * 50_000),
                                             ("task", "c", str(i))])  # fmt: skip
            if t.checkpoint["id"] in acked_writes:
                assert len(t.pending_writes or []) == 3
        latest = saver.get_tuple(cfg("crash"))
        assert latest is not None and latest.checkpoint["id"] == max(ids)
        if keys == 8:
            assert saver._segments.count("crash", "") > 2  # the kills met a chain of segments


# -- list, delete, copy, prune beyond the suite -----------------------------------------


def test_list_filters_across_threads_and_namespaces(saver: VictorActorsSaver) -> None:
    put_chain(saver, "t1", 3, run_id="r1")
    put_chain(saver, "t1", 2, ns="sub:1", run_id="r2")
    put_chain(saver, "t2", 4, run_id="r2")
    assert len(list(saver.list(None))) == 9
    assert len(list(saver.list(None, filter={"run_id": "r2"}))) == 6
    assert len(list(saver.list({"configurable": {"thread_id": "t1"}}))) == 5  # every namespace
    assert len(list(saver.list(cfg("t1")))) == 3  # the root namespace only
    newest = [t.checkpoint["id"] for t in saver.list(cfg("t2"))]
    assert [t.checkpoint["id"] for t in saver.list(cfg("t2"), before=cfg("t2", cid=newest[1]), limit=1)] == [
        newest[2]
    ]
    assert [t.checkpoint["id"] for t in saver.list(cfg("t2", cid=newest[3]))] == [newest[3]]


def test_delete_thread_drops_values_from_the_store_too(saver: VictorActorsSaver) -> None:
    put_chain(saver, "gone", 150, big="y" * 50_000)
    put_chain(saver, "stays", 3)
    store, handle = saver.manager.store, scope_of(saver, "gone")
    assert store is not None
    before = store.size_of(handle.ref)
    assert before > 50_000
    saver.delete_thread("gone")
    assert saver.get_tuple(cfg("gone")) is None and not list(saver.list(cfg("gone")))
    assert store.size_of(handle.ref) < 1_000 < before  # log and old checkpoints gone, not just the keys
    assert len(store.checkpoints(handle.ref)) == 1
    assert saver.get_tuple(cfg("stays")) is not None
    again = put_chain(saver, "gone", 2)  # the thread id can be used again
    assert [t.config for t in saver.list(cfg("gone"))] == again[::-1]


def test_prune_keeps_values_the_latest_checkpoint_still_uses(saver: VictorActorsSaver) -> None:
    put_chain(saver, "p", 30, big="z" * 1_000)
    saver.prune(["p"])
    state = scope_of(saver, "p").snapshot().state
    assert len(layout.checkpoint_ids(state)) == 1
    latest = saver.get_tuple(cfg("p"))
    assert latest is not None
    assert latest.checkpoint["channel_values"] == {"big": "z" * 1_000, "step": 29, "notes": ["note 29"]}
    assert len([k for k in state if k.startswith("b/")]) == 3
    with pytest.raises(ValueError, match="strategy"):
        saver.prune(["p"], strategy="sometimes")


def test_delete_for_runs_collects_values_nobody_uses(saver: VictorActorsSaver) -> None:
    put_chain(saver, "runs", 3, run_id="old")
    keep = put_chain(saver, "runs", 2, run_id="new")
    saver.delete_for_runs(["old"])
    left = list(saver.list(cfg("runs")))
    assert [t.metadata["run_id"] for t in left] == ["new", "new"]
    got = saver.get_tuple(keep[-1])
    assert got is not None and got.checkpoint["channel_values"]["step"] == 1


def test_copy_thread_then_continue_the_copy(saver: VictorActorsSaver) -> None:
    graph = review_graph(saver)
    src: Any = {"configurable": {"thread_id": "src"}}
    graph.invoke({"topic": "forks", "log": []}, src)
    saver.copy_thread("src", "dst")
    dst: Any = {"configurable": {"thread_id": "dst"}}
    assert graph.invoke(Command(resume="on the copy"), dst)["log"] == ["write", "approved=on the copy"]
    assert graph.get_state(src).next == ("approve",)  # the source still waits


def test_the_command_line_shows_threads_as_scopes(tmp_path: Path) -> None:
    with VictorActorsSaver.open(tmp_path / "store") as saver:
        put_chain(saver, "shown", 3)
        put_chain(saver, "shown", 1, ns="child:1")
    proc = subprocess.run(
        [sys.executable, "-m", "victor_actors", "inspect", str(tmp_path / "store")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "team:lg:shown" in out and "conversation:lg:shown:child:1" in out
    assert re.search(r"^ +conversation:lg:shown: +3 ", out, re.MULTILINE), out  # the root namespace, v3


def test_thread_ids_with_separators_do_not_collide(saver: VictorActorsSaver) -> None:
    put_chain(saver, "a:b", 1, ns="")
    put_chain(saver, "a", 2, ns="b:")
    assert len(list(saver.list(cfg("a:b")))) == 1 and len(list(saver.list(cfg("a", "b:")))) == 2
    threads = {t.config["configurable"]["thread_id"] for t in saver.list(None)}
    assert threads == {"a", "a:b"}  # each id decoded back from its team scope


def test_core_does_not_import_langgraph() -> None:
    code = "import sys, victor_actors; assert not [m for m in sys.modules if m.startswith('langgraph')]"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
