"""``victor-actors bench``: the benchmarks, each in a fresh process, ratios side by side.

The benchmark scripts live in the source checkout (``benchmarks/``), next to the
package. Each one runs in its own subprocess (a shared interpreter skews
results: threads, the allocator and the GIL carry over) with ``--json``; this
module collects their JSON, prints one table of measured values with their
same-run baselines, and checks each of the issue's targets against them.
Targets are for benchmarks, never timed tests: a missed target is reported,
not failed. ``benchmarks/report.py`` turns the JSON into ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

__all__ = ["BENCHMARKS", "TARGETS", "add_parser", "benchmarks_dir", "evaluate", "run_command"]

Json = Any
PROG = "victor-actors bench"
INSTALL_HINT = "pip install -e '.[bench]'"
SCHEMA = 1
PACKAGES = (
    "victor-actors",
    "pykka",
    "immutables",
    "lmdb",
    "msgpack",
    "zstandard",
    "langgraph",
    "langgraph-checkpoint",
    "langgraph-checkpoint-sqlite",
    "matplotlib",
)
# An importable module each optional dependency must provide, and the distribution to name.
_DISTRIBUTIONS = {
    "langgraph": "langgraph",
    "langgraph.checkpoint.sqlite": "langgraph-checkpoint-sqlite",
    "langgraph_checkpoint_lmdb": "langgraph-checkpoint-lmdb",
}


@dataclass(frozen=True)
class Bench:
    name: str
    script: str
    about: str
    needs: tuple[str, ...] = ()  # modules that must import (the bench extra)
    default: bool = True  # part of a plain ``victor-actors bench``
    timeout: float = 3600.0


BENCHMARKS: dict[str, Bench] = {
    b.name: b
    for b in (
        Bench(
            "core", "bench_core.py", "apply round trip vs a pykka echo ask; snapshot at 10 vs 100,000 keys"
        ),
        Bench("pipeline", "bench_pipeline.py", "pipelined aapply vs raw pykka tell, at 10 and 100,000 keys"),
        Bench(
            "startup", "bench_startup.py", "start-up of 1,000 and 10,000 scope actors vs bare pykka actors"
        ),
        Bench(
            "store",
            "bench_store.py",
            "durable commits/s vs SqliteSaver puts; bytes on disk after 1,000 steps",
            needs=("langgraph", "langgraph.checkpoint.sqlite"),
        ),
        Bench(
            "agent",
            "bench_agent.py",
            "agent step vs a one-node LangGraph StateGraph with SqliteSaver",
            needs=("langgraph", "langgraph.checkpoint.sqlite"),
        ),
        Bench("scale", "bench_scale.py", "passivation of 100,000 conversations under a cap", default=False),
        Bench(
            "langgraph",
            "bench_langgraph.py",
            "LangGraph checkpointers side by side (ours, SqliteSaver, LMDBSaver)",
            needs=("langgraph", "langgraph.checkpoint.sqlite", "langgraph_checkpoint_lmdb"),
            default=False,
        ),
    )
}


def benchmarks_dir() -> Path:
    """Where the benchmark scripts are: ``benchmarks/`` of the source checkout, beside the package."""
    import victor_actors

    return Path(victor_actors.__file__).resolve().parent.parent / "benchmarks"


def missing_dependency(bench: Bench) -> str | None:
    """Why ``bench`` cannot run here (an optional dependency is missing), or None."""
    for module in bench.needs:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return f"{_DISTRIBUTIONS.get(module, module)} not installed ({INSTALL_HINT})"
    return None


# -- rows: measured values with their same-run baselines ------------------------------------------


@dataclass(frozen=True)
class RowSpec:
    """One line of the table: ``ours`` against ``baseline``, ratio = ours / baseline."""

    id: str
    bench: str
    what: str
    unit: str  # of ours and baseline: "us", "ops/s", "B", "s", "steps/s"
    better: str  # "lower" or "higher": which way the ratio is good
    values: Callable[[Json], tuple[float, float, str]]  # the bench's JSON -> (ours, baseline, note)


def _lat(r: Json, key: str, stat: str) -> float:
    return float(r["latency"][key][stat])


def _core_apply(stat: str) -> Callable[[Json], tuple[float, float, str]]:
    def values(r: Json) -> tuple[float, float, str]:
        n = r["latency"]["apply1"]["n"]
        note = f"{n:,} calls; of which the apply call {_lat(r, 'apply1_call', stat):.1f} us"
        return _lat(r, "apply1", stat), _lat(r, "echo", stat), note

    return values


def _core_aapply(r: Json) -> tuple[float, float, str]:
    return _lat(r, "aapply1", "median_us"), _lat(r, "echo", "median_us"), "asyncio twin, one at a time"


def _core_snapshot(stat: str) -> Callable[[Json], tuple[float, float, str]]:
    def values(r: Json) -> tuple[float, float, str]:
        copy = _lat(r, "copy_dict", "median_us")
        return _lat(r, "snap100k", stat), _lat(r, "snap10", stat), f"a dict copy of 100k keys: {copy:,.0f} us"

    return values


def _pipe(key: str, base: str = "tell") -> Callable[[Json], tuple[float, float, str]]:
    def values(r: Json) -> tuple[float, float, str]:
        note = f"{r['in_flight']:,} in flight x {r['rounds']} rounds"
        return float(r["throughput"][key]["per_s"]), float(r["throughput"][base]["per_s"]), note

    return values


def _store_rate(key: str, base: str = "sqlite_put") -> Callable[[Json], tuple[float, float, str]]:
    def values(r: Json) -> tuple[float, float, str]:
        acc = r["throughput"][key]
        note = f"{acc['store_commits'] / acc['store_txns']:.1f} commits/txn" if acc.get("store_txns") else ""
        return float(acc["rate"]), float(r["throughput"][base]["rate"]), note

    return values


def _storage_vs_final(r: Json) -> tuple[float, float, str]:
    st = r["storage"]
    ours = st["ours"]
    note = f"{st['steps']:,} steps; {ours['kept']}"
    return float(ours["data_mdb"]["size"]), float(ours["final_state_bytes"]), note


def _storage_scope(r: Json) -> tuple[float, float, str]:
    ours = r["storage"]["ours"]
    return float(ours["scope_bytes"]), float(ours["final_state_bytes"]), "size_of(scope): its own records"


def _storage_vs_plain(r: Json) -> tuple[float, float, str]:
    st = r["storage"]
    return (
        float(st["ours"]["data_mdb"]["size"]),
        float(st["plain_msgpack_bytes"]),
        "final state, plain msgpack",
    )


def _storage_vs_sqlite(r: Json) -> tuple[float, float, str]:
    st = r["storage"]
    note = f"SqliteSaver's final state {st['sqlite']['final_state_bytes']:,} B"
    return float(st["ours"]["data_mdb"]["size"]), float(st["sqlite"]["file"]["size"]), note


def _agent(key: str) -> Callable[[Json], tuple[float, float, str]]:
    def values(r: Json) -> tuple[float, float, str]:
        note = f"{r['rounds']} rounds x {r['steps']} steps from 100 messages"
        return float(r["rates"][key]), float(r["rates"]["langgraph_sqlite"]), note

    return values


def _startup_sizes(r: Json) -> list[str]:
    return sorted(r["sizes"], key=int)


def _startup(which: int) -> Callable[[Json], tuple[float, float, str]]:
    def values(r: Json) -> tuple[float, float, str]:
        size = r["sizes"][_startup_sizes(r)[which]]
        ours, bare = size["ours"], size["bare"]
        kib = (
            f"{ours['rss_per_actor_bytes'] / 1024:.1f} vs {bare['rss_per_actor_bytes'] / 1024:.1f} KiB/actor"
        )
        rounds = size["rounds"]
        note = f"{size['actors']:,} actors, {rounds} round{'' if rounds == 1 else 's'}; {kib}"
        return float(ours["start_s"]), float(bare["start_s"]), note

    return values


_R = RowSpec
ROWS: tuple[RowSpec, ...] = (
    _R("apply_p50", "core", "apply round trip p50 / pykka echo ask p50", "us", "lower",
       _core_apply("median_us")),
    _R("apply_p99", "core", "apply round trip p99 / pykka echo ask p99", "us", "lower",
       _core_apply("p99_us")),
    _R("aapply_p50", "core", "aapply round trip p50 / pykka echo ask p50", "us", "lower", _core_aapply),
    _R("snapshot_p50", "core", "snapshot() p50 at 100,000 keys / at 10 keys", "us", "lower",
       _core_snapshot("median_us")),
    _R("snapshot_p99", "core", "snapshot() p99 at 100,000 keys / at 10 keys", "us", "lower",
       _core_snapshot("p99_us")),
    _R("pipeline_10", "pipeline", "pipelined aapply, 10-key scope / raw pykka tell", "ops/s", "higher",
       _pipe("aapply_10")),
    _R("pipeline_100k", "pipeline", "pipelined aapply, 100,000-key scope / raw pykka tell", "ops/s", "higher",
       _pipe("aapply_100k")),
    _R("pipeline_flat", "pipeline", "pipelined aapply at 100,000 keys / at 10 keys", "ops/s", "higher",
       _pipe("aapply_100k", "aapply_10")),
    _R("pipeline_futures", "pipeline", "sync pipelined apply (pykka futures) / raw tell", "ops/s", "higher",
       _pipe("futures_10")),
    _R("durable_1", "store", "durable commits/s, 1 scope / SqliteSaver put", "ops/s", "higher",
       _store_rate("sync1")),
    _R("durable_100", "store", "durable commits/s, 100 scopes / SqliteSaver put", "ops/s", "higher",
       _store_rate("sync100")),
    _R("durable_raw", "store", "durable commits/s, 1 scope / raw LMDB synced txn", "ops/s", "higher",
       _store_rate("sync1", "raw_lmdb")),
    _R("storage", "store", "bytes on disk after the conversation / final state", "B", "lower",
       _storage_vs_final),
    _R("storage_scope", "store", "the scope's stored records / final state", "B", "lower", _storage_scope),
    _R("storage_plain", "store", "bytes on disk / final state as plain msgpack", "B", "lower",
       _storage_vs_plain),
    _R("storage_sqlite", "store", "bytes on disk / SqliteSaver's file, same run", "B", "lower",
       _storage_vs_sqlite),
    _R("agent", "agent", "agent step, durable / LangGraph 1-node StateGraph", "steps/s", "higher",
       _agent("ours_sync")),
    _R("agent_memory", "agent", "agent step, in memory / LangGraph 1-node StateGraph", "steps/s", "higher",
       _agent("ours_memory")),
    _R("startup_small", "startup", "start N scope actors / N bare pykka actors (smaller N)", "s", "lower",
       _startup(0)),
    _R("startup_large", "startup", "start N scope actors / N bare pykka actors (larger N)", "s", "lower",
       _startup(1)),
)  # fmt: skip


# -- targets: the issue's, checked against the rows -------------------------------------------------


def _f(x: float) -> str:
    return f"{x:,.2f}" if abs(x) < 10 else f"{x:,.1f}" if abs(x) < 100 else f"{x:,.0f}"


def _why_apply(stat: str, label: str) -> Callable[[dict[str, Json]], str]:
    def why(res: dict[str, Json]) -> str:
        r = res["core"]
        apply, call, echo = _lat(r, "apply1", stat), _lat(r, "apply1_call", stat), _lat(r, "echo", stat)
        return (
            f"apply {label} {_f(apply)} us vs echo {_f(echo)} us: {_f(apply - call)} us building (and "
            f"validating) the batch, then the apply call alone is {_f(call)} us, {_f(call - echo)} us more "
            "than a bare ask (request set-up, the reducer, the commit record)"
        )

    return why


def _why_snapshot(res: dict[str, Json]) -> str:
    r = res["core"]
    big, small = _lat(r, "snap100k", "median_us"), _lat(r, "snap10", "median_us")
    p99 = _lat(r, "snap100k", "p99_us") / _lat(r, "snap10", "p99_us")
    return (
        f"p50 {_f(big)} us at 100,000 keys vs {_f(small)} us at 10 (p99 ratio {p99:.2f}x): "
        f"{(big - small) * 1000:,.0f} ns more on a call that copies nothing (a dict copy of the 100k "
        f"keys takes {_lat(r, 'copy_dict', 'median_us'):,.0f} us)"
    )


def _why_pipeline(size: str) -> Callable[[dict[str, Json]], str]:
    def why(res: dict[str, Json]) -> str:
        tp = res["pipeline"]["throughput"]
        us = {k: 1e6 / v["per_s"] for k, v in tp.items()}
        return (
            f"{_f(us['aapply_' + size])} us per pipelined aapply vs {_f(us['tell'])} us per raw tell; "
            f"without asyncio (pykka futures) still {_f(us['futures_' + size])} us, and "
            f"{_f(us['prebuilt_' + size])} us with the batches built beforehand: the work per request "
            "(request set-up, the reducer, the commit record, the reply) dominates, not the mailbox"
        )

    return why


def _why_flat(res: dict[str, Json]) -> str:
    tp = res["pipeline"]["throughput"]
    big, small = tp["aapply_100k"]["per_s"], tp["aapply_10"]["per_s"]
    pre = tp["prebuilt_100k"]["per_s"] / tp["prebuilt_10"]["per_s"]
    fut = tp["futures_100k"]["per_s"] / tp["futures_10"]["per_s"]
    return (
        f"{big:,.0f} ops/s at 100,000 keys vs {small:,.0f} at 10; the same ratio is {pre:.2f}x with "
        f"prebuilt batches and {fut:.2f}x without asyncio"
    )


def _ms(rate: float) -> str:
    return f"{1000 / rate:.2f} ms" if rate else "-"


def _why_durable_1(res: dict[str, Json]) -> str:
    tp = res["store"]["throughput"]
    ours, sq, raw = tp["sync1"]["rate"], tp["sqlite_put"]["rate"], tp["raw_lmdb"]["rate"]
    return (
        f"{_ms(ours)} per durable commit ({ours:,.0f}/s) vs {_ms(sq)} per SqliteSaver put; a bare synced "
        f"LMDB txn of one ~300 B value takes {_ms(raw)} here (ours is {ours / raw:.2f}x of it), so even "
        f"that floor is only {raw / sq:.2f}x SqliteSaver on this disk; ours in memory: "
        f"{tp['mem1']['rate']:,.0f}/s"
    )


def _why_durable_100(res: dict[str, Json]) -> str:
    tp = res["store"]["throughput"]
    acc, sq, raw = tp["sync100"], tp["sqlite_put"]["rate"], tp["raw_lmdb"]["rate"]
    per_txn = acc["store_commits"] / acc["store_txns"] if acc.get("store_txns") else 1.0
    txns = acc["rate"] / per_txn
    cpus = (res["store"].get("meta") or {}).get("cpus", "?")
    return (
        f"{acc['rate']:,.0f} commits/s vs {sq:,.0f} puts/s: group commit packs {per_txn:.0f} commits into "
        f"each synced txn, but only {txns:,.0f} txns/s ({_ms(txns)} each; a bare synced txn takes "
        f"{_ms(raw)}); async mode, which never waits for the disk, does {tp['async100']['rate']:,.0f}/s "
        f"with the same 100 threads, so the CPU ({cpus} CPUs for 100 clients and 100 actors) bounds it"
    )


def _why_agent(res: dict[str, Json]) -> str:
    rates = res["agent"]["rates"]
    return (
        f"{rates['ours_sync']:,.0f} steps/s durable vs {rates['langgraph_sqlite']:,.0f} for LangGraph; "
        f"in memory ours does {rates['ours_memory']:,.0f}/s, so the synced commit per step bounds it"
    )


def _why_storage(res: dict[str, Json]) -> str:
    st = res["store"]["storage"]
    ours = st["ours"]
    final, size, scope = ours["final_state_bytes"], ours["data_mdb"]["size"], ours["scope_bytes"]
    return (
        f"data.mdb {size:,} B vs a {final:,} B zstd-encoded final state; the scope's own records "
        f"({ours['kept']}) are {scope:,} B ({scope / final:.1f}x), the other {size - scope:,} B are LMDB "
        f"pages, free space and the other tables; against the {st['plain_msgpack_bytes']:,} B plain msgpack "
        f"state the file is {size / st['plain_msgpack_bytes']:.1f}x"
    )


@dataclass(frozen=True)
class TargetSpec:
    id: str
    text: str
    row: str  # the row whose ratio is measured
    op: str  # "<=" or ">="
    threshold: float
    why: Callable[[dict[str, Json]], str] = field(repr=False)


TARGETS: tuple[TargetSpec, ...] = (
    TargetSpec("apply_p50", "apply p50 <= 1.15x the pykka echo ask", "apply_p50", "<=", 1.15,
               _why_apply("median_us", "p50")),
    TargetSpec("apply_p99", "apply p99 <= 1.5x the pykka echo ask", "apply_p99", "<=", 1.5,
               _why_apply("p99_us", "p99")),
    TargetSpec("pipeline_10", "pipelined apply >= 0.5x raw tell (10 keys)", "pipeline_10", ">=", 0.5,
               _why_pipeline("10")),
    TargetSpec("pipeline_100k", "pipelined apply >= 0.5x raw tell (100,000 keys)", "pipeline_100k", ">=", 0.5,
               _why_pipeline("100k")),
    TargetSpec("pipeline_flat", "pipelined apply flat to 100,000 keys (>= 0.9x the rate at 10)",
               "pipeline_flat", ">=", 0.9, _why_flat),
    TargetSpec("snapshot", "snapshot at 100,000 keys <= 1.1x at 10 keys (p50)", "snapshot_p50", "<=", 1.1,
               _why_snapshot),
    TargetSpec("durable_1", "durable commits, 1 scope >= 2x SqliteSaver puts", "durable_1", ">=", 2.0,
               _why_durable_1),
    TargetSpec("durable_100", "durable commits, 100 scopes (group commit) >= 25x SqliteSaver puts",
               "durable_100", ">=", 25.0, _why_durable_100),
    TargetSpec("agent", "agent step >= 10x a LangGraph step (SqliteSaver)", "agent", ">=", 10.0, _why_agent),
    TargetSpec("storage", "bytes on disk after 1,000 steps <= 3x the final state", "storage", "<=", 3.0,
               _why_storage),
)  # fmt: skip


def _row(spec: RowSpec, results: dict[str, Json], status: dict[str, str]) -> dict[str, Any]:
    row: dict[str, Any] = {"id": spec.id, "bench": spec.bench, "what": spec.what, "unit": spec.unit}
    row |= {"better": spec.better, "ours": None, "baseline": None, "ratio": None, "note": ""}
    if spec.bench not in results:
        row["note"] = status.get(spec.bench, "not run")
        return row
    try:
        ours, base, note = spec.values(results[spec.bench])
    except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError) as exc:
        row["note"] = f"not in this run's JSON ({type(exc).__name__}: {exc})"
        return row
    row |= {"ours": ours, "baseline": base, "ratio": ours / base if base else None, "note": note}
    return row


def evaluate(
    results: dict[str, Json], status: dict[str, str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Rows and target verdicts from each benchmark's JSON (``status``: why a bench has none)."""
    rows = [_row(spec, results, status) for spec in ROWS]
    by_id = {row["id"]: row for row in rows}
    targets = []
    for t in TARGETS:
        row = by_id[t.row]
        out: dict[str, Any] = {"id": t.id, "target": t.text, "op": t.op, "threshold": t.threshold}
        out |= {"bench": row["bench"], "row": t.row, "measured": row["ratio"], "why": ""}
        measured = row["ratio"]
        if measured is None:
            out["verdict"] = "NOT RUN"
            out["why"] = row["note"]
        else:
            met = measured <= t.threshold if t.op == "<=" else measured >= t.threshold
            out["verdict"] = "MET" if met else "MISSED"
            if not met:
                try:
                    out["why"] = t.why(results)
                except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
                    out["why"] = f"(no explanation: {type(exc).__name__}: {exc})"
        targets.append(out)
    return rows, targets


# -- the machine --------------------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _memory_bytes() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _git_commit(root: Path) -> str | None:
    try:
        proc = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, timeout=10, check=False,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def machine() -> dict[str, Any]:
    """What the report needs to say where the numbers come from."""
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = None
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count() or 0
    return {
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpu_model": _cpu_model(),
        "cpus": os.cpu_count(),
        "cpus_usable": usable,
        "memory_bytes": _memory_bytes(),
        "platform": platform.platform(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "packages": versions,
        "load_average_start": _load(),
    }


# -- running --------------------------------------------------------------------------------------------


def _names(only: list[str] | None) -> list[str]:
    if not only:
        return [name for name, b in BENCHMARKS.items() if b.default]
    names: list[str] = []
    for chunk in only:
        for name in chunk.replace(",", " ").split():
            if name not in BENCHMARKS:
                known = ", ".join(BENCHMARKS)
                raise ValueError(f"--only: no benchmark named {name!r} (known: {known})")
            if name not in names:
                names.append(name)
    if not names:
        raise ValueError("--only names no benchmark")
    return names


def _missing_module(stderr: str) -> str | None:
    """The module a child could not import (``ModuleNotFoundError``), if that is why it failed."""
    marker = "ModuleNotFoundError: No module named '"
    at = stderr.rfind(marker)
    if at < 0:
        return None
    return stderr[at + len(marker) :].split("'", 1)[0]


def run_one(bench: Bench, where: Path, quick: bool) -> dict[str, Any]:
    """Run one benchmark script in a fresh process; its status, wall time, JSON and output."""
    out: dict[str, Any] = {"script": f"benchmarks/{bench.script}", "about": bench.about}
    missing = missing_dependency(bench)
    if missing is not None:
        return out | {"status": "skipped", "reason": missing, "seconds": 0.0}
    script = where / bench.script
    if not script.is_file():
        return out | {"status": "failed", "reason": f"{script} is missing", "seconds": 0.0}
    env = dict(os.environ)
    root = str(where.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    with tempfile.TemporaryDirectory(prefix="victor-actors-bench-") as tmp:
        json_path = os.path.join(tmp, f"{bench.name}.json")
        cmd = [sys.executable, str(script), "--json", json_path] + (["--quick"] if quick else [])
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(
                cmd, cwd=root, env=env, capture_output=True, text=True, timeout=bench.timeout, check=False
            )
        except subprocess.TimeoutExpired:
            return out | {"status": "failed", "reason": f"timed out after {bench.timeout:.0f} s",
                          "seconds": time.perf_counter() - t0}  # fmt: skip
        out["seconds"] = time.perf_counter() - t0
        out["stdout"] = proc.stdout
        if proc.returncode != 0 or not os.path.exists(json_path):
            module = _missing_module(proc.stderr)
            if module is not None and module.split(".")[0].startswith("langgraph"):
                dist = _DISTRIBUTIONS.get(module, module.split(".")[0])
                return out | {"status": "skipped", "reason": f"{dist} not installed ({INSTALL_HINT})"}
            tail = " | ".join(proc.stderr.strip().splitlines()[-3:]) or "no output on stderr"
            return out | {"status": "failed", "reason": f"exit status {proc.returncode}: {tail}",
                          "stderr": proc.stderr}  # fmt: skip
        with open(json_path, encoding="utf-8") as fh:
            out["result"] = json.load(fh)
    return out | {"status": "ok"}


# -- the table ------------------------------------------------------------------------------------------


def fmt_value(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "us":
        return f"{value:,.2f} us"
    if unit == "s":
        return f"{value:,.3f} s"
    if unit == "B":
        return f"{value:,.0f} B"
    return f"{value:,.0f} {unit}"


def fmt_ratio(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 0.1:
        return f"{value:.2g}x"
    return f"{value:.2f}x" if value < 100 else f"{value:,.0f}x"


def table(doc: dict[str, Any]) -> str:
    """The terminal report of one ``bench`` run."""
    lines: list[str] = []
    meta = doc["meta"]
    mem = meta.get("memory_bytes")
    memory = f"{mem / 2**30:.1f} GiB" if mem else "memory unknown"
    lines.append(
        f"machine: {meta['cpu_model']}, {meta['cpus_usable']} usable of {meta['cpus']} CPUs, {memory}, "
        f"{meta['python']}; load average at start {meta.get('load_average_start')}"
    )
    lines.append("")
    lines.append(f"{'BENCHMARK':<11}{'STATUS':<9}{'WALL':>9}  ABOUT")
    for name, b in doc["benchmarks"].items():
        wall = f"{b.get('seconds', 0.0):.1f} s"
        lines.append(f"{name:<11}{b['status']:<9}{wall:>9}  {b['about']}")
        if b["status"] != "ok":
            lines.append(f"{'':<20}  {b['reason']}")
    lines.append("")
    w = max(len(r["what"]) for r in doc["rows"]) + 2
    lines.append(
        f"{'MEASURED (same run; ratio = ours / baseline)':<{w}}{'OURS':>17}{'BASELINE':>17}{'RATIO':>9}"
    )
    bench = None
    for r in doc["rows"]:
        if r["bench"] != bench:
            bench = r["bench"]
            lines.append(f"[{bench}]")
            if bench not in doc["benchmarks"] or doc["benchmarks"][bench]["status"] != "ok":
                lines.append(f"    {r['note']}")
        if r["bench"] not in doc["benchmarks"] or doc["benchmarks"][r["bench"]]["status"] != "ok":
            continue
        if r["ratio"] is None:
            lines.append(f"{r['what']:<{w}}{'-':>17}{'-':>17}{'-':>9}  {r['note']}")
            continue
        ours, base = fmt_value(r["ours"], r["unit"]), fmt_value(r["baseline"], r["unit"])
        lines.append(f"{r['what']:<{w}}{ours:>17}{base:>17}{fmt_ratio(r['ratio']):>9}  {r['note']}")
    lines.append("")
    tw = max(len(t["target"]) for t in doc["targets"]) + 2
    lines.append(f"{'TARGET':<{tw}}{'MEASURED':>10}  VERDICT")
    for t in doc["targets"]:
        lines.append(f"{t['target']:<{tw}}{fmt_ratio(t['measured']):>10}  {t['verdict']}")
        if t["why"] and t["verdict"] == "MISSED":
            lines.append(f"    why: {t['why']}")
        elif t["why"]:
            lines[-1] += f"  ({t['why']})"
    counts = {v: sum(1 for t in doc["targets"] if t["verdict"] == v) for v in ("MET", "MISSED", "NOT RUN")}
    lines.append("targets: " + ", ".join(f"{n} {v}" for v, n in counts.items() if n or v != "NOT RUN"))
    return "\n".join(lines)


# -- the command ----------------------------------------------------------------------------------------


def add_parser(sub: Any) -> None:
    """Add ``bench`` to the command line's subcommands."""
    text = "run the benchmarks, each in a fresh process, and check the targets (needs the source checkout)"
    p = sub.add_parser("bench", help=text, description=text)
    p.add_argument("--quick", action="store_true", help="a short smoke run of each benchmark (noisy numbers)")
    p.add_argument(
        "--json", metavar="FILE", help="write every result, the rows and the targets as JSON to FILE"
    )
    defaults = ", ".join(n for n, b in BENCHMARKS.items() if b.default)
    extra = ", ".join(n for n, b in BENCHMARKS.items() if not b.default)
    p.add_argument(
        "--only",
        action="append",
        metavar="NAMES",
        help=f"comma-separated benchmarks to run (default: {defaults}; also available: {extra})",
    )


def run_command(args: argparse.Namespace) -> int:
    """``victor-actors bench``: 0 when every selected benchmark ran or was skipped, 1 if one failed, 2 on
    a usage error or without the benchmark scripts."""
    try:
        names = _names(args.only)
    except ValueError as exc:
        print(f"victor-actors: error: {exc}", file=sys.stderr)
        return 2
    where = benchmarks_dir()
    if not where.is_dir():
        print(
            f"victor-actors: error: no benchmark scripts at {where}: they ship with the source checkout "
            "(git clone the project and pip install -e '.[bench]' from it), not with the installed package",
            file=sys.stderr,
        )
        return 2
    mode = "quick" if args.quick else "default"
    print(f"{PROG}: {len(names)} benchmark(s), each in a fresh process ({mode} mode); scripts in {where}")
    doc: dict[str, Any] = {"schema": SCHEMA, "mode": mode, "meta": machine(), "benchmarks": {}}
    doc["meta"]["git_commit"] = _git_commit(where.parent)
    wall0 = time.perf_counter()
    for i, name in enumerate(names, 1):
        print(f"[{i}/{len(names)}] {name}: {BENCHMARKS[name].about} ...", flush=True)
        res = run_one(BENCHMARKS[name], where, args.quick)
        doc["benchmarks"][name] = res
        done = f"{res['status']} in {res.get('seconds', 0.0):.1f} s"
        print(f"      {done}" + ("" if res["status"] == "ok" else f": {res['reason']}"), flush=True)
    doc["wall_seconds"] = time.perf_counter() - wall0
    doc["meta"]["load_average_end"] = _load()
    results = {n: b["result"] for n, b in doc["benchmarks"].items() if b["status"] == "ok"}
    status = {n: f"{b['status']}: {b['reason']}" for n, b in doc["benchmarks"].items() if b["status"] != "ok"}
    for unselected in {spec.bench for spec in ROWS} - set(doc["benchmarks"]):
        status[unselected] = "not selected (--only)"
    doc["rows"], doc["targets"] = evaluate(results, status)
    print()
    print(table(doc))
    print(f"\nwall time {doc['wall_seconds']:.1f} s")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2)
        print(f"wrote {args.json}; docs: python benchmarks/report.py {args.json}")
    return 1 if any(b["status"] == "failed" for b in doc["benchmarks"].values()) else 0
