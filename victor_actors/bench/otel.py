"""What the OpenTelemetry hooks cost: apply p50 not instrumented, installed but off, and on.

    python -m victor_actors.bench.otel [--quick] [--json FILE]

1. Disabled: apply p50 in processes that imported ``victor_actors.otel`` (and
   so OpenTelemetry's API) without instrumenting, against processes that never
   imported it. The code path is the same in both (the hook slot is None); this
   checks that having the extra installed and imported costs nothing. Processes
   alternate (A B B A ...), so drift of the machine hits both sides alike; each
   side's figure is the median of its processes' p50s.
2. Enabled: in one process, apply p50 with ``VictorActorsInstrumentor``
   instrumented, in rounds interleaved with uninstrumented ones: with the SDK
   (a ``TracerProvider`` with a ``BatchSpanProcessor`` to an exporter that
   drops the spans, a ``MeterProvider`` with a reader), and with the API's
   no-op providers (the hooks' own cost, with spans that record nothing).

Each process also times a bare pykka echo ask, the floor of any reply, as a
yardstick of how fast that process's machine was. Per-call times come from
time.perf_counter_ns with gc disabled inside each timed block; only the apply
call is timed, its batch is built outside the timer.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime
from functools import partial
from typing import Any

from victor_actors import GlobalStateManager, ScopeHandle, TransitionBatch
from victor_actors.bench._common import no_gc, ns, version_of
from victor_actors.bench.core import Echo, stats, time_calls

SIDES = ("plain", "imported")


def time_apply_call(handle: ScopeHandle, n: int, out: list[int], start: list[int]) -> None:
    """Time n apply calls of 1-key batches built beforehand (fresh values: every call commits)."""
    base = start[0]
    start[0] += n
    batches = [TransitionBatch().update_state("k", i) for i in range(base, base + n)]
    with no_gc():
        for batch in batches:
            t0 = ns()
            handle.apply(batch)
            out.append(ns() - t0)


def _blocks(rounds: int, blocks: list[Callable[[], None]]) -> None:
    """Run the blocks ``rounds`` times, odd rounds in reverse (no block always follows the same one)."""
    for r in range(rounds):
        for block in blocks if r % 2 == 0 else reversed(blocks):
            block()


def child_disabled(side: str, rounds: int, n: int, warm: int) -> dict[str, Any]:
    """One process of section 1: ``side`` is "plain" (never imported) or "imported"."""
    if side == "imported":
        import victor_actors.otel  # noqa: F401  (installed and imported, never instrumented)
    from victor_actors import _trace

    manager = GlobalStateManager.open(request_timeout=60.0)
    echo = Echo.start()
    try:
        handle = manager.get_conversation_state("otel-bench")
        ask = partial(echo.ask, 0, block=True)
        counter = [0]
        time_calls(ask, warm, [])
        time_apply_call(handle, warm, [], counter)
        apply: list[int] = []
        floor: list[int] = []
        _blocks(
            rounds, [partial(time_calls, ask, n, floor), partial(time_apply_call, handle, n, apply, counter)]
        )
    finally:
        manager.close()
        echo.stop()
    return {
        "side": side,
        "apply": stats(apply),
        "echo": stats(floor),
        "opentelemetry_imported": any(m.split(".")[0] == "opentelemetry" for m in sys.modules),
        "hooks_installed": _trace.hooks is not None,
    }


def child_enabled(rounds: int, n: int, warm: int) -> dict[str, Any]:
    """Section 2, in one process: not instrumented, instrumented with the SDK, with no-op providers."""
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    from victor_actors.otel import VictorActorsInstrumentor

    class Discard(SpanExporter):
        """An exporter that drops what it gets: the SDK's work without a collector's."""

        def __init__(self) -> None:
            self.spans = 0

        def export(self, spans: Any) -> SpanExportResult:
            self.spans += len(spans)
            return SpanExportResult.SUCCESS

    exporter = Discard()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(exporter))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    noop_tracer, noop_meter = trace.NoOpTracerProvider(), metrics.NoOpMeterProvider()
    instrumentor = VictorActorsInstrumentor()
    manager = GlobalStateManager.open(request_timeout=60.0)
    echo = Echo.start()
    samples: dict[str, list[int]] = {"off": [], "sdk": [], "noop": [], "echo": []}
    try:
        handle = manager.get_conversation_state("otel-bench")
        ask = partial(echo.ask, 0, block=True)
        counter = [0]

        def mode(which: str, out: list[int]) -> None:
            if which == "sdk":
                instrumentor.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)
            elif which == "noop":
                instrumentor.instrument(tracer_provider=noop_tracer, meter_provider=noop_meter)
            try:
                time_apply_call(handle, n, out, counter)
            finally:
                instrumentor.uninstrument()

        time_calls(ask, warm, [])
        for which in ("off", "sdk", "noop"):
            mode(which, [])  # warm each path
        blocks: list[Callable[[], None]] = [partial(time_calls, ask, n, samples["echo"])]
        blocks += [partial(mode, which, samples[which]) for which in ("off", "sdk", "noop")]
        _blocks(rounds, blocks)
    finally:
        manager.close()
        echo.stop()
        tracer_provider.shutdown()  # exports what is still queued
        meter_provider.shutdown()
    return {
        **{which: stats(s) for which, s in samples.items()},
        "spans_exported": exporter.spans,
    }


def _pin() -> None:
    """Keep this process on one CPU (Linux), the same one for every child.

    Where the scheduler puts the caller's and the actor's threads decides
    most of a round trip: on this kind of machine a bare ask takes ~18 us
    with both on one core and ~50 us across two, and a process may get
    either. Pinned, every process runs the same way and their p50s compare.
    """
    if hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[-1]})


def _run_child(args: list[str]) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "victor_actors.bench.otel", "--child", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"child {' '.join(args)} failed:\n{proc.stderr}")
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a short smoke run (a few seconds)")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _pin()
        kind, *rest = args.child
        rounds, n, warm = (int(x) for x in rest)
        result = (
            child_enabled(rounds, n, warm) if kind == "enabled" else child_disabled(kind, rounds, n, warm)
        )
        print(json.dumps(result))
        return

    # processes per side (in A B B A order), rounds and calls per block in each
    groups, rounds, n, warm = (1, 2, 300, 200) if args.quick else (2, 4, 1_500, 1_000)
    meta = {
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "pykka": version_of("pykka"),
        "opentelemetry_api": version_of("opentelemetry-api"),
        "opentelemetry_sdk": version_of("opentelemetry-sdk"),
        "victor_actors": version_of("victor-actors"),
        "cpus": os.cpu_count(),
        "mode": "quick" if args.quick else "default",
    }
    print(
        "victor_actors OpenTelemetry overhead benchmark\n" + "  ".join(f"{k}: {v}" for k, v in meta.items())
    )

    order = [side for _ in range(groups) for side in (*SIDES, *reversed(SIDES))]
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    for side in order:
        runs[side].append(_run_child([side, str(rounds), str(n), str(warm)]))
    for run in runs["plain"]:
        assert not run["opentelemetry_imported"] and not run["hooks_installed"], run
    for run in runs["imported"]:
        assert run["opentelemetry_imported"] and not run["hooks_installed"], run

    def med(side: str, key: str, stat: str = "median_us") -> float:
        return statistics.median(float(r[key][stat]) for r in runs[side])

    def med_norm(side: str) -> float:
        return statistics.median(float(r["apply"]["median_us"] / r["echo"]["median_us"]) for r in runs[side])

    disabled = {
        "processes_per_side": len(runs["plain"]),
        "rounds": rounds,
        "calls_per_block": n,
        "runs": runs,
        "plain_p50_us": med("plain", "apply"),
        "imported_p50_us": med("imported", "apply"),
        "plain_p99_us": med("plain", "apply", "p99_us"),
        "imported_p99_us": med("imported", "apply", "p99_us"),
        "ratio_p50": med("imported", "apply") / med("plain", "apply"),
        "ratio_p50_echo_normalised": med_norm("imported") / med_norm("plain"),
        "plain_p50_spread_us": [r["apply"]["median_us"] for r in runs["plain"]],
    }
    enabled = _run_child(["enabled", str(rounds), str(n), str(warm)])
    enabled["ratio_sdk_p50"] = enabled["sdk"]["median_us"] / enabled["off"]["median_us"]
    enabled["ratio_noop_p50"] = enabled["noop"]["median_us"] / enabled["off"]["median_us"]
    enabled["ratio_sdk_p99"] = enabled["sdk"]["p99_us"] / enabled["off"]["p99_us"]
    enabled["rounds"], enabled["calls_per_block"] = rounds, n

    print(f"\n1. not instrumented: {len(order)} processes (A B B A), {rounds} rounds x {n} applies each")
    print(f"{'':<4}{'what':<50}{'p50 us':>10}{'p99 us':>10}")
    for side, label in (
        ("plain", "victor_actors.otel never imported"),
        ("imported", "imported, not enabled"),
    ):
        print(f"{'':<4}{label:<50}{med(side, 'apply'):>10.2f}{med(side, 'apply', 'p99_us'):>10.2f}")
    print(f"    ratio imported / never imported (p50)             {disabled['ratio_p50']:>10.3f}x")
    normalised = disabled["ratio_p50_echo_normalised"]
    print(f"    the same, each process normalised by its echo ask {normalised:>10.3f}x")
    print(f"\n2. instrumented, one process, {rounds} interleaved rounds x {n} applies")
    for key, label in (
        ("off", "not instrumented"),
        ("sdk", "SDK, batched export"),
        ("noop", "no-op providers"),
    ):
        s = enabled[key]
        print(f"{'':<4}{label:<50}{s['median_us']:>10.2f}{s['p99_us']:>10.2f}")
    print(f"    ratio SDK / not instrumented (p50)                {enabled['ratio_sdk_p50']:>10.3f}x")
    print(f"    ratio no-op providers / not instrumented (p50)    {enabled['ratio_noop_p50']:>10.3f}x")
    print(f"    spans exported: {enabled['spans_exported']:,}")

    if args.json:
        out = {"meta": meta, "disabled": disabled, "enabled": enabled}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=2)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
