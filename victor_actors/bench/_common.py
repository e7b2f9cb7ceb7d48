"""What the benchmark modules share: the clock, gc off while timed, package versions."""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version

__all__ = ["no_gc", "ns", "quick_and_json", "version_of"]

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
