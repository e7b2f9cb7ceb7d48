"""LangGraph checkpointers side by side: VictorActorsSaver, SqliteSaver, LMDBSaver, PostgresSaver.

    python -m victor_actors.bench.langgraph [--quick] [--rounds N] [--json FILE] [--dir DIR]

Needs the bench extra, ``pip install 'victor-actors[bench]'`` (LangGraph, langgraph-checkpoint-sqlite and
langgraph-checkpoint-lmdb). Three savers, each on its own files, all durable on return:

- ours: ``VictorActorsSaver.open(dir)`` (LMDB, durability "sync": fdatasync per commit, group commit);
- SqliteSaver on a file (its setup sets WAL; ``PRAGMA synchronous`` is printed);
- langgraph-checkpoint-lmdb's ``LMDBSaver`` (``lmdb.open(dir, max_dbs=10)``, LMDB's default sync), when
  installed;
- langgraph-checkpoint-postgres's ``PostgresSaver`` on a pool of 10 connections to a private PostgreSQL
  the benchmark starts and stops (``initdb`` and ``pg_ctl`` on the PATH, a Unix socket, ``fsync=on``,
  ``synchronous_commit=on``: a commit returns once its WAL is flushed; run as root, the server runs as
  the ``postgres`` user), when the package, psycopg and a server are there;
- and, for put/s only, a bare synced LMDB transaction (``lmdb.open(dir, sync=True)``, one put of the
  serialized checkpoint's bytes per transaction): the floor of a durable put on this disk.

1. put/s: a thread of ``--puts`` checkpoints shaped like a graph's: an 8 KB document written once,
   a step counter and a list of the last five notes written every step (only changed channels are
   passed in ``new_versions``, as LangGraph does);
2. get_tuple/s on that thread: alternately the newest checkpoint and a random earlier one;
3. a 200-step StateGraph run (one node looping on itself, the same three channels; durability="sync"):
   wall time, then bytes on disk once the saver is closed (apparent size and allocated blocks of
   every file the saver made);
4. concurrent graphs: ``--graphs`` (50) such graphs of ``--graph-steps`` (50) steps each, one per
   Python thread and one LangGraph thread id each, all on one saver, released together: wall time
   (and the same on LangGraph's InMemorySaver, the floor any durable saver can reach here);
5. one long thread: a ``--long`` (2,000)-step run of that graph, then bytes on disk.

Subjects run in interleaved rounds (the order rotates every round) on a shared, noisy machine; a
rate is all operations over all timed wall time; gc is off while timed. Files live in a temporary
directory (under --dir if given), removed at the end.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import itertools
import json
import os
import platform
import random
import shutil
import sqlite3
import tempfile
import threading
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
    "langgraph-checkpoint-postgres",
    "psycopg",
    "lmdb",
)
IDS = itertools.count()


@functools.cache
def lg() -> SimpleNamespace:
    """LangGraph's checkpoint base and graph, the two other savers, and ours: imported on first use."""
    modules = peer_modules(
        "langgraph.checkpoint.base",
        "langgraph.checkpoint.memory",
        "langgraph.checkpoint.sqlite",
        "langgraph.graph",
        "victor_actors.langgraph",
    )
    if isinstance(modules, str):
        raise SystemExit(f"victor_actors.bench.langgraph: {modules}")
    base, memory, sqlite, graph, ours = modules
    optional = {}  # peers measured when installed, named as skipped otherwise
    for name in ("langgraph_checkpoint_lmdb", "langgraph.checkpoint.postgres"):
        found = peer_modules(name)
        optional[name] = found if isinstance(found, str) else found[0]
    return SimpleNamespace(
        base=base,
        memory=memory,
        sqlite=sqlite,
        graph=graph,
        ours=ours,
        lmdb_saver=optional["langgraph_checkpoint_lmdb"],
        postgres=optional["langgraph.checkpoint.postgres"],
    )


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

    def counters(self) -> dict[str, int]:
        """The store's commits and transactions so far (ours only)."""
        return {}

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

    def counters(self) -> dict[str, int]:
        store = self.ours.manager.store
        return {"commits": store.commits, "transactions": store.transactions}


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


class PostgresServer:
    """A private PostgreSQL the benchmark starts (``initdb``, ``pg_ctl``) on a Unix socket, and stops.

    Durable as its defaults make it: ``fsync=on`` and ``synchronous_commit=on``
    (a commit returns once its WAL is flushed), what production users run.
    Run as root, the server runs as the ``postgres`` user (``runuser``), as
    PostgreSQL refuses root.
    """

    def __init__(self, root: str) -> None:
        self.bindir = _pg_bindir()
        if self.bindir is None:
            raise OSError("no PostgreSQL server here (initdb and pg_ctl not found)")
        self.dir = os.path.join(root, "postgres")
        self.data, self.sock = os.path.join(self.dir, "data"), os.path.join(self.dir, "sock")
        os.makedirs(self.sock)
        self.prefix: list[str] = []
        if os.geteuid() == 0:
            import pwd

            user = pwd.getpwnam("postgres")  # KeyError: no such user, no server
            for path in (root, self.dir, self.sock):
                os.chmod(path, 0o755)
            os.chown(self.dir, user.pw_uid, user.pw_gid)
            os.chown(self.sock, user.pw_uid, user.pw_gid)
            self.prefix = ["runuser", "-u", "postgres", "--"]
        self._run("initdb", "-D", self.data, "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8")
        opts = f"-c listen_addresses='' -c unix_socket_directories={self.sock}"
        opts += " -c fsync=on -c synchronous_commit=on"
        self._run("pg_ctl", "-D", self.data, "-o", opts, "-w", "-l", os.path.join(self.dir, "log"), "start")
        self.conninfo = f"host={self.sock} user=postgres dbname=postgres"
        self.started = True

    def _run(self, tool: str, *args: str) -> None:
        import subprocess

        assert self.bindir is not None
        subprocess.run(
            [*self.prefix, os.path.join(self.bindir, tool), *args], check=True, capture_output=True
        )

    def database(self, name: str) -> str:
        psycopg = importlib.import_module("psycopg")  # the bench's optional peer: imported by name
        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return f"host={self.sock} user=postgres dbname={name}"

    def stop(self) -> None:
        if self.started:
            self.started = False
            self._run("pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop")


def _pg_bindir() -> str | None:
    """Where ``initdb`` and ``pg_ctl`` are: the PATH, else Debian's ``/usr/lib/postgresql/N/bin``."""
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return os.path.dirname(os.path.realpath(found))
    debian = "/usr/lib/postgresql"
    versions = (
        sorted(os.listdir(debian), key=lambda v: int(v) if v.isdigit() else -1)
        if os.path.isdir(debian)
        else []
    )
    for version in reversed(versions):
        bindir = os.path.join(debian, version, "bin")
        if all(os.access(os.path.join(bindir, tool), os.X_OK) for tool in ("initdb", "pg_ctl")):
            return bindir
    return None


class Postgres(Subject):
    """LangGraph's PostgresSaver on a connection pool (10 connections), one database per subject."""

    name = "postgres"
    server: PostgresServer | None = None

    def open(self) -> Any:
        dict_row = importlib.import_module("psycopg.rows").dict_row
        pool_class = importlib.import_module("psycopg_pool").ConnectionPool
        assert Postgres.server is not None
        self.db = os.path.basename(self.path).replace("-", "_")
        conninfo = Postgres.server.database(self.db)
        kwargs = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
        self.pool = pool_class(conninfo, min_size=1, max_size=10, kwargs=kwargs, open=True)
        saver = lg().postgres.PostgresSaver(self.pool)
        saver.setup()
        return saver

    def close(self) -> None:
        with self.pool.connection() as conn:
            self.size = int(conn.execute("SELECT pg_database_size(current_database()) AS n").fetchone()["n"])
        self.pool.close()

    def disk(self) -> dict[str, int]:
        return {"size": self.size, "allocated": self.size}


SUBJECTS: list[type[Subject]] = [Ours, Sqlite, Lmdb, Postgres]
LABELS = {
    "victor_actors": "VictorActorsSaver (victor_actors)",
    "sqlite": "SqliteSaver",
    "lmdb": "LMDBSaver (langgraph-checkpoint-lmdb)",
    "postgres": "PostgresSaver (local PostgreSQL)",
}


def subjects(root: str) -> tuple[list[type[Subject]], dict[str, str]]:
    """The savers measurable here, and why each other one is not (a missing package, no server)."""
    out: list[type[Subject]] = [Ours, Sqlite]
    skipped: dict[str, str] = {}
    if isinstance(lg().lmdb_saver, str):
        skipped["lmdb"] = lg().lmdb_saver
    else:
        out.append(Lmdb)
    if isinstance(lg().postgres, str):
        skipped["postgres"] = lg().postgres
    else:
        try:
            Postgres.server = PostgresServer(root)
            out.append(Postgres)
        except (OSError, KeyError, ImportError) as exc:
            skipped["postgres"] = f"no local PostgreSQL could be started ({exc})"
        except Exception as exc:  # subprocess.CalledProcessError: initdb or pg_ctl failed
            skipped["postgres"] = f"no local PostgreSQL could be started ({exc})"
    return out, skipped


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


def loop_graph(saver: Any, steps: int) -> Any:
    def work(state: Loop) -> dict[str, Any]:
        i = state["step"]
        return {"step": i + 1, "notes": [*state["notes"], f"note {i}: step {i} checked {i * 7} rows"][-5:]}

    end = lg().graph.END
    g = lg().graph.StateGraph(Loop).add_node("work", work).add_edge(lg().graph.START, "work")
    g.add_conditional_edges("work", lambda s: "work" if s["step"] < steps else end, ["work", end])
    return g.compile(checkpointer=saver)


def invoke(graph: Any, steps: int, thread: str) -> None:
    config: Any = {"configurable": {"thread_id": thread}, "recursion_limit": 10 * steps + 10}
    out = graph.invoke({"doc": DOC, "step": 0, "notes": []}, config, durability="sync")
    assert out["step"] == steps and out["doc"] == DOC


def graph_run(saver: Any, steps: int = STEPS) -> float:
    graph = loop_graph(saver, steps)
    start = time.perf_counter()
    invoke(graph, steps, f"run-{next(IDS)}")
    return time.perf_counter() - start


def concurrent_run(saver: Any, graphs: int, steps: int) -> float:
    """``graphs`` graphs of ``steps`` steps on as many Python threads, released together: wall time."""
    graph = loop_graph(saver, steps)
    prefix = f"conc-{next(IDS)}"
    barrier = threading.Barrier(graphs + 1)
    errors: list[BaseException] = []

    def one(i: int) -> None:
        barrier.wait()
        try:
            invoke(graph, steps, f"{prefix}-{i}")
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(graphs)]
    for th in threads:
        th.start()
    barrier.wait()
    start = time.perf_counter()
    for th in threads:
        th.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise errors[0]
    return elapsed


def bench_raw_lmdb(root: str, plan: list[Any], acc: Acc) -> None:
    """The floor: one synced LMDB transaction per put of the serialized checkpoint's bytes."""
    serde = lg().base.BaseCheckpointSaver().serde
    values = [serde.dumps_typed(cp)[1] for cp, _meta, _new in plan]
    path = os.path.join(root, f"raw-{next(IDS)}")
    env = lmdb.open(path, map_size=1 << 30, sync=True, metasync=True)
    try:
        with no_gc():
            start = ns()
            for i, value in enumerate(values):
                with env.begin(write=True) as txn:
                    txn.put(b"%08d" % i, value)
            acc.ns += ns() - start
        acc.ops += len(values)
    finally:
        env.close()
        shutil.rmtree(path, ignore_errors=True)


# -- the run --------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="1 round, 50 puts, 200 gets")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--puts", type=int, default=200)
    parser.add_argument("--gets", type=int, default=2000)
    parser.add_argument("--graphs", type=int, default=50, help="concurrent graphs (one thread each)")
    parser.add_argument("--graph-steps", type=int, default=50, help="steps of each concurrent graph")
    parser.add_argument("--long", type=int, default=2000, help="steps of the one long thread")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--dir", help="where to put the temporary files")
    args = parser.parse_args()
    lg()  # without the bench extra: stop here, saying which package is missing
    rounds, puts, gets = (1, 50, 200) if args.quick else (args.rounds, args.puts, args.gets)
    graphs, graph_steps, long_steps = (
        (8, 10, 200) if args.quick else (args.graphs, args.graph_steps, args.long)
    )
    root = tempfile.mkdtemp(prefix="bench-langgraph-", dir=args.dir)
    try:
        return _run(args, root, rounds, puts, gets, graphs, graph_steps, long_steps)
    finally:
        if Postgres.server is not None:
            Postgres.server.stop()
        shutil.rmtree(root, ignore_errors=True)


def _run(
    args: argparse.Namespace,
    root: str,
    rounds: int,
    puts: int,
    gets: int,
    graphs: int,
    graph_steps: int,
    long_steps: int,
) -> int:
    SUBJECTS, skipped = subjects(root)  # the module's list, narrowed to what runs here
    for name, why in skipped.items():
        print(f"{LABELS[name]}: skipped, {why}")
    put = {s.name: Acc() for s in SUBJECTS}
    get = {s.name: Acc() for s in SUBJECTS}
    graph = {s.name: Acc() for s in SUBJECTS}
    conc = {s.name: Acc() for s in SUBJECTS}
    raw = Acc()
    floor = Acc()  # the concurrent graphs on LangGraph's InMemorySaver: no disk, no store at all
    disk: dict[str, dict[str, int]] = {}
    long_disk: dict[str, dict[str, int]] = {}
    long_s: dict[str, float] = {}
    stats: dict[str, dict[str, int]] = {}
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
            bench_raw_lmdb(root, plan, raw)
            for kind in order:
                subject = kind(root)
                try:
                    before = subject.counters()
                    graph[kind.name].runs.append(graph_run(subject.saver))
                    after = subject.counters()
                    if after:
                        stats["graph"] = {k: after[k] - before[k] for k in after}
                finally:
                    subject.close()
                disk[kind.name] = subject.disk()  # every round's run is the same: keep the last
            for kind in order:
                subject = kind(root)
                try:
                    before = subject.counters()
                    conc[kind.name].runs.append(concurrent_run(subject.saver, graphs, graph_steps))
                    after = subject.counters()
                    if after:
                        stats[kind.name] = {k: after[k] - before[k] for k in after}
                finally:
                    subject.close()
            floor.runs.append(concurrent_run(lg().memory.InMemorySaver(), graphs, graph_steps))
            print(f"round {r + 1}/{rounds} done", flush=True)
        for kind in SUBJECTS:  # one long thread per saver: its disk (and its time, for the record)
            subject = kind(root)
            try:
                long_s[kind.name] = graph_run(subject.saver, long_steps)
            finally:
                subject.close()
            long_disk[kind.name] = subject.disk()
            shutil.rmtree(subject.path, ignore_errors=True)
        with sqlite3.connect(os.path.join(root, "probe.sqlite")) as probe:
            probe.execute("PRAGMA journal_mode=WAL")
            sync_pragma = probe.execute("PRAGMA synchronous").fetchone()[0]
    finally:
        for name in os.listdir(root):
            if name != "postgres":
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)

    print(
        f"\nLangGraph checkpointers, {rounds} interleaved round(s); put: {puts} checkpoints per round "
        f"(8 KB document once, counter and notes every step); get_tuple: {gets} per round (newest, "
        f"random earlier); graph: {STEPS}-step StateGraph run, durability='sync'; "
        f"sqlite synchronous={sync_pragma}"
    )
    print(
        f"concurrent: {graphs} graphs x {graph_steps} steps on {graphs} threads; long: one {long_steps}-step "
        f"thread; raw LMDB: one synced transaction per put of the serialized checkpoint"
    )
    head = (
        f"{'saver':<40}{'put/s':>9}{'get_tuple/s':>13}{'graph s':>9}{'disk KiB':>10}{'concurrent s':>14}"
        f"{'long s':>8}{'long disk KiB':>15}"
    )
    print(head)
    results: dict[str, Any] = {}
    for kind in SUBJECTS:
        n = kind.name
        run_s = sum(graph[n].runs) / len(graph[n].runs)
        conc_s = sum(conc[n].runs) / len(conc[n].runs)
        print(
            f"{LABELS[n]:<40}{put[n].rate:>9.0f}{get[n].rate:>13.0f}{run_s:>9.2f}"
            f"{disk[n]['size'] / 1024:>10.0f}{conc_s:>14.2f}{long_s[n]:>8.2f}"
            f"{long_disk[n]['size'] / 1024:>15.0f}"
        )
        results[n] = {"put_per_s": put[n].rate, "get_tuple_per_s": get[n].rate, "graph_s": graph[n].runs}
        results[n] |= {"disk": disk[n], "put": asdict(put[n]), "get": asdict(get[n])}
        results[n] |= {"concurrent_s": conc[n].runs, "long_s": long_s[n], "long_disk": long_disk[n]}
    results["victor_actors"]["concurrent_store"] = stats.get("victor_actors", {})
    results["victor_actors"]["graph_store"] = stats.get("graph", {})
    results["memory"] = {"concurrent_s": floor.runs}
    floor_s = sum(floor.runs) / len(floor.runs)
    print(f"{'InMemorySaver (LangGraph, no disk)':<40}{'':>41}{floor_s:>14.2f}")
    results["raw_lmdb"] = {"put_per_s": raw.rate, "put": asdict(raw)}
    print(f"{'bare synced LMDB transaction':<40}{raw.rate:>9.0f}")
    txn = stats.get("victor_actors", {})
    if txn:
        print(f"ours, concurrent graphs: {txn['commits']:,} commits in {txn['transactions']:,} transactions")
    print(
        "\nratios, victor_actors / other (same run; rates: higher is better; time and disk: lower is better)"
    )
    o = results["victor_actors"]
    print(f"  vs a bare synced LMDB transaction        put {o['put_per_s'] / raw.rate:.2f}x")
    for other in [kind.name for kind in SUBJECTS if kind is not Ours]:
        t = results[other]
        put_x, get_x = o["put_per_s"] / t["put_per_s"], o["get_tuple_per_s"] / t["get_tuple_per_s"]
        disk_x, graph_x = o["disk"]["size"] / t["disk"]["size"], sum(o["graph_s"]) / sum(t["graph_s"])
        conc_x = sum(o["concurrent_s"]) / sum(t["concurrent_s"])
        long_x = o["long_disk"]["size"] / t["long_disk"]["size"]
        print(
            f"  vs {LABELS[other]:<38} put {put_x:.2f}x, get_tuple {get_x:.2f}x, "
            f"graph time {graph_x:.2f}x, disk {disk_x:.2f}x, concurrent time {conc_x:.2f}x, "
            f"long-thread disk {long_x:.2f}x"
        )
    if args.json:
        meta = {
            "when": datetime.now().isoformat(timespec="seconds"),
            "python": platform.python_version(),
            "machine": platform.platform(),
            "versions": {p: version_of(p) for p in PACKAGES},
            "rounds": rounds, "puts": puts, "gets": gets, "steps": STEPS, "sqlite_synchronous": sync_pragma,
            "graphs": graphs, "graph_steps": graph_steps, "long_steps": long_steps, "skipped": skipped,
        }  # fmt: skip
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
