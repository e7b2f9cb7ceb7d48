"""Many scopes on one machine: passivate idle actors, evict idle scopes, bring them back on use.

pykka runs one thread per actor, and an agent platform has far more
conversations than a machine has threads or memory for, nearly all of them
idle. So a scope is in one of three places:

- *live*: resident, with an actor (a thread) serving its mailbox;
- *resident*: its cell (last committed state, subscribers, handle) is in the
  kernel's registry, but it has no actor; the next request starts one;
- *evicted*: nothing of it is in memory but, if someone subscribed to it, the
  subscription. With a store, the store is its registry and its state; without
  one, its state is kept encoded (:class:`MemoryArchive`). The next lookup
  builds a new cell from there (``Kernel.resolve``), exactly as it was.

An actor is passivated, and its scope evicted, when it has been idle for
``idle_timeout`` seconds, or when more than ``max_live_actors`` actors are live
(least recently used first; a tenth of the cap at once, so one sort of the
live set serves many activations). That work runs on the evictor thread, off
every request's path, and costs O(live set) per round, never O(all scopes).

What pins a scope, and for how long:

- a live actor with requests in its mailbox, or inside a message (a prepared
  cross-scope part waits inside one): until the mailbox is empty;
- a run in progress that touched it: until the run ends;
- pending tool requests: until their results are committed;
- resident children (their cells hold this one as an ancestor): until they go;
- a failure supervision gave up on, an injected fault, a durability mode of
  its own (``set_durability``), or ``manual`` durability (its commits are in
  memory only): for the manager's lifetime;
- a subscription pins nothing: it stays in ``Kernel.subscriptions`` and the
  scope's next cell takes it.

The protocol, and why it is safe. Phase 1 (passivate) takes the cell's lock
(non-blocking: a sender holding it is never waited for), checks the pins,
clears ``cell.actor`` and asks the actor to stop; pykka puts the stop behind
any message already taken, so a message taken just before the check is
served first. Phase 2 (evict) waits until each stopped actor's thread has
exited, so nobody can change the scope any more, then flushes the store (in
``async`` mode, so the state the next cell loads is the one in memory; in
every mode, so scope records queued at creation are written), then, under
the kernel's lock and the cell's, re-checks that no sender has started a new
actor meanwhile, marks the cell evicted and takes it out of the registry.
Senders take the cell's lock around "which actor is live, put the message in
its mailbox", and look an evicted cell up again, so no message is ever put
into a stopped actor's mailbox and no two actors ever serve one scope.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pykka

from victor_actors import _clock
from victor_actors._actor import stop_actor
from victor_actors._archive import MemoryArchive
from victor_actors._cell import ScopeCell
from victor_actors._errors import RuntimeClosedError
from victor_actors._kernel import Kernel
from victor_actors._model import ScopeRef

__all__ = ["Passivator"]

logger = logging.getLogger("victor_actors")

_STOP_WAIT = 10.0  # seconds an eviction waits for a stopped actor's thread to exit


class Passivator:
    """Activation, passivation and eviction for one kernel's scopes."""

    def __init__(
        self,
        kernel: Kernel,
        spawn: Callable[[ScopeCell], pykka.ActorRef[Any]],
        busy_refs: Callable[[], set[ScopeRef]],
        before_evict: Callable[[], None],
        archive: MemoryArchive | None,
        *,
        idle_timeout: float | None = None,
        max_live_actors: int | None = None,
    ) -> None:
        if idle_timeout is not None and not idle_timeout > 0:
            raise ValueError("idle_timeout must be positive (or None)")
        if max_live_actors is not None and max_live_actors < 1:
            raise ValueError("max_live_actors must be at least 1 (or None)")
        self._kernel = kernel
        self._spawn = spawn
        self._busy_refs = busy_refs
        self._before_evict = before_evict
        self._archive = archive
        self.idle_timeout = idle_timeout
        self.max_live_actors = max_live_actors
        self._lock = threading.Lock()  # the counters
        self._round_lock = threading.Lock()  # one passivation round at a time
        self.live = 0
        self.peak_live = 0
        self.activations = 0
        self.activations_new = 0  # a scope's first actor
        self.activations_memory = 0  # a resident scope (or, without a store, an encoded one)
        self.activations_store = 0  # a scope read back from the store
        self.passivations = 0
        self.evictions = 0  # passivations the cap forced (the live-actor bound)
        self.evicted = 0  # scopes taken out of memory
        self.eviction_rounds = 0
        self.eviction_ns = 0  # time spent in rounds, on the evictor thread (or passivate_idle's caller)
        self._wake = threading.Event()
        self._idle = threading.Condition()  # notified when the evictor finishes a round
        self._working = False
        # cells a round stopped but could not evict yet (their actor had not finished): the evictor
        # comes back for these alone in a moment, without a whole round
        self._leftovers: list[ScopeCell] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if idle_timeout is not None or max_live_actors is not None:
            self._thread = threading.Thread(target=self._loop, name="victor-actors-evictor", daemon=True)
            self._thread.start()

    # -- activation (on senders' threads) ------------------------------------

    def activate(self, cell: ScopeCell) -> pykka.ActorRef[Any]:
        """Start an actor for a cell that has none. The caller holds ``cell.lock``."""
        if self._kernel.closed:
            raise RuntimeClosedError(f"the manager is closed; {cell.state.ref} takes no requests")
        if cell.stopping is not None:
            # the previous actor's thread has exited: one actor per scope
            cell.stopping.get(timeout=_STOP_WAIT)
            cell.stopping = None
        actor = self._spawn(cell)
        cell.actor = actor
        source, cell.source = cell.source, "memory"
        with self._lock:
            self.activations += 1
            if source == "new":
                self.activations_new += 1
            elif source == "store":
                self.activations_store += 1
            else:
                self.activations_memory += 1
            self.live += 1
            self.peak_live = max(self.peak_live, self.live)
        return actor

    def after_activation(self) -> None:
        """Called by senders after they released the cell's lock: wake the evictor if over the cap."""
        cap = self.max_live_actors
        if cap is not None and self.live > cap and not self._wake.is_set():
            self._wake.set()

    def resident_grew(self) -> None:
        """A cell was built (created, or brought back by a read): wake the evictor if too many are."""
        cap = self.max_live_actors
        if cap is not None and len(self._kernel.cells) > cap + _slack(cap) and not self._wake.is_set():
            self._wake.set()

    # -- passivation and eviction -------------------------------------------

    def _pinned(self, cell: ScopeCell, busy: set[ScopeRef]) -> bool:
        """Whether ``cell`` must keep its actor now (see the module's docstring)."""
        return bool(
            cell.busy
            or cell.faults
            or cell.failed_reason is not None
            or cell.state.pending_tools
            or cell.state.ref in busy
        )

    def _resident_pinned(self, cell: ScopeCell, busy: set[ScopeRef]) -> bool:
        """Whether ``cell`` (with no actor) must stay in memory now."""
        kernel = self._kernel
        return (
            self._pinned(cell, busy)
            or cell.durability != kernel.durability
            or cell.durability == "manual"  # its commits are in memory only, until a checkpoint
            or bool(kernel.children.get(cell.state.ref))
        )

    def passivate(self, cell: ScopeCell, busy: set[ScopeRef] | None = None) -> bool:
        """Stop ``cell``'s actor if it may be stopped now; False if it was left alone."""
        if not cell.lock.acquire(blocking=False):
            return False  # someone is sending to it right now
        try:
            actor = cell.actor
            if actor is None or cell.evicted or not actor.actor_inbox.empty():
                return False
            if self._pinned(cell, self._busy_refs() if busy is None else busy):
                return False
            cell.actor = None
            cell.stopping = stop_actor(actor)
        finally:
            cell.lock.release()
        with self._lock:
            self.passivations += 1
            self.live -= 1
        return True

    def _evict(self, cells: list[ScopeCell], wait: bool) -> int:
        """Take actor-less ``cells`` out of memory where no pin holds them; return how many left.

        With ``wait``, first wait for each stopped actor to finish; without,
        a cell whose actor has not finished yet stays resident for the next
        round (the evictor never waits on one actor at a time).
        """
        kernel = self._kernel
        running: set[int] = set()  # cells whose stopped actor has not finished yet
        for cell in cells:
            stopping = cell.stopping
            if stopping is not None:
                try:
                    stopping.get(timeout=_STOP_WAIT if wait else 0)
                except pykka.Timeout:
                    if wait:
                        logger.warning(
                            "%s's actor did not stop within %s s; it stays resident", cell, _STOP_WAIT
                        )
                    running.add(id(cell))
        self._before_evict()  # what the next cell will load is in the store
        busy = self._busy_refs()
        archive = self._archive
        encoded: dict[int, bytes] = {}
        if archive is not None:  # encode outside the kernel's lock; checked unchanged below
            encoded = {
                id(c): archive.encode(c.state) for c in cells if c.actor is None and id(c) not in running
            }
        # children first: a parent can go once its last resident child has gone
        cells = sorted(cells, key=lambda c: -len(c.state.lineage))
        gone = 0
        for cell in cells:
            # the kernel's lock is taken per cell, not for the round: a request that looks up an
            # evicted scope meanwhile waits for one cell's eviction at most
            with kernel.lock:
                if not cell.lock.acquire(blocking=False):
                    continue
                try:
                    if cell.evicted or cell.actor is not None or kernel.cells.get(cell.state.ref) is not cell:
                        continue
                    if id(cell) in running or self._resident_pinned(cell, busy):
                        continue
                    if archive is not None:
                        raw = encoded.get(id(cell))
                        if raw is None:
                            continue
                        archive.put(cell.state.ref, raw)
                    cell.evicted = True
                    cell.stopping = None
                    kernel.unregister(cell)
                    gone += 1
                finally:
                    cell.lock.release()
        with self._lock:
            self.evicted += gone
        if not wait:
            self._leftovers = [c for c in cells if id(c) in running]
        return gone

    def _enforce_cap(self) -> None:
        """One round of the cap: passivate the least recently used, evict the actor-less."""
        cap = self.max_live_actors
        if cap is None:
            return
        kernel = self._kernel
        cells = list(kernel.cells.values())
        live = [c for c in cells if c.actor is not None]
        idle = [c for c in cells if c.actor is None and not c.evicted]
        if len(live) <= cap and len(cells) <= cap + _slack(cap):
            return
        busy = self._busy_refs()
        stopped: list[ScopeCell] = []
        if len(live) > cap:
            want = len(live) - cap + _slack(cap)
            live.sort(key=lambda c: c.last_active)
            for cell in live:
                if len(stopped) >= want:
                    break
                if self.passivate(cell, busy):
                    stopped.append(cell)
            with self._lock:
                self.evictions += len(stopped)
        self._evict(stopped + idle, wait=False)

    def _loop(self) -> None:
        idle = self.idle_timeout
        interval = None if idle is None else max(idle / 2, 0.01)
        while not self._stop.is_set():
            # a round that left stopped actors behind comes back for them in a moment
            woken = self._wake.wait(0.005 if self._leftovers else interval)
            with self._idle:
                self._working = True
                self._wake.clear()
            try:
                if self._stop.is_set() or self._kernel.closed:
                    return
                with self._round_lock:
                    start = time.perf_counter_ns()
                    if not woken and self._leftovers:
                        self._evict(self._leftovers, wait=False)
                    else:
                        self._enforce_cap()
                        if idle is not None:
                            self._sweep(idle, wait=False)
                    self._count_round(start)
            except Exception:  # the evictor must not die
                logger.exception("passivating idle scopes failed")
            finally:
                with self._idle:
                    self._working = False
                    self._idle.notify_all()

    def settle(self, timeout: float) -> bool:
        """Wait until the evictor has no round asked for or running; False at the timeout.

        ``max_live_actors`` is kept off the requests' path, so for a moment
        after a burst more actors may be live than the cap; once settled,
        at most the cap are (less what pins hold).
        """
        if self._thread is None:
            return True
        until = _clock.timer(_clock.monotonic() + timeout)
        with self._idle:
            while self._working or self._wake.is_set() or self._leftovers:
                if self._stop.is_set() or not self._thread.is_alive():
                    return True
                left = until()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def _count_round(self, start: int) -> None:
        with self._lock:
            self.eviction_rounds += 1
            self.eviction_ns += time.perf_counter_ns() - start

    def sweep(self, idle_for: float | None = None) -> int:
        """Passivate (and evict) every scope idle longer than ``idle_for`` (default ``idle_timeout``).

        Returns how many actors were passivated. Runs on the caller's
        thread and returns once the scopes it evicted are out of memory.
        """
        idle = self.idle_timeout if idle_for is None else idle_for
        if idle is None:
            return 0
        with self._round_lock:
            start = time.perf_counter_ns()
            count = self._sweep(idle, wait=True)
            self._count_round(start)
        return count

    def _sweep(self, idle: float, wait: bool) -> int:
        limit = _clock.monotonic() - idle
        cells = [c for c in list(self._kernel.cells.values()) if c.last_active <= limit]
        if not cells:
            return 0
        busy = self._busy_refs()
        stopped = [c for c in cells if c.actor is not None and self.passivate(c, busy)]
        self._evict([c for c in cells if c.actor is None], wait)
        return len(stopped)

    def close(self) -> None:
        self._stop.set()
        self._wake.set()


def _slack(cap: int) -> int:
    return max(1, cap // 10)
