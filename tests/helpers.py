"""Small helpers shared by the test modules (imported as ``helpers``; tests/ is on sys.path).

Order threads with events, a :class:`Gate`, or ``manager.quiesce()``; never with sleeps.
:func:`wait_for` polls, and is only for conditions nothing signals (an idle timeout firing, a
background flush landing, requests from other threads reaching a mailbox).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from victor_actors import GlobalStateManager, ScopeRef
from victor_actors.testing import inject_fault


def wait_for(predicate: Callable[[], object], timeout: float = 5.0) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` seconds pass; return its last answer."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return bool(predicate())


class Gate:
    """Holds scope actors on their next request until the test opens it.

    ``Gate().hold(manager, ref, ...)`` injects a fault into each scope: the
    actor that takes the scope's next request stops inside it (before applying
    it) until :meth:`open`; then the request goes on and is applied as usual.
    :meth:`wait_held` returns once that many actors are held, so a test knows
    the actor is busy instead of hoping a sleep was long enough.

    A gate nobody opens gives up after ``timeout`` seconds and fails the held
    request (the caller gets ``ScopeFailedError``), so a broken test fails
    loudly rather than hanging. With ``opens_after`` it opens by itself after
    that many seconds instead, and the request goes on: only for measuring
    what a caller does while an actor is busy for a known time.

    Used as a context manager, it opens on exit, so no actor is left held.
    """

    def __init__(self, *, timeout: float = 10.0, opens_after: float | None = None) -> None:
        self._opened = threading.Event()
        self._cond = threading.Condition()
        self._held = 0
        self._timeout = timeout if opens_after is None else opens_after
        self._fail = opens_after is None
        self.released: list[str] = []  # the scope ids whose held request went on, in order

    def hold(self, manager: GlobalStateManager, *refs: ScopeRef | str) -> Gate:
        for ref in refs:
            name = ref.id if isinstance(ref, ScopeRef) else str(ref)
            inject_fault(manager, ref, self._fault(name))
        return self

    def _fault(self, name: str) -> Callable[[], None]:
        def fault() -> None:
            with self._cond:
                self._held += 1
                self._cond.notify_all()
            if not self._opened.wait(self._timeout) and self._fail:
                raise TimeoutError(f"the test never opened the gate holding {name}")
            with self._cond:
                self.released.append(name)

        return fault

    @property
    def held(self) -> int:
        """How many actors have entered the gate so far (held now, or released since)."""
        with self._cond:
            return self._held

    def wait_held(self, count: int = 1, timeout: float = 5.0) -> None:
        """Return once ``count`` actors have entered the gate; AssertionError after ``timeout``."""
        with self._cond:
            ok = self._cond.wait_for(lambda: self._held >= count, timeout)
        assert ok, f"{self._held} of {count} actors reached the gate within {timeout} s"

    def open(self) -> None:
        self._opened.set()

    @property
    def is_open(self) -> bool:
        return self._opened.is_set()

    def __enter__(self) -> Gate:
        return self

    def __exit__(self, *exc: object) -> None:
        self.open()
