"""GlobalStateManager: the facade orchestrators use to reach scope actors."""

from __future__ import annotations

import asyncio
import atexit
import itertools
import logging
import os
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from typing import Any, ClassVar

import pykka

from victor_actors._actor import Barrier, RestartRequest, ScopeActor, ScopeCell, mailbox_depth
from victor_actors._checkpoints import DURABILITY_MODES, CheckpointsMixin
from victor_actors._errors import DeadlineExceededError, RuntimeClosedError, ScopeAccessError
from victor_actors._events import EventBus, Subscription
from victor_actors._handle import ScopeHandle
from victor_actors._model import GLOBAL_REF, ScopeRef, StateScope
from victor_actors._passivation import Passivator
from victor_actors._runs import Run, RunContext
from victor_actors._state import ScopeState, StateChanged
from victor_actors._supervision import SupervisionEvent, SupervisionPolicy, Supervisor
from victor_actors._tools import ToolDispatcher
from victor_actors.store import RecoveryReport, Store
from victor_actors.store._codec import Codec, ScopeRecord

logger = logging.getLogger("victor_actors")

__all__ = ["GlobalStateManager"]

_open_managers: weakref.WeakSet[GlobalStateManager] = weakref.WeakSet()
_manager_ids = itertools.count(1)


class _Entry:
    __slots__ = ("cell", "handle")

    def __init__(self, cell: ScopeCell, handle: ScopeHandle) -> None:
        self.cell = cell
        self.handle = handle


class GlobalStateManager(CheckpointsMixin):
    """One entry point for every scope: global, teams, workflows, conversations.

    Each scope instance is owned by one actor, created on first use under
    its parent (a team under global; a workflow under a team or global; a
    conversation under a workflow, a team or global). Handles returned by
    the ``get_*_state`` methods talk to those actors.

    The manager's threads are daemon threads and an exit hook closes any
    manager left open, so a program that never calls :meth:`close` still
    exits cleanly. :meth:`close` is idempotent.
    """

    _default: ClassVar[GlobalStateManager | None] = None
    _default_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(
        self,
        *,
        request_timeout: float = 5.0,
        store: Store | None = None,
        durability: str = "sync",
        checkpoint_every: int = 100,
        keep_checkpoints: int = 3,
        supervision: SupervisionPolicy | None = None,
        idle_timeout: float | None = None,
        max_live_actors: int | None = None,
        mailbox_size: int | None = None,
        backpressure: str = "wait",
    ) -> None:
        if not request_timeout > 0:
            raise ValueError("request_timeout must be positive")
        if durability not in DURABILITY_MODES:
            raise ValueError(f"durability must be one of {DURABILITY_MODES}, not {durability!r}")
        if checkpoint_every < 1 or keep_checkpoints < 1:
            raise ValueError("checkpoint_every and keep_checkpoints must be at least 1")
        if backpressure not in ("wait", "reject"):
            raise ValueError(f"backpressure must be 'wait' or 'reject', not {backpressure!r}")
        if mailbox_size is not None and mailbox_size < 1:
            raise ValueError("mailbox_size must be at least 1 (or None)")
        self.request_timeout = float(request_timeout)
        self.mailbox_size = mailbox_size
        self.backpressure = backpressure
        self._store = store
        self.durability = durability if store is not None else "memory"
        self.checkpoint_every = checkpoint_every
        self.keep_checkpoints = keep_checkpoints
        self.recovery_reports: list[RecoveryReport] = []
        self._closed = False
        self._lock = threading.RLock()
        self._scopes: dict[ScopeRef, _Entry] = {}
        self._reserved: dict[ScopeRef, ScopeRef] = {}  # session ids claimed by a commit in flight
        self._children: dict[ScopeRef | None, list[ScopeRef]] = {}  # in creation order
        self._supervision_subs: tuple[Subscription, ...] = ()
        self.tools = ToolDispatcher(self)
        self._observer: Callable[[str, ScopeRef, Any], None] | None = None
        self._active_runs: dict[str, Run] = {}
        self.passivator = Passivator(
            self._spawn,
            lambda: [e.cell for e in list(self._scopes.values())],
            self._busy_refs,
            self._flush_for_passivation,
            lambda: self._closed,
            idle_timeout=idle_timeout,
            max_live_actors=max_live_actors,
        )
        self.supervisor = Supervisor(
            children=lambda ref: list(self._children.get(ref, ())),
            parent=lambda ref: self._scopes[ref].cell.state.parent if ref in self._scopes else None,
            restart=self._restart_request,
            give_up=self._give_up,
            publish=self._publish_supervision,
            default=supervision,
        )
        name = f"victor-actors-{next(_manager_ids)}"
        self._bus = EventBus(name)
        # Commit ids: unique per process and manager; next() on a count is atomic.
        self._commit_prefix = f"{os.getpid():x}.{next(_manager_ids):x}"
        self._commit_counter = itertools.count(1)
        # Held while a cross-scope commit publishes its states, and by snapshots reading several
        # scopes, so a snapshot sees all of such a commit or none of it.
        self._publish_lock = threading.Lock()
        _open_managers.add(self)
        self._ensure(GLOBAL_REF, None)

    # -- construction -----------------------------------------------------

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str] | None = None,
        *,
        read_only: bool = False,
        durability: str = "sync",
        checkpoint_every: int = 100,
        keep_checkpoints: int = 3,
        flush_interval: float = 0.05,
        codec: Codec | None = None,
        map_size: int = 256 * 1024 * 1024,
        request_timeout: float = 5.0,
        supervision: SupervisionPolicy | None = None,
        idle_timeout: float | None = None,
        max_live_actors: int | None = None,
        mailbox_size: int | None = None,
        backpressure: str = "wait",
    ) -> GlobalStateManager:
        """Open a manager: in memory (``path=None``) or on an LMDB store at ``path``.

        With a store, every scope found there is restored lazily, at its
        last durable version, on first access. ``durability`` is ``"sync"``
        (apply returns once the commit is durable; commits from many scopes
        share LMDB transactions), ``"async"`` (apply returns at once; commits
        reach LMDB within ``flush_interval`` seconds; ``close()`` flushes) or
        ``"manual"`` (only explicit checkpoints are written). A full
        checkpoint is written every ``checkpoint_every`` commits, and the
        newest ``keep_checkpoints`` are kept with the log from the oldest kept
        one on.

        Scale (see ``docs/scale.md``): ``idle_timeout`` passivates scopes idle
        that long, ``max_live_actors`` caps live actor threads (least recently
        used scopes are passivated first), ``mailbox_size`` bounds each
        scope's mailbox, and past it a request waits until its deadline
        (``backpressure="wait"``) or is refused at once (``"reject"``) with
        :class:`BackpressureError`.

        Raises:
            StoreLockedError: another live manager owns ``path`` for writing.
            ValueError: an option is out of range; nothing was opened.
        """
        scale = {
            "idle_timeout": idle_timeout,
            "max_live_actors": max_live_actors,
            "mailbox_size": mailbox_size,
            "backpressure": backpressure,
        }
        if durability not in DURABILITY_MODES:
            raise ValueError(f"durability must be one of {DURABILITY_MODES}, not {durability!r}")
        if path is None:
            if read_only:
                raise ValueError("read_only needs a path")
            return cls(request_timeout=request_timeout, supervision=supervision, **scale)  # type: ignore[arg-type]
        store = Store(
            path, read_only=read_only, codec=codec, map_size=map_size, flush_interval=flush_interval
        )
        try:
            return cls(
                request_timeout=request_timeout,
                store=store,
                durability=durability,
                checkpoint_every=checkpoint_every,
                keep_checkpoints=keep_checkpoints,
                supervision=supervision,
                **scale,  # type: ignore[arg-type]
            )
        except BaseException:
            store.close()
            raise

    @classmethod
    def get_instance(cls) -> GlobalStateManager:
        """The process-wide default manager (in memory), created on first use."""
        with cls._default_lock:
            if cls._default is None or cls._default._closed:
                cls._default = cls()
            return cls._default

    def __enter__(self) -> GlobalStateManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, timeout: float = 5.0) -> None:
        """Stop every scope actor and the event thread. Idempotent.

        Requests already in a mailbox are answered first; later requests
        raise :class:`RuntimeClosedError`.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            entries = list(self._scopes.values())
        self.tools.close()
        self.passivator.close()
        futures = []
        for e in entries:
            with e.cell.lock:
                actor, e.cell.actor = e.cell.actor, None
            if actor is not None:
                futures.append(actor.stop(block=False))
            if e.cell.stopping is not None:
                futures.append(e.cell.stopping)
        deadline = time.monotonic() + timeout
        for f in futures:
            try:
                f.get(timeout=max(deadline - time.monotonic(), 0.0))
            except pykka.Timeout:
                pass
        self._bus.close(timeout)
        if self._store is not None:
            self._store.close()  # flushes what async mode still holds
        _open_managers.discard(self)

    @property
    def store(self) -> Store | None:
        """The LMDB store, or None for an in-memory manager."""
        return self._store

    @property
    def read_only(self) -> bool:
        return self._store is not None and self._store.read_only

    # -- scopes -----------------------------------------------------------

    def _ensure(self, ref: ScopeRef, parent: ScopeRef | None) -> ScopeHandle:
        """Return the handle of ``ref``, creating its actor under ``parent``.

        ``parent=None`` means "any parent" for an existing scope and the
        global scope for a new one.
        """
        entry = self._scopes.get(ref)
        if entry is not None and (parent is None or entry.cell.state.parent == parent):
            return entry.handle
        with self._lock:
            if self._closed:
                raise RuntimeClosedError("the manager is closed")
            entry = self._scopes.get(ref)
            if entry is None and self._store is not None:
                entry = self._restore(ref)
            if entry is not None:
                if parent is not None and entry.cell.state.parent != parent:
                    raise ScopeAccessError(
                        f"{ref} already exists under {entry.cell.state.parent}, not under {parent}; "
                        "a scope keeps the parent it was created under"
                    )
                return entry.handle
            if self.read_only:
                raise ScopeAccessError(f"no scope {ref} in the store, and a read-only manager creates none")
            claimed = self._reserved.get(ref)
            if claimed is not None and parent != claimed:
                raise ScopeAccessError(f"{ref} is being created under {claimed}")
            if ref == GLOBAL_REF:
                lineage: tuple[ScopeRef, ...] = ()
            else:
                parent_ref = GLOBAL_REF if parent is None else parent
                parent_entry = self._scopes.get(parent_ref)
                if parent_entry is None:
                    raise ScopeAccessError(f"cannot create {ref}: its parent {parent_ref} does not exist")
                lineage = (parent_ref, *parent_entry.cell.state.lineage)
            if self._store is not None:
                record = ScopeRecord(ref, lineage, time.time())
                self._store.submit([self._store.op_put_scope(record)], wait=True)
            return self._start(ScopeState(ref=ref, lineage=lineage)).handle

    def _start(self, state: ScopeState) -> _Entry:
        """Start the actor owning ``state`` (its parent is already live). Holds the lock."""
        if state.lineage:
            parent_entry = self._scopes[state.lineage[0]]
            ancestor_cells: tuple[ScopeCell, ...] = (parent_entry.cell, *parent_entry.handle._ancestor_cells)
        else:
            ancestor_cells = ()
        cell = ScopeCell(state, self.durability)
        cell.observer = self._observer
        cell.actor = self._spawn(cell)
        entry = _Entry(cell, ScopeHandle(self, state.ref, cell, ancestor_cells))
        self._scopes[state.ref] = entry
        self._children.setdefault(state.parent, []).append(state.ref)
        self.passivator.started()
        return entry

    def _spawn(self, cell: ScopeCell) -> pykka.ActorRef[Any]:
        persist = None if self._store is None else self._persister(cell)
        return ScopeActor.start(cell, self._bus, self._commit_prefix, self._commit_counter, persist, self)

    def _activate(self, cell: ScopeCell) -> pykka.ActorRef[Any]:
        """Start an actor for a passivated scope (the caller holds ``cell.lock``)."""
        return self.passivator.activate(cell)

    def _busy_refs(self) -> set[ScopeRef]:
        """Scopes a run in progress has touched: never passivated until the run ends."""
        refs: set[ScopeRef] = set()
        for run in list(self._active_runs.values()):
            refs.update(run.refs())
        return refs

    def _flush_for_passivation(self) -> None:
        if self._store is not None and not self._store.read_only and self.durability == "async":
            self._store.flush()

    def passivate_idle(self) -> int:
        """Passivate every scope idle for longer than ``idle_timeout`` now; return how many."""
        return self.passivator.sweep()

    def _restore(self, ref: ScopeRef) -> _Entry | None:
        """Bring a stored scope (and, first, its ancestors) back to life. Holds the lock."""
        store = self._store
        assert store is not None
        record = store.scope_record(ref)
        if record is None:
            return None
        for anc in reversed(record.lineage):
            if anc not in self._scopes and self._restore(anc) is None:
                raise ScopeAccessError(f"{ref}'s ancestor {anc} is missing from the store")
        state, report = store.load(ref, record.lineage)
        if not report.clean:
            logger.warning("recovered %s at version %d, skipping: %s", ref, state.version, report.skipped)
            self.recovery_reports.append(report)
            if not store.read_only and report.latest_stored_version > state.version:
                store.submit([store.op_quarantine_after(ref, state.version)], wait=True)
        entry = self._start(state)
        if state.pending_tools and not store.read_only:
            # the outbox survives restarts: dispatch what was committed but never answered
            self.tools.dispatch(ref, tuple(state.pending_tools.values()), redelivery=True)
        return entry

    def _new_commit_id(self) -> str:
        return f"{self._commit_prefix}.{next(self._commit_counter):x}"

    def get_global_state(self) -> ScopeHandle:
        """The application-wide scope."""
        return self._ensure(GLOBAL_REF, None)

    def get_team_state(self, team_id: str) -> ScopeHandle:
        """The scope shared by a team's agents (under global)."""
        return self._ensure(ScopeRef(StateScope.TEAM, team_id), GLOBAL_REF)

    def get_workflow_state(self, workflow_id: str, team_id: str | None = None) -> ScopeHandle:
        """A workflow's scope, under ``team_id``'s team or, without one, under global.

        Without ``team_id`` an existing workflow is returned wherever it lives.
        """
        ref = ScopeRef(StateScope.WORKFLOW, workflow_id)
        if team_id is None:
            return self._ensure(ref, None)
        team = self.get_team_state(team_id)
        return self._ensure(ref, team.ref)

    def get_conversation_state(
        self, session_id: str, workflow_id: str | None = None, team_id: str | None = None
    ) -> ScopeHandle:
        """One agent's conversation: under the workflow if given, else the team, else global.

        With neither, an existing conversation is returned wherever it lives.

        Raises:
            ScopeAccessError: the conversation exists under another parent.
        """
        ref = ScopeRef(StateScope.CONVERSATION, session_id)
        if workflow_id is not None:
            parent: ScopeRef | None = self.get_workflow_state(workflow_id, team_id).ref
        elif team_id is not None:
            parent = self.get_team_state(team_id).ref
        else:
            parent = None
        return self._ensure(ref, parent)

    def scope(self, ref: ScopeRef | str) -> ScopeHandle:
        """The handle of an existing scope.

        Raises:
            ScopeAccessError: no such scope exists.
        """
        if isinstance(ref, str):
            ref = ScopeRef.parse(ref)
        entry = self._scopes.get(ref)
        if entry is not None:
            return entry.handle
        if self._store is not None:
            with self._lock:
                entry = self._scopes.get(ref) or self._restore(ref)
            if entry is not None:
                return entry.handle
        raise ScopeAccessError(f"no scope {ref} exists")

    def scopes(self) -> list[ScopeRef]:
        """Every scope instance this manager holds, live or only in its store."""
        refs = dict.fromkeys(self._scopes)
        if self._store is not None:
            refs.update(dict.fromkeys(r.ref for r in self._store.scope_records()))
        return list(refs)

    # -- internals used by handles ----------------------------------------

    def reserve_sessions(self, parent: ScopeRef, session_ids: tuple[str, ...]) -> None:
        """Claim child conversation ids for ``parent`` before its commit is made durable.

        Called on the parent's actor thread. Raises ScopeAccessError (and
        claims nothing) when an id is taken by a scope under another parent.
        """
        refs = [ScopeRef(StateScope.CONVERSATION, sid) for sid in session_ids]
        with self._lock:
            for ref in refs:
                entry = self._scopes.get(ref)
                owner = entry.cell.state.parent if entry is not None else self._reserved.get(ref)
                if owner is None and self._store is not None:
                    record = self._store.scope_record(ref)
                    owner = record.lineage[0] if record is not None and record.lineage else None
                if (entry is not None or owner is not None) and owner != parent:
                    raise ScopeAccessError(f"CREATE_SESSION: {ref} already exists under {owner}")
            for ref in refs:
                self._reserved[ref] = parent

    def release_sessions(self, session_ids: tuple[str, ...]) -> None:
        with self._lock:
            for sid in session_ids:
                self._reserved.pop(ScopeRef(StateScope.CONVERSATION, sid), None)

    def adopt_sessions(self, parent: ScopeRef, session_ids: tuple[str, ...]) -> None:
        """Start the claimed child conversations once the parent's commit is published."""
        try:
            for sid in session_ids:
                self._ensure(ScopeRef(StateScope.CONVERSATION, sid), parent)
        finally:
            self.release_sessions(session_ids)

    def set_observer(self, observer: Callable[[str, ScopeRef, Any], None] | None) -> None:
        """Deprecated: use ``victor_actors.testing.set_observer(manager, observer)``."""
        warnings.warn(
            "manager.set_observer is deprecated; use victor_actors.testing.set_observer(manager, observer)",
            DeprecationWarning,
            stacklevel=2,
        )
        self._set_observer(observer)

    def _set_observer(self, observer: Callable[[str, ScopeRef, Any], None] | None) -> None:
        with self._lock:
            self._observer = observer
            for entry in self._scopes.values():
                entry.cell.observer = observer

    # -- tools ---------------------------------------------------------------

    def register_tool(self, name: str, fn: Callable[..., Any], *, timeout: float = 30.0) -> None:
        """Execute committed EXECUTE_TOOL requests for ``name`` with ``fn(call: ToolCall)``.

        ``fn`` may be sync or ``async``; its return value (or its error, or
        a timeout after ``timeout`` seconds) comes back as a TOOL_RESULT in
        the requesting scope. See ``docs/orchestrators.md``.
        """
        self.tools.register(name, fn, timeout=timeout)

    def resume_tools(self) -> int:
        """Dispatch every pending tool request again (after a restart); return how many.

        Restores every stored scope. Requests dispatched again carry
        ``redelivery=True`` and their original idempotency key; those with no
        registered executor are listed in ``manager.tools.unhandled``.
        """
        count = 0
        for ref in self.scopes():
            handle = self.scope(ref)
            pending = tuple(handle._cell.state.pending_tools.values())
            if pending:
                self.tools.dispatch(ref, pending, redelivery=True)
                count += len(pending)
        return count

    async def aresume_tools(self) -> int:
        """The asyncio twin of :meth:`resume_tools`."""
        return await asyncio.to_thread(self.resume_tools)

    def tools_committed(self, ref: ScopeRef, requests: tuple[Any, ...], run_id: str | None = None) -> None:
        self.tools.dispatch(ref, requests, run_id=run_id)

    def run_committed(self, record: StateChanged) -> None:
        run = self._active_runs.get(record.run_id or "")
        if run is not None:
            run.record(record)

    # -- runs ----------------------------------------------------------------

    def run(self, session_id: str, timeout: float = 30.0) -> RunContext:
        """``with manager.run(session_id, timeout=30.0) as run:``: one agent operation.

        Every request inside is tagged with ``run.id`` and bounded by the
        run's deadline. If the block raises or outlives ``timeout``, the
        run's own writes are rolled back in every scope it touched (see
        ``docs/supervision-and-runs.md``) and the error is raised again with a
        ``rollback_report``.
        """
        if self._closed:
            raise RuntimeClosedError("the manager is closed")
        return RunContext(self, session_id, timeout)

    def arun(self, session_id: str, timeout: float = 30.0) -> RunContext:
        """``async with manager.arun(session_id, timeout=30.0) as run:``; the timeout cancels the body."""
        return self.run(session_id, timeout)

    def quiesce(self, timeout: float = 10.0) -> None:
        """Return once the runtime is quiet: every mailbox empty, every event and tool result delivered.

        Repeats rounds (wait for running tools, pass a barrier through every
        live actor's mailbox and through the event thread) until a whole
        round saw no new commit, so writes that subscribers or tools make in
        answer to other writes are waited for too. For tests and orderly
        shutdowns; it does not stop anyone from sending more.

        Raises:
            DeadlineExceededError: still busy after ``timeout`` seconds.
        """
        end = time.monotonic() + timeout
        while True:
            before = self._activity()
            quiet = self.tools.wait_idle(max(end - time.monotonic(), 0.0))
            futures = []
            for entry in list(self._scopes.values()):
                with entry.cell.lock:
                    actor = entry.cell.actor
                    if actor is not None:
                        futures.append(actor.ask(Barrier(), block=False))
            for future in futures:
                try:
                    future.get(timeout=max(end - time.monotonic(), 0.0))
                except pykka.Timeout:
                    quiet = False
                except pykka.ActorDeadError:
                    pass
            quiet = self._bus.barrier(max(end - time.monotonic(), 0.0)) and quiet
            if quiet and self._activity() == before:
                return
            if time.monotonic() >= end:
                raise DeadlineExceededError(
                    f"the runtime was still busy after {timeout} s (commits, events or tools in flight)"
                )

    async def aquiesce(self, timeout: float = 10.0) -> None:
        """The asyncio twin of :meth:`quiesce`; the event loop stays free meanwhile."""
        await asyncio.to_thread(self.quiesce, timeout)

    def _activity(self) -> tuple[int, int, int]:
        return (
            sum(e.cell.commits for e in list(self._scopes.values())),
            self.tools.dispatched,
            self._bus.published,
        )

    def stats(self) -> dict[str, int]:
        """Counters: live and passivated scopes, activations, evictions, mailbox depth, commits,
        supervision failures, restarts and escalations, store commits and transactions."""
        return {
            "live_actors": self.passivator.live,
            "peak_live_actors": self.passivator.peak_live,
            "scopes": len(self._scopes),
            "passivated_scopes": sum(1 for e in self._scopes.values() if e.cell.actor is None),
            "activations": self.passivator.activations,
            "passivations": self.passivator.passivations,
            "evictions": self.passivator.evictions,
            "mailbox_depth_max": max(
                (mailbox_depth(a) for e in self._scopes.values() if (a := e.cell.actor) is not None),
                default=0,
            ),
            "commits": sum(e.cell.commits for e in self._scopes.values()),
            "failures": self.supervisor.failures,
            "restarts": self.supervisor.restarts,
            "escalations": self.supervisor.escalations,
            "store_commits": 0 if self._store is None else self._store.commits,
            "store_transactions": 0 if self._store is None else self._store.transactions,
        }

    # -- supervision --------------------------------------------------------

    def set_supervision(
        self,
        supervisor: ScopeRef | str | None,
        strategy: str = "one_for_one",
        *,
        max_restarts: int = 3,
        within: float = 5.0,
    ) -> None:
        """Set how ``supervisor`` (a scope, or None for the root above global) treats failed children."""
        ref = None if supervisor is None else self.scope(supervisor).ref
        self.supervisor.policies[ref] = SupervisionPolicy(strategy, max_restarts, within)

    def subscribe_supervision(self, callback: Callable[[SupervisionEvent], object]) -> Subscription:
        """Call ``callback`` with every failure, restart, escalation and give-up, in order."""

        def remove(sub: Subscription) -> None:
            with self._lock:
                self._supervision_subs = tuple(s for s in self._supervision_subs if s is not sub)

        sub = Subscription(None, callback, remove)  # type: ignore[arg-type]
        with self._lock:
            self._supervision_subs = (*self._supervision_subs, sub)
        return sub

    def restart_scope(self, ref: ScopeRef | str, *, timeout: float | None = None) -> None:
        """Restart a scope from its last committed state, also one supervision gave up on."""
        handle = self.scope(ref)
        wait = self.request_timeout if timeout is None else timeout
        handle._ask(RestartRequest("restarted by hand"), wait)

    def scope_failed(self, ref: ScopeRef, exc: BaseException) -> None:
        self.supervisor.failed(ref, exc)

    def reload(self, cell: ScopeCell, reason: str) -> None:
        """Rebuild ``cell``'s state from its last committed state (on its actor's thread)."""
        state = cell.state
        loaded = state
        store = self._store
        if store is not None and not store.read_only and cell.durability != "manual":
            try:
                store.flush()
                loaded, _report = store.load(state.ref, state.lineage)
            except Exception:
                logger.exception(
                    "restarting %s from the store failed; using its committed state in memory", state.ref
                )
                loaded = state
            if loaded.version != state.version:
                logger.warning(
                    "%s: the store holds version %d, memory %d; restarting from memory",
                    state.ref,
                    loaded.version,
                    state.version,
                )
                loaded = state
        cell.state = loaded
        cell.restarts += 1
        cell.failed_reason = None
        logger.info("restarted %s at version %d (%s)", state.ref, loaded.version, reason)

    def _restart_request(self, ref: ScopeRef, reason: str) -> None:
        entry = self._scopes.get(ref)
        if entry is None:
            return
        cell = entry.cell
        if threading.current_thread() is cell.owner:
            self.reload(cell, reason)  # the failed scope itself: before its queued requests
            return
        with cell.lock:
            actor = cell.actor
            if actor is None:  # passivated: no thread to race with, restart it here
                self.reload(cell, reason)
                return
            try:
                actor.tell(RestartRequest(reason))
            except pykka.ActorDeadError:
                pass

    def _give_up(self, ref: ScopeRef, reason: str) -> None:
        entry = self._scopes.get(ref)
        if entry is not None:
            entry.cell.failed_reason = reason

    def _publish_supervision(self, event: SupervisionEvent) -> None:
        subs = self._supervision_subs
        if subs:
            self._bus.publish(subs, event)  # type: ignore[arg-type]

    def _subscribe(
        self, cell: ScopeCell, ref: ScopeRef, callback: Callable[[StateChanged], object]
    ) -> Subscription:
        def remove(sub: Subscription) -> None:
            with self._lock:
                cell.subscribers = tuple(s for s in cell.subscribers if s is not sub)

        sub = Subscription(ref, callback, remove)
        with self._lock:
            cell.subscribers = (*cell.subscribers, sub)
        return sub

    def inject_fault(self, ref: ScopeRef | str, fault: BaseException | Callable[[], Any]) -> None:
        """Deprecated: use ``victor_actors.testing.inject_fault(manager, ref, fault)``."""
        warnings.warn(
            "manager.inject_fault is deprecated; use victor_actors.testing.inject_fault(manager, ref, fault)",
            DeprecationWarning,
            stacklevel=2,
        )
        self._inject_fault(ref, fault)

    def _inject_fault(self, ref: ScopeRef | str, fault: BaseException | Callable[[], Any]) -> None:
        handle = self.scope(ref)
        self._scopes[handle.ref].cell.faults.append(fault)


@atexit.register
def _close_open_managers() -> None:
    for manager in list(_open_managers):
        try:
            manager.close(timeout=1.0)
        except Exception:  # pragma: no cover - best effort at exit
            pass
