"""What the benchmark modules share: the clock, gc off while timed, package versions."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version

__all__ = ["no_gc", "ns", "version_of"]

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
