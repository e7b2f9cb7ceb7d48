"""The clock every deadline is read from: the real one, or a virtual one a deterministic simulation installs.

The runtime decides deadlines (has a request expired, is a run past its
timeout, how long a transaction's participant waits for its coordinator,
when a supervisor's restart window ends, which scope has been idle long
enough to passivate) by reading ``_clock.monotonic()``, and stamps records
with ``_clock.time()``. Both are module attributes, bound to
``time.monotonic`` and ``time.time`` by default, so a read costs what
``time.monotonic()`` costs: one module attribute and one call.

A :class:`VirtualClock`, installed with :func:`use_clock` (the deterministic
mode of ``victor_actors.sim.Simulation`` does), rebinds them. Its time moves
only when something advances it (the simulation's scheduler, between steps,
by amounts drawn from the seed or asked for by an agent's ``sleep``), so
every deadline is decided in virtual time and a seed replays its timeouts.

Real waits stay real: a thread still blocks in ``Future.get(timeout)`` or
``Condition.wait``. What a wait's timeout should be is asked of the clock
too, through :func:`remaining` (one wait) and :func:`timer` (a loop of
waits): with the real clock it is the time left until the deadline; with the
virtual clock, virtual time does not move while a thread waits, so waiting
the virtual time left in real seconds would let the machine's speed decide
what the seed should. Instead a wait whose deadline has passed in virtual
time gives up at once, and one whose deadline has not waits until it is
answered, bounded only by a real backstop (:attr:`VirtualClock.real_floor`)
that catches a step that is stuck for good.

The clock is process-wide, not per manager (ADR 0034): the deadline reads
sit on the request path of every actor and every caller, and a lookup
through the manager would cost an attribute chain on each and thread the
manager into places (a transaction's participant, a tool result's waiter)
that do not hold it. One virtual clock may be installed at a time.
"""

from __future__ import annotations

import threading
import time as _time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from victor_actors._errors import VictorActorsError

__all__ = [
    "VirtualClock",
    "current",
    "monotonic",
    "remaining",
    "sleep",
    "time",
    "timer",
    "use_clock",
    "virtual",
]


def _real_remaining(deadline: float) -> float:
    return max(deadline - _time.monotonic(), 0.0)


def _real_timer(deadline: float) -> Callable[[], float]:
    return lambda: deadline - _time.monotonic()


#: Clock time in seconds, for deadlines (``time.monotonic`` unless a virtual clock is installed).
monotonic: Callable[[], float] = _time.monotonic
#: Wall-clock time in seconds since the epoch, for the timestamps of records.
time: Callable[[], float] = _time.time
#: ``remaining(deadline)``: the real seconds one wait for something due at ``deadline`` may block.
remaining: Callable[[float], float] = _real_remaining
#: ``timer(deadline)``: a function giving the real seconds a loop of waits may still block (<= 0: stop).
timer: Callable[[float], Callable[[], float]] = _real_timer
#: ``sleep(seconds)``: a pause in clock time (a virtual clock advances instead of blocking).
sleep: Callable[[float], None] = _time.sleep
#: Whether a virtual clock is installed (a plain attribute: cheap to test on the request path).
virtual = False

_installed: VirtualClock | None = None
_install_lock = threading.Lock()


class VirtualClock:
    """Time that moves only when :meth:`advance` (or :meth:`sleep`) moves it.

    ``start`` is its first :meth:`monotonic` reading and ``epoch`` its first
    :meth:`time`: fixed values, so two processes compute the same deadlines
    to the last bit. ``real_floor`` is the real backstop of a wait whose
    deadline has not passed in virtual time (see the module).
    """

    def __init__(
        self, start: float = 1000.0, *, epoch: float = 1_767_225_600.0, real_floor: float = 10.0
    ) -> None:
        if not real_floor > 0:
            raise ValueError(
                f"a virtual clock's real_floor is a positive number of seconds, not {real_floor!r}"
            )
        self.start = float(start)
        self.epoch = float(epoch)
        self.real_floor = float(real_floor)
        self._now = self.start
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<VirtualClock at +{self.elapsed:.6f} s>"

    @property
    def elapsed(self) -> float:
        """Virtual seconds since the clock's start."""
        return self._now - self.start

    def monotonic(self) -> float:
        return self._now

    def time(self) -> float:
        return self.epoch + (self._now - self.start)

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (never back)."""
        if not seconds >= 0:
            raise ValueError(f"a virtual clock moves forward only, not by {seconds!r} s")
        with self._lock:
            self._now += seconds

    def advance_to(self, when: float) -> None:
        """Move time forward to ``when`` (a :meth:`monotonic` reading), if it is not there yet."""
        with self._lock:
            if when > self._now:
                self._now = when

    def sleep(self, seconds: float) -> None:
        """A thread that sleeps in virtual time returns at once, the clock moved on by ``seconds``."""
        self.advance(max(float(seconds), 0.0))

    def remaining(self, deadline: float) -> float:
        left = deadline - self._now
        return 0.0 if left <= 0 else max(left, self.real_floor)

    def timer(self, deadline: float) -> Callable[[], float]:
        if deadline <= self._now:
            return lambda: 0.0
        real_end = _time.monotonic() + max(deadline - self._now, self.real_floor)
        return lambda: 0.0 if deadline <= self._now else real_end - _time.monotonic()


def current() -> VirtualClock | None:
    """The virtual clock installed, or None when deadlines read the real clock."""
    return _installed


@contextmanager
def use_clock(clock: VirtualClock) -> Iterator[VirtualClock]:
    """Install ``clock`` for the ``with`` block: every deadline of the process reads it.

    Raises:
        VictorActorsError: another virtual clock is installed (one at a time:
            two deterministic simulations cannot share a process's time); the
            clock in place is left as it was.
    """
    global _installed, monotonic, time, remaining, timer, sleep, virtual
    with _install_lock:
        if _installed is not None:
            raise VictorActorsError(
                f"a virtual clock is already installed ({_installed!r}); one deterministic simulation "
                "at a time per process: the installed clock was left in place"
            )
        _installed, virtual = clock, True
        monotonic, time, remaining, timer, sleep = (
            clock.monotonic,
            clock.time,
            clock.remaining,
            clock.timer,
            clock.sleep,
        )
    try:
        yield clock
    finally:
        with _install_lock:
            _installed, virtual = None, False
            monotonic, time, remaining, timer, sleep = (
                _time.monotonic,
                _time.time,
                _real_remaining,
                _real_timer,
                _time.sleep,
            )
