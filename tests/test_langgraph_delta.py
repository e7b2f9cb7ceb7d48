"""LangGraph's DeltaChannel on our saver: the history walk, and deletes that keep it rebuildable.

The contract of ``get_delta_channel_history`` / ``aget_delta_channel_history``
follows the ``delta_channel_history`` capability LangGraph's main branch adds
to its conformance suite (``libs/checkpoint-conformance/.../spec/
test_delta_channel_history.py`` at langchain-ai/langgraph commit
a90ab4435853b8a5b6f82b20220b4c76af0e46d1, "collect writes at plain-value
seed"), restated here in our own tests until a released conformance package
carries it. What each test guards:

- the walk's result for every checkpoint of a forked chain that spans
  several segments equals LangGraph's reference walk (the base class's
  default, through ``get_tuple``): seeds, writes, their order, sync and
  asyncio (new: the saver had no override, so the capability was not
  detected);
- the rules one by one: oldest first, the nearest stored value is the seed
  (a ``_DeltaSnapshot`` or a plain value), its checkpoint's own writes are
  replayed, the target's are not, channels end independently, no seed at the
  root, an empty request, a missing target, the parent chain rather than the
  listing order, writes of one step in ``writes_sort_key`` order;
- the capability is detected the way the conformance suite detects it;
- a real graph with a ``DeltaChannel`` reads the same state as on
  InMemorySaver, after a reopen, after ``prune`` (failed before: the
  channel came back empty, since prune dropped the ancestors it is rebuilt
  from), after ``delete_for_runs`` of an earlier run (failed before: the
  channel lost that run's part) and in a ``copy_thread`` copy.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver, Checkpoint
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.types import _DeltaSnapshot
from langgraph.graph import END, START, StateGraph

from victor_actors import GlobalStateManager
from victor_actors.langgraph import VictorActorsSaver

History = Callable[..., Any]


@pytest.fixture(params=["sync", "asyncio"])
def history(request: pytest.FixtureRequest) -> History:
    """The walk, called as ``get_delta_channel_history`` or through asyncio's twin."""

    def call(saver: VictorActorsSaver, config: RunnableConfig, channels: list[str]) -> Any:
        if request.param == "sync":
            return saver.get_delta_channel_history(config=config, channels=channels)
        return asyncio.run(saver.aget_delta_channel_history(config=config, channels=channels))

    return call


@pytest.fixture
def saver() -> Iterator[VictorActorsSaver]:
    with VictorActorsSaver(GlobalStateManager.open(), close_manager=True, segment_keys=8) as s:
        yield s


def cfg(thread: str, cid: str | None = None) -> RunnableConfig:
    conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ""}
    if cid is not None:
        conf["checkpoint_id"] = cid
    return {"configurable": conf}


def put(
    saver: VictorActorsSaver,
    thread: str,
    parent: str | None,
    stored: dict[str, Any] | None = None,
    writes: list[tuple[str, Any]] | None = None,
    *,
    task: str = "",
    path: str = "",
) -> str:
    """A checkpoint under ``parent`` storing ``stored`` (channel -> value), then a task's ``writes``."""
    stored = stored or {}
    versions = {ch: str(uuid6()) for ch in stored}
    cp = Checkpoint(
        v=1,
        id=str(uuid6(clock_seq=-1)),
        ts="",
        channel_values=dict(stored),
        channel_versions=versions,
        versions_seen={},
        updated_channels=None,
    )
    config = saver.put(cfg(thread, parent), cp, {"source": "loop", "step": 0, "parents": {}}, versions)
    if writes:
        saver.put_writes(config, writes, task or str(uuid6()), path)
    return str(config["configurable"]["checkpoint_id"])


def values(entry: dict[str, Any]) -> list[Any]:
    return [w[2] for w in entry["writes"]]


# -- the walk equals LangGraph's reference walk -------------------------------------


def test_every_checkpoint_of_a_forked_chain_across_segments_walks_as_langgraph_does(
    saver: VictorActorsSaver, history: History
) -> None:
    """A tree of 40 checkpoints (forks, snapshots, plain values, writes from several tasks to three
    channels) over several segments: for each checkpoint, the saver's walk gives what LangGraph's
    reference walk (the base class's, through get_tuple) gives (new: no override before)."""
    rng = random.Random(7)
    ids: list[str] = []
    for step in range(40):
        parent = ids[-1] if ids and rng.random() < 0.8 else (rng.choice(ids) if ids else None)
        stored: dict[str, Any] = {}
        for ch in ("a", "b", "c"):
            roll = rng.random()
            if roll < 0.12:
                stored[ch] = _DeltaSnapshot([f"{ch}-snap-{step}"])
            elif roll < 0.18:
                stored[ch] = [f"{ch}-plain-{step}"]
        cid = put(saver, "tree", parent, stored)
        for task in range(rng.randrange(3)):
            writes = [(rng.choice("abcz"), f"w{step}.{task}.{i}") for i in range(rng.randrange(1, 4))]
            saver.put_writes(cfg("tree", cid), writes, f"task-{rng.randrange(100)}", f"~{rng.randrange(3)}")
        ids.append(cid)
    assert saver._segments.count("tree", "") > 3  # the chain spans segments
    for cid in [*ids, None]:
        mine = history(saver, cfg("tree", cid), ["a", "b", "c", "z"])
        reference = BaseCheckpointSaver.get_delta_channel_history(
            saver, config=cfg("tree", cid), channels=["a", "b", "c", "z"]
        )
        assert mine == reference, cid


# -- the rules, one by one -----------------------------------------------------------


def test_writes_come_oldest_first_from_the_target_parent_back_to_the_seed(
    saver: VictorActorsSaver, history: History
) -> None:
    c0 = put(saver, "t", None, {"ch": _DeltaSnapshot(["s0"])})
    c1 = put(saver, "t", c0, writes=[("ch", 1)])
    c2 = put(saver, "t", c1, writes=[("ch", 2)])
    c3 = put(saver, "t", c2, {"ch": _DeltaSnapshot(["s3"])}, writes=[("ch", 3)])
    c4 = put(saver, "t", c3, writes=[("ch", 4)])
    head = put(saver, "t", c4, writes=[("ch", "pending at the head")])
    got = history(saver, cfg("t", head), ["ch"])["ch"]
    assert got["seed"] == _DeltaSnapshot(["s3"])  # the nearest stored value
    assert values(got) == [3, 4]  # the seed's own write produced its child; the head's is pending
    got = history(saver, cfg("t", c3), ["ch"])["ch"]
    assert got["seed"] == _DeltaSnapshot(["s0"]) and values(got) == [1, 2]


def test_a_plain_stored_value_is_a_seed_and_its_own_writes_are_replayed(
    saver: VictorActorsSaver, history: History
) -> None:
    c0 = put(saver, "t", None, {"ch": [10]}, writes=[("ch", "older than the seed")])
    c1 = put(saver, "t", c0, {"ch": [10, 20]}, writes=[("ch", "at the seed")])
    c2 = put(saver, "t", c1, writes=[("ch", "after the seed")])
    head = put(saver, "t", c2, writes=[("ch", "pending")])
    got = history(saver, cfg("t", head), ["ch"])["ch"]
    assert got["seed"] == [10, 20]
    assert values(got) == ["at the seed", "after the seed"]


def test_channels_end_their_walks_independently_and_without_a_seed_at_the_root(
    saver: VictorActorsSaver, history: History
) -> None:
    parent = None
    for step in range(5):
        stored = {"a": _DeltaSnapshot("A")} if step == 1 else {"b": _DeltaSnapshot("B")} if step == 3 else {}
        parent = put(saver, "t", parent, stored, writes=[("a", step), ("b", step), ("n", step)])
    got = history(saver, cfg("t", parent), ["a", "b", "n", "a"])
    assert list(got) == ["a", "b", "n"]
    assert values(got["a"]) == [1, 2, 3] and got["a"]["seed"] == _DeltaSnapshot("A")
    assert values(got["b"]) == [3] and got["b"]["seed"] == _DeltaSnapshot("B")
    assert values(got["n"]) == [0, 1, 2, 3] and "seed" not in got["n"]  # walked to the root
    assert history(saver, cfg("t", parent), []) == {}


def test_the_walk_follows_the_parent_chain_not_the_listing(
    saver: VictorActorsSaver, history: History
) -> None:
    root = put(saver, "t", None, {"ch": _DeltaSnapshot([])})
    left = put(saver, "t", root, writes=[("ch", "left")])
    put(saver, "t", root, writes=[("ch", "right, a sibling branch")])  # newer, not on the path
    head = put(saver, "t", left)
    assert values(history(saver, cfg("t", head), ["ch"])["ch"]) == ["left"]


def test_one_step_writes_replay_in_writes_sort_key_order(saver: VictorActorsSaver, history: History) -> None:
    """(task path, task id, idx): task ids that sort against their paths are ordered by path."""
    root = put(saver, "t", None, {"ch": _DeltaSnapshot([])})
    saver.put_writes(cfg("t", root), [("ch", "z-task, path ~1")], "z-task", "~1")
    saver.put_writes(
        cfg("t", root), [("ch", "a-task, path ~2, first"), ("ch", "a-task, second")], "a-task", "~2"
    )
    saver.put_writes(cfg("t", root), [("ch", "input, no path")], "m-task", "")
    head = put(saver, "t", root)
    assert values(history(saver, cfg("t", head), ["ch"])["ch"]) == [
        "input, no path",
        "z-task, path ~1",
        "a-task, path ~2, first",
        "a-task, second",
    ]


def test_the_newest_checkpoint_is_the_default_target_and_a_missing_one_has_no_history(
    saver: VictorActorsSaver, history: History
) -> None:
    root = put(saver, "t", None, {"ch": _DeltaSnapshot(["s"])}, writes=[("ch", 1)])
    put(saver, "t", root)
    newest = history(saver, cfg("t"), ["ch"])["ch"]
    assert newest["seed"] == _DeltaSnapshot(["s"]) and values(newest) == [1]
    assert history(saver, cfg("t", str(uuid6())), ["ch"]) == {"ch": {"writes": []}}
    assert history(saver, cfg("never-written"), ["ch"]) == {"ch": {"writes": []}}


def test_the_capability_is_detected_as_the_conformance_suite_detects_it() -> None:
    """The suite counts a capability when the saver's class overrides the base's async method; the
    next release asks for ``aget_delta_channel_history`` (failed before: not overridden)."""
    for name in ("aget_delta_channel_history", "get_delta_channel_history"):
        assert getattr(VictorActorsSaver, name) is not getattr(BaseCheckpointSaver, name)


# -- a real graph --------------------------------------------------------------------


def _append(state: list[str], writes: list[Any]) -> list[str]:
    return state + [w for batch in writes for w in (batch if isinstance(batch, list) else [batch])]


class Notes(TypedDict):
    """A counter, and a log in a ``DeltaChannel`` stored once in 50 updates (here: once per thread)."""

    log: Annotated[list[str], DeltaChannel(_append, snapshot_frequency=50)]
    n: int


class OftenStoredNotes(TypedDict):
    """The same, the log stored every 3 updates."""

    log: Annotated[list[str], DeltaChannel(_append, snapshot_frequency=3)]
    n: int


def notes_graph(checkpointer: BaseCheckpointSaver[Any], schema: type = Notes) -> Any:
    """A run is 5 steps, each adding one line to the log."""

    def step(s: Any) -> dict[str, Any]:
        return {"log": [f"step {s['n']}"], "n": s["n"] + 1}

    def more(s: Any) -> str:
        return END if s["n"] % 6 == 0 else "step"

    g = StateGraph(schema).add_node("step", step).add_edge(START, "step").add_conditional_edges("step", more)
    return g.compile(checkpointer=checkpointer)


RUN_1, RUN_2 = "00000000-0000-4000-8000-000000000001", "00000000-0000-4000-8000-000000000002"


def _two_runs(checkpointer: BaseCheckpointSaver[Any], thread: str, schema: type = Notes) -> list[str]:
    graph = notes_graph(checkpointer, schema)
    config: Any = {"configurable": {"thread_id": thread}}
    graph.invoke({"log": ["first"], "n": 0}, {**config, "metadata": {"run_id": RUN_1}})
    out = graph.invoke({"log": ["second"], "n": 1}, {**config, "metadata": {"run_id": RUN_2}})
    return list(out["log"])


def test_a_delta_channel_graph_rebuilds_after_reopen_delete_for_runs_prune_and_copy(tmp_path: Path) -> None:
    """The one snapshot is the thread's first checkpoint (snapshot_frequency=50), so the head's log
    is rebuilt from both runs' writes. Failed before for delete_for_runs of the first run (the log
    lost the first run's part) and prune (the log came back empty)."""
    expected = _two_runs(InMemorySaver(), "t")
    assert expected[:2] == ["first", "step 0"] and expected[-1] == "step 5" and "second" in expected
    config: Any = {"configurable": {"thread_id": "t"}}
    with VictorActorsSaver.open(tmp_path / "store", segment_keys=16) as saver:
        assert _two_runs(saver, "t") == expected
        _two_runs(saver, "other")
        saver.copy_thread("t", "copy")
    with VictorActorsSaver.open(tmp_path / "store", segment_keys=16) as saver:  # a reopen
        graph = notes_graph(saver)
        assert graph.get_state(config).values["log"] == expected
        assert graph.get_state({"configurable": {"thread_id": "copy"}}).values["log"] == expected
        before = len(list(saver.list(config)))
        saver.delete_for_runs([RUN_1])
        assert graph.get_state(config).values["log"] == expected
        assert len(list(saver.list(config))) == before  # every checkpoint is on the head's walk
        saver.prune(["t"])
        assert graph.get_state(config).values["log"] == expected
        out = graph.invoke({"log": ["third"], "n": 1}, config)  # the graph goes on from the pruned thread
        assert out["log"] == [*expected, "third", *[f"step {i}" for i in range(1, 6)]]


def test_prune_keeps_the_newest_and_the_ancestors_back_to_its_snapshot(tmp_path: Path) -> None:
    """Snapshots every 3 updates: prune keeps a few ancestors, not the thread (failed before: it kept
    the newest alone and the log came back empty)."""
    expected = _two_runs(InMemorySaver(), "t", OftenStoredNotes)
    config: Any = {"configurable": {"thread_id": "t"}}
    with VictorActorsSaver.open(tmp_path / "store") as saver:
        assert _two_runs(saver, "t", OftenStoredNotes) == expected
        before = len(list(saver.list(config)))
        saver.prune(["t"])
        assert notes_graph(saver, OftenStoredNotes).get_state(config).values["log"] == expected
        assert 1 < len(list(saver.list(config))) <= 4 < before


def test_delete_for_runs_still_deletes_what_no_remaining_checkpoint_rebuilds_through(tmp_path: Path) -> None:
    with VictorActorsSaver.open(tmp_path / "store") as saver:
        graph = notes_graph(saver)
        for thread in ("x", "y"):
            graph.invoke(
                {"log": ["only"], "n": 0},
                {"configurable": {"thread_id": thread}, "metadata": {"run_id": f"run-{thread}"}},
            )
        saver.delete_for_runs(["run-x"])
        assert not list(saver.list({"configurable": {"thread_id": "x"}}))
        assert len(list(saver.list({"configurable": {"thread_id": "y"}}))) > 1
