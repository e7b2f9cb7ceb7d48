"""LangGraph checkpointers side by side: victor_actors' VictorActorsSaver, SqliteSaver, LMDBSaver.

    python -m victor_actors.bench.langgraph [--quick] [--rounds N] [--json FILE] [--dir DIR]

Needs the bench extra, ``pip install 'victor-actors[bench]'`` (LangGraph, langgraph-checkpoint-sqlite and
langgraph-checkpoint-lmdb). Three savers, each on its own files, all durable on return:

- ours: ``VictorActorsSaver.open(dir)`` (LMDB, durability "sync": fdatasync per commit, group commit);
- SqliteSaver on a file (its setup sets WAL; ``PRAGMA synchronous`` is printed);
- langgraph-checkpoint-lmdb's ``LMDBSaver`` (``lmdb.open(dir, max_dbs=10)``, LMDB's default sync).

1. put/s: a thread of ``--puts`` checkpoints shaped like a graph's: an 8 KB document written once,
   a step counter and a list of the last five notes written every step (only changed channels are
   passed in ``new_versions``, as LangGraph does);
2. get_tuple/s on that thread: alternately the newest checkpoint and a random earlier one;
3. a 200-step StateGraph run (one node looping on itself, the same three channels; durability="sync"):
   wall time, then bytes on disk once the saver is closed (apparent size and allocated blocks of
   every file the saver made).

Subjects run in interleaved rounds (the order rotates every round) on a shared, noisy machine; a
rate is all operations over all timed wall time; gc is off while timed. Files live in a temporary
directory (under --dir if given), removed at the end.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import platform
import random
import shutil
import sqlite3
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from types import SimpleNamespace
from typing import Any, TypedDict

import lmdb

from victor_actors.bench._common import no_gc, ns, version_of
from victor_actors.bench._peers import peer_modules

DOC = " ".join(
    f"paragraph {i}: the agent read the quarterly report and noted the figures." for i in range(120)
)[:8192]
STEPS = 200
PACKAGES = (
    "langgraph",
    "langgraph-checkpoint",
    "langgraph-checkpoint-sqlite",
    "langgraph-checkpoint-lmdb",
    "lmdb",
)
IDS = itertools.count()


@functools.cache
def lg() -> SimpleNamespace:
    """LangGraph's checkpoint base and graph, the two other savers, and ours: imported on first use."""
    modules = peer_modules(
        "langgraph.checkpoint.base",
        "langgraph.checkpoint.sqlite",
        "langgraph.graph",
        "langgraph_checkpoint_lmdb",
        "victor_actors.langgraph",
    )
    if isinstance(modules, str):
        raise SystemExit(f"victor_actors.bench.langgraph: {modules}")
    base, sqlite, graph, lmdb_saver, ours = modules
    return SimpleNamespace(base=base, sqlite=sqlite, graph=graph, lmdb_saver=lmdb_saver, ours=ours)


# -- the subjects ---------------------------------------------------------------------


class Subject:
    """Opens a saver on fresh files under ``root`` and closes it; knows which files are its own."""

    name = ""

    def __init__(self, root: str) -> None:
        self.path = os.path.join(root, f"{self.name}-{next(IDS)}")
        os.makedirs(self.path)
        self.saver: Any = self.open()

    def open(self) -> Any:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def disk(self) -> dict[str, int]:
        size = allocated = 0
        for dirpath, _dirs, files in os.walk(self.path):
            for f in files:
                st = os.stat(os.path.join(dirpath, f))
                size += st.st_size
                allocated += st.st_blocks * 512
        return {"size": size, "allocated": allocated}


class Ours(Subject):
    name = "victor_actors"

    def open(self) -> Any:
        self.ours = lg().ours.VictorActorsSaver.open(self.path)
        return self.ours

    def close(self) -> None:
        self.ours.close()


class Sqlite(Subject):
    name = "sqlite"

    def open(self) -> Any:
        self.conn = sqlite3.connect(os.path.join(self.path, "checkpoints.sqlite"), check_same_thread=False)
        saver = lg().sqlite.SqliteSaver(self.conn)
        saver.setup()
        return saver

    def close(self) -> None:
        self.conn.close()  # checkpoints the WAL into the main file


class Lmdb(Subject):
    name = "lmdb"

    def open(self) -> Any:
        # LMDBSaver stores whole checkpoints: a 200-step run outgrows LMDB's 10 MiB default map.
        self.env = lmdb.open(self.path, max_dbs=10, map_size=1 << 31)
        return lg().lmdb_saver.LMDBSaver(self.env)

    def close(self) -> None:
        self.env.close()


SUBJECTS: list[type[Subject]] = [Ours, Sqlite, Lmdb]
LABELS = {
    "victor_actors": "VictorActorsSaver (victor_actors)",
    "sqlite": "SqliteSaver",
    "lmdb": "LMDBSaver (langgraph-checkpoint-lmdb)",
}


@dataclass
class Acc:
    ops: int = 0
    ns: int = 0
    runs: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.ops / (self.ns / 1e9) if self.ns else 0.0


# -- the work -------------------------------------------------------------------------


def checkpoints(n: int) -> list[tuple[Any, Any, dict[str, Any]]]:
    """``n`` (checkpoint, metadata, new_versions) like a looping graph's, made before timing."""
    out = []
    cp, notes = lg().base.empty_checkpoint(), list[str]()
    for i in range(n):
        notes = [*notes, f"note {i}: step {i} checked {i * 7} rows"][-5:]
        cp = lg().base.create_checkpoint(cp, None, i)
        new: dict[str, Any] = {"step": i + 1, "notes": i + 1} | ({"doc": 1} if i == 0 else {})
        cp["channel_values"] = {"doc": DOC, "step": i, "notes": notes}
        cp["channel_versions"] = {**cp["channel_versions"], **new}
        cp["versions_seen"] = {"loop": {"step": i, "notes": i}}
        out.append((cp, {"source": "loop", "step": i, "parents": {}}, new))
    return out


def bench_put(saver: Any, thread: str, plan: list[Any], acc: Acc) -> list[Any]:
    config: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    configs = []
    with no_gc():
        start = ns()
        for cp, meta, new in plan:
            config = saver.put(config, cp, meta, new)
            configs.append(config)
        acc.ns += ns() - start
    acc.ops += len(plan)
    return configs


def bench_get(saver: Any, configs: list[Any], n: int, acc: Acc, seed: int) -> None:
    rng = random.Random(seed)
    latest: Any = {
        "configurable": {"thread_id": configs[0]["configurable"]["thread_id"], "checkpoint_ns": ""}
    }
    asks = [latest if i % 2 == 0 else rng.choice(configs) for i in range(n)]
    with no_gc():
        start = ns()
        for config in asks:
            got = saver.get_tuple(config)
        acc.ns += ns() - start
    acc.ops += n
    assert got is not None and got.checkpoint["channel_values"]["doc"] == DOC


class Loop(TypedDict):
    doc: str
    step: int
    notes: list[str]


def graph_run(saver: Any) -> float:
    def work(state: Loop) -> dict[str, Any]:
        i = state["step"]
        return {"step": i + 1, "notes": [*state["notes"], f"note {i}: step {i} checked {i * 7} rows"][-5:]}

    end = lg().graph.END
    g = lg().graph.StateGraph(Loop).add_node("work", work).add_edge(lg().graph.START, "work")
    g.add_conditional_edges("work", lambda s: "work" if s["step"] < STEPS else end, ["work", end])
    graph = g.compile(checkpointer=saver)
    config: Any = {"configurable": {"thread_id": f"run-{next(IDS)}"}, "recursion_limit": 10 * STEPS}
    start = time.perf_counter()
    out = graph.invoke({"doc": DOC, "step": 0, "notes": []}, config, durability="sync")
    elapsed = time.perf_counter() - start
    assert out["step"] == STEPS and out["doc"] == DOC
    return elapsed


# -- the run --------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="1 round, 50 puts, 200 gets")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--puts", type=int, default=200)
    parser.add_argument("--gets", type=int, default=2000)
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--dir", help="where to put the temporary files")
    args = parser.parse_args()
    lg()  # without the bench extra: stop here, saying which package is missing
    rounds, puts, gets = (1, 50, 200) if args.quick else (args.rounds, args.puts, args.gets)
    root = tempfile.mkdtemp(prefix="bench-langgraph-", dir=args.dir)
    put = {s.name: Acc() for s in SUBJECTS}
    get = {s.name: Acc() for s in SUBJECTS}
    graph = {s.name: Acc() for s in SUBJECTS}
    disk: dict[str, dict[str, int]] = {}
    plan = checkpoints(puts)
    try:
        for r in range(rounds):
            order = SUBJECTS[r % len(SUBJECTS) :] + SUBJECTS[: r % len(SUBJECTS)]
            for kind in order:
                subject = kind(root)
                try:
                    configs = bench_put(subject.saver, f"put-{r}", plan, put[kind.name])
                    bench_get(subject.saver, configs, gets, get[kind.name], seed=r)
                finally:
                    subject.close()
            for kind in order:
                subject = kind(root)
                try:
                    graph[kind.name].runs.append(graph_run(subject.saver))
                finally:
                    subject.close()
                disk[kind.name] = subject.disk()  # every round's run is the same: keep the last
            print(f"round {r + 1}/{rounds} done", flush=True)
        with sqlite3.connect(os.path.join(root, "probe.sqlite")) as probe:
            probe.execute("PRAGMA journal_mode=WAL")
            sync_pragma = probe.execute("PRAGMA synchronous").fetchone()[0]
    finally:
        shutil.rmtree(root, ignore_errors=True)

    print(
        f"\nLangGraph checkpointers, {rounds} interleaved round(s); put: {puts} checkpoints per round "
        f"(8 KB document once, counter and notes every step); get_tuple: {gets} per round (newest, "
        f"random earlier); graph: {STEPS}-step StateGraph run, durability='sync'; "
        f"sqlite synchronous={sync_pragma}"
    )
    head = f"{'saver':<40}{'put/s':>9}{'get_tuple/s':>13}{'graph s':>9}{'disk KiB':>10}{'allocated KiB':>15}"
    print(head)
    results: dict[str, Any] = {}
    for kind in SUBJECTS:
        n = kind.name
        run_s = sum(graph[n].runs) / len(graph[n].runs)
        print(
            f"{LABELS[n]:<40}{put[n].rate:>9.0f}{get[n].rate:>13.0f}{run_s:>9.2f}"
            f"{disk[n]['size'] / 1024:>10.0f}{disk[n]['allocated'] / 1024:>15.0f}"
        )
        results[n] = {"put_per_s": put[n].rate, "get_tuple_per_s": get[n].rate, "graph_s": graph[n].runs}
        results[n] |= {"disk": disk[n], "put": asdict(put[n]), "get": asdict(get[n])}
    print(
        "\nratios, victor_actors / other (same run; rates: higher is better; time and disk: lower is better)"
    )
    for other in ("sqlite", "lmdb"):
        o, t = results["victor_actors"], results[other]
        put_x, get_x = o["put_per_s"] / t["put_per_s"], o["get_tuple_per_s"] / t["get_tuple_per_s"]
        disk_x, graph_x = o["disk"]["size"] / t["disk"]["size"], sum(o["graph_s"]) / sum(t["graph_s"])
        print(
            f"  vs {LABELS[other]:<38} put {put_x:.2f}x, get_tuple {get_x:.2f}x, "
            f"graph time {graph_x:.2f}x, disk {disk_x:.2f}x"
        )
    if args.json:
        meta = {
            "when": datetime.now().isoformat(timespec="seconds"),
            "python": platform.python_version(),
            "machine": platform.platform(),
            "versions": {p: version_of(p) for p in PACKAGES},
            "rounds": rounds, "puts": puts, "gets": gets, "steps": STEPS, "sqlite_synchronous": sync_pragma,
        }  # fmt: skip
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
