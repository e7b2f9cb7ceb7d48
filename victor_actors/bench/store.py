"""Durable-store benchmark for victor_actors, against LangGraph's SqliteSaver in the same run.

    python -m victor_actors.bench.store [--quick] [--json FILE] [--dir DIR]

1. sync commits/s, one add_message (~200 chars) per commit: (a) one scope, one thread, each
   conversation growing to 100 messages; (b) 100 scopes, one client thread each, with the mean
   commits per LMDB write transaction (group commit);  2. the same in async mode, then flush();
3. SqliteSaver (file, WAL, synchronous=FULL): one put of the whole conversation so far per step
   (1..100 of the same messages); a one-node StateGraph invoke (durability="sync"); raw LMDB, one
   synced transaction per ~300 B put, as the disk's baseline, and our in-memory manager as the
   CPU path's baseline;  4. ratios, all from this run;
5. storage of a 1,000-step conversation: ours (default checkpoints) vs SqliteSaver.

The machine is shared and noisy: subjects run in interleaved rounds (odd rounds reversed), each
rate is all ops over all timed wall time, gc is off while timed. Files live in one temporary
directory (under --dir if given), removed at the end. Without LangGraph (the bench extra) the
SqliteSaver and StateGraph subjects are skipped (``skipped`` in the JSON says why); ours still run.
"""

from __future__ import annotations

import argparse
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
from collections.abc import Callable
from contextlib import ExitStack, closing
from dataclasses import asdict, dataclass
from datetime import datetime
from functools import partial
from typing import Any

import lmdb
import msgpack

from victor_actors import GlobalStateManager, ScopeHandle
from victor_actors.bench._common import no_gc, ns, version_of
from victor_actors.bench._peers import LangGraph, Messages, langgraph
from victor_actors.store import CheckpointRecord

CONV = 100  # messages per conversation in sections 1-3
WORDS = (
    "the agent called search tool with query about quarterly revenue and returned three results "
    "summarise report draft user asked assistant to check refund policy for order invoice customer "
    "error timeout retry plan step next we should verify data before sending email to the team lead "
    "according latest figures growth was percent compared last year however costs rose in region "
    "please review attached file config yaml deploy staging branch merge request failing tests"
).split()


def make_messages(n: int, seed: int = 7) -> list[dict[str, str]]:
    """Varied chat messages of 150-250 characters (~200 on average), alternating roles; deterministic."""
    rng, out = random.Random(seed), []
    for i in range(n):
        target, text = rng.randint(150, 250), ""
        while len(text) < target:
            r = rng.random()
            word = rng.choice(WORDS) if r < 0.85 else f"#{rng.randint(1000, 99999)}" if r < 0.93 else None
            text += " " + (word or f"src/{rng.choice(WORDS)}_{rng.randint(1, 99)}.py")
        out.append({"role": ("user", "assistant")[i % 2], "content": text[1].upper() + text[2:]})
    return out


MSGS = make_messages(1_000)
IDS = itertools.count()  # unique scope, thread and key ids


@dataclass
class Acc:  # one subject's work over all rounds
    ops: int = 0
    ns: int = 0
    store_commits: int = 0
    store_txns: int = 0
    flush_ns: int = 0

    @property
    def rate(self) -> float:
        return self.ops / (self.ns / 1e9) if self.ns else 0.0


def ours(mgr: GlobalStateManager, tag: str, n_scopes: int, steps: int, threaded: bool, acc: Acc) -> None:
    """``steps`` add_message commits to each of ``n_scopes`` fresh scopes: by one thread, or one each."""
    store = mgr.store
    handles = [mgr.get_conversation_state(f"{tag}-{next(IDS)}") for _ in range(n_scopes)]
    c0, t0 = (store.commits, store.transactions) if store else (0, 0)

    groups = [[h] for h in handles] if threaded else [handles]
    barrier = threading.Barrier(len(groups) + 1)

    def drive(group: list[ScopeHandle]) -> None:
        barrier.wait()
        for h in group:
            for i in range(steps):
                h.add_message(MSGS[i])

    threads = [threading.Thread(target=drive, args=(g,), daemon=True) for g in groups]
    for t in threads:
        t.start()
    with no_gc():
        barrier.wait()
        start = ns()
        for t in threads:
            t.join()
        acc.ns += ns() - start
        if mgr.durability == "async":
            start = ns()
            mgr.flush()
            acc.flush_ns += ns() - start
    acc.ops += steps * n_scopes
    if store is not None:
        acc.store_commits += store.commits - c0 - (mgr.durability == "async")  # not the flush job
        acc.store_txns += store.transactions - t0


def timed(acc: Acc, ops: int, fn: Callable[[], object]) -> None:
    with no_gc():
        start = ns()
        fn()
        acc.ns += ns() - start
    acc.ops += ops


def respond(state: Messages) -> dict[str, Any]:
    return {"messages": [MSGS[len(state["messages"]) % len(MSGS)]]}


def graph_steps(graph: Any, steps: int) -> None:
    """``steps`` invokes on a fresh thread; each appends one message."""
    cfg: Any = {"configurable": {"thread_id": f"g-{next(IDS)}"}}
    for _ in range(steps):
        graph.invoke({"messages": []}, cfg, durability="sync")


def raw_lmdb(env: Any, n: int) -> None:
    value = msgpack.packb({"kind": "batch", "transitions": [MSGS[0]], "ts": 0.0})
    for _ in range(n):
        with env.begin(write=True) as txn:
            txn.put(next(IDS).to_bytes(8, "big"), value)


def on_disk(path: str) -> dict[str, int]:
    return {"size": os.stat(path).st_size, "allocated": os.stat(path).st_blocks * 512}


def storage(root: str, steps: int, lg: LangGraph | None) -> dict[str, Any]:
    """A ``steps``-message conversation: our store vs SqliteSaver with the whole state each step."""
    marks = (steps // 4, steps // 2, steps)
    path, db = os.path.join(root, "storage-ours"), os.path.join(root, "storage.sqlite")
    ours_at, sq_at = {}, {}
    t0 = time.perf_counter()
    with GlobalStateManager.open(path, request_timeout=60.0) as mgr:
        store = mgr.store
        assert store is not None
        h = mgr.get_conversation_state("long")
        for i in range(steps):
            h.add_message(MSGS[i])
            if i + 1 in marks:
                ours_at[i + 1] = store.size_of(h.ref)
        state = store.checkpoint(h.ref, steps).state  # steps is a multiple of checkpoint_every
        final = len(store.codec.encode_checkpoint(CheckpointRecord(state, None, 0.0)))
        kept = f"{len(mgr.list_checkpoints(h.ref))} ckpts + {len(store.log_versions(h.ref))} log records"
    ours_s = time.perf_counter() - t0
    out: dict[str, Any] = {
        "steps": steps,
        "plain_msgpack_bytes": len(msgpack.packb(MSGS[:steps])),
        "ours": {"seconds": ours_s, "final_state_bytes": final, "scope_bytes": ours_at[steps], "kept": kept,
                 "scope_bytes_at": ours_at, "data_mdb": on_disk(os.path.join(path, "data", "data.mdb"))},
    }  # fmt: skip
    if lg is None:
        return out

    def sq_mark(step: int) -> None:
        if step in marks:
            sq_at[step] = sum(os.path.getsize(p) for p in (db, db + "-wal") if os.path.exists(p))

    conn = sqlite3.connect(db, check_same_thread=False)
    saver = lg.saver(conn)
    t0 = time.perf_counter()
    cp = lg.conversation_puts(saver, "long", MSGS[:steps], sq_mark)
    sq_final = len(saver.serde.dumps_typed(cp)[1])
    conn.close()  # checkpoints the WAL into the main file
    sq_s = time.perf_counter() - t0
    out["sqlite"] = {
        "seconds": sq_s,
        "final_state_bytes": sq_final,
        "file_bytes_at": sq_at,
        "file": on_disk(db),
    }
    return out


def report(accs: dict[str, Acc], st: dict[str, Any], rounds: int, many: int, close: float) -> dict[str, Any]:
    rows = [
        ("1a", "sync1", "ours sync, 1 scope, 1 thread"),
        ("1b", "sync100", f"ours sync, 100 scopes x {many} commits, 100 threads"),
        ("2", "async1", "ours async, 1 scope, 1 thread (apply rate)"),
        ("2", "async100", f"ours async, 100 scopes x {many}, 100 threads"),
        ("3", "sqlite_put", "SqliteSaver.put of the whole state, 1 thread"),
        ("3", "graph", "StateGraph 1-node invoke + SqliteSaver, sync"),
        ("3", "raw_lmdb", "raw LMDB, one synced txn per ~300 B put"),
        ("3", "mem1", "ours in memory (no store), 1 scope, 1 thread"),
    ]
    print(f"\nthroughput ({rounds} interleaved rounds; conversations of {CONV} messages unless noted)")
    print(f"{'sec':<4}{'what':<50}{'ops':>8}{'ops/s':>9}{'commits/txn':>13}{'flush ms':>10}")
    for sec, key, label in rows:
        if key not in accs:
            print(f"{sec:<4}{label:<50}{'skipped (no LangGraph)':>40}")
            continue
        a = accs[key]
        per_txn = f"{a.store_commits / a.store_txns:.1f}" if a.store_txns else "-"
        flush = f"{a.flush_ns / 1e6 / rounds:.1f}" if key.startswith("async") else "-"
        print(f"{sec:<4}{label:<50}{a.ops:>8}{a.rate:>9.0f}{per_txn:>13}{flush:>10}")
    print(f"    flush ms: mean manager.flush() per round after the async applies; close: {close:.3f} s")
    names = {"sync1": "ours sync 1 scope", "sync100": "ours sync 100 scopes", "sqlite_put": "sqlite put"}
    names |= {"raw_lmdb": "raw LMDB synced txn", "mem1": "ours in memory", "graph": "StateGraph invoke"}
    names |= {"async100": "ours async 100 scopes"}
    pairs = [("sync1", "sqlite_put"), ("sync100", "sqlite_put"), ("sync1", "raw_lmdb"), ("sync1", "mem1")]
    pairs += [("sync1", "graph"), ("async100", "sync100")]
    ratios = {f"{names[a]} / {names[b]}": accs[a].rate / accs[b].rate for a, b in pairs if b in accs}
    print("\n4   ratios (same run)")
    for name, value in ratios.items():
        print(f"    {name:<50}{value:>10.2f}x")
    o, q, plain = st["ours"], st.get("sqlite"), st["plain_msgpack_bytes"]
    sq_final = "skipped" if q is None else f"{q['final_state_bytes']} B"
    print(f"\n5   storage: one {st['steps']}-step conversation, one message per step")
    print(f"    final state: plain msgpack {plain} B, ours encoded (zstd) {o['final_state_bytes']} B, "
          f"sqlite serde {sq_final}; '/final' divides by each one's own")  # fmt: skip
    print(f"    {'what':<50}{'bytes':>14}{'/final':>10}{'/plain':>10}")
    lines = [
        (f"ours size_of(scope) ({o['kept']})", o["scope_bytes"], o["final_state_bytes"]),
        ("ours data.mdb file size (after close)", o["data_mdb"]["size"], o["final_state_bytes"]),
        ("ours data.mdb allocated blocks", o["data_mdb"]["allocated"], o["final_state_bytes"]),
    ]
    if q is not None:
        lines.append(("sqlite file size (after close)", q["file"]["size"], q["final_state_bytes"]))
    for label, size, final in lines:
        print(f"    {label:<50}{size:>14}{size / final:>9.1f}x{size / plain:>9.1f}x")
    growth = ", ".join(f"{k}: {v}" for k, v in o["scope_bytes_at"].items())
    if q is not None:
        growth += "; sqlite db+wal " + ", ".join(f"{k}: {v}" for k, v in q["file_bytes_at"].items())
    print(f"    growth, bytes at step: ours size_of {growth}")
    print(f"    wall: ours {o['seconds']:.2f} s" + ("" if q is None else f", sqlite {q['seconds']:.2f} s"))
    return ratios


def run_rounds(
    mgrs: tuple[GlobalStateManager, ...], env: Any, peer: tuple[LangGraph, Any, Any] | None,
    accs: dict[str, Acc], rounds: int, sizes: tuple[int, int, int],
) -> None:  # fmt: skip
    """A warm-up round (forgotten), then ``rounds`` rounds, odd ones in reverse order.

    ``peer``: LangGraph, a SqliteSaver and a compiled one-node graph; None skips their blocks.
    """

    def acc(name: str) -> Acc:
        return accs.setdefault(name, Acc())

    sync, asyn, mem = mgrs

    def puts(c: int) -> None:
        assert peer is not None
        lg, saver, _graph = peer
        for _ in range(c):
            lg.conversation_puts(saver, f"p-{next(IDS)}", MSGS[:CONV])

    def blocks(c: int, m: int, g: int) -> list[Callable[[], None]]:
        out: list[Callable[[], None] | None] = [
            lambda: ours(sync, "s1", c, CONV, False, acc("sync1")),
            (lambda: timed(acc("sqlite_put"), c * CONV, partial(puts, c))) if peer else None,
            lambda: ours(sync, "s100", 100, m, True, acc("sync100")),
            lambda: timed(acc("raw_lmdb"), c * CONV, partial(raw_lmdb, env, c * CONV)),
            lambda: ours(mem, "m1", c, CONV, False, acc("mem1")),
            lambda: ours(asyn, "a1", c, CONV, False, acc("async1")),
            (lambda: timed(acc("sqlite_put"), c * CONV, partial(puts, c))) if peer else None,
            lambda: ours(asyn, "a100", 100, m, True, acc("async100")),
            (lambda: timed(acc("graph"), g, partial(graph_steps, peer[2], g))) if peer else None,
        ]
        return [b for b in out if b is not None]

    for b in blocks(1, 5, 5):
        b()
    accs.clear()
    for r in range(rounds):
        bl = blocks(*sizes)
        for b in bl if r % 2 == 0 else reversed(bl):
            b()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a short smoke run (under ~20 s)")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    ap.add_argument("--dir", help="parent of the temporary directory (default: the system's, e.g. /tmp)")
    args = ap.parse_args()
    # rounds; 100-message conversations per round for the one-thread subjects; commits per scope
    # with 100 scopes; StateGraph invokes per round; storage steps (a multiple of 100)
    rounds, convs, many, gsteps, steps = (2, 1, 20, 40, 1_000) if args.quick else (5, 3, 100, 100, 1_000)
    lg = langgraph()
    skipped = {"langgraph": lg} if isinstance(lg, str) else {}
    meta: dict[str, Any] = {"date": datetime.now().astimezone().isoformat(timespec="seconds")}
    meta |= {"python": platform.python_version(), "sqlite": sqlite3.sqlite_version, "cpus": os.cpu_count()}
    meta |= {n: version_of(n) for n in ("pykka", "lmdb", "langgraph", "langgraph-checkpoint-sqlite")}
    meta["victor_actors"] = version_of("victor-actors")
    meta["mode"] = "quick" if args.quick else "default"
    print("victor_actors store benchmark\n" + "  ".join(f"{k}: {v}" for k, v in meta.items()))
    for subject, why in skipped.items():
        print(f"skipped: the {subject} subjects ({why})")
    wall0 = time.perf_counter()
    root = tempfile.mkdtemp(prefix="bench-store-", dir=args.dir)
    accs: dict[str, Acc] = {}
    try:
        with ExitStack() as stack:
            opener = partial(GlobalStateManager.open, request_timeout=60.0)
            sync = stack.enter_context(opener(os.path.join(root, "sync")))
            asyn = stack.enter_context(opener(os.path.join(root, "async"), durability="async"))
            mem = stack.enter_context(opener(None))
            env = stack.enter_context(lmdb.open(os.path.join(root, "raw"), map_size=1 << 28, sync=True))
            peer = None
            if not isinstance(lg, str):
                conns = [
                    stack.enter_context(
                        closing(sqlite3.connect(os.path.join(root, f), check_same_thread=False))
                    )
                    for f in ("p.db", "g.db")
                ]
                peer = (lg, lg.saver(conns[0]), lg.one_node_graph(lg.saver(conns[1]), respond))
                meta["sqlite_pragma_synchronous"] = conns[0].execute("PRAGMA synchronous").fetchone()[0]
            run_rounds((sync, asyn, mem), env, peer, accs, rounds, (convs, many, gsteps))
            start = ns()
            asyn.close()  # flushed after its last block: this is stopping its actors and writer
            close_s = (ns() - start) / 1e9
        st = storage(root, steps, None if isinstance(lg, str) else lg)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ratios = report(accs, st, rounds, many, close_s)
    wall = time.perf_counter() - wall0
    print(f"\nwall time {wall:.1f} s")
    if args.json:
        tp = {k: {**asdict(v), "rate": v.rate} for k, v in accs.items()}
        out = {"meta": meta, "wall_seconds": wall, "throughput": tp, "async_close_seconds": close_s}
        out |= {"ratios": ratios, "storage": st, "skipped": skipped}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=2)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
