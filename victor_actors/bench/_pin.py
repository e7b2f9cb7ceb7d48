"""Pinning a benchmark process to one CPU while it measures latency.

A one-caller latency measurement (an ``apply`` round trip, a synced commit)
on a shared machine wanders with where the scheduler puts the caller and the
actor's thread: on two CPUs a hand-off may wake a thread on the other core,
or wait for it. Pinned to one CPU, every thread of the process shares it, so
the figure is the work and the hand-offs themselves, as a ``taskset -c N``
run would measure them.

On Linux ``os.sched_setaffinity(0, ...)`` changes the calling thread only;
:func:`pinned` sets the mask of every thread of the process
(``/proc/self/task``), and restores each one's on exit; threads started
while pinned inherit the mask from their creator and are restored too.
Where affinity cannot be set (not Linux, a restricted container) it pins
nothing and says so in :attr:`Pin.how`.

``VICTOR_ACTORS_BENCH_CPU`` chooses the CPU (default: the highest one this
process may run on).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

__all__ = ["CPU_ENV", "Pin", "choose_cpu", "pinned"]

CPU_ENV = "VICTOR_ACTORS_BENCH_CPU"


@dataclass
class Pin:
    """Where a block ran: ``cpu`` (None when nothing was pinned) and a phrase for the row's note."""

    cpu: int | None
    how: str

    def as_json(self) -> dict[str, object]:
        return {"cpu": self.cpu, "how": self.how}


def _allowed() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set()


def choose_cpu() -> int | None:
    """The CPU to pin to: ``$VICTOR_ACTORS_BENCH_CPU`` if set and allowed, else the highest allowed."""
    allowed = _allowed()
    if not allowed:
        return None
    wanted = os.environ.get(CPU_ENV, "").strip()
    if wanted.isdigit() and int(wanted) in allowed:
        return int(wanted)
    return max(allowed)


def _tasks() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]


def _set(tid: int, cpus: set[int]) -> bool:
    try:
        os.sched_setaffinity(tid, cpus)
    except (AttributeError, OSError):  # a thread that ended meanwhile, or no affinity here
        return False
    return True


@contextmanager
def pinned(what: str = "own process") -> Iterator[Pin]:
    """Every thread of this process on one CPU inside the block; each thread's mask restored after."""
    cpu = choose_cpu()
    if cpu is None:
        yield Pin(None, f"not pinned ({what}: CPU affinity is not available here)")
        return
    before: dict[int, set[int]] = {}
    for tid in _tasks():
        try:
            before[tid] = set(os.sched_getaffinity(tid))
        except OSError:
            continue
        _set(tid, {cpu})
    if not before:
        yield Pin(None, f"not pinned ({what}: its threads' affinity could not be set)")
        return
    try:
        yield Pin(cpu, f"pinned: {what}, every thread, to CPU {cpu}")
    finally:
        allowed = set().union(*before.values())
        for tid in _tasks():  # threads started inside the block inherited the pin: widen them too
            _set(tid, before.get(tid, allowed))
