"""Core benchmarks for victor_actors, each against a baseline taken in the same run.

    python -m victor_actors.bench.core [--quick] [--json FILE]

1. apply round trip (1-key and 10-key batches) vs a bare pykka echo ask, and vs a plain
   ``threading.Lock`` plus dict update on the caller's thread (the floor of any in-process store);
2. aapply (the asyncio twin) vs the same echo baseline;
3. snapshot at 10 vs 100,000 keys, with a dict copy at 100k as a contrast;
4. a 10-key apply at 100,000 vs 10 keys;
5. throughput: 4 threads applying to 4 scopes vs 4 threads asking 4 echo actors;
6. cross-scope batches on a conversation under workflow "wf" under team "t": a
   single-scope batch (the baseline) vs the same batch also writing the team
   (two scopes) or the workflow, team and global scopes too (four), and vs
   transact() locking the team (two scopes, pessimistic).

Sections 1-4 and 6 measure one caller's latency: the whole process (the caller and every
actor thread) is pinned to one CPU while they run (``_pin.pinned``); section 5 runs four
threads at once and is not pinned.

The machine is shared and noisy, so subjects are never timed in one long
stretch each: every section runs in rounds that interleave the baseline and
the subjects, and drift hits all of them alike. Per-call times come from
time.perf_counter_ns with gc disabled inside each timed block.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import threading
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from functools import partial
from typing import Any

import pykka

from victor_actors import GlobalStateManager, ScopeHandle, TransitionBatch
from victor_actors.bench._common import no_gc, ns, version_of
from victor_actors.bench._pin import pinned

BIG = 100_000  # keys in the large scope
FILL_CHUNK = 10_000  # update_state transitions per fill batch
KEYS10 = [f"k{i}" for i in range(10)]


class Echo(pykka.ThreadingActor):
    """The baseline: the cheapest pykka ask round trip there is."""

    use_daemon_thread = True

    def on_receive(self, message: Any) -> Any:
        return message


def batch_of(keys: list[str], value: int) -> TransitionBatch:
    batch = TransitionBatch()
    for key in keys:
        batch.update_state(key, value)
    return batch


# -- timed blocks: each appends one sample (ns) per call ----------------------------------


def time_apply(handle: ScopeHandle, keys: list[str], n: int, total: list[int], call: list[int]) -> None:
    # One loop gives two numbers: the call as users write it (build the batch,
    # e.g. TransitionBatch().update_state("k", i), and apply it) and the apply
    # call alone on the batch just built. Batch building validates and freezes
    # each transition on the caller's thread, so it is worth seeing apart.
    with no_gc():
        for i in range(n):
            t0 = ns()
            batch = batch_of(keys, i)
            t1 = ns()
            handle.apply(batch)
            t2 = ns()
            total.append(t2 - t0)
            call.append(t2 - t1)


async def _aapply_loop(handle: ScopeHandle, n: int, total: list[int], call: list[int]) -> None:
    for i in range(n):
        t0 = ns()
        batch = TransitionBatch().update_state("k", i)
        t1 = ns()
        await handle.aapply(batch)
        t2 = ns()
        total.append(t2 - t0)
        call.append(t2 - t1)


def time_aapply(
    runner: asyncio.Runner, handle: ScopeHandle, n: int, total: list[int], call: list[int]
) -> None:
    with no_gc():
        runner.run(_aapply_loop(handle, n, total, call))


def time_lock(lock: threading.Lock, d: dict[str, int], n: int, out: list[int]) -> None:
    """The floor: a plain ``threading.Lock`` plus one dict update, as the apply writes one key."""
    with no_gc():
        for i in range(n):
            t0 = ns()
            with lock:
                d["k"] = i
            out.append(ns() - t0)


def time_calls(fn: Callable[[], object], n: int, out: list[int]) -> None:
    """Time n calls of fn(): the echo ask, snapshot() and the copies."""
    with no_gc():
        for _ in range(n):
            t0 = ns()
            fn()
            out.append(ns() - t0)


def apply_one(handle: ScopeHandle, i: int) -> object:
    return handle.apply(TransitionBatch().update_state("k", i))


def echo_one(actor: pykka.ActorRef[Any], i: int) -> object:
    return actor.ask(i, block=True)


# -- section 6: cross-scope batches, each written as users write it ------------------------


def cross_single(conv: ScopeHandle, i: int) -> object:
    return conv.apply(TransitionBatch().add_message(i).update_state("k", i))


def cross_two(conv: ScopeHandle, i: int) -> object:
    return conv.apply(
        TransitionBatch().add_message(i).update_state("k", i).update_state("t", i, scope="team")
    )


def cross_four(conv: ScopeHandle, i: int) -> object:
    return conv.apply(
        TransitionBatch()
        .add_message(i)
        .update_state("k", i)
        .update_state("t", i, scope="team")
        .update_state("w", i, scope="workflow")
        .update_state("g", i, scope="global")
    )


def cross_transact(conv: ScopeHandle, i: int) -> object:
    return conv.transact(
        lambda s: TransitionBatch().add_message(i).update_state("t", i, scope="team"), lock=["team"]
    )


def time_indexed(fn: Callable[[int], object], n: int, out: list[int], seq: Iterator[int]) -> None:
    """Time n calls fn(i). Every block takes fresh values of i from seq, so no update is a no-op."""
    base = next(seq) * n
    with no_gc():
        for i in range(base, base + n):
            t0 = ns()
            fn(i)
            out.append(ns() - t0)


def run_threads(fns: Sequence[Callable[[int], object]], ops: int) -> int:
    """Run ``fn(i)`` for i < ops on one thread per fn, all released at once; wall ns."""
    barrier = threading.Barrier(len(fns) + 1)

    def work(fn: Callable[[int], object]) -> None:
        barrier.wait()
        for i in range(ops):
            fn(i)

    threads = [threading.Thread(target=work, args=(fn,), daemon=True) for fn in fns]
    for t in threads:
        t.start()
    with no_gc():  # gc is process-wide: this covers the workers too
        barrier.wait()
        t0 = ns()
        for t in threads:
            t.join()
        return ns() - t0


# -- statistics and output ---------------------------------------------------------------


def pct(sorted_ns: list[int], q: float) -> float:
    """Nearest-rank percentile, in microseconds."""
    idx = min(len(sorted_ns) - 1, max(0, round(q * len(sorted_ns)) - 1))
    return sorted_ns[idx] / 1000.0


def stats(samples: list[int]) -> dict[str, float]:
    s = sorted(samples)
    return {"n": len(s), "median_us": pct(s, 0.5), "p99_us": pct(s, 0.99)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a short smoke run (a few seconds)")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    args = ap.parse_args()
    # Calls per block and rounds: default = thousands of calls per subject.
    rounds, n, warm = (2, 300, 200) if args.quick else (10, 2_500, 1_000)
    # copy_n: dict(snapshot.state) copies per round (~0.1 s each); 10x that for dict(d).
    snap_n, copy_n = (2_000, 2) if args.quick else (20_000, 3)
    tp_rounds, tp_ops = (2, 300) if args.quick else (4, 2_500)
    # Section 6: a four-scope call costs ~4 single ones, so fewer calls per block.
    cross_rounds, cross_n = (2, 150) if args.quick else (10, 1_250)

    meta = {
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "pykka": version_of("pykka"),
        "immutables": version_of("immutables"),
        "victor_actors": version_of("victor-actors"),
        "cpus": os.cpu_count(),
        "mode": "quick" if args.quick else "default",
    }
    print("victor_actors core benchmark\n" + "  ".join(f"{k}: {v}" for k, v in meta.items()))

    lat: dict[str, list[int]] = {}

    def bucket(name: str) -> list[int]:
        return lat.setdefault(name, [])

    echo = Echo.start()
    echo4 = [Echo.start() for _ in range(4)]
    manager = GlobalStateManager.open(request_timeout=60.0)
    runner = asyncio.Runner()
    try:
        one = manager.get_conversation_state("bench-1key")
        ten = manager.get_conversation_state("bench-10keys")
        big = manager.get_conversation_state("bench-100k")
        echo_ask = partial(echo.ask, 0, block=True)
        ten.apply(batch_of(KEYS10, 0))
        t0 = ns()
        for start in range(0, BIG, FILL_CHUNK):
            big.apply(batch_of([f"key{j:06d}" for j in range(start, start + FILL_CHUNK)], 0))
        fill_s = (ns() - t0) / 1e9
        big_keys10 = [f"key{j:06d}" for j in range(10)]  # existing keys: size stays 100k
        assert len(big.snapshot().state) == BIG and len(ten.snapshot().state) == 10
        print(f"filled the 100k-key scope in {fill_s:.2f} s ({BIG // FILL_CHUNK} batches)")

        lock, plain_store = threading.Lock(), {"k": 0}
        # Sections 1-4 measure one caller's latency: every thread of the process on one CPU.
        with pinned() as pin:
            # Warm-up: threads, code paths, allocator, asyncio loop.
            time_calls(echo_ask, warm, [])
            time_apply(one, ["k"], warm, [], [])
            time_apply(ten, KEYS10, warm, [], [])
            time_apply(big, big_keys10, warm, [], [])
            time_aapply(runner, one, warm, [], [])
            time_lock(lock, plain_store, warm, [])

            # Sections 1, 2 and 4: one interleaved round loop, with the echo baseline
            # between the subjects; odd rounds run the blocks in reverse order so no
            # subject always follows the same neighbour.
            blocks: list[Callable[[], None]] = [
                partial(time_calls, echo_ask, n, bucket("echo")),
                partial(time_apply, one, ["k"], n, bucket("apply1"), bucket("apply1_call")),
                partial(time_lock, lock, plain_store, n, bucket("lock")),
                partial(time_calls, echo_ask, n, bucket("echo")),
                partial(time_apply, ten, KEYS10, n, bucket("apply10"), bucket("apply10_call")),
                partial(time_calls, echo_ask, n, bucket("echo")),
                partial(time_aapply, runner, one, n, bucket("aapply1"), bucket("aapply1_call")),
                partial(time_apply, big, big_keys10, n, bucket("apply10_big"), bucket("apply10_big_call")),
            ]
            for r in range(rounds):
                for block in blocks if r % 2 == 0 else reversed(blocks):
                    block()

            # Section 3: snapshots, and what copying 100k keys would cost instead.
            plain = dict(big.snapshot().state.items())  # the same 100k items in a plain dict
            view = big.snapshot().state
            for _ in range(rounds):  # interleaved like the rest
                time_calls(ten.snapshot, snap_n, bucket("snap10"))
                time_calls(big.snapshot, snap_n, bucket("snap100k"))
                time_calls(lambda: dict(plain), copy_n * 10, bucket("copy_dict"))
                time_calls(lambda: dict(view), copy_n, bucket("copy_view"))

        # Section 5: throughput, rounds interleaved; rate = all ops / all wall time.
        tp_scopes = [manager.get_conversation_state(f"bench-tp-{i}") for i in range(4)]
        apply_fns = [partial(apply_one, h) for h in tp_scopes]
        echo_fns = [partial(echo_one, a) for a in echo4]
        run_threads(echo_fns, warm // 4)
        run_threads(apply_fns, warm // 4)
        tp_ns = {"echo": 0, "apply": 0}
        for _ in range(tp_rounds):
            tp_ns["echo"] += run_threads(echo_fns, tp_ops)
            tp_ns["apply"] += run_threads(apply_fns, tp_ops)

        # Section 6: cross-scope batches, interleaved (odd rounds reversed) like sections 1-4.
        conv = manager.get_conversation_state("bench-cross", workflow_id="wf", team_id="t")
        seq = itertools.count()
        cross_fns: list[tuple[str, Callable[[int], object]]] = [
            ("cross1", partial(cross_single, conv)),
            ("cross2", partial(cross_two, conv)),
            ("cross4", partial(cross_four, conv)),
            ("transact2", partial(cross_transact, conv)),
        ]
        with pinned():
            for _name, fn in cross_fns:
                time_indexed(fn, warm, [], seq)
            cross_blocks = [partial(time_indexed, fn, cross_n, bucket(name), seq) for name, fn in cross_fns]
            for r in range(cross_rounds):
                for block in cross_blocks if r % 2 == 0 else reversed(cross_blocks):
                    block()
        cross_versions = {
            "conversation": conv.version,
            "workflow": manager.get_workflow_state("wf").version,
            "team": manager.get_team_state("t").version,
            "global": manager.get_global_state().version,
        }
    finally:
        runner.close()
        manager.close()
        for a in (echo, *echo4):
            a.stop()

    st = {name: stats(samples) for name, samples in lat.items()}

    def ratio(a: str, b: str, key: str = "median_us") -> float:
        return st[a][key] / st[b][key]

    total_ops = tp_rounds * tp_ops * 4
    rates = {k: total_ops / (v / 1e9) for k, v in tp_ns.items()}
    ratios: dict[str, float] = {}
    for label, num, den in [
        ("apply1/echo", "apply1", "echo"),
        ("apply1 call only/echo", "apply1_call", "echo"),
        ("apply1/lock + dict update", "apply1", "lock"),
        ("apply10/echo", "apply10", "echo"),
        ("aapply1/echo", "aapply1", "echo"),
        ("snapshot 100k/10", "snap100k", "snap10"),
        ("apply10 at 100k/at 10 keys", "apply10_big", "apply10"),
        ("apply10 call only at 100k/at 10 keys", "apply10_big_call", "apply10_call"),
    ]:
        ratios[f"{label} median"] = ratio(num, den)
        ratios[f"{label} p99"] = ratio(num, den, "p99_us")
    ratios["throughput apply/echo"] = rates["apply"] / rates["echo"]

    labels = [
        ("1", "echo", "bare pykka echo ask (baseline)"),
        ("1", "apply1", "apply 1-key batch (build + apply)"),
        ("1", "apply1_call", "  of which the apply call"),
        ("1", "lock", "threading.Lock + dict update (baseline)"),
        ("1", "apply10", "apply 10-key batch (build + apply)"),
        ("1", "apply10_call", "  of which the apply call"),
        ("2", "aapply1", "aapply 1-key batch (build + aapply)"),
        ("2", "aapply1_call", "  of which the aapply call"),
        ("3", "snap10", "snapshot() at 10 keys"),
        ("3", "snap100k", "snapshot() at 100k keys"),
        ("3", "copy_dict", "dict(d) of 100k keys (a copying snapshot)"),
        ("3", "copy_view", "dict(snapshot.state) at 100k (via MapView)"),
        ("4", "apply10", "apply 10-key batch at 10 keys (as in 1)"),
        ("4", "apply10_big", "apply 10-key batch at 100k keys (build+apply)"),
        ("4", "apply10_big_call", "  of which the apply call"),
    ]
    print(f"\nlatency ({rounds} interleaved rounds; {n} calls per block; gc off while timed; {pin.how})")
    print(f"{'sec':<4}{'what':<46}{'calls':>8}{'median us':>12}{'p99 us':>12}")
    for sec, key, label in labels:
        s = st[key]
        print(f"{sec:<4}{label:<46}{s['n']:>8}{s['median_us']:>12.2f}{s['p99_us']:>12.2f}")
    print("\nratios")
    for name, value in ratios.items():
        print(f"    {name:<50}{value:>10.2f}x")
    print(f"\nthroughput (4 threads x {tp_ops} ops, {tp_rounds} interleaved rounds)")
    print(f"    {'bare pykka echo asks on 4 actors':<50}{rates['echo']:>10.0f} ops/s")
    print(f"    {'apply on 4 conversation scopes':<50}{rates['apply']:>10.0f} ops/s")

    cross_ratios: dict[str, float] = {}
    for label, num, den in [
        ("two-scope/single", "cross2", "cross1"),
        ("four-scope/single", "cross4", "cross1"),
        ("transact two-scope/single", "transact2", "cross1"),
    ]:
        cross_ratios[f"cross {label} median"] = ratio(num, den)
        cross_ratios[f"cross {label} p99"] = ratio(num, den, "p99_us")
    cross_labels = [
        ("cross1", "apply: conversation only (baseline)"),
        ("cross2", "apply: conversation + team"),
        ("cross4", "apply: conversation + workflow + team + global"),
        ("transact2", "transact(lock=team): conversation + team"),
    ]
    print(f"\ncross-scope batches ({cross_rounds} interleaved rounds; {cross_n} calls per block; gc off)")
    print('    conversation under workflow "wf" under team "t"; each call builds its batch, then applies')
    print(f"{'sec':<4}{'what':<46}{'calls':>8}{'median us':>12}{'p99 us':>12}")
    for key, label in cross_labels:
        s = st[key]
        print(f"{'6':<4}{label:<46}{s['n']:>8}{s['median_us']:>12.2f}{s['p99_us']:>12.2f}")
    print("    versions after the run: " + ", ".join(f"{k} {v}" for k, v in cross_versions.items()))
    print("\nratios (cross-scope)")
    for name, value in cross_ratios.items():
        print(f"    {name:<50}{value:>10.2f}x")

    if args.json:
        out = {
            "meta": meta,
            "pinned": pin.as_json(),
            "fill_seconds": fill_s,
            "latency": st,
            "ratios": {**ratios, **cross_ratios},
            "throughput": rates,
            "cross_scope": {"rounds": cross_rounds, "calls_per_block": cross_n, "versions": cross_versions},
        }
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=2)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
