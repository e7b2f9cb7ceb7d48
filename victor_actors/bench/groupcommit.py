"""Group commit per scope: durable commits with many requests in flight, against the same in memory.

    python -m victor_actors.bench.groupcommit [--quick] [--json FILE]

Issue 15's pipelined targets, measured side by side in one process and run:

- one scope, one asyncio caller with 1,000 ``aapply`` in flight (``asyncio.gather`` over a
  semaphore of 1,000), 10,000 one-message commits (``--quick``: 2,000), ``durability="sync"``
  on a store in a temporary directory; baseline: the same workload on an in-memory manager;
- 100 scopes driven from one event loop, 10,000 in flight (100 per scope), 20,000 commits
  (``--quick``: 4,000); baseline: the same in memory;
- a peer: LangGraph's SqliteSaver ``put`` of a one-message checkpoint, one after another (if
  ``langgraph-checkpoint-sqlite`` is installed; the bench extra has it).

A rate is all commits over the wall time from the first send to the last reply; rounds
alternate the durable and the in-memory run so drift on the shared machine hits both.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import json
import os
import platform
import shutil
import tempfile
import time
from datetime import UTC, datetime
from typing import Any

from victor_actors import GlobalStateManager, TransitionBatch
from victor_actors.bench._common import version_of

TARGETS = {
    "one scope, sync >= 10,000 commits/s": ("one_sync", 10_000.0),
    "one scope, sync >= 0.5x in memory": ("one_ratio", 0.5),
    "100 scopes, sync >= 0.5x in memory": ("many_ratio", 0.5),
    "100 scopes, sync >= 5x SqliteSaver puts": ("many_vs_sqlite", 5.0),
}


async def _flood(manager: GlobalStateManager, scopes: int, commits: int, inflight: int) -> float:
    handles = [manager.get_conversation_state(f"s{i}") for i in range(scopes)]
    gate = asyncio.Semaphore(inflight)

    async def one(i: int) -> None:
        async with gate:
            await handles[i % scopes].aapply(TransitionBatch().add_message({"role": "user", "content": i}))

    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(commits)))
    return commits / (time.perf_counter() - start)


def _rate(durable: bool, scopes: int, commits: int, inflight: int) -> tuple[float, int]:
    """(commits/s, store transactions) of one fresh manager."""
    path = tempfile.mkdtemp(prefix="va-groupcommit-") if durable else None
    try:
        with GlobalStateManager.open(path, durability="sync") as manager:
            gc.collect()
            gc.disable()
            try:
                rate = asyncio.run(_flood(manager, scopes, commits, inflight))
            finally:
                gc.enable()
            return rate, manager.stats()["store_transactions"]
    finally:
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)


def _sqlite_puts(n: int) -> float | None:
    try:  # found at run time: the peer is optional (the bench extra), and unknown to the type checker
        empty_checkpoint = importlib.import_module("langgraph.checkpoint.base").empty_checkpoint
        SqliteSaver = importlib.import_module("langgraph.checkpoint.sqlite").SqliteSaver
    except ImportError:
        return None
    root = tempfile.mkdtemp(prefix="va-groupcommit-sqlite-")
    try:
        with SqliteSaver.from_conn_string(os.path.join(root, "db.sqlite")) as saver:
            config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
            start = time.perf_counter()
            for i in range(n):
                checkpoint = empty_checkpoint()
                checkpoint["channel_values"] = {"messages": [{"role": "user", "content": i}]}
                config = saver.put(config, checkpoint, {"step": i}, {})
            return n / (time.perf_counter() - start)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller counts, one round (a smoke run)")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    args = ap.parse_args()
    one_n, many_n, sqlite_n, rounds = (2_000, 4_000, 300, 1) if args.quick else (10_000, 20_000, 2_000, 3)
    rows: dict[str, list[float]] = {k: [] for k in ("one_sync", "one_mem", "many_sync", "many_mem")}
    txns: dict[str, int] = {}
    for r in range(rounds):
        order = (True, False) if r % 2 == 0 else (False, True)
        for durable in order:
            tag = "sync" if durable else "mem"
            rate, t = _rate(durable, 1, one_n, 1_000)
            rows[f"one_{tag}"].append(rate)
            txns["one"] = t if durable else txns.get("one", 0)
            rate, t = _rate(durable, 100, many_n, 10_000)
            rows[f"many_{tag}"].append(rate)
            txns["many"] = t if durable else txns.get("many", 0)
    sqlite = _sqlite_puts(sqlite_n)
    best = {k: max(v) for k, v in rows.items()}
    res: dict[str, float | None] = {
        "one_sync": best["one_sync"],
        "one_mem": best["one_mem"],
        "one_ratio": best["one_sync"] / best["one_mem"],
        "many_sync": best["many_sync"],
        "many_mem": best["many_mem"],
        "many_ratio": best["many_sync"] / best["many_mem"],
        "sqlite_puts": sqlite,
        "many_vs_sqlite": None if sqlite is None else best["many_sync"] / sqlite,
    }
    print("victor_actors group-commit benchmark (issue 15: pipelined durable commits)")
    print(
        f"date: {datetime.now(UTC).isoformat(timespec='seconds')}  python: {platform.python_version()}  "
        f"lmdb: {version_of('lmdb')}  cpus: {os.cpu_count()}  rounds: {rounds} (best of each)"
    )
    print(f"\n{'measure':<62}{'ours':>14}{'baseline':>14}{'ratio':>9}")
    print(
        f"{'1 scope, 1,000 in flight: sync / in memory (commits/s)':<62}"
        f"{best['one_sync']:>14,.0f}{best['one_mem']:>14,.0f}{res['one_ratio']:>8.2f}x"
        f"   {one_n:,} commits in {txns['one']} transactions"
    )
    print(
        f"{'100 scopes, 10,000 in flight: sync / in memory (commits/s)':<62}"
        f"{best['many_sync']:>14,.0f}{best['many_mem']:>14,.0f}{res['many_ratio']:>8.2f}x"
        f"   {many_n:,} commits in {txns['many']} transactions"
    )
    if sqlite is not None:
        print(
            f"{'100 scopes sync / SqliteSaver puts, one after another (/s)':<62}"
            f"{best['many_sync']:>14,.0f}{sqlite:>14,.0f}{best['many_sync'] / sqlite:>8.2f}x"
        )
    print(f"\n{'target':<50}{'measured':>12}  verdict")
    for name, (key, goal) in TARGETS.items():
        value = res.get(key)
        if value is None:
            print(f"{name:<50}{'-':>12}  NOT RUN (langgraph-checkpoint-sqlite is not installed)")
            continue
        print(f"{name:<50}{value:>12,.2f}  {'MET' if value >= goal else 'MISSED'}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"results": res, "rounds": rows, "transactions": txns}, fh, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
