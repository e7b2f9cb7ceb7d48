"""The runtime: the kernel and its services wired together, and the host the actors call.

One :class:`Runtime` per manager. It builds the kernel and the services
(durability, the scope tree, supervision, passivation, tools), plugs them
into each other through the small ports they declare, and implements the
actors' :class:`ActorHost` by routing each callback to the service that owns
it. The manager is a facade over it; nothing here knows handles.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import pykka

from victor_actors import _clock
from victor_actors._actor import ScopeActor, stop_actor
from victor_actors._archive import MemoryArchive
from victor_actors._cell import ScopeCell, mailbox_depth
from victor_actors._durability import Durability
from victor_actors._errors import DeadlineExceededError, VictorActorsError
from victor_actors._events import Subscription
from victor_actors._kernel import Kernel
from victor_actors._messages import Barrier
from victor_actors._model import ScopeRef, TransitionBatch
from victor_actors._options import Options
from victor_actors._passivation import Passivator
from victor_actors._state import StateChanged
from victor_actors._supervision import Supervision, SupervisionPolicy
from victor_actors._tools import ToolDispatcher
from victor_actors._tree import ScopeTree
from victor_actors.store import Store

__all__ = ["Runtime"]

logger = logging.getLogger("victor_actors")


class Runtime:
    """A kernel with its services. ``apply_result(ref, batch)`` is how tool results are applied."""

    def __init__(
        self,
        options: Options,
        store: Store | None,
        *,
        supervision: SupervisionPolicy | None,
        apply_result: Callable[[ScopeRef, TransitionBatch], object],
    ) -> None:
        self.kernel = kernel = Kernel(options, store)
        self.durability = Durability(kernel)
        self._persist = self.durability.persister()
        self._stager = self.durability.stager()
        self._checkpointer = self.durability.checkpointer()
        self.archive = MemoryArchive() if store is None else None
        self.passivator = Passivator(
            kernel,
            self._spawn,
            kernel.run_refs,
            self.durability.flush_for_eviction,
            self.archive,
            idle_timeout=options.idle_timeout,
            max_live_actors=options.max_live_actors,
        )
        self.tree = ScopeTree(
            kernel,
            create_record=self._create_record,
            restored=self._restored,
            grew=self.passivator.resident_grew,
            archive=self.archive,
        )
        kernel.activator = self.passivator
        kernel.resolver = self.tree
        self.supervision = Supervision(
            kernel,
            children=self.tree.children,
            parent=self.tree.parent,
            load_committed=self.durability.load_committed,
            default=supervision,
        )
        self.tools = ToolDispatcher(kernel, apply_result, self._pending_tools)

    # -- actors -------------------------------------------------------------

    def _spawn(self, cell: ScopeCell) -> pykka.ActorRef[Any]:
        return ScopeActor.start(cell, self, self._persist, self._stager, self._checkpointer)

    def _create_record(self, ref: ScopeRef, lineage: tuple[ScopeRef, ...]) -> None:
        self.durability.create_scope(ref, lineage)

    def _restored(self, cell: ScopeCell) -> None:
        pending = cell.state.pending_tools
        if pending and not self.kernel.read_only:
            # the outbox survives restarts: dispatch what was committed but never answered
            self.tools.dispatch(cell.state.ref, tuple(pending.values()), redelivery=True)

    def _pending_tools(self, ref: ScopeRef) -> Mapping[str, Any]:
        return self.resolve(ref).state.pending_tools

    def resolve(self, ref: ScopeRef) -> ScopeCell:
        """The cell of an existing scope (restored from the store if needed).

        Raises:
            ScopeAccessError: no such scope exists.
        """
        return self.tree.resolve(ref)

    # -- ActorHost: what the actors call ------------------------------------

    def new_commit_id(self) -> str:
        return self.kernel.new_commit_id()

    def publish_event(self, subscribers: tuple[Subscription, ...], record: StateChanged) -> None:
        self.kernel.bus.publish(subscribers, record)

    def reserve_sessions(self, parent: ScopeRef, session_ids: tuple[str, ...]) -> None:
        self.tree.reserve_sessions(parent, session_ids)

    def release_sessions(self, session_ids: tuple[str, ...]) -> None:
        self.tree.release_sessions(session_ids)

    def adopt_sessions(self, parent: ScopeRef, session_ids: tuple[str, ...]) -> None:
        self.tree.adopt_sessions(parent, session_ids)

    def scope_failed(self, ref: ScopeRef, exc: BaseException) -> None:
        self.supervision.failed(ref, exc)

    def tools_committed(self, ref: ScopeRef, requests: tuple[Any, ...], run_id: str | None = None) -> None:
        self.tools.dispatch(ref, requests, run_id=run_id)

    def run_committed(self, record: StateChanged) -> None:
        run = self.kernel.runs.get(record.run_id or "")
        if run is not None:
            run.record(record)

    def reload(self, cell: ScopeCell, reason: str) -> None:
        self.supervision.reload(cell, reason)

    # -- the whole runtime --------------------------------------------------

    def quiesce(self, timeout: float) -> None:
        """See ``GlobalStateManager.quiesce``."""
        kernel = self.kernel
        where = self._runtime_thread()
        if where is not None:
            raise VictorActorsError(
                f"quiesce was called from {where}, which it would wait for: it can never be quiet "
                "from in there; call it from your own code's thread or task"
            )
        end = _clock.monotonic() + timeout
        left = _clock.timer(end)  # with a virtual clock, a real bound (time stands still meanwhile)
        while True:
            before = self._activity()
            quiet = self.tools.wait_idle(max(left(), 0.0))
            quiet = kernel.barrier(kernel.all_cells(), Barrier(), end) and quiet
            quiet = kernel.bus.barrier(max(left(), 0.05)) and quiet
            quiet = self.passivator.settle(max(left(), 0.0)) and quiet
            if quiet and self._activity() == before:
                return
            if left() <= 0:
                raise DeadlineExceededError(
                    f"the runtime was still busy after {timeout} s (commits, events or tools in flight)"
                )

    def _runtime_thread(self) -> str | None:
        """What the calling thread is, if it is one of this runtime's own (else None)."""
        me = threading.current_thread()
        if me is self.kernel.bus.thread:
            return "a subscriber (the event thread)"
        if self.tools.running_here():
            return "a tool executor"
        if any(c.owner is me for c in self.kernel.all_cells()):
            return "a scope's actor thread"
        return None

    def _activity(self) -> tuple[int, int, int]:
        return (
            self.kernel.commits(),
            self.tools.dispatched,
            self.kernel.bus.published,
        )

    def stats(self) -> dict[str, int]:
        kernel = self.kernel
        cells = kernel.all_cells()
        passivator = self.passivator
        supervisor = self.supervision.supervisor
        store = kernel.store
        archive = self.archive
        if store is not None:
            evicted = max(store.scope_count() - sum(1 for c in cells if not c.evicted), 0)
        else:
            evicted = 0 if archive is None else len(archive)
        return {
            "live_actors": passivator.live,
            "peak_live_actors": passivator.peak_live,
            "scopes": len(cells) + evicted,
            "resident_scopes": len(cells),
            "evicted_scopes": evicted,
            "passivated_scopes": sum(1 for c in cells if c.actor is None) + evicted,
            "bytes_resident": 0 if archive is None else archive.bytes,
            "activations": passivator.activations,
            "activations_new": passivator.activations_new,
            "activations_memory": passivator.activations_memory,
            "activations_store": passivator.activations_store,
            "passivations": passivator.passivations,
            "evictions": passivator.evictions,
            "evicted": passivator.evicted,
            "eviction_rounds": passivator.eviction_rounds,
            "eviction_us": passivator.eviction_ns // 1000,
            "mailbox_depth_max": max(
                (mailbox_depth(a) for c in cells if (a := c.actor) is not None),
                default=0,
            ),
            "commits": kernel.commits(),
            "subscribed_scopes": len(kernel.subscriptions),
            "failures": supervisor.failures,
            "restarts": supervisor.restarts,
            "escalations": supervisor.escalations,
            "events_published": kernel.bus.published,
            "events_queued": kernel.bus.queued,
            "store_commits": 0 if store is None else store.commits,
            "store_transactions": 0 if store is None else store.transactions,
        }

    def close(self, timeout: float) -> None:
        """Stop every actor and the event thread, then close the store. Idempotent."""
        kernel = self.kernel
        with kernel.lock:
            if kernel.closed:
                return
            kernel.closed = True
            cells = kernel.all_cells()
        self.tools.close()
        self.passivator.close()
        futures = []
        for cell in cells:
            with cell.lock:
                actor, cell.actor = cell.actor, None
            if actor is not None:
                stopped = stop_actor(actor)
                if stopped is not None:
                    futures.append(stopped)
            if cell.stopping is not None:
                futures.append(cell.stopping)
        deadline = time.monotonic() + timeout
        for f in futures:
            try:
                f.get(timeout=max(deadline - time.monotonic(), 0.0))
            except pykka.Timeout:
                pass
        kernel.shut_steps()  # asyncio callers' steps in progress on the pool (ADR 0036)
        kernel.bus.close(timeout)
        if kernel.store is not None:
            kernel.store.close()  # flushes what async mode still holds
