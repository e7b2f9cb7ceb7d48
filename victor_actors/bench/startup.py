"""Start-up of many scope actors, against starting as many bare pykka actors in the same process.

    python -m victor_actors.bench.startup [--quick] [--json FILE]

For each size (1,000 and 10,000; --quick: 300 and 1,000) a fresh process (so thread counts,
memory and the allocator are its own) runs interleaved rounds of:

- ours: ``get_conversation_state(f"c{i}")`` for N new conversations on an in-memory manager,
  each followed by one empty ``apply`` (a scope starts its ThreadingActor on its first
  request), then ``manager.close()``;
- baseline: ``Bare.start()`` for N bare ``pykka.ThreadingActor`` subclasses (an empty
  ``on_receive``), each followed by one ``ask``, then stopping them all.

Reported per size: wall time to start N (the ratio ours / bare is a time: lower is better), the
time per actor, the resident memory the N actors added (read from /proc/self/statm before and
after starting them), and the time to stop them. Odd rounds run the baseline first; gc is off
while timed.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import threading
import time
from datetime import datetime
from typing import Any

import pykka

from victor_actors import GlobalStateManager, TransitionBatch
from victor_actors.bench._common import ns, version_of

SIZES = (1_000, 10_000)
QUICK_SIZES = (300, 1_000)  # a smoke run: the same code, smaller
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class Bare(pykka.ThreadingActor):
    """The baseline: the cheapest pykka actor there is."""

    use_daemon_thread = True

    def on_receive(self, message: Any) -> Any:
        return None


def rss_bytes() -> int:
    """Resident memory now (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * PAGE
    except OSError:
        return 0


def ours(n: int, round_no: int) -> dict[str, float]:
    manager = GlobalStateManager.open(request_timeout=120.0)
    try:
        gc.collect()
        gc.disable()
        rss0 = rss_bytes()
        t0 = ns()
        empty = TransitionBatch()
        for i in range(n):
            manager.get_conversation_state(f"c{round_no}-{i}").apply(empty)
        start_ns = ns() - t0
        rss1 = rss_bytes()
        live = manager.stats()["live_actors"]
        assert live >= n, f"expected {n} live scope actors, found {live}"
        t0 = ns()
        manager.close(timeout=120.0)
        stop_ns = ns() - t0
    finally:
        gc.enable()
        manager.close()
    return {"start_s": start_ns / 1e9, "stop_s": stop_ns / 1e9, "rss_bytes": float(rss1 - rss0)}


def bare(n: int) -> dict[str, float]:
    refs: list[pykka.ActorRef[Any]] = []
    try:
        gc.collect()
        gc.disable()
        rss0 = rss_bytes()
        t0 = ns()
        for _ in range(n):
            ref = Bare.start()
            ref.ask(None)
            refs.append(ref)
        start_ns = ns() - t0
        rss1 = rss_bytes()
        t0 = ns()
        futures = [ref.stop(block=False) for ref in refs]
        for f in futures:
            f.get(timeout=120.0)
        stop_ns = ns() - t0
    finally:
        gc.enable()
        for ref in refs:
            if ref.is_alive():
                ref.stop(block=False)
    return {"start_s": start_ns / 1e9, "stop_s": stop_ns / 1e9, "rss_bytes": float(rss1 - rss0)}


def run_size(n: int, rounds: int) -> dict[str, Any]:
    """One size, in this process: a small warm-up of each, then ``rounds`` interleaved rounds."""
    ours(min(n, 100), -1)
    bare(min(n, 100))
    samples: dict[str, list[dict[str, float]]] = {"ours": [], "bare": []}
    peak_threads = 0
    for r in range(rounds):
        order = ("ours", "bare") if r % 2 == 0 else ("bare", "ours")
        for who in order:
            samples[who].append(ours(n, r) if who == "ours" else bare(n))
            peak_threads = max(peak_threads, threading.active_count())
    out: dict[str, Any] = {"actors": n, "rounds": rounds}
    for who, rows in samples.items():
        start = sum(row["start_s"] for row in rows)
        out[who] = {
            "start_s": start / rounds,  # mean per round
            "start_best_s": min(row["start_s"] for row in rows),
            "per_actor_us": start / rounds / n * 1e6,
            "stop_s": sum(row["stop_s"] for row in rows) / rounds,
            "rss_per_actor_bytes": sum(row["rss_bytes"] for row in rows) / rounds / n,
        }
    out["ratio_start"] = out["ours"]["start_s"] / out["bare"]["start_s"]
    out["ratio_stop"] = out["ours"]["stop_s"] / out["bare"]["stop_s"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=f"one round of {QUICK_SIZES} actors (a smoke run)")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    ap.add_argument("--size", type=int, help=argparse.SUPPRESS)  # the child: one size, JSON on stdout
    ap.add_argument("--rounds", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.size is not None:
        print(json.dumps(run_size(args.size, args.rounds or 1)))
        return 0
    sizes_run = QUICK_SIZES if args.quick else SIZES
    rounds = dict(zip(sizes_run, (1, 1) if args.quick else (8, 3), strict=True))
    meta: dict[str, Any] = {"date": datetime.now().astimezone().isoformat(timespec="seconds")}
    meta |= {"python": platform.python_version(), "pykka": version_of("pykka"), "cpus": os.cpu_count()}
    meta |= {"victor_actors": version_of("victor-actors"), "mode": "quick" if args.quick else "default"}
    print("victor_actors start-up benchmark (in-memory manager; each size in a fresh process)")
    print("  ".join(f"{k}: {v}" for k, v in meta.items()))
    wall0 = time.perf_counter()
    sizes: dict[str, Any] = {}
    for n in sizes_run:
        cmd = [
            sys.executable,
            "-m",
            "victor_actors.bench.startup",
            "--size",
            str(n),
            "--rounds",
            str(rounds[n]),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr)
            raise SystemExit(f"the {n}-actor child failed with status {proc.returncode}")
        sizes[str(n)] = json.loads(proc.stdout.strip().splitlines()[-1])
    wall = time.perf_counter() - wall0

    print(f"\n{'what':<44}{'actors':>8}{'rounds':>8}{'start s':>10}{'us/actor':>10}{'KiB/actor':>11}"
          f"{'stop s':>9}")  # fmt: skip
    for key, res in sizes.items():
        for who, label in (("ours", "ours: new scope + first apply"), ("bare", "bare pykka")):
            row = res[who]
            print(f"{label:<44}{key:>8}{res['rounds']:>8}{row['start_s']:>10.3f}{row['per_actor_us']:>10.1f}"
                  f"{row['rss_per_actor_bytes'] / 1024:>11.1f}{row['stop_s']:>9.3f}")  # fmt: skip
    print("\nratios (start time, ours / bare pykka; lower is better)")
    for key, res in sizes.items():
        print(f"    {key + ' actors':<50}{res['ratio_start']:>10.2f}x")
    print(f"\nwall time {wall:.1f} s")
    if args.json:
        out = {"meta": meta, "wall_seconds": wall, "sizes": sizes,
               "ratios": {f"start {k} ours/bare": v["ratio_start"] for k, v in sizes.items()}}  # fmt: skip
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
