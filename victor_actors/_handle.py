"""ScopeHandle: what orchestrator code holds to talk to one scope's actor."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from victor_actors import _clock, _trace
from victor_actors._cell import ScopeCell
from victor_actors._errors import (
    DeadlineExceededError,
    ScopeAccessError,
    TransitionValidationError,
    VersionConflictError,
)
from victor_actors._events import Subscription
from victor_actors._kernel import Kernel
from victor_actors._level_checkpoints import ScopeDict
from victor_actors._messages import ApplyRequest, AsyncReply
from victor_actors._model import (
    CoordinatorResult,
    ScopeRef,
    StateScope,
    StateTransition,
    TransitionBatch,
    TransitionType,
)
from victor_actors._runs import CURRENT_RUN, run_bound_deadline
from victor_actors._snapshot import ContextSnapshot
from victor_actors._state import StateChanged
from victor_actors._toolresult import await_tool_result, wait_tool_result
from victor_actors._twins import Step, StepGen, adrive, drive
from victor_actors._txn import apply_across, expected_for, resolve_session, split_by_scope, transact
from victor_actors._values import FrozenDict

__all__ = ["BatchLike", "ScopeHandle"]

BatchLike = TransitionBatch | StateTransition | CoordinatorResult | Iterable[StateTransition]
Expected = int | Mapping[Any, int] | None
Parts = dict[ScopeRef, tuple[list[StateTransition], list[int]]] | None


def _plain(batch: TransitionBatch) -> tuple[StateTransition, ...] | None:
    """A batch's transitions if every one is a builder-made, non-BATCH transition naming no scope.

    The common batch, checked in one pass: what :func:`_transitions` would
    capture, and what ``resolve_session`` and ``split_by_scope`` would leave
    as it is. None: the batch needs the general path (which also gives the
    errors).
    """
    ts = batch.transitions
    if ts.__class__ is not list:
        return None
    captured = tuple(ts)
    for t in captured:
        if t.__class__ is not StateTransition or t.transition_type is _BATCH:
            return None
        data = t.data
        if data.__class__ is not FrozenDict or "scope" in data._data:
            return None
    return captured


_BATCH = TransitionType.BATCH


def _transitions(batch: BatchLike) -> tuple[StateTransition, ...]:
    """The transitions ``apply`` captures from what it was given, each checked: garbage is refused here."""
    if isinstance(batch, TransitionBatch):
        ts = batch.transitions
        if ts.__class__ is not list:
            raise TransitionValidationError(
                f"TransitionBatch.transitions must be a list of StateTransition, not {type(ts).__name__}; "
                "nothing was applied",
                field="transitions",
            )
        captured = tuple(ts)
        if any(
            t.__class__ is StateTransition and t.transition_type is TransitionType.BATCH for t in captured
        ):
            captured = TransitionBatch(captured).freeze()
    elif isinstance(batch, CoordinatorResult):
        return _transitions(batch.transitions)
    elif isinstance(batch, StateTransition):
        captured = tuple(batch.flatten())
    elif isinstance(batch, Iterable) and not isinstance(batch, (str, bytes, Mapping)):
        captured = TransitionBatch(batch).freeze()
    else:
        raise TransitionValidationError(
            f"apply takes a TransitionBatch, a StateTransition, a CoordinatorResult or "
            f"transitions, not {type(batch).__name__}"
        )
    for index, t in enumerate(captured):
        if t.__class__ is not StateTransition or t.data.__class__ is not FrozenDict:
            raise TransitionValidationError(
                f"item {index} of the batch is a {type(t).__name__}, not a StateTransition made by the "
                "batch's builders; nothing was applied",
                index=index,
                field="transitions",
            )
    return captured


class ScopeHandle:
    """A handle on one scope instance. Cheap, thread-safe, shareable.

    Writes go through the scope's actor; reads (``snapshot``, ``get``,
    ``version``) take the last committed immutable state without a round
    trip. Every blocking method has an ``a``-prefixed asyncio twin that
    leaves the event loop free while the actor works.

    Every request has a deadline: ``timeout`` seconds, or the manager's
    ``request_timeout``. A request still in the mailbox at its deadline is
    not applied and raises :class:`DeadlineExceededError`.

    A handle is a reference, not the scope: it holds its scope's cell only
    weakly and looks the scope up again once the cell has been evicted, so
    holding handles keeps nothing of an idle scope in memory, and a handle
    taken before an eviction works after it.
    """

    __slots__ = ("_cellref", "_kernel", "ref")

    def __init__(self, kernel: Kernel, cell: ScopeCell) -> None:
        self._kernel = kernel
        self._cellref = weakref.ref(cell)
        self.ref = cell.state.ref

    @property
    def _cell(self) -> ScopeCell:
        """The scope's resident cell, brought back from the store (or memory) if it was evicted."""
        cell = self._cellref()
        if cell is None or cell.evicted or self._kernel.forked:
            if self._kernel.forked:
                self._kernel.check_open(self.ref)
            cell = self._kernel.resolve(self.ref)
            self._cellref = weakref.ref(cell)
        return cell

    def __repr__(self) -> str:
        cell = self._cellref()
        if cell is None or cell.evicted:
            return f"<ScopeHandle {self.ref} evicted>"
        return f"<ScopeHandle {self.ref} v{cell.state.version}>"

    # -- reads -------------------------------------------------------------

    @property
    def parent(self) -> ScopeRef | None:
        return self._cell.state.parent

    @property
    def is_live(self) -> bool:
        """Whether the scope's actor is running now (False: passivated; the next request restarts it).

        Asking does not bring an evicted scope back.
        """
        cell = self._cellref()
        return cell is not None and not cell.evicted and cell.actor is not None

    @property
    def version(self) -> int:
        """The scope's current committed version."""
        if self._kernel.fresh is not None:
            return self.snapshot().version
        return self._cell.state.version

    def snapshot(self) -> ContextSnapshot:
        """An immutable view of this scope and its ancestors, in O(1).

        It reflects every commit acknowledged before the call, and never
        changes afterwards. In a read-only manager (another process owns the
        store), it is the store's newest consistent state: re-read when the
        store has moved on since the last read, never torn.
        """
        cell = self._cell
        kernel = self._kernel
        fresh = kernel.fresh
        if fresh is not None:
            snap = fresh(cell)
        elif not (cells := cell.ancestors):
            snap = ContextSnapshot(cell.state)
        else:
            with kernel.publish_lock:
                snap = ContextSnapshot(cell.state, tuple(c.state for c in cells))
        calls = kernel.calls
        if calls is not None:  # the testing kit's recorder: who read what, for its history checks
            calls("read", self.ref, snap)
        return snap

    async def asnapshot(self) -> ContextSnapshot:
        return self.snapshot()

    def get(self, key: str, default: Any = None) -> Any:
        """Read ``key`` from this scope, else from its nearest ancestor that has it."""
        return self.snapshot().get_state(key, default)

    def to_dict(self) -> ScopeDict:
        """This scope's own key-value state as a plain, mutable deep copy.

        A ``dict`` that also names this scope instance and its version
        (``.ref``, ``.version``): ADR-002's
        ``await manager.save_checkpoint(StateScope.X, handle.to_dict())`` uses them.
        """
        if self._kernel.fresh is not None or self._kernel.calls is not None:
            return ScopeDict.of(self.snapshot()._state)
        return ScopeDict.of(self._cell.state)

    # -- writes ------------------------------------------------------------

    def _request(
        self, batch: BatchLike, expected_version: Expected, timeout: float | None, reply: AsyncReply | None
    ) -> tuple[ApplyRequest, float, Parts]:
        kernel = self._kernel
        kernel.check_open(self.ref)
        if kernel.read_only:
            raise ScopeAccessError(f"the manager is read-only; {self.ref} takes no batches")
        cell = self._cell
        transitions = _plain(batch) if batch.__class__ is TransitionBatch else None
        if transitions is None:
            transitions = self._checked(batch, cell)
            parts = split_by_scope(cell, transitions)
        else:  # no transition names a scope: nothing to resolve or split
            validate = kernel.validate
            if validate is not None:
                validate(cell, transitions)
            parts = None
        if expected_version is not None and not isinstance(expected_version, int):
            parts = self._checked_scopes(expected_version, transitions, parts)
            if parts is None:
                expected_version = expected_for(expected_version, self.ref, self.ref)
        wait = kernel.options.request_timeout if timeout is None else timeout
        run = CURRENT_RUN.get()
        deadline = _clock.monotonic() + wait
        run_id = None
        if run is not None:
            deadline = run_bound_deadline(deadline)
            wait = _clock.remaining(deadline)
            run_id = run.id
        elif _clock.virtual:
            wait = _clock.remaining(deadline)  # virtual time stands still while the caller waits
        return ApplyRequest(transitions, expected_version, deadline, run_id, reply), wait, parts  # type: ignore[arg-type]

    def _captured(self, batch: BatchLike, cell: ScopeCell | None = None) -> tuple[StateTransition, ...]:
        """The transitions of ``batch``, checked, with ``scope="session"`` resolved to this scope's parent."""
        state = (self._cell if cell is None else cell).state
        return resolve_session(state.ref, state.lineage, _transitions(batch))

    def _checked(self, batch: BatchLike, cell: ScopeCell | None = None) -> tuple[StateTransition, ...]:
        """:meth:`_captured`, and the application's rules (``validators``) checked."""
        if cell is None:
            cell = self._cell
        transitions = self._captured(batch, cell)
        validate = self._kernel.validate
        if validate is not None:
            validate(cell, transitions)
        return transitions

    def _checked_scopes(
        self, expected: Mapping[Any, int], transitions: tuple[StateTransition, ...], parts: Parts
    ) -> Parts:
        """Scopes named in ``expected`` take part in the batch (possibly with nothing to write).

        A version named for an ancestor the batch does not write is checked
        atomically with the commit: the ancestor joins the transaction with an
        empty part. Naming a scope that is neither this one nor an ancestor is
        an access error.
        """
        lineage = self._cell.state.lineage
        names: dict[Any, ScopeRef] = {
            self.ref: self.ref,
            str(self.ref): self.ref,
            self.ref.scope.value: self.ref,
        }
        names[self.ref.scope] = self.ref
        for anc in lineage:
            names.update({anc: anc, str(anc): anc, anc.scope.value: anc, anc.scope: anc})
        extra = []
        for key in expected:
            ref = names.get(key)
            if ref is None:
                raise ScopeAccessError(
                    f"expected_version names {key!r}, which is neither {self.ref} nor one of its ancestors"
                )
            if ref != self.ref and (parts is None or ref not in parts):
                extra.append(ref)
        if not extra:
            return parts
        if parts is None:
            parts = {self.ref: (list(transitions), list(range(len(transitions))))}
        for ref in extra:
            parts[ref] = ([], [])
        return parts

    def _unanswered(self, req: ApplyRequest) -> None:
        """No reply in time: if the request belongs to a run, the run must check this scope."""
        run = CURRENT_RUN.get()
        if run is not None and req.run_id == run.id:
            run.touch(self.ref)

    @staticmethod
    def _ran(record: StateChanged) -> StateChanged:
        run = CURRENT_RUN.get()
        if run is not None:
            run.record(record)
        return record

    def apply(
        self, batch: BatchLike, *, expected_version: Expected = None, timeout: float | None = None
    ) -> StateChanged:
        """Apply a batch all or nothing; return the commit record.

        A batch may also carry transitions for this scope's ancestors
        (``scope="team"``, ...): then it commits in every scope it touches or
        in none, and ``expected_version`` may be a mapping from scope (a
        ``ScopeRef``, ``"team:t"``, or a level such as ``"team"``) to
        version. The record returned is this scope's; its ``involved`` and
        ``related`` name the other scopes' commits, which share its
        ``commit_id``.

        Raises:
            VersionConflictError: ``expected_version`` is not the current one.
            TransitionValidationError, ScopeAccessError, ScopeClosedError:
                the batch cannot apply here; the error names the transition.
            DeadlineExceededError: no reply within the deadline.
            ScopeFailedError: the actor failed on this request.
            In every case nothing of the batch was applied.
        """
        req, wait, parts = self._request(batch, expected_version, timeout, None)
        if self._kernel.calls is not None:  # the testing kit's recorder
            return self._noted(
                "apply", req.transitions, expected_version, self._apply_traced, req, wait, parts
            )
        if _trace.hooks is None:
            return self._apply(req, wait, parts, expected_version)
        return self._apply_traced(req, wait, parts, expected_version)

    def _apply_traced(
        self, req: ApplyRequest, wait: float, parts: Parts, expected_version: Expected
    ) -> StateChanged:
        hooks = _trace.hooks  # traced: the caller's span, current from here until trace.end
        if hooks is None:
            return self._apply(req, wait, parts, expected_version)
        trace = req.trace = hooks.call("apply", self.ref, req, parts is not None, self._kernel.names)
        try:
            record = self._apply(req, wait, parts, expected_version)
        except BaseException as exc:
            trace.end(None, exc)
            raise
        trace.end(record, None)
        return record

    def _apply(
        self, req: ApplyRequest, wait: float, parts: Parts, expected_version: Expected
    ) -> StateChanged:
        if parts is not None:
            deadline = req.deadline or 0.0
            return self._ran(
                apply_across(self._kernel, self._cell, parts, expected_version, deadline, req.run_id)
            )
        try:
            record: StateChanged = self._kernel.ask(self._cell, req, wait)
        except DeadlineExceededError:
            self._unanswered(req)  # it may still commit: a run must look here when it rolls back
            raise
        return self._ran(record) if req.run_id is not None else record

    async def aapply(
        self, batch: BatchLike, *, expected_version: Expected = None, timeout: float | None = None
    ) -> StateChanged:
        """The asyncio twin of :meth:`apply`; the event loop stays free meanwhile."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[StateChanged] = loop.create_future()
        req, wait, parts = self._request(batch, expected_version, timeout, AsyncReply(loop, future))
        calls = self._kernel.calls
        if calls is None:  # the testing kit's recorder is not attached
            if _trace.hooks is None:
                return await self._aapply(req, wait, parts, expected_version, loop, future)
            return await self._aapply_traced(req, wait, parts, expected_version, loop, future)
        try:
            record = await self._aapply_traced(req, wait, parts, expected_version, loop, future)
        except BaseException as exc:
            calls("write", self.ref, ("aapply", req.transitions, expected_version, None, exc))
            raise
        calls("write", self.ref, ("aapply", req.transitions, expected_version, record, None))
        return record

    async def _aapply_traced(
        self,
        req: ApplyRequest,
        wait: float,
        parts: Parts,
        expected_version: Expected,
        loop: asyncio.AbstractEventLoop,
        future: asyncio.Future[StateChanged],
    ) -> StateChanged:
        hooks = _trace.hooks  # traced: the caller's span, current from here until trace.end
        if hooks is None:
            return await self._aapply(req, wait, parts, expected_version, loop, future)
        trace = req.trace = hooks.call("aapply", self.ref, req, parts is not None, self._kernel.names)
        try:
            record = await self._aapply(req, wait, parts, expected_version, loop, future)
        except BaseException as exc:
            trace.end(None, exc)
            raise
        trace.end(record, None)
        return record

    def _noted(
        self,
        via: str,
        transitions: Any,
        expected_version: Expected,
        fn: Callable[..., StateChanged],
        *args: Any,
    ) -> StateChanged:
        """``fn(*args, expected_version)`` with the outcome told to the kernel's ``calls`` hook."""
        calls = self._kernel.calls
        try:
            record = fn(*args, expected_version) if via == "apply" else fn(*args)
        except BaseException as exc:
            if calls is not None:
                calls("write", self.ref, (via, transitions, expected_version, None, exc))
            raise
        if calls is not None:
            calls("write", self.ref, (via, transitions, expected_version, record, None))
        return record

    async def _aapply(
        self,
        req: ApplyRequest,
        wait: float,
        parts: Parts,
        expected_version: Expected,
        loop: asyncio.AbstractEventLoop,
        future: asyncio.Future[StateChanged],
    ) -> StateChanged:
        if parts is not None:  # the coordinator blocks on votes: run it off the loop
            call = _tracked(CURRENT_RUN.get(), parts, apply_across)
            deadline = req.deadline or 0.0
            record = await asyncio.to_thread(
                call, self._kernel, self._cell, parts, expected_version, deadline, req.run_id
            )
            return self._ran(record)
        kernel = self._kernel
        # an idle scope whose commit does not wait for the disk: a pool thread takes the step
        # (ADR 0036); otherwise the request goes to the actor (a full mailbox: wait for room)
        if not kernel.step_soon(self._cell, req) and not kernel.try_tell(self._cell, req):
            await kernel.asend(self._cell, req, req.deadline or 0.0)
        # A plain timer is cheaper than asyncio.timeout() on this hot path.
        timer = loop.call_later(wait, _expire, future, self.ref, wait)
        try:
            record = await future
        except (DeadlineExceededError, asyncio.CancelledError):
            self._unanswered(req)  # it may still commit: a run must look here when it rolls back
            raise
        finally:
            timer.cancel()
        return self._ran(record) if req.run_id is not None else record

    def _modify(
        self, fn: Callable[[ContextSnapshot], Any], retries: int, timeout: float | None
    ) -> StepGen[StateChanged]:
        """The optimistic read-modify-write loop, once for :meth:`modify` and :meth:`amodify`."""
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be an int of at least 0, not {retries!r}")
        if not callable(fn):
            raise TypeError("modify takes a callable: fn(snapshot) -> batch")
        for attempt in range(1, retries + 2):
            snapshot = self.snapshot()
            transitions = self._captured((yield Step(fn, None, snapshot)))
            expected = self._read_versions(snapshot, transitions)
            try:
                record: StateChanged = yield Step(
                    self.apply, self.aapply, transitions, expected_version=expected, timeout=timeout
                )
                return record
            except VersionConflictError as exc:
                if attempt > retries:
                    exc.add_note(f"modify gave up after {attempt} attempts, each with a fresh snapshot")
                    raise
                if exc.ref == self.ref and exc.current_version > self.version:
                    # the winner's commit is staged but not yet durable (group commit): an empty
                    # request is answered once it is, so the next snapshot is not stale again
                    yield Step(self.apply, self.aapply, (), timeout=timeout)
        raise AssertionError("unreachable")  # pragma: no cover

    def _read_versions(
        self, snapshot: ContextSnapshot, transitions: tuple[StateTransition, ...]
    ) -> int | dict[ScopeRef, int]:
        """The snapshot's versions of the scopes ``transitions`` write (this one, and any ancestor)."""
        parts = split_by_scope(self._cell, transitions)
        if parts is None:
            return snapshot.version
        return {ref: v for ref, v in snapshot.versions().items() if ref in parts}

    def written_scopes(self, batch: BatchLike) -> frozenset[ScopeRef]:
        """The scopes ``batch`` would write if applied here: this one, and each ancestor it targets.

        Raises:
            ScopeAccessError: a transition targets a scope that is neither
                this one nor an ancestor.
            TransitionValidationError: ``batch`` is not a batch.
        """
        parts = split_by_scope(self._cell, self._captured(batch))
        return frozenset((self.ref,) if parts is None else (self.ref, *parts))

    def modify(
        self,
        fn: Callable[[ContextSnapshot], BatchLike],
        *,
        retries: int = 5,
        timeout: float | None = None,
    ) -> StateChanged:
        """Read-modify-write without lost updates: ``fn(snapshot)`` returns the batch to apply.

        The batch is applied with the snapshot's versions of the scopes it
        writes as ``expected_version``. If another writer committed first
        (:class:`VersionConflictError`), ``fn`` is called again with a fresh
        snapshot, up to ``retries`` more times. ``fn`` may be called several
        times, so keep it free of side effects; an error it raises propagates
        and nothing is applied. For one hot scope shared by many writers,
        :meth:`transact` does one round of messages per write instead.

        Raises:
            VersionConflictError: still conflicting after the last retry
                (a note says how many attempts were made); nothing of the
                last attempt was applied.
            The errors of :meth:`apply`.
        """
        return drive(self._modify(fn, retries, timeout), "modify's fn")

    async def amodify(
        self,
        fn: Callable[[ContextSnapshot], BatchLike | Awaitable[BatchLike]],
        *,
        retries: int = 5,
        timeout: float | None = None,
    ) -> StateChanged:
        """The asyncio twin of :meth:`modify`; ``fn`` may also be ``async``."""
        return await adrive(self._modify(fn, retries, timeout))

    def transact(
        self,
        fn: Callable[[ContextSnapshot], BatchLike],
        *,
        lock: Iterable[ScopeRef | StateScope | str] | None = None,
        timeout: float | None = None,
    ) -> StateChanged:
        """Read and write this scope and its ancestors with no chance of a version conflict.

        Locks this scope and the ancestors in ``lock`` (default: all of
        them), in the runtime's fixed order, then calls ``fn(snapshot)`` with
        their current states, and applies the batch it returns, all or
        nothing, before unlocking. The pessimistic twin of
        ``apply(..., expected_version=...)`` with retries: under heavy
        contention on one scope (a team counter bumped by every agent) it
        does one round of messages per write instead of many failed tries.
        ``fn`` runs while the scopes wait, so keep it short and free of I/O;
        if it raises, nothing is applied and the error propagates.

        Raises:
            ScopeAccessError: ``lock`` names a scope that is not this one or an
                ancestor, or the batch writes a scope that was not locked.
            DeadlineExceededError, ScopeFailedError: as for :meth:`apply`.
        """
        if self._kernel.calls is not None:
            return self._noted("transact", None, None, self._transact, fn, lock, timeout)
        return self._transact(fn, lock, timeout)

    def _transact(
        self,
        fn: Callable[[ContextSnapshot], BatchLike],
        lock: Iterable[ScopeRef | StateScope | str] | None,
        timeout: float | None,
    ) -> StateChanged:
        kernel = self._kernel
        kernel.check_open(self.ref)
        if kernel.read_only:
            raise ScopeAccessError(f"the manager is read-only; {self.ref} takes no batches")
        refs = self._lock_refs(lock)
        wait = kernel.options.request_timeout if timeout is None else timeout
        deadline = run_bound_deadline(_clock.monotonic() + wait)
        run = CURRENT_RUN.get()
        record = transact(
            kernel, self._cell, fn, refs, deadline, self._checked, None if run is None else run.id
        )
        return self._ran(record)

    async def atransact(
        self,
        fn: Callable[[ContextSnapshot], BatchLike],
        *,
        lock: Iterable[ScopeRef | StateScope | str] | None = None,
        timeout: float | None = None,
    ) -> StateChanged:
        """The asyncio twin of :meth:`transact` (``fn`` runs on a worker thread)."""
        # to_thread carries the context (the current run) into the worker thread
        run = CURRENT_RUN.get()
        call = _tracked(run, self._lock_refs(lock), self._transact)
        calls = self._kernel.calls
        if calls is None:
            return await asyncio.to_thread(call, fn, lock, timeout)
        try:
            record = await asyncio.to_thread(call, fn, lock, timeout)
        except BaseException as exc:
            calls("write", self.ref, ("atransact", None, None, None, exc))
            raise
        calls("write", self.ref, ("atransact", None, None, record, None))
        return record

    def _lock_refs(self, lock: Iterable[ScopeRef | StateScope | str] | None) -> tuple[ScopeRef, ...]:
        lineage = self._cell.state.lineage
        if lock is None:
            return (self.ref, *lineage)
        by_name = {a.scope.value: a for a in lineage}
        by_name.update({str(a): a for a in lineage})
        by_name.update({self.ref.scope.value: self.ref, str(self.ref): self.ref})
        out = []
        for item in lock:
            key = (
                str(item)
                if isinstance(item, ScopeRef)
                else StateScope(item).value
                if isinstance(item, StateScope)
                else item
            )
            ref = by_name.get(key)
            if ref is None:
                raise ScopeAccessError(f"transact can lock only {self.ref} and its ancestors, not {item!r}")
            out.append(ref)
        return tuple(out)

    def update(
        self, values: Mapping[str, Any], *, expected_version: Expected = None, timeout: float | None = None
    ) -> StateChanged:
        """Set several keys in this scope in one commit."""
        return self.apply(_updates(values), expected_version=expected_version, timeout=timeout)

    async def aupdate(
        self, values: Mapping[str, Any], *, expected_version: Expected = None, timeout: float | None = None
    ) -> StateChanged:
        return await self.aapply(_updates(values), expected_version=expected_version, timeout=timeout)

    def set(self, key: str, value: Any, *, timeout: float | None = None) -> StateChanged:
        return self.apply(TransitionBatch().update_state(key, value), timeout=timeout)

    async def aset(self, key: str, value: Any, *, timeout: float | None = None) -> StateChanged:
        return await self.aapply(TransitionBatch().update_state(key, value), timeout=timeout)

    def delete(self, key: str, *, timeout: float | None = None) -> StateChanged:
        return self.apply(TransitionBatch().delete_state(key), timeout=timeout)

    async def adelete(self, key: str, *, timeout: float | None = None) -> StateChanged:
        return await self.aapply(TransitionBatch().delete_state(key), timeout=timeout)

    def add_message(self, message: Any, *, timeout: float | None = None) -> StateChanged:
        return self.apply(TransitionBatch().add_message(message), timeout=timeout)

    async def aadd_message(self, message: Any, *, timeout: float | None = None) -> StateChanged:
        return await self.aapply(TransitionBatch().add_message(message), timeout=timeout)

    # -- tool results --------------------------------------------------------

    def wait_tool_result(self, request: str | Mapping[str, Any], *, timeout: float = 60.0) -> Any:
        """Wait for the result of one tool request of this scope; return its TOOL_RESULT message.

        ``request`` is a request id or a request (an item of a commit's
        ``tool_requests``). The message is a frozen mapping with ``role``
        ("tool"), ``tool_name``, ``content``, ``request_id`` and ``error``
        (None, or ``"ExcType: message"`` when the executor failed or timed
        out). Returns at once if the result is already there.

        Raises:
            ToolRequestNotFoundError: the request is neither pending nor
                answered here (never made, or released by a rollback).
            DeadlineExceededError: no result within ``timeout`` seconds; the
                request stays pending.
        """
        return wait_tool_result(self.ref, self.subscribe, self.snapshot, request, timeout)

    async def await_tool_result(self, request: str | Mapping[str, Any], *, timeout: float = 60.0) -> Any:
        """The asyncio twin of :meth:`wait_tool_result`; the event loop stays free meanwhile."""
        return await await_tool_result(self.ref, self.subscribe, self.asnapshot, request, timeout)

    # -- events ------------------------------------------------------------

    def subscribe(self, callback: Callable[[StateChanged], object]) -> Subscription:
        """Call ``callback(event)`` after every later commit of this scope, in order.

        Callbacks run on the manager's event thread, never on an actor's, so
        a callback may apply batches (to this scope too) without deadlock.
        A callback that raises is logged and changes nothing else.
        """
        if not callable(callback):
            raise TypeError("subscribe takes a callable")
        return self._kernel.subscribe(self._cell, callback)


def _tracked(
    run: Any, refs: Iterable[ScopeRef], fn: Callable[..., StateChanged]
) -> Callable[..., StateChanged]:
    """``fn`` for a worker thread: a run waits for it before rolling back, even if its caller is cancelled."""
    if run is None:
        return fn
    run.begin(refs)

    def call(*args: Any, **kwargs: Any) -> StateChanged:
        try:
            return fn(*args, **kwargs)
        finally:
            run.end()

    return call


def _expire(future: asyncio.Future[Any], ref: ScopeRef, wait: float) -> None:
    if not future.done():
        future.set_exception(
            DeadlineExceededError(
                f"{ref}: no reply within {wait} s; the request may still be applied, "
                "read the scope's version to tell"
            )
        )


def _updates(values: Mapping[str, Any]) -> TransitionBatch:
    if not isinstance(values, Mapping):
        raise TransitionValidationError(f"update takes a mapping, not {type(values).__name__}")
    batch = TransitionBatch()
    for key, value in values.items():
        batch.update_state(key, value)
    return batch
