"""Virtual scopes (issue 14): a million conversations on one machine, evicted and brought back.

    python -m victor_actors.bench.virtual [--quick] [--n N] [--touches M] [--tasks K] [--json FILE]

A scope with no actor leaves memory: with a store it is reloaded from LMDB
on its next use, without one its state is kept encoded. This measures what
that costs and saves. Each part runs in its own fresh process, so its memory
is its own. Memory is anonymous memory (``RssAnon`` of /proc/self/status,
after ``gc.collect()``), not RSS: LMDB's mapped pages count in RSS.

1. Creation, store-backed (``GlobalStateManager.open(path,
   max_live_actors=2000)``), durability ``async`` and then ``sync``, a fresh
   store and process each: N conversations (1,000,000; ``--quick`` 20,000)
   created and committed once each (one ``add_message`` of a small dict) by
   K asyncio tasks (64) each looping ``h = manager.get_conversation_state(cid);
   await h.aadd_message(msg)``. Reported: the rate, anonymous memory after
   minus before over N (before: after a warm-up of 3,000 conversations,
   ``passivate_idle(0)`` and gc; after: after ``passivate_idle(0)`` and gc),
   the same over the second half alone (the conversations are created in two
   halves, everything evicted in between: the marginal cost, without the
   allocator's one-off high-water mark, which dominates at small N), peak
   anonymous memory (sampled every 50 ms), and the eviction counters.
   Then 20,000 more conversations (``--quick`` 2,000) one at a time on one
   thread: the sequential rate. Baselines: the in-memory manager's rate with
   the same cap and driver (part 3), and a bare pykka actor's start, one
   ask and stop, one at a time, in the same process as the async part.
2. Random touches, in the async part's process on the same store: 100,000
   (``--quick`` 10,000) touches of random conversations among the N, one
   thread, each ``manager.get_conversation_state(cid).add_message(msg)``
   timed alone (``time.perf_counter_ns``; the ``handle.is_live`` check that
   classifies it, False meaning the request starts an actor, is outside the
   timer). Baseline, in interleaved rounds with gc off while timed: the same
   number of touches over 2,000 conversations of a second store-backed
   manager with the same options, which all stay live. The rounds run with
   the process, every thread of it, pinned to one CPU (``_pin.pinned``).
3. Without a store: 100,000 conversations (``--quick`` 20,000) committed once
   each with ``max_live_actors=2000``, all evicted (kept encoded) at the end:
   anonymous bytes per evicted conversation. Baseline, in its own process:
   5,000 conversations (``--quick`` 2,000) committed once each through a
   manager with ``max_live_actors=None, idle_timeout=None``, whose actors all
   stay live. The issue's figure for the code before eviction, about 8,500
   bytes per passivated conversation, is quoted beside it, not measured.

``--n`` sets N (and caps the other counts at it); ``--warm W`` sets the
warm-up (3,000: past the cap of 2,000, so eviction has run before "before";
a smaller one is for smoke runs of the plumbing, whose memory figures mean
little).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any, Literal

import pykka

from victor_actors import GlobalStateManager
from victor_actors.bench._common import no_gc, ns, version_of
from victor_actors.bench._machine import git_commit, load_average, source_checkout
from victor_actors.bench._pin import pinned

CAP = 2_000  # max_live_actors of every capped manager here
WARM = 3_000  # warm-up conversations before "before" is measured (past the cap, so eviction has run)
MSG = {"role": "user", "content": "hello"}
QUOTED_OLD_BYTES = 8_500  # issue 14: bytes per passivated conversation before eviction (quoted, not measured)
PARTS = ("store-async", "store-sync", "memory", "memory-live")
SAMPLE_S = 0.05


# -- memory -----------------------------------------------------------------------------------------------


def _status(field: str) -> int:
    """A ``kB`` field of /proc/self/status, in bytes (0 where /proc is missing)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def anon_bytes() -> int:
    """Anonymous resident memory (heap, stacks): ``RssAnon``, which leaves out LMDB's mapped file."""
    return _status("RssAnon")


def settled_anon() -> int:
    gc.collect()
    return anon_bytes()


class AnonPeak:
    """The highest ``RssAnon`` seen while the block runs, sampled every 50 ms on a thread."""

    def __init__(self) -> None:
        self.peak = anon_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="anon-sampler", daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.peak = max(self.peak, anon_bytes())

    def __enter__(self) -> AnonPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, anon_bytes())


# -- drivers ----------------------------------------------------------------------------------------------


def ids(prefix: str, n: int) -> Iterator[str]:
    return (f"{prefix}{i:07d}" for i in range(n))


def create_async(manager: GlobalStateManager, cids: Iterable[str], tasks: int) -> float:
    """Create and commit once each conversation of ``cids`` with ``tasks`` asyncio tasks; seconds."""
    it = iter(cids)

    async def worker() -> None:
        get = manager.get_conversation_state
        for cid in it:
            h = get(cid)
            await h.aadd_message(MSG)

    async def drive() -> None:
        await asyncio.gather(*(worker() for _ in range(tasks)))

    t0 = time.perf_counter()
    asyncio.run(drive())
    return time.perf_counter() - t0


def create_seq(manager: GlobalStateManager, cids: Iterable[str]) -> float:
    """The same, one conversation at a time on this thread; seconds."""
    get = manager.get_conversation_state
    t0 = time.perf_counter()
    for cid in cids:
        get(cid).add_message(MSG)
    return time.perf_counter() - t0


def create_halves(manager: GlobalStateManager, n: int, tasks: int) -> tuple[float, int]:
    """Create conversations c0..c(n-1) with :func:`create_async`, in two halves with everything
    evicted in between; the seconds creating (the settling between is not counted) and the
    anonymous memory at half-way, so the second half's growth is the marginal cost per
    conversation, free of the allocator's one-off high-water mark."""
    half = n // 2
    seconds = create_async(manager, ids("c", half), tasks)
    settle(manager)
    mid = settled_anon()
    seconds += create_async(manager, (f"c{i:07d}" for i in range(half, n)), tasks)
    return seconds, mid


def settle(manager: GlobalStateManager) -> float:
    """Passivate and evict every scope that may be (``passivate_idle(0)``), then collect; seconds."""
    t0 = time.perf_counter()
    for _ in range(5):  # the evictor may hold a round when we ask: repeat until none is live
        manager.passivate_idle(0)
        if manager.stats()["live_actors"] == 0:
            break
        time.sleep(0.05)
    gc.collect()
    return time.perf_counter() - t0


def log(message: str) -> None:
    print(f"[virtual {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


EVICTION_KEYS = (
    "live_actors", "peak_live_actors", "resident_scopes", "evicted_scopes", "passivated_scopes",
    "bytes_resident", "activations", "activations_new", "activations_memory", "activations_store",
    "passivations", "evictions", "evicted", "eviction_rounds", "eviction_us", "commits",
    "store_commits", "store_transactions",
)  # fmt: skip


def counters(manager: GlobalStateManager) -> dict[str, int]:
    stats = manager.stats()
    return {k: stats[k] for k in EVICTION_KEYS if k in stats}


# -- the bare pykka floor -----------------------------------------------------------------------------------


class Bare(pykka.ThreadingActor):
    use_daemon_thread = True

    def on_receive(self, message: Any) -> Any:
        return None


def pykka_floor(n: int) -> dict[str, float]:
    """Start a bare pykka actor, ask it once, stop it (not waited for), ``n`` times on one thread."""
    stops = []
    t0 = time.perf_counter()
    for _ in range(n):
        ref = Bare.start()
        ref.ask(None)
        stops.append(ref.stop(block=False))
    seconds = time.perf_counter() - t0
    for f in stops:
        f.get(timeout=60.0)
    return {"actors": n, "seconds": seconds, "per_s": n / seconds, "us_each": seconds / n * 1e6}


# -- touches ------------------------------------------------------------------------------------------------


def touch(manager: GlobalStateManager, cids: list[str], lat: list[int], react: list[int]) -> float:
    """One touch of each of ``cids``, timed alone; latencies (ns) into ``lat`` (and ``react`` for the
    ones that found no live actor). Seconds for the whole block."""
    get = manager.get_conversation_state
    t_start = time.perf_counter()
    for cid in cids:
        t0 = ns()
        h = get(cid)
        t1 = ns()
        live = h.is_live  # False: this request starts an actor (the scope was passivated or evicted)
        t2 = ns()
        h.add_message(MSG)
        t3 = ns()
        d = (t1 - t0) + (t3 - t2)
        lat.append(d)
        if not live:
            react.append(d)
    return time.perf_counter() - t_start


def pct_us(values: list[int], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1e3


def summary(lat: list[int], react: list[int], seconds: float) -> dict[str, float]:
    return {
        "touches": len(lat),
        "seconds": seconds,
        "per_s": len(lat) / seconds if seconds else 0.0,
        "p50_us": pct_us(lat, 0.5),
        "p99_us": pct_us(lat, 0.99),
        "max_us": max(lat, default=0) / 1e3,
        "mean_us": statistics.fmean(lat) / 1e3 if lat else 0.0,
        "reactivations": len(react),
        "react_p50_us": pct_us(react, 0.5),
        "react_p99_us": pct_us(react, 0.99),
        "react_max_us": max(react, default=0) / 1e3,
    }


def random_touches(
    manager: GlobalStateManager,
    durability: Literal["async", "sync"],
    cfg: dict[str, Any],
    tmp: str,
) -> dict[str, Any]:
    """``touches`` random touches over the ``n`` conversations, against as many over 2,000 live ones."""
    base = GlobalStateManager.open(
        os.path.join(tmp, "baseline"), durability=durability, max_live_actors=CAP,
        map_size=256 * 1024**2, request_timeout=120.0,
    )  # fmt: skip
    n, touches, rounds = cfg["n"], cfg["touches"], cfg["rounds"]
    try:
        live_n = min(CAP, n)
        create_async(base, ids("b", live_n), 16)
        rng = random.Random(cfg["seed"])
        ours_lat: list[int] = []
        ours_react: list[int] = []
        base_lat: list[int] = []
        base_react: list[int] = []
        ours_s = base_s = 0.0
        per_round = max(1, touches // rounds)
        with pinned("own process (the touch rounds)") as pin:  # one caller's latency: every thread on one CPU
            for r in range(rounds):
                m = per_round if r < rounds - 1 else touches - per_round * (rounds - 1)
                picks = [f"c{rng.randrange(n):07d}" for _ in range(m)]
                live_picks = [f"b{rng.randrange(live_n):07d}" for _ in range(m)]
                with no_gc():
                    ours_s += touch(manager, picks, ours_lat, ours_react)
                with no_gc():
                    base_s += touch(base, live_picks, base_lat, base_react)
        out: dict[str, Any] = summary(ours_lat, ours_react, ours_s)
        out["rounds"] = rounds
        out["pinned"] = pin.as_json()
        out["baseline"] = summary(base_lat, base_react, base_s) | {"conversations": live_n}
        out["baseline"]["stats"] = counters(base)
        out["ratio_per_s"] = out["per_s"] / out["baseline"]["per_s"] if out["baseline"]["per_s"] else None
    finally:
        base.close(timeout=60.0)
    return out


# -- the parts, each in its own process ----------------------------------------------------------------------


def part_store(cfg: dict[str, Any], durability: Literal["async", "sync"]) -> dict[str, Any]:
    n, tasks = cfg["n"], cfg["tasks"]
    out: dict[str, Any] = {"durability": durability, "conversations": n, "tasks": tasks, "cap": CAP}
    if durability == "async":
        out["pykka_floor"] = pykka_floor(cfg["floor_n"])
    with tempfile.TemporaryDirectory(prefix=f"va-bench-virtual-{durability}-") as tmp:
        path = os.path.join(tmp, "store")
        manager = GlobalStateManager.open(
            path, durability=durability, max_live_actors=CAP,
            map_size=max(1024**3, n * 4096), request_timeout=120.0,
        )  # fmt: skip
        try:
            create_async(manager, ids("w", cfg["warm"]), tasks)
            settle(manager)
            before = settled_anon()
            log(f"store {durability}: creating {n:,} conversations with {tasks} tasks")
            start = counters(manager)
            with AnonPeak() as peak:
                seconds, mid = create_halves(manager, n, tasks)
            created = counters(manager)
            settle_s = settle(manager)
            after = settled_anon()
            log(f"store {durability}: {n / seconds:,.0f}/s, {(after - before) / n:,.0f} B each")
            out |= _creation(n, seconds, before, mid, after, peak.peak) | {
                "settle_seconds": settle_s,
                "stats_after": counters(manager),
                "during": {k: created[k] - start[k] for k in ("evicted", "evictions", "eviction_rounds",
                                                             "eviction_us", "activations")},
            }  # fmt: skip
            out["during"]["eviction_s"] = out["during"].pop("eviction_us") / 1e6
            seq_n = cfg["seq_n"]
            seq_s = create_seq(manager, ids("s", seq_n))
            out |= {"seq_conversations": seq_n, "seq_seconds": seq_s, "seq_per_s": seq_n / seq_s}
            log(f"store {durability}: sequential {seq_n / seq_s:,.0f}/s")
            if cfg["touches"]:
                log(f"store {durability}: {cfg['touches']:,} random touches")
                out["touch"] = random_touches(manager, durability, cfg, tmp)
                out["touch"]["stats"] = counters(manager)
            out["peak_rss"] = _status("VmHWM")
        finally:
            manager.close(timeout=60.0)
        data = os.path.join(path, "data", "data.mdb")
        out["data_mdb_bytes"] = os.path.getsize(data) if os.path.exists(data) else 0
    return out


def part_memory(cfg: dict[str, Any]) -> dict[str, Any]:
    n, tasks = cfg["mem_n"], cfg["tasks"]
    manager = GlobalStateManager.open(max_live_actors=CAP, request_timeout=120.0)
    try:
        create_async(manager, ids("w", cfg["warm"]), tasks)
        settle(manager)
        warm = counters(manager)
        before = settled_anon()
        log(f"memory: creating {n:,} conversations with {tasks} tasks")
        with AnonPeak() as peak:
            seconds, mid = create_halves(manager, n, tasks)
        settle(manager)
        after = settled_anon()
        stats = counters(manager)
    finally:
        manager.close(timeout=60.0)
    encoded = stats.get("bytes_resident", 0) - warm.get("bytes_resident", 0)
    return (
        {"conversations": n}
        | _creation(n, seconds, before, mid, after, peak.peak)
        | {
            "encoded_bytes_per_conversation": encoded / n,
            "stats_after": stats,
        }
    )


def _creation(n: int, seconds: float, before: int, mid: int, after: int, peak: int) -> dict[str, Any]:
    """A creation part's rate and memory: per conversation overall, and over the second half alone."""
    return {
        "create_seconds": seconds,
        "create_per_s": n / seconds,
        "anon_before": before,
        "anon_after": after,
        "anon_peak": peak,
        "bytes_per_conversation": (after - before) / n,
        "anon_half": mid,
        "marginal_bytes_per_conversation": (after - mid) / max(1, n - n // 2),
    }


def part_memory_live(cfg: dict[str, Any]) -> dict[str, Any]:
    n, tasks = cfg["live_n"], cfg["tasks"]
    manager = GlobalStateManager.open(max_live_actors=None, idle_timeout=None, request_timeout=120.0)
    try:
        create_async(manager, ids("w", 200), tasks)
        before = settled_anon()
        log(f"memory, all live: creating {n:,} conversations")
        seconds = create_async(manager, ids("c", n), tasks)
        after = settled_anon()
        stats = counters(manager)
        assert stats["live_actors"] >= n, stats  # the baseline keeps every actor live
    finally:
        manager.close(timeout=120.0)
    return {
        "conversations": n,
        "create_seconds": seconds,
        "create_per_s": n / seconds,
        "anon_before": before,
        "anon_after": after,
        "bytes_per_conversation": (after - before) / n,
        "stats_after": stats,
    }


def run_part(name: str, cfg: dict[str, Any]) -> dict[str, Any]:
    if name == "store-async":
        return part_store(cfg, "async")
    if name == "store-sync":
        return part_store(cfg | {"touches": 0}, "sync")
    if name == "memory":
        return part_memory(cfg)
    if name == "memory-live":
        return part_memory_live(cfg)
    raise ValueError(f"no part {name!r}")


def child(name: str, cfg: dict[str, Any]) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "victor_actors.bench.virtual", "--part", name, "--config", json.dumps(cfg)]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)  # stderr: passed through
    if proc.returncode != 0:
        raise RuntimeError(f"part {name} failed with exit status {proc.returncode}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


# -- main ---------------------------------------------------------------------------------------------------


def config(args: argparse.Namespace) -> dict[str, Any]:
    q = args.quick
    n = args.n if args.n is not None else (20_000 if q else 1_000_000)
    if n < 1:
        raise SystemExit("--n must be at least 1")
    if args.warm is not None and args.warm < 0:
        raise SystemExit("--warm must be at least 0")
    touches = args.touches if args.touches is not None else (10_000 if q else 100_000)
    return {
        "n": n,
        "tasks": args.tasks,
        "touches": touches,
        "rounds": 5 if q else 10,
        "seq_n": min(2_000 if q else 20_000, n),
        "mem_n": min(20_000 if q else 100_000, n),
        "live_n": min(2_000 if q else 5_000, n),
        "floor_n": min(1_000 if q else 5_000, n),
        "warm": WARM if args.warm is None else args.warm,
        "seed": 14,
        "quick": q,
    }


def mib(b: float) -> str:
    return f"{b / 2**20:,.1f} MiB"


def print_report(result: dict[str, Any]) -> None:
    from victor_actors.bench._table import print_rows, print_targets

    print_rows("virtual", result, result["quoted"])
    print_targets("virtual", result)
    for mode in ("async", "sync"):
        s = result["store"][mode]
        d = s["during"]
        print(
            f"\nstore {mode}: {s['conversations']:,} created in {s['create_seconds']:.1f} s "
            f"({s['create_per_s']:,.0f}/s, {s['tasks']} tasks), sequential {s['seq_per_s']:,.0f}/s; "
            f"anon {mib(s['anon_before'])} -> {mib(s['anon_half'])} at half-way -> {mib(s['anon_after'])}, "
            f"peak {mib(s['anon_peak'])}; "
            f"evicted {d['evicted']:,} in {d['eviction_rounds']:,} rounds, {d['eviction_s']:.1f} s on the "
            f"evictor; data.mdb {s['data_mdb_bytes']:,} B"
        )
    t = result["touch"]
    b = t["baseline"]
    print(
        f"touches: {t['touches']:,} at {t['per_s']:,.0f}/s (p50 {t['p50_us']:,.0f} us, p99 "
        f"{t['p99_us']:,.0f} us, max {t['max_us'] / 1e3:,.1f} ms), {t['reactivations']:,} reactivations "
        f"(p50 {t['react_p50_us']:,.0f} us, p99 {t['react_p99_us']:,.0f} us); over {b['conversations']:,} "
        f"live: {b['per_s']:,.0f}/s (p50 {b['p50_us']:,.0f} us, p99 {b['p99_us']:,.0f} us, max "
        f"{b['max_us'] / 1e3:,.1f} ms, {b['reactivations']} reactivations)"
    )
    m, lv = result["memory"]["evicted"], result["memory"]["live"]
    print(
        f"no store: {m['conversations']:,} evicted, {m['bytes_per_conversation']:,.0f} B each "
        f"({m['encoded_bytes_per_conversation']:,.0f} B of it encoded state); {lv['conversations']:,} "
        f"live, {lv['bytes_per_conversation']:,.0f} B each; the issue quotes about {QUOTED_OLD_BYTES:,} B "
        "per passivated conversation before eviction (quoted, not measured)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="20,000 conversations, 10,000 touches")
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON")
    parser.add_argument("--n", type=int, help="conversations in the store-backed parts (default 1,000,000)")
    parser.add_argument("--touches", type=int, help="random touches (default 100,000; --quick 10,000)")
    parser.add_argument("--tasks", type=int, default=64, help="asyncio tasks creating conversations (64)")
    parser.add_argument("--warm", type=int, help="warm-up conversations before memory is read (3,000)")
    parser.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.part:
        print(json.dumps(run_part(args.part, json.loads(args.config))))
        return 0
    cfg = config(args)
    started = time.perf_counter()
    print("victor_actors virtual-scopes benchmark (issue 14); each part in a fresh process")
    when = datetime.now(UTC).isoformat(timespec="seconds")
    checkout = source_checkout()
    meta: dict[str, Any] = {"date": when, "python": platform.python_version(), "cpus": os.cpu_count()}
    meta |= {
        "git_commit": None if checkout is None else git_commit(checkout),
        "load_average_start": load_average(),
    }
    print(
        f"date: {when}  python: {platform.python_version()}  lmdb: {version_of('lmdb')}  "
        f"cpus: {os.cpu_count()}  commit: {meta['git_commit']}  load average: {meta['load_average_start']}"
    )
    print(
        f"conversations: {cfg['n']:,} (store), {cfg['mem_n']:,} (no store), {cfg['live_n']:,} (all live); "
        f"touches: {cfg['touches']:,}; tasks: {cfg['tasks']}; max_live_actors: {CAP:,}"
    )
    try:
        parts = {name: child(name, cfg) for name in PARTS}
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 1
    result: dict[str, Any] = {
        "conversations": cfg["n"],
        "config": cfg,
        "store": {"async": parts["store-async"], "sync": parts["store-sync"]},
        "memory": {"evicted": parts["memory"], "live": parts["memory-live"]},
        "pykka_floor": parts["store-async"].pop("pykka_floor"),
        "quoted": {
            "bytes": QUOTED_OLD_BYTES,
            "what": "bytes per passivated conversation before eviction (issue 14)",
        },
        "meta": meta,
    }
    meta["load_average_end"] = load_average()
    result["touch"] = result["store"]["async"].pop("touch")
    result["seconds"] = time.perf_counter() - started
    print_report(result)
    print(f"\nwall time {result['seconds']:.1f} s; load average at end {meta['load_average_end']}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
