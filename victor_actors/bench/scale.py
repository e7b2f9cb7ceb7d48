"""Many conversations on one machine: passivation under a live-actor cap.

    python -m victor_actors.bench.scale [--quick] [--json FILE]

Workload: touch N conversations once each (one apply), then M of them again
at random. Variants, each in its own fresh process (so RSS and thread counts
are its own):

- capped: N = 100,000 conversations, max_live_actors = 2,000;
- all live: the same touches over 2,000 conversations, all kept live (the
  baseline the issue asks for).

Reported per variant: wall time and throughput of each phase, peak live
threads (sampled), peak RSS, and for the capped variant the latency of
requests that had to reactivate a passivated scope (p50, p99) against those
that found it live. In-memory managers: the subject is the actor machinery,
not the disk.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

from victor_actors import GlobalStateManager, TransitionBatch
from victor_actors.bench._probes import is_live


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def run_variant(n: int, m: int, cap: int | None, seed: int) -> dict[str, Any]:
    peak_threads = [threading.active_count()]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.05):
            peak_threads[0] = max(peak_threads[0], threading.active_count())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    manager = GlobalStateManager.open(max_live_actors=cap, request_timeout=60.0)
    team = manager.get_team_state("t")
    rng = random.Random(seed)
    batch = TransitionBatch().add_message({"role": "user", "content": "hello"})
    started = time.perf_counter()
    for i in range(n):
        manager.get_conversation_state(f"c{i}", team_id=team.ref.id).apply(batch)
    touch_all = time.perf_counter() - started
    reactivations: list[float] = []
    live_hits: list[float] = []
    started = time.perf_counter()
    for _ in range(m):
        handle = manager.get_conversation_state(f"c{rng.randrange(n)}")
        was_live = is_live(handle)
        t0 = time.perf_counter()
        handle.apply(batch)
        (live_hits if was_live else reactivations).append(time.perf_counter() - t0)
    random_phase = time.perf_counter() - started
    stats = manager.stats()
    t0 = time.perf_counter()
    manager.close()
    close_s = time.perf_counter() - t0
    stop.set()
    return {
        "conversations": n,
        "random_touches": m,
        "cap": cap,
        "touch_all_s": touch_all,
        "touch_all_per_s": n / touch_all,
        "random_s": random_phase,
        "random_per_s": m / random_phase,
        "reactivations": len(reactivations),
        "reactivation_p50_us": percentile(reactivations, 0.5) * 1e6,
        "reactivation_p99_us": percentile(reactivations, 0.99) * 1e6,
        "live_hit_p50_us": percentile(live_hits, 0.5) * 1e6,
        "live_hit_p99_us": percentile(live_hits, 0.99) * 1e6,
        "slowest_request_ms": max(reactivations + live_hits, default=0.0) * 1e3,
        "peak_threads": peak_threads[0],
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "close_s": close_s,
        "stats": stats,
        "median_live_us": statistics.median(live_hits) * 1e6 if live_hits else 0.0,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="10,000 conversations, 2,000 touches, cap 500")
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    args = parser.parse_args()
    n, m, cap = (10_000, 2_000, 500) if args.quick else (100_000, 10_000, 2_000)
    if args.variant == "capped":
        print(json.dumps(run_variant(n, m, cap, 7)))
        return 0
    if args.variant == "live":
        print(json.dumps(run_variant(cap, m, None, 7)))
        return 0
    results = {}
    for variant in ("capped", "live"):
        cmd = [sys.executable, "-m", "victor_actors.bench.scale", "--variant", variant] + (
            ["--quick"] if args.quick else []
        )
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"the {variant} variant failed:\n{proc.stderr[-3000:]}", file=sys.stderr)
            return 1
        results[variant] = json.loads(proc.stdout.strip().splitlines()[-1])
    capped, live = results["capped"], results["live"]
    print("victor_actors scale benchmark (in-memory managers; each variant in a fresh process)")
    print(f"{'':38} {'capped':>14} {'all live':>14}")
    rows = [
        ("conversations", "conversations", "{:.0f}"),
        ("live-actor cap", "cap", "{}"),
        ("touch each once, per s", "touch_all_per_s", "{:.0f}"),
        ("random touches, per s", "random_per_s", "{:.0f}"),
        ("reactivations in the random phase", "reactivations", "{:.0f}"),
        ("reactivation p50 us", "reactivation_p50_us", "{:.0f}"),
        ("reactivation p99 us", "reactivation_p99_us", "{:.0f}"),
        ("request to a live scope p50 us", "live_hit_p50_us", "{:.0f}"),
        ("request to a live scope p99 us", "live_hit_p99_us", "{:.0f}"),
        ("slowest request ms", "slowest_request_ms", "{:.0f}"),
        ("peak threads", "peak_threads", "{:.0f}"),
        ("peak RSS MiB", "peak_rss_mib", "{:.0f}"),
        ("close s", "close_s", "{:.2f}"),
    ]
    for label, key, fmt in rows:
        print(f"{label:38} {fmt.format(capped[key]):>14} {fmt.format(live[key]):>14}")
    ratio = capped["random_per_s"] / live["random_per_s"]
    print(f"\nrandom-phase throughput, capped / all live: {ratio:.2f}x")
    print(f"capped stats: {capped['stats']}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"capped": capped, "live": live, "random_throughput_ratio": ratio}, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
