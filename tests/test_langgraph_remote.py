"""The saver and the long-term store on clients of an owner process, as a LangGraph app runs them.

A LangGraph app served by ``uvicorn --workers N`` has N processes: one of
them (or a separate ``victor-actors owner``) owns the store and every worker
reaches it through ``victor_actors.connect``. Here the test starts a real
owner process and talks to it from clients in this process and from worker
processes of its own.

What each test guards (and whether it failed before, checked by running this
file against the code before the change):

- a graph checkpointed through one client is read, listed and deleted
  through another; a late ``put_writes`` from the first client after the
  other deleted the thread is refused with ``ThreadDeletedError``; and the
  namespace the delete emptied is compacted by the owner (failed before: a
  saver on a client never compacted, so a deleted thread's values stayed on
  the owner's disk);
- a thread another client keeps writing is not expired by this client's
  TTL sweep, and is once it is idle everywhere (failed before: each
  client's sweep trusted its own table of activity);
- a worker process and this one, each with its own client, increment one
  store item with ``expected_version`` concurrently: no update is lost
  across processes, and the worker's checkpoint is read here (new: it passed
  before the change, which only made the types say that a client is
  accepted).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypedDict

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import create_checkpoint, empty_checkpoint
from langgraph.graph import END, START, StateGraph

import victor_actors
from victor_actors import ScopeRef, StateScope
from victor_actors.langgraph import ThreadDeletedError, VictorActorsSaver, VictorActorsStore
from victor_actors.langgraph import _layout as layout

ROOT = Path(__file__).resolve().parents[1]


class Owner:
    """``python -m victor_actors owner STORE --socket SOCK`` in a child process."""

    def __init__(self, store: Path, sock: Path) -> None:
        self.url = f"unix://{sock}"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "victor_actors", "owner", str(store), "--socket", str(sock)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("victor-actors owner: serving"):
            self.proc.kill()
            raise AssertionError(line + (self.proc.stderr.read() if self.proc.stderr else ""))

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


@pytest.fixture(scope="module")
def owner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Owner]:
    root = tmp_path_factory.mktemp("owner")
    o = Owner(root / "store", root / "owner.sock")
    try:
        yield o
    finally:
        if o.proc.poll() is None:
            o.stop()


class Count(TypedDict):
    n: int


def counting_graph(saver: VictorActorsSaver) -> Any:
    g = StateGraph(Count)
    g.add_node("step", lambda s: {"n": s["n"] + 1})
    g.add_conditional_edges(START, lambda s: END if s["n"] >= 3 else "step")
    g.add_conditional_edges("step", lambda s: END if s["n"] >= 3 else "step")
    return g.compile(checkpointer=saver)


def cfg(thread: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}


def test_a_thread_written_through_one_client_is_read_and_deleted_through_another(owner: Owner) -> None:
    """Two uvicorn workers' clients: one runs the graph, the other reads and deletes the thread, the
    first one's late write is refused. Failed before at the last assertion: a saver on a client
    never compacted, so the deleted checkpoints stayed in the owner's store."""
    with victor_actors.connect(owner.url) as a, victor_actors.connect(owner.url) as b:
        ours, theirs = VictorActorsSaver(a), VictorActorsSaver(b)
        assert counting_graph(ours).invoke({"n": 0}, cfg("shared")) == {"n": 3}
        seen = theirs.get_tuple(cfg("shared"))
        assert seen is not None and seen.checkpoint["channel_values"]["n"] == 3
        assert len(list(theirs.list(cfg("shared")))) == len(list(ours.list(cfg("shared")))) >= 4

        theirs.delete_thread("shared")
        assert ours.get_tuple(cfg("shared")) is None
        with pytest.raises(ThreadDeletedError):  # a late task of the first worker's run
            ours.put_writes(seen.config, [("n", 4)], "late-task")
        assert theirs.get_tuple(cfg("shared")) is None

        segment = ScopeRef(StateScope.CONVERSATION, layout.segment_id("shared", "", 0))
        labels = [info.label for info in b.list_checkpoints(segment)]
        assert labels == ["langgraph: compacted"]  # only the emptied state is stored at the owner


class Clock:
    """Seconds, moved by the test."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, minutes: float) -> None:
        self.now += minutes * 60


def test_a_thread_another_process_keeps_writing_is_not_expired_by_this_ones_sweep(owner: Owner) -> None:
    """Failed before: the sweeping client's table still had the thread's first write, so its sweep
    deleted a thread the other client had written 40 minutes before (of a 60-minute TTL)."""
    clock, ttl = Clock(), {"default_ttl": 60}
    with victor_actors.connect(owner.url) as a, victor_actors.connect(owner.url) as b:
        writer, sweeper = (
            VictorActorsSaver(a, ttl=ttl, clock=clock),
            VictorActorsSaver(b, ttl=ttl, clock=clock),
        )
        cp = create_checkpoint(empty_checkpoint(), None, 0)
        first = writer.put(cfg("busy"), cp, {"source": "input", "step": -1}, {})
        assert sweeper.sweep() == 0  # the sweeper learns of "busy", written now
        clock.advance(40)
        writer.put(first, create_checkpoint(cp, None, 1), {"source": "loop", "step": 0}, {})
        clock.advance(40)  # 80 minutes after the first write, 40 after the last
        assert sweeper.sweep() == 0
        assert writer.get_tuple(cfg("busy")) is not None
        clock.advance(20)  # 60 minutes after the last write: idle everywhere
        assert sweeper.sweep() == 1
        assert writer.get_tuple(cfg("busy")) is None


WORKER = textwrap.dedent(
    """
    import sys
    import victor_actors
    from langgraph.checkpoint.base import empty_checkpoint
    from victor_actors.langgraph import ItemVersionConflictError, VictorActorsSaver, VictorActorsStore

    url, n = sys.argv[1], int(sys.argv[2])
    with victor_actors.connect(url) as client:
        store = VictorActorsStore(client)
        store.get(("counters",), "hits")  # connected, the store's scope open
        print("ready", flush=True)
        sys.stdin.readline()  # both processes start incrementing together
        done = 0
        while done < n:
            item = store.get(("counters",), "hits")
            count, version = (item.value["n"], item.version) if item is not None else (0, 0)
            try:
                store.put(("counters",), "hits", {"n": count + 1}, expected_version=version)
                done += 1
            except ItemVersionConflictError:
                pass
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"], checkpoint["channel_versions"] = {"n": 7}, {"n": 1}
        config = {"configurable": {"thread_id": "worker", "checkpoint_ns": ""}}
        VictorActorsSaver(client).put(config, checkpoint, {"source": "input", "step": -1}, {"n": 1})
    print("done", flush=True)
    """
)


def test_a_worker_process_loses_no_store_update_and_sees_this_process_thread(owner: Owner) -> None:
    """Another process (a uvicorn worker) and this one increment one item with ``expected_version``
    through their own clients, concurrently: every increment lands once. The worker's checkpoint is
    is read here."""
    each = 20
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, owner.url, str(each)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert worker.stdin is not None and worker.stdout is not None
    with victor_actors.connect(owner.url) as client:
        store = VictorActorsStore(client)
        store.get(("counters",), "hits")
        assert worker.stdout.readline().strip() == "ready", worker.stderr.read() if worker.stderr else ""
        worker.stdin.write("go\n")
        worker.stdin.flush()
        done = 0
        while done < each:  # this process increments too, while the worker does
            item = store.get(("counters",), "hits")
            count, version = (item.value["n"], item.version) if item is not None else (0, 0)
            try:
                store.put(("counters",), "hits", {"n": count + 1}, expected_version=version)
                done += 1
            except victor_actors.VersionConflictError:
                continue
        out, err = worker.communicate(timeout=120)
        assert worker.returncode == 0 and out.strip() == "done", err
        item = store.get(("counters",), "hits")
        assert item is not None and item.value == {"n": 2 * each} and item.version == 2 * each
        saver = VictorActorsSaver(client)
        last = saver.get_tuple(cfg("worker"))
        assert last is not None and last.checkpoint["channel_values"] == {"n": 7}
        assert "worker" in {t.config["configurable"]["thread_id"] for t in saver.list(None)}
