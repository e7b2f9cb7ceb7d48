"""Pipelined apply throughput on one scope, against raw pykka tells drained by one actor.

    python -m victor_actors.bench.pipeline [--quick] [--json FILE]

Many requests in flight on one actor, in the same process and run:

- ours: an asyncio task sends a burst of ``aapply`` calls to one conversation scope, all in
  flight at once (``asyncio.gather``), each a one-key ``update_state`` batch built as users
  write it (``TransitionBatch().update_state(key, i)``), and waits for every commit record;
  at 10 keys in the scope and at 100,000 keys (each update rewrites an existing key, spread
  over the whole map, so the size stays put);
- ours, batches built beforehand: the same burst with the batches built before the timer, so
  the rate is the apply path's own;
- ours, sync pipelining without asyncio: the same burst sent through the handle's own request
  path with a pykka future per request (what ``apply`` does, without blocking on each reply;
  private API, see ``_probes.py``, used here only to split the asyncio wake-up from the actor's
  own work);
- baseline: ``tell`` of the same number of messages to one bare ``pykka.ThreadingActor`` that
  counts them, then one ``ask`` that returns once the actor has drained them all.

A rate is all operations over all timed wall time (first send to last reply). Blocks run in
interleaved rounds (the baseline between the subjects; odd rounds in reverse order) so drift on
the shared, noisy machine hits all of them alike; gc is off while timed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from functools import partial
from typing import Any

import pykka

from victor_actors import GlobalStateManager, ScopeHandle, TransitionBatch
from victor_actors.bench._common import no_gc, ns, version_of
from victor_actors.bench._probes import send_nowait

BIG = 100_000  # keys in the large scope
FILL_CHUNK = 10_000  # update_state transitions per fill batch
STRIDE = 7_919  # a prime: consecutive updates land far apart in the 100k-key map


class Counter(pykka.ThreadingActor):
    """The baseline: an actor that only counts what it is told."""

    use_daemon_thread = True

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def on_receive(self, message: Any) -> Any:
        self.count += 1
        return self.count


class Rate:
    """One subject's operations and timed nanoseconds over all rounds."""

    def __init__(self) -> None:
        self.ops = 0
        self.ns = 0

    @property
    def per_s(self) -> float:
        return self.ops / (self.ns / 1e9) if self.ns else 0.0


def key_of(size: int, i: int) -> str:
    return f"k{i % 10}" if size == 10 else f"key{(i * STRIDE) % size:06d}"


def tell_burst(actor: pykka.ActorRef[Any], n: int, rate: Rate) -> None:
    with no_gc():
        t0 = ns()
        for i in range(n):
            actor.tell(i)
        actor.ask(None)  # FIFO: this returns once every tell above was handled
        rate.ns += ns() - t0
    rate.ops += n


async def _aapply_burst(handle: ScopeHandle, size: int, base: int, n: int) -> int:
    t0 = ns()
    await asyncio.gather(
        *(handle.aapply(TransitionBatch().update_state(key_of(size, i), i)) for i in range(base, base + n))
    )
    return ns() - t0


async def _aapply_prebuilt(handle: ScopeHandle, batches: list[TransitionBatch]) -> int:
    t0 = ns()
    await asyncio.gather(*(handle.aapply(b) for b in batches))
    return ns() - t0


def aapply_burst(
    runner: asyncio.Runner, handle: ScopeHandle, size: int, n: int, seq: Iterator[int], rate: Rate
) -> None:
    base = next(seq) * n  # fresh values every block: no update is a no-op
    with no_gc():
        rate.ns += runner.run(_aapply_burst(handle, size, base, n))
    rate.ops += n


def prebuilt_burst(
    runner: asyncio.Runner, handle: ScopeHandle, size: int, n: int, seq: Iterator[int], rate: Rate
) -> None:
    base = next(seq) * n
    batches = [TransitionBatch().update_state(key_of(size, i), i) for i in range(base, base + n)]
    with no_gc():
        rate.ns += runner.run(_aapply_prebuilt(handle, batches))
    rate.ops += n


def futures_burst(handle: ScopeHandle, size: int, n: int, seq: Iterator[int], rate: Rate) -> None:
    base = next(seq) * n
    with no_gc():
        t0 = ns()
        futures = [
            send_nowait(handle, TransitionBatch().update_state(key_of(size, i), i))
            for i in range(base, base + n)
        ]
        for future in futures:
            future.get(timeout=300.0)
        rate.ns += ns() - t0
    rate.ops += n


def fill(handle: ScopeHandle, size: int) -> None:
    for start in range(0, size, FILL_CHUNK):
        batch = TransitionBatch()
        for j in range(start, min(size, start + FILL_CHUNK)):
            batch.update_state(key_of(size, j) if size == 10 else f"key{j:06d}", 0)
        handle.apply(batch)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a short smoke run (a few seconds)")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    args = ap.parse_args()
    rounds, n = (2, 2_000) if args.quick else (6, 10_000)  # rounds; requests in flight per burst
    meta: dict[str, Any] = {"date": datetime.now().astimezone().isoformat(timespec="seconds")}
    meta |= {"python": platform.python_version(), "pykka": version_of("pykka"), "cpus": os.cpu_count()}
    meta |= {"immutables": version_of("immutables"), "victor_actors": version_of("victor-actors")}
    meta["mode"] = "quick" if args.quick else "default"
    print("victor_actors pipelined-apply benchmark\n" + "  ".join(f"{k}: {v}" for k, v in meta.items()))
    wall0 = time.perf_counter()

    rates: dict[str, Rate] = {}

    def rate(name: str) -> Rate:
        return rates.setdefault(name, Rate())

    counter = Counter.start()
    manager = GlobalStateManager.open(request_timeout=300.0)
    runner = asyncio.Runner()
    try:
        scopes = {
            10: manager.get_conversation_state("pipe-10"),
            BIG: manager.get_conversation_state("pipe-100k"),
        }
        for size, handle in scopes.items():
            fill(handle, size)
            assert len(handle.snapshot().state) == size
        seq = iter(range(1, 1 << 62))
        # Warm-up: threads, code paths, the event loop, the allocator (forgotten).
        warm = max(n // 4, 500)
        tell_burst(counter, warm, Rate())
        for size, handle in scopes.items():
            aapply_burst(runner, handle, size, warm, seq, Rate())
            prebuilt_burst(runner, handle, size, warm, seq, Rate())
            futures_burst(handle, size, warm, seq, Rate())

        blocks: list[Callable[[], None]] = [
            partial(tell_burst, counter, n, rate("tell")),
            partial(aapply_burst, runner, scopes[10], 10, n, seq, rate("aapply_10")),
            partial(tell_burst, counter, n, rate("tell")),
            partial(aapply_burst, runner, scopes[BIG], BIG, n, seq, rate("aapply_100k")),
            partial(tell_burst, counter, n, rate("tell")),
            partial(prebuilt_burst, runner, scopes[10], 10, n, seq, rate("prebuilt_10")),
            partial(prebuilt_burst, runner, scopes[BIG], BIG, n, seq, rate("prebuilt_100k")),
            partial(tell_burst, counter, n, rate("tell")),
            partial(futures_burst, scopes[10], 10, n, seq, rate("futures_10")),
            partial(futures_burst, scopes[BIG], BIG, n, seq, rate("futures_100k")),
        ]
        for r in range(rounds):
            for block in blocks if r % 2 == 0 else reversed(blocks):
                block()
        sizes_after = {str(size): len(h.snapshot().state) for size, h in scopes.items()}
        versions = {str(size): h.version for size, h in scopes.items()}
        assert sizes_after == {"10": 10, str(BIG): BIG}, sizes_after
    finally:
        runner.close()
        manager.close()
        counter.stop()
    wall = time.perf_counter() - wall0

    per_s = {name: r.per_s for name, r in rates.items()}
    ratios = {
        "aapply/tell at 10 keys": per_s["aapply_10"] / per_s["tell"],
        "aapply/tell at 100k keys": per_s["aapply_100k"] / per_s["tell"],
        "aapply at 100k/at 10 keys": per_s["aapply_100k"] / per_s["aapply_10"],
        "prebuilt aapply/tell at 10 keys": per_s["prebuilt_10"] / per_s["tell"],
        "prebuilt aapply/tell at 100k keys": per_s["prebuilt_100k"] / per_s["tell"],
        "prebuilt aapply at 100k/at 10 keys": per_s["prebuilt_100k"] / per_s["prebuilt_10"],
        "sync pipelined (pykka futures)/tell at 10 keys": per_s["futures_10"] / per_s["tell"],
        "sync pipelined (pykka futures)/tell at 100k keys": per_s["futures_100k"] / per_s["tell"],
    }
    labels = [
        ("tell", "raw pykka tell, drained by one actor (baseline)"),
        ("aapply_10", "aapply in flight, 10-key scope (build + aapply)"),
        ("aapply_100k", "aapply in flight, 100k-key scope (build + aapply)"),
        ("prebuilt_10", "aapply in flight, 10-key scope (batches prebuilt)"),
        ("prebuilt_100k", "aapply in flight, 100k-key scope (batches prebuilt)"),
        ("futures_10", "sync pipelined, pykka futures, 10-key scope (no asyncio)"),
        ("futures_100k", "sync pipelined, pykka futures, 100k-key scope"),
    ]
    print(f"\nthroughput ({rounds} interleaved rounds; bursts of {n} requests in flight; gc off while timed)")
    print(f"    {'what':<56}{'ops':>9}{'ops/s':>10}{'us/op':>8}")
    for key, label in labels:
        got = rates[key]
        print(f"    {label:<56}{got.ops:>9}{got.per_s:>10.0f}{1e6 / got.per_s:>8.1f}")
    print("\nratios (same run)")
    for name, value in ratios.items():
        print(f"    {name:<56}{value:>10.2f}x")
    print(f"    scope versions after the run: {versions}")
    print(f"\nwall time {wall:.1f} s")
    if args.json:
        tp = {k: {"ops": r.ops, "seconds": r.ns / 1e9, "per_s": r.per_s} for k, r in rates.items()}
        out = {"meta": meta, "wall_seconds": wall, "rounds": rounds, "in_flight": n, "versions": versions,
               "throughput": tp, "ratios": ratios}  # fmt: skip
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
