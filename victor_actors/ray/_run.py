"""A run over Ray, seen from the driver: its commits, its writes in flight, the ones in doubt.

A local run learns of its commits from the actor that makes them, so a
write whose caller stopped waiting (an asyncio body cancelled at the run's
timeout, a reply that came after the request's deadline) is still undone by
the rollback. Over Ray the commit is made in another process, and only its
reply tells the driver. So every write of a run is tracked from the moment
it is queued on its shard's lane until its reply, however late:

- a reply that says it committed records the commit in the run (on the
  driver loop, whether or not the caller still waits for it);
- a reply that says it was refused, or a write never sent (its deadline
  passed in the queue), leaves nothing to undo;
- a write sent to a shard that then died, or still unanswered when the run
  rolls back, is *in doubt*: the rollback asks each scope it may have
  written to look for its batch id in the scope's log and undo it if found.

Before rolling back, the run waits (boundedly) for its writes in flight, and
each shard refuses writes of a run it has rolled back, so no write of the
run commits after its rollback. Every write of a run is also bounded by the
run's deadline, as locally.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol

from victor_actors._errors import (
    DeadlineExceededError,
    ScopeAccessError,
    ScopeClosedError,
    TransitionValidationError,
    VersionConflictError,
    VictorActorsError,
)
from victor_actors._model import GLOBAL_REF, ScopeRef, StateScope, StateTransition
from victor_actors._rollback import RollbackReport, RunFailedError, RunTimeoutError, ScopeRollback
from victor_actors._state import StateChanged
from victor_actors.ray import _wire as w
from victor_actors.ray._placement import Address
from victor_actors.ray._wire import ShardUnavailableError

__all__ = ["CURRENT_RAY_RUN", "RayRun", "RunWrite", "finish", "refused"]

SETTLE_SLACK = 5.0  # seconds past a run's deadline its rollback waits for the run's writes in flight
ROLLBACK_WAIT = 10.0  # at least this long for each scope's undo: it rides out a shard's restart
CURRENT_RAY_RUN: contextvars.ContextVar[RayRun | None] = contextvars.ContextVar(
    "victor_actors_ray_run", default=None
)


class RayScopeHandle(Protocol):
    """What a run needs of a ``RayScopeHandle`` (the driver's, which imports this module)."""

    ref: ScopeRef
    address: Address
    shard: int
    _manager: Any


class Driver(Protocol):
    """What a run's end needs of its manager (the driver's, which imports this module)."""

    request_timeout: float

    async def _ask(
        self, owner: int, op: dict[str, Any], timeout: float | None, outcome: Any = None
    ) -> Any: ...


class RayRun:
    """What ``with manager.run(...)`` yields: the run's id, its commits, and how it ended.

    ``status`` is ``"running"``, ``"succeeded"`` or ``"rolled_back"``; after a
    rollback ``rollback_report`` says what was undone in each scope, on
    whatever shard, and what was left because another writer changed it since.
    """

    def __init__(self, session_id: str, timeout: float) -> None:
        self.id = uuid.uuid4().hex
        self.session_id = session_id
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.handles: dict[ScopeRef, RayScopeHandle] = {}
        self.commits: list[StateChanged] = []
        self.status = "running"
        self.rollback_report: RollbackReport | None = None
        # the driver loop's alone: writes on their way, writes in doubt, a waiter for the first
        self._open: dict[int, RunWrite] = {}
        self._doubt: list[RunWrite] = []
        self._quiet: asyncio.Event | None = None

    @property
    def rolled_back(self) -> bool:
        return self.status == "rolled_back"

    @property
    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def _record(self, handle: RayScopeHandle, record: StateChanged) -> None:
        for rec in (record, *record.related):
            if rec.committed:
                self.commits.append(rec)
                if rec.ref not in self.handles:
                    h = handle if rec.ref == handle.ref else handle._manager._known_handle(rec.ref)
                    self.handles[rec.ref] = h

    def _begin(self, write: RunWrite) -> None:
        self._open[id(write)] = write

    def _end(self, write: RunWrite, committed: bool | None) -> None:
        self._open.pop(id(write), None)
        if committed is None:
            self._doubt.append(write)
        if not self._open and self._quiet is not None:
            self._quiet.set()

    async def _settle(self, wait: float) -> list[RunWrite]:
        """Wait up to ``wait`` s for the writes on their way; return those in doubt (on the driver loop)."""
        if self._open:
            self._quiet = asyncio.Event()
            try:
                await asyncio.wait_for(self._quiet.wait(), max(wait, 0.0))
            except TimeoutError:
                pass
            finally:
                self._quiet = None
        return [*self._doubt, *self._open.values()]


class RunWrite:
    """One write of a run on its way: recorded in the run by its reply, or listed as in doubt.

    ``batch_id`` is what the shards find its commit by (the batch id of a
    plain write, the transaction id of a cross-shard one); ``handles`` are
    the scopes it may have written, with their handles.
    """

    __slots__ = ("batch_id", "done", "handle", "handles", "run", "steps")

    def __init__(
        self,
        run: RayRun,
        handle: RayScopeHandle,
        steps: tuple[StateTransition, ...],
        batch_id: str,
        known: Callable[[ScopeRef], RayScopeHandle],
        across: bool = False,
    ) -> None:
        self.run = run
        self.handle = handle
        self.steps = steps
        self.batch_id = batch_id
        self.done = False
        self.handles: dict[ScopeRef, RayScopeHandle] = {handle.ref: handle}
        for ref in _written(handle, steps) + ([GLOBAL_REF] if across else []):
            if ref not in self.handles:
                try:
                    self.handles[ref] = known(ref)
                except ScopeAccessError:
                    pass  # not an ancestor this driver knows: the shard refuses the write

    def begin(self) -> None:
        self.run._begin(self)

    def settle(self, committed: bool | None, value: Any = None) -> None:
        """Its outcome: True (committed; ``value`` is the reply's record), False (refused, or never
        sent) or None (unknown)."""
        if self.done:
            return
        self.done = True
        if committed:
            record = value if isinstance(value, StateChanged) else w.record_from(value, self.steps)
            self.run._record(self.handle, record)
        self.run._end(self, committed)


def refused(exc: BaseException) -> bool:
    """Whether a failed cross-shard write certainly applied nothing (else its outcome is in doubt)."""
    if isinstance(exc, ShardUnavailableError):
        return not exc.may_have_applied
    return isinstance(
        exc, (TransitionValidationError, VersionConflictError, ScopeAccessError, ScopeClosedError)
    )


def _written(handle: RayScopeHandle, steps: tuple[StateTransition, ...]) -> list[ScopeRef]:
    """The scopes ``steps`` may write from ``handle``'s scope: its own, and each ancestor named."""
    _level, _ident, wf, team = handle.address
    levels = {StateScope.GLOBAL.value: GLOBAL_REF}
    if team is not None:
        levels[StateScope.TEAM.value] = ScopeRef(StateScope.TEAM, team)
    if wf is not None:
        levels[StateScope.WORKFLOW.value] = ScopeRef(StateScope.WORKFLOW, wf)
    out = [handle.ref]
    for t in steps:
        target = t.data.get("scope")
        if not isinstance(target, str) or target in (handle.ref.scope.value, str(handle.ref)):
            continue
        ref = levels.get(target)
        if ref is None and ":" in target:
            try:
                ref = ScopeRef.parse(target)
            except (ValueError, TransitionValidationError):
                ref = None
        if ref is not None and ref not in out:
            out.append(ref)
    return out


async def finish(manager: Driver, run: RayRun, exc: BaseException | None) -> None:
    """End ``run`` (on the driver's loop): nothing to do if it succeeded; else roll it back and raise
    :class:`RunFailedError` or :class:`RunTimeoutError` with the report (a cancellation propagates
    as it is)."""
    timed_out = run.remaining <= 0 or isinstance(exc, TimeoutError)
    if exc is None and not timed_out:
        run.status = "succeeded"
        return
    reason = "timed out" if timed_out and exc is None else f"{type(exc).__name__}: {exc}"
    report = await roll_back(manager, run, reason)
    note = ""
    if report.conflicts:
        note = f"; left as another writer changed them: {list(report.conflicts)}"
    if exc is None or isinstance(exc, TimeoutError) or (timed_out and isinstance(exc, DeadlineExceededError)):
        err = RunTimeoutError(
            f"run {run.id} exceeded its timeout of {run.timeout} s; its writes were rolled back{note}",
            run_id=run.id,
            rollback_report=report,
        )
        raise err from exc
    if not isinstance(exc, Exception):
        return  # cancellation, KeyboardInterrupt, SystemExit: propagate as they are
    raise RunFailedError(
        f"run {run.id} failed ({type(exc).__name__}: {exc}); its writes were rolled back{note}",
        error=exc,
        run_id=run.id,
        rollback_report=report,
    ) from exc


async def roll_back(manager: Driver, run: RayRun, reason: str) -> RollbackReport:
    """Undo the run's writes scope by scope, each on its shard; failures are reported, not raised.

    First the run's writes still on their way are waited for (up to the run's deadline plus
    the few seconds a dead shard takes to be noticed); a write still unanswered then, or sent
    to a shard that died, is in doubt: each scope it may have written looks for its batch id.
    """
    doubt = await run._settle(min(manager.request_timeout, max(run.remaining, 0.0) + SETTLE_SLACK))
    handles = dict(run.handles)
    batches: dict[ScopeRef, list[str]] = {}
    for write in doubt:
        for ref, h in write.handles.items():
            handles.setdefault(ref, h)
            batches.setdefault(ref, []).append(write.batch_id)

    async def one(ref: ScopeRef) -> ScopeRollback:
        h = handles[ref]
        records = tuple(w.record_to(r) for r in run.commits if r.ref == ref)
        op = {"k": "rollback", "a": h.address, "run": run.id, "r": records, "b": tuple(batches.get(ref, ()))}
        try:
            return w.rollback_from(
                await manager._ask(h.shard, op, max(manager.request_timeout, ROLLBACK_WAIT))
            )
        except VictorActorsError as exc:
            return ScopeRollback(ref, conflicts=(f"the rollback of {ref} failed: {exc!r}",))

    scopes = await asyncio.gather(*(one(ref) for ref in handles))
    run.rollback_report = RollbackReport(run.id, reason, tuple(scopes))
    run.status = "rolled_back"
    return run.rollback_report
