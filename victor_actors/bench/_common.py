"""What the benchmark modules share: the clock, gc off while timed, package versions, CPU time."""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from typing import Any

__all__ = ["cpu_seconds", "no_gc", "ns", "quick_and_json", "run_module", "version_of"]

ns = time.perf_counter_ns


@contextmanager
def no_gc() -> Iterator[None]:
    """gc off inside a timed block; pending garbage is collected first, outside the timer."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def version_of(dist: str) -> str | None:
    """The installed version of ``dist``, or None when it is not installed."""
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def quick_and_json(doc: str | None) -> argparse.Namespace:
    """The two flags every benchmark module takes: ``--quick`` and ``--json FILE``."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON")
    return parser.parse_args()


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time a process has used so far (0.0 if it is gone), from /proc/PID/stat."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            stat = fh.read()
    except OSError:
        return 0.0
    fields = stat[stat.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_module(
    doc: str | None,
    title: str,
    run: Callable[[bool], dict[str, Any]],
    print_report: Callable[[dict[str, Any]], None],
    packages: tuple[str, ...] = (),
) -> int:
    """A benchmark module's ``main``: its flags, a header, the run, its metadata, the report, the JSON.

    ``packages`` are the peers whose versions the header and the metadata name beside Python's.
    """
    from victor_actors.bench._machine import git_commit, load_average, source_checkout

    args = quick_and_json(doc)
    started = time.perf_counter()
    when = datetime.now(UTC).isoformat(timespec="seconds")
    checkout = source_checkout()
    peers = {name: version_of(name) for name in packages}
    print(title)
    named = "".join(f"  {name}: {v}" for name, v in peers.items())
    print(
        f"date: {when}  python: {platform.python_version()}{named}  cpus: {os.cpu_count()}  "
        f"load average: {load_average()}"
    )
    res = run(args.quick)
    res["meta"] = {
        "date": when,
        "python": platform.python_version(),
        "victor_actors": version_of("victor-actors"),
        **peers,
        "cpus": os.cpu_count(),
        "git_commit": None if checkout is None else git_commit(checkout),
        "load_average_end": load_average(),
    }
    res["seconds"] = time.perf_counter() - started
    print_report(res)
    print(f"\nwall time {res['seconds']:.1f} s")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(res, fh, indent=1)
        print(f"wrote {args.json}")
    return 0
