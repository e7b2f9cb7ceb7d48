"""What the benchmark modules share: the clock, gc off while timed, package versions, CPU time."""

from __future__ import annotations

import argparse
import gc
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version

__all__ = ["cpu_seconds", "no_gc", "ns", "quick_and_json", "version_of"]

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
