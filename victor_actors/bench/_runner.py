"""``victor-actors bench``: run the benchmarks, each in a fresh process, and collect their JSON.

Each benchmark is a module of this package, run as ``python -m <module>
--json FILE`` in its own subprocess (a shared interpreter skews results:
threads, the allocator and the GIL carry over), from a temporary directory,
so it works from an installed package as well as from a checkout.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from victor_actors.bench._machine import default_out, git_commit, load_average, machine, source_checkout
from victor_actors.bench._registry import BENCHMARKS, INSTALL_HINT, Bench, distribution, missing_dependency
from victor_actors.bench._table import table
from victor_actors.bench._targets import evaluate

__all__ = ["add_parser", "run_command", "run_one"]

PROG = "victor-actors bench"
SCHEMA = 1


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


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def run_one(bench: Bench, quick: bool) -> dict[str, Any]:
    """Run one benchmark module in a fresh process; its status, wall time, JSON and output."""
    out: dict[str, Any] = {"module": bench.module, "about": bench.about}
    missing = missing_dependency(bench)
    if missing is not None:
        return out | {"status": "skipped", "reason": missing, "seconds": 0.0}
    if not _importable(bench.module):
        return out | {"status": "failed", "reason": f"no module {bench.module} here", "seconds": 0.0}
    with tempfile.TemporaryDirectory(prefix="victor-actors-bench-") as tmp:
        json_path = os.path.join(tmp, f"{bench.name}.json")
        cmd = [sys.executable, "-m", bench.module, "--json", json_path] + (["--quick"] if quick else [])
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(
                cmd, cwd=tmp, capture_output=True, text=True, timeout=bench.timeout, check=False
            )
        except subprocess.TimeoutExpired:
            return out | {"status": "failed", "reason": f"timed out after {bench.timeout:.0f} s",
                          "seconds": time.perf_counter() - t0}  # fmt: skip
        out["seconds"] = time.perf_counter() - t0
        out["stdout"] = proc.stdout
        if proc.returncode != 0 or not os.path.exists(json_path):
            module = _missing_module(proc.stderr)
            if module is not None and module.split(".")[0].startswith("langgraph"):
                reason = f"{distribution(module)} not installed ({INSTALL_HINT})"
                return out | {"status": "skipped", "reason": reason}
            tail = " | ".join(proc.stderr.strip().splitlines()[-3:]) or "no output on stderr"
            return out | {"status": "failed", "reason": f"exit status {proc.returncode}: {tail}",
                          "stderr": proc.stderr}  # fmt: skip
        with open(json_path, encoding="utf-8") as fh:
            out["result"] = json.load(fh)
    return out | {"status": "ok"}


def add_parser(sub: Any) -> None:
    """Add ``bench`` to the command line's subcommands."""
    text = "run the benchmarks, each in a fresh process, and check the targets"
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
    """``victor-actors bench``: 0 when every selected benchmark ran or was skipped, 1 if one failed,
    2 on a usage error."""
    try:
        names = _names(args.only)
    except ValueError as exc:
        print(f"victor-actors: error: {exc}", file=sys.stderr)
        return 2
    mode = "quick" if args.quick else "default"
    print(f"{PROG}: {len(names)} benchmark(s), each in a fresh process ({mode} mode)")
    doc: dict[str, Any] = {"schema": SCHEMA, "mode": mode, "meta": machine(), "benchmarks": {}}
    checkout = source_checkout()
    doc["meta"]["git_commit"] = None if checkout is None else git_commit(checkout)
    wall0 = time.perf_counter()
    for i, name in enumerate(names, 1):
        print(f"[{i}/{len(names)}] {name}: {BENCHMARKS[name].about} ...", flush=True)
        res = run_one(BENCHMARKS[name], args.quick)
        doc["benchmarks"][name] = res
        done = f"{res['status']} in {res.get('seconds', 0.0):.1f} s"
        print(f"      {done}" + ("" if res["status"] == "ok" else f": {res['reason']}"), flush=True)
    doc["wall_seconds"] = time.perf_counter() - wall0
    doc["meta"]["load_average_end"] = load_average()
    results = {n: b["result"] for n, b in doc["benchmarks"].items() if b["status"] == "ok"}
    status = {n: f"{b['status']}: {b['reason']}" for n, b in doc["benchmarks"].items() if b["status"] != "ok"}
    rows, targets = evaluate(results, status)
    # Only what was asked for: the rows and targets of the benchmarks selected (run, skipped or failed).
    doc["rows"] = [r for r in rows if r["bench"] in doc["benchmarks"]]
    doc["targets"] = [t for t in targets if t["bench"] in doc["benchmarks"]]
    print()
    print(table(doc))
    print(f"\nwall time {doc['wall_seconds']:.1f} s")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2)
        print(f"wrote {args.json}")
        print(
            f"its report (markdown and figures): python -m victor_actors.bench.report {args.json}  "
            f"(writes {default_out(args.json)}/)"
        )
    return 1 if any(b["status"] == "failed" for b in doc["benchmarks"].values()) else 0
