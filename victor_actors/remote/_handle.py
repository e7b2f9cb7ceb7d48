"""A scope seen from another process: :class:`RemoteScopeHandle`, and a client's run.

The handle has the local :class:`ScopeHandle`'s API (reads, writes with
``expected_version``, ``modify``, ``transact``, ``subscribe``, every
blocking call with its asyncio twin); each call is a request to the owner.
Reads are not cached: a snapshot is the owner's current committed state,
taken atomically with its ancestors, so a client reads its own writes and
never sees part of a cross-scope batch.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Protocol

from victor_actors._errors import (
    DeadlineExceededError,
    ScopeAccessError,
    TransitionValidationError,
    VersionConflictError,
)
from victor_actors._handle import BatchLike, _transitions
from victor_actors._level_checkpoints import ScopeDict
from victor_actors._model import SESSION, ScopeRef, StateScope, StateTransition, TransitionBatch
from victor_actors._rollback import RollbackReport
from victor_actors._snapshot import ContextSnapshot
from victor_actors._state import StateChanged
from victor_actors._twins import Step, StepGen, adrive, drive
from victor_actors.remote import _wire as w
from victor_actors.remote._client import Subscription, batch_id

__all__ = ["CURRENT_REMOTE_RUN", "Connection", "RemoteRun", "RemoteScopeHandle"]


class Connection(Protocol):
    """What a handle needs of its client (the manager passes itself in)."""

    url: str
    request_timeout: float
    closed: bool

    def _sync(self, coro: Any) -> Any: ...

    async def _ask(self, owner: int, op: dict[str, Any], timeout: float | None) -> Any: ...

    def _subscribe(
        self, ref: ScopeRef, owner: int, version: int, callback: Callable[..., object]
    ) -> Subscription: ...

    def _blocking(self, kind: str, op: dict[str, Any], timeout: float | None) -> Any: ...

    async def _atx(self, kind: str, op: dict[str, Any], timeout: float | None) -> Any: ...


CURRENT_REMOTE_RUN: contextvars.ContextVar[RemoteRun | None] = contextvars.ContextVar(
    "victor_actors_remote_run", default=None
)


class RemoteRun:
    """What ``with client.run(...)`` yields: the run's id (the owner's), its commits, how it ended.

    ``status`` is ``"running"``, ``"succeeded"`` or ``"rolled_back"``; after a
    rollback ``rollback_report`` says what the owner undid in each scope.
    """

    def __init__(self, run_id: str, session_id: str, timeout: float) -> None:
        self.id = run_id
        self.session_id = session_id
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.commits: list[StateChanged] = []
        self.status = "running"
        self.rollback_report: RollbackReport | None = None

    def __repr__(self) -> str:
        return f"<RemoteRun {self.id} {self.status}>"

    @property
    def rolled_back(self) -> bool:
        return self.status == "rolled_back"

    @property
    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def bind(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Wrap ``fn`` to run in this run's context (for threads and executors)."""
        ctx = contextvars.copy_context()

        def bound(*args: Any, **kwargs: Any) -> Any:
            return ctx.copy().run(fn, *args, **kwargs)

        return bound

    def _record(self, record: StateChanged) -> None:
        self.commits.extend(r for r in (record, *record.related) if r.committed)


def _scope_names(ref: ScopeRef, lineage: tuple[ScopeRef, ...]) -> dict[Any, ScopeRef]:
    names: dict[Any, ScopeRef] = {}
    for r in (*lineage, ref):
        names.update({r: r, str(r): r, r.scope.value: r, r.scope: r})
    if lineage and lineage[0].scope is not StateScope.GLOBAL:
        names[SESSION] = lineage[0]  # the seed's "session": the parent (the owner resolves it too)
    return names


class RemoteScopeHandle:
    """A handle on one scope owned by another process. Cheap, thread-safe, shareable."""

    __slots__ = ("_manager", "lineage", "ref")

    def __init__(self, manager: Connection, ref: ScopeRef, lineage: tuple[ScopeRef, ...]) -> None:
        self._manager = manager
        self.ref = ref
        self.lineage = lineage

    def __repr__(self) -> str:
        return f"<RemoteScopeHandle {self.ref} at {self._manager.url}>"

    @property
    def parent(self) -> ScopeRef | None:
        return self.lineage[0] if self.lineage else None

    @property
    def is_live(self) -> bool:
        """Always True from a client: the owner brings a passivated scope back on the next request."""
        return not self._manager.closed

    # -- reads ---------------------------------------------------------------

    def snapshot(self, *, timeout: float | None = None) -> ContextSnapshot:
        """The owner's current committed state of this scope and its ancestors, taken atomically."""
        snap: ContextSnapshot = self._manager._sync(self.asnapshot(timeout=timeout))
        return snap

    async def asnapshot(self, *, timeout: float | None = None) -> ContextSnapshot:
        m = self._manager
        return w.snapshot_from(await m._ask(0, {"k": "snapshot", "s": str(self.ref)}, timeout))

    @property
    def version(self) -> int:
        """The scope's current committed version (a round trip to the owner)."""
        return self.snapshot().version

    async def aversion(self) -> int:
        return (await self.asnapshot()).version

    def get(self, key: str, default: Any = None) -> Any:
        """Read ``key`` from this scope, else from its nearest ancestor that has it."""
        return self.snapshot().get_state(key, default)

    async def aget(self, key: str, default: Any = None) -> Any:
        return (await self.asnapshot()).get_state(key, default)

    def to_dict(self) -> ScopeDict:
        """This scope's own key-value state as a plain, mutable deep copy (naming its scope, as locally)."""
        return ScopeDict.of(self.snapshot()._state)

    async def ato_dict(self) -> ScopeDict:
        return ScopeDict.of((await self.asnapshot())._state)

    # -- writes --------------------------------------------------------------

    def apply(
        self, batch: BatchLike, *, expected_version: Any = None, timeout: float | None = None
    ) -> StateChanged:
        """Apply a batch all or nothing (across this scope and its ancestors); return the commit record.

        Raises: as ``ScopeHandle.apply``, and :class:`OwnerUnavailableError`
        when the owner could not be reached before the deadline (it says
        whether the batch may have been applied; a batch the client sent
        again for you is applied at most once).
        """
        record: StateChanged = self._manager._sync(
            self.aapply(batch, expected_version=expected_version, timeout=timeout)
        )
        return record

    async def aapply(
        self, batch: BatchLike, *, expected_version: Any = None, timeout: float | None = None
    ) -> StateChanged:
        steps = _transitions(batch)
        m = self._manager
        op: dict[str, Any] = {
            "k": "apply",
            "s": str(self.ref),
            "t": w.transitions_to(steps),
            "x": self._expected(expected_version),
            "b": batch_id(),
        }
        wait = m.request_timeout if timeout is None else timeout
        run = CURRENT_REMOTE_RUN.get()
        if run is not None:
            if run.remaining <= 0:
                raise DeadlineExceededError(f"run {run.id} exceeded its timeout; nothing was applied")
            op["run"] = run.id
            wait = min(wait, run.remaining)
        record = w.record_from(await m._ask(0, op, wait), steps)
        if run is not None:
            run._record(record)
        return record

    def _expected(self, expected: Any) -> Any:
        """``expected_version`` in its wire form: an int, None, or (ref, version) pairs."""
        if expected is None or (isinstance(expected, int) and not isinstance(expected, bool)):
            return expected
        if not isinstance(expected, Mapping):
            raise TransitionValidationError(
                "expected_version is an int, None, or a mapping of scope to version"
            )
        names = _scope_names(self.ref, self.lineage)
        out = []
        for key, version in expected.items():
            ref = names.get(key)
            if ref is None:
                raise ScopeAccessError(
                    f"expected_version names {key!r}, which is neither {self.ref} nor one of its ancestors"
                )
            if isinstance(version, bool) or not isinstance(version, int):
                raise TransitionValidationError(f"expected_version for {ref} must be an int, not {version!r}")
            out.append((str(ref), version))
        return tuple(out)

    def written_scopes(self, batch: BatchLike) -> frozenset[ScopeRef]:
        """The scopes ``batch`` would write if applied here: this one, and each ancestor it targets.

        Raises:
            ScopeAccessError: a transition targets a scope that is neither this one nor an ancestor.
        """
        return self._written(_transitions(batch))

    def _written(self, steps: tuple[StateTransition, ...]) -> frozenset[ScopeRef]:
        names = _scope_names(self.ref, self.lineage)
        out = {self.ref}
        for t in steps:
            target = t.data.get("scope")
            if target is None:
                continue
            ref = names.get(target)
            if ref is None:
                raise ScopeAccessError(
                    f"a transition targets {target!r}, which is not {self.ref} or an ancestor"
                )
            out.add(ref)
        return frozenset(out)

    def update(
        self, values: Mapping[str, Any], *, expected_version: Any = None, timeout: float | None = None
    ) -> StateChanged:
        """Set several keys in this scope in one commit."""
        return self.apply(_updates(values), expected_version=expected_version, timeout=timeout)

    async def aupdate(
        self, values: Mapping[str, Any], *, expected_version: Any = None, timeout: float | None = None
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

    # -- read-modify-write ---------------------------------------------------------

    def _modify(
        self, fn: Callable[[ContextSnapshot], Any], retries: int, timeout: float | None
    ) -> StepGen[StateChanged]:
        """The optimistic read-modify-write loop, once for :meth:`modify` and :meth:`amodify`."""
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be an int of at least 0, not {retries!r}")
        if not callable(fn):
            raise TypeError("modify takes a callable: fn(snapshot) -> batch")
        for attempt in range(1, retries + 2):
            snapshot = yield Step(self.snapshot, self.asnapshot, timeout=timeout)
            steps = _transitions((yield Step(fn, None, snapshot)))
            written = self._written(steps)
            versions = snapshot.versions()
            expected = {r: versions[r] for r in written if r in versions}
            try:
                record: StateChanged = yield Step(
                    self.apply, self.aapply, steps, expected_version=expected, timeout=timeout
                )
                return record
            except VersionConflictError as exc:
                if attempt > retries:
                    exc.add_note(f"modify gave up after {attempt} attempts, each with a fresh snapshot")
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def modify(
        self, fn: Callable[[ContextSnapshot], BatchLike], *, retries: int = 5, timeout: float | None = None
    ) -> StateChanged:
        """Read-modify-write without lost updates, as ``ScopeHandle.modify``: ``fn(snapshot)`` returns
        the batch, applied with the snapshot's versions of the scopes it writes; on a conflict ``fn``
        is called again with a fresh snapshot, up to ``retries`` more times."""
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

    def _lock_names(self, lock: Iterable[Any] | None) -> tuple[str, ...] | None:
        if lock is None:
            return None
        names = _scope_names(self.ref, self.lineage)
        out = []
        for item in lock:
            ref = names.get(item)
            if ref is None:
                raise ScopeAccessError(f"transact can lock only {self.ref} and its ancestors, not {item!r}")
            out.append(str(ref))
        return tuple(out)

    def _transact(
        self, fn: Callable[[ContextSnapshot], Any], lock: Iterable[Any] | None, timeout: float | None
    ) -> StepGen[StateChanged]:
        if not callable(fn):
            raise TypeError("transact takes a callable: fn(snapshot) -> batch")
        m = self._manager
        names = self._lock_names(lock)
        opened = yield Step(m._blocking, m._atx, "tx_open", {"s": str(self.ref), "l": names}, timeout)
        txid, raw = opened
        try:
            snapshot = w.snapshot_from(raw)
            steps = _transitions((yield Step(fn, None, snapshot)))
        except BaseException:
            yield Step(m._blocking, m._atx, "tx_abort", {"id": txid}, timeout)
            raise
        out = yield Step(
            m._blocking, m._atx, "tx_commit", {"id": txid, "t": w.transitions_to(steps)}, timeout
        )
        record = w.record_from(out, steps)
        run = CURRENT_REMOTE_RUN.get()
        if run is not None:
            run._record(record)
        return record

    def transact(
        self,
        fn: Callable[[ContextSnapshot], BatchLike],
        *,
        lock: Iterable[ScopeRef | StateScope | str] | None = None,
        timeout: float | None = None,
    ) -> StateChanged:
        """Read and write this scope and its ancestors with no chance of a version conflict.

        As ``ScopeHandle.transact``: the owner locks the scopes, this client
        calls ``fn(snapshot)`` with their current states and sends the batch
        back, and the owner applies it before unlocking. If ``fn`` raises,
        nothing is applied; if this client goes away meanwhile, the owner
        unlocks at the deadline and applies nothing.
        """
        return drive(self._transact(fn, lock, timeout), "transact's fn")

    async def atransact(
        self,
        fn: Callable[[ContextSnapshot], BatchLike | Awaitable[BatchLike]],
        *,
        lock: Iterable[ScopeRef | StateScope | str] | None = None,
        timeout: float | None = None,
    ) -> StateChanged:
        """The asyncio twin of :meth:`transact`; ``fn`` may also be ``async``."""
        return await adrive(self._transact(fn, lock, timeout))

    # -- events ----------------------------------------------------------------

    def subscribe(self, callback: Callable[[StateChanged], object]) -> Subscription:
        """Call ``callback(event)`` in this process after every later commit of this scope, in order.

        Events are read from the owner by version, so a reconnect or an
        owner restart loses none and doubles none: delivery resumes after
        the last version delivered. Callbacks run on the client's delivery
        thread; a callback that raises is ignored.
        """
        if not callable(callback):
            raise TypeError("subscribe takes a callable")
        return self._manager._subscribe(self.ref, 0, self.version, callback)


def _updates(values: Mapping[str, Any]) -> TransitionBatch:
    if not isinstance(values, Mapping):
        raise TransitionValidationError(f"update takes a mapping, not {type(values).__name__}")
    batch = TransitionBatch()
    for key, value in values.items():
        batch.update_state(key, value)
    return batch
