"""Many scopes on one machine: passivate idle actors, reactivate them on demand.

pykka runs one thread per actor, and an agent platform has far more
conversations than a machine has threads for, most of them idle. A scope's
state lives in its cell, not in its actor, so an actor can be stopped
(*passivated*) and a new one started for the same cell on the next request
(*activated*); handles, subscriptions and parent links all hang off the cell
and never notice, except in latency.

A scope is passivated when it has been idle for ``idle_timeout`` seconds, or
when more than ``max_live_actors`` actors are live (least recently used
first). Never passivated: a scope in the middle of a message (a prepared
cross-scope part waits inside one), with requests in its mailbox, with
pending tool requests, or touched by a run still in progress. With a store in
``async`` mode the store is flushed first, so a passivated scope's state is
durable; without a store the committed immutable state simply stays in memory.

Sending and passivating both take the cell's lock around "which actor is
live, put the message in its mailbox", and activation waits until the
previous actor's thread has exited, so no message is ever put into a stopping
actor's mailbox and no two actors ever serve one scope.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import pykka

from victor_actors._cell import ScopeCell
from victor_actors._errors import RuntimeClosedError
from victor_actors._model import ScopeRef

__all__ = ["Passivator"]

logger = logging.getLogger("victor_actors")


class Passivator:
    """Activation, passivation and eviction for one manager's scopes."""

    def __init__(
        self,
        spawn: Callable[[ScopeCell], pykka.ActorRef[Any]],
        cells: Callable[[], Iterable[ScopeCell]],
        busy_refs: Callable[[], set[ScopeRef]],
        before_passivate: Callable[[], None],
        closed: Callable[[], bool],
        *,
        idle_timeout: float | None = None,
        max_live_actors: int | None = None,
    ) -> None:
        if idle_timeout is not None and not idle_timeout > 0:
            raise ValueError("idle_timeout must be positive (or None)")
        if max_live_actors is not None and max_live_actors < 1:
            raise ValueError("max_live_actors must be at least 1 (or None)")
        self._spawn = spawn
        self._cells = cells
        self._busy_refs = busy_refs
        self._before_passivate = before_passivate
        self._closed = closed
        self.idle_timeout = idle_timeout
        self.max_live_actors = max_live_actors
        self._lock = threading.Lock()
        self.live = 0
        self.peak_live = 0
        self.activations = 0
        self.passivations = 0
        self.evictions = 0
        self._evicting = False
        self._stop = threading.Event()
        self._janitor: threading.Thread | None = None
        if idle_timeout is not None:
            self._janitor = threading.Thread(
                target=self._sweep_loop, name="victor-actors-janitor", daemon=True
            )
            self._janitor.start()

    def started(self) -> None:
        """An actor was started for a new scope (counted like an activation, for the cap)."""
        with self._lock:
            self.live += 1
            self.peak_live = max(self.peak_live, self.live)
        self._enforce_cap()

    def activate(self, cell: ScopeCell) -> pykka.ActorRef[Any]:
        """Start a new actor for a passivated cell. The caller holds ``cell.lock``."""
        if self._closed():
            raise RuntimeClosedError(f"the manager is closed; {cell.state.ref} takes no requests")
        if cell.stopping is not None:
            cell.stopping.get(timeout=10.0)  # the previous actor's thread has exited: one actor per scope
            cell.stopping = None
        actor = self._spawn(cell)
        cell.actor = actor
        with self._lock:
            self.activations += 1
            self.live += 1
            self.peak_live = max(self.peak_live, self.live)
        return actor

    def after_activation(self) -> None:
        """Called by senders after they released the cell's lock: keep the cap."""
        self._enforce_cap()

    def passivate(self, cell: ScopeCell, busy: set[ScopeRef] | None = None) -> bool:
        """Stop ``cell``'s actor if it may be stopped now; False if it was left alone."""
        if not cell.lock.acquire(blocking=False):
            return False  # someone is sending to it right now
        try:
            actor = cell.actor
            if actor is None or cell.busy or cell.faults or cell.state.pending_tools:
                return False
            if not actor.actor_inbox.empty():
                return False
            if cell.state.ref in (self._busy_refs() if busy is None else busy):
                return False
            cell.actor = None
            cell.stopping = actor.stop(block=False)
        finally:
            cell.lock.release()
        with self._lock:
            self.passivations += 1
            self.live -= 1
        return True

    def _enforce_cap(self) -> None:
        cap = self.max_live_actors
        if cap is None or self.live <= cap:
            return
        with self._lock:
            if self._evicting:
                return
            self._evicting = True
        try:
            # Evict a tenth of the cap at once: one sort serves many activations.
            want = self.live - cap + max(1, cap // 10)
            self._before_passivate()
            busy = self._busy_refs()
            idle = sorted((c for c in self._cells() if c.actor is not None), key=lambda c: c.last_active)
            evicted = 0
            for cell in idle:
                if evicted >= want:
                    break
                if self.passivate(cell, busy):
                    evicted += 1
            with self._lock:
                self.evictions += evicted
        finally:
            with self._lock:
                self._evicting = False

    def _sweep_loop(self) -> None:
        assert self.idle_timeout is not None
        interval = max(self.idle_timeout / 2, 0.01)
        while not self._stop.wait(interval):
            if self._closed():
                return
            try:
                self.sweep()
            except Exception:  # the janitor must not die
                logger.exception("passivating idle scopes failed")

    def sweep(self, idle_for: float | None = None) -> int:
        """Passivate every scope idle longer than ``idle_for`` (default ``idle_timeout``); return how many."""
        idle = self.idle_timeout if idle_for is None else idle_for
        if idle is None:
            return 0
        limit = time.monotonic() - idle
        candidates = [c for c in self._cells() if c.actor is not None and c.last_active < limit]
        if not candidates:
            return 0
        self._before_passivate()
        busy = self._busy_refs()
        return sum(1 for c in candidates if self.passivate(c, busy))

    def close(self) -> None:
        self._stop.set()
