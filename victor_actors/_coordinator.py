"""The state-passed loop: snapshot, coordinator, apply, follow the result.

A coordinator is a pure decision: it reads an immutable snapshot and returns
a :class:`CoordinatorResult` (transitions plus why, and what to do next). The
runner takes the snapshot, calls the coordinator, and applies its transitions
with ``expected_version`` set to the snapshot's versions of the scopes the
batch writes (of every scope the snapshot saw, with ``validate_reads=True``);
if another writer got there first (:class:`VersionConflictError`) it takes a fresh
snapshot and asks the coordinator again, a bounded number of times. Then it
stops on ``should_continue=False``, follows ``handoff_to`` to the coordinator
registered under that name, or stops when there is nowhere to hand off to.

Tool use needs no special path: a coordinator returns an EXECUTE_TOOL
transition, which commits with its batch and is dispatched afterwards (see
``_tools.py``); the result arrives as a TOOL_RESULT that the next snapshot
shows. Nested coordinators get the same snapshot and their results merge
(:meth:`CoordinatorRunner.nested`).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import attrs

from victor_actors._errors import VersionConflictError, VictorActorsError
from victor_actors._model import CoordinatorResult, TransitionBatch
from victor_actors._state import ContextSnapshot, StateChanged
from victor_actors._txn import split_by_scope

if TYPE_CHECKING:
    from victor_actors._handle import ScopeHandle

__all__ = ["Coordinator", "CoordinatorRunner", "LoopResult", "StepRecord", "UnknownHandoffError", "merge"]

logger = logging.getLogger("victor_actors")


@runtime_checkable
class Coordinator(Protocol):
    """``process(snapshot, user_message) -> CoordinatorResult``, plain or ``async``."""

    def process(
        self, snapshot: ContextSnapshot, user_message: str
    ) -> CoordinatorResult | Awaitable[CoordinatorResult]: ...


@attrs.frozen(slots=True)
class StepRecord:
    """One coordinator step: who decided, what, the commit it made, and how many tries it took."""

    coordinator: str
    result: CoordinatorResult
    commit: StateChanged | None
    attempts: int


@attrs.frozen(slots=True)
class LoopResult:
    """The whole loop: its steps, the final snapshot, and why it stopped."""

    steps: tuple[StepRecord, ...]
    snapshot: ContextSnapshot
    stopped_because: str  # "should_continue=False", "no handoff", "max_steps"


class UnknownHandoffError(VictorActorsError):
    """A coordinator handed off to a name nobody registered.

    ``loop_result`` holds the steps made before it, which stand.
    """

    def __init__(self, message: str, *, loop_result: LoopResult) -> None:
        super().__init__(message)
        self.loop_result = loop_result


def merge(*results: CoordinatorResult) -> CoordinatorResult:
    """Merge nested coordinators' results: transitions in order, the last word on what comes next."""
    batch = TransitionBatch()
    reasons = []
    metadata: dict[str, Any] = {}
    for r in results:
        batch.extend(r.transitions)
        if r.reasoning:
            reasons.append(r.reasoning)
        metadata.update(r.metadata)
    return CoordinatorResult(
        transitions=batch,
        reasoning="; ".join(reasons) or None,
        confidence=min((r.confidence for r in results), default=1.0),
        metadata=metadata,
        should_continue=all(r.should_continue for r in results),
        handoff_to=next((r.handoff_to for r in reversed(results) if r.handoff_to), None),
    )


class CoordinatorRunner:
    """Runs coordinators against one scope, safely under concurrency.

    Args:
        coordinators: name -> coordinator, for handoffs (``register`` adds more).
        max_retries: fresh snapshots to try after version conflicts, per step.
        max_steps: handoffs to follow at most in one ``run``.
        validate_reads: also require the ancestors the coordinator only read
            to be unchanged at commit time (they join the transaction, locked,
            with nothing to write). Off by default: a step then checks the
            versions of the scopes it writes (its own, and any ancestor its
            batch targets), so no update is ever lost, but a decision may
            rest on an ancestor value that changed meanwhile. Turn it on when
            a decision written here must stay consistent with what it read
            above; it costs a round trip per ancestor and serialises steps on
            the shared ancestors.
    """

    def __init__(
        self,
        coordinators: Mapping[str, Coordinator] | None = None,
        *,
        max_retries: int = 5,
        max_steps: int = 25,
        validate_reads: bool = False,
    ) -> None:
        if max_retries < 0 or max_steps < 1:
            raise ValueError("max_retries must be >= 0 and max_steps >= 1")
        self.coordinators: dict[str, Coordinator] = dict(coordinators or {})
        self.max_retries = max_retries
        self.max_steps = max_steps
        self.validate_reads = validate_reads

    def register(self, name: str, coordinator: Coordinator) -> None:
        if not callable(getattr(coordinator, "process", None)):
            raise TypeError(f"{coordinator!r} has no process(snapshot, user_message) method")
        self.coordinators[name] = coordinator

    def _resolve(self, coordinator: str | Coordinator) -> tuple[str, Coordinator]:
        if isinstance(coordinator, str):
            found = self.coordinators.get(coordinator)
            if found is None:
                known = ", ".join(sorted(self.coordinators)) or "none"
                raise VictorActorsError(f"no coordinator named {coordinator!r} (registered: {known})")
            return coordinator, found
        return type(coordinator).__name__, coordinator

    # -- one step -----------------------------------------------------------

    def step(self, handle: ScopeHandle, coordinator: str | Coordinator, user_message: str) -> StepRecord:
        """Snapshot, decide, apply with the snapshot's versions; retry on conflict.

        Raises:
            VersionConflictError: still conflicting after ``max_retries``
                fresh snapshots (with a note saying so).
        """
        name, coord = self._resolve(coordinator)
        for attempt in range(1, self.max_retries + 2):
            snapshot = handle.snapshot()
            result = _call_sync(coord, snapshot, user_message)
            try:
                return self._apply(handle, name, result, snapshot, attempt)
            except VersionConflictError as exc:
                if attempt > self.max_retries:
                    exc.add_note(f"{name}: gave up after {attempt} attempts with fresh snapshots")
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def astep(
        self, handle: ScopeHandle, coordinator: str | Coordinator, user_message: str
    ) -> StepRecord:
        """The asyncio twin of :meth:`step`."""
        name, coord = self._resolve(coordinator)
        for attempt in range(1, self.max_retries + 2):
            snapshot = await handle.asnapshot()
            result = coord.process(snapshot, user_message)
            if inspect.isawaitable(result):
                result = await result
            try:
                return await self._aapply(handle, name, _checked(name, result), snapshot, attempt)
            except VersionConflictError as exc:
                if attempt > self.max_retries:
                    exc.add_note(f"{name}: gave up after {attempt} attempts with fresh snapshots")
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _apply(
        self,
        handle: ScopeHandle,
        name: str,
        result: CoordinatorResult,
        snapshot: ContextSnapshot,
        attempt: int,
    ) -> StepRecord:
        _log(name, result)
        commit = None
        if not result.transitions.is_empty():
            commit = handle.apply(
                result.transitions, expected_version=self._expected(handle, snapshot, result)
            )
        return StepRecord(name, result, commit, attempt)

    def _expected(
        self, handle: ScopeHandle, snapshot: ContextSnapshot, result: CoordinatorResult
    ) -> dict[Any, int]:
        """The versions to check: every scope the snapshot saw, or only those the batch writes."""
        versions = snapshot.versions()
        if self.validate_reads:
            return dict(versions)
        written = {snapshot.ref}
        parts = split_by_scope(handle._cell, result.transitions.freeze())
        if parts is not None:
            written.update(parts)
        return {ref: v for ref, v in versions.items() if ref in written}

    async def _aapply(
        self,
        handle: ScopeHandle,
        name: str,
        result: CoordinatorResult,
        snapshot: ContextSnapshot,
        attempt: int,
    ) -> StepRecord:
        _log(name, result)
        commit = None
        if not result.transitions.is_empty():
            expected = self._expected(handle, snapshot, result)
            commit = await handle.aapply(result.transitions, expected_version=expected)
        return StepRecord(name, result, commit, attempt)

    # -- the loop -----------------------------------------------------------

    def run(self, handle: ScopeHandle, coordinator: str | Coordinator, user_message: str) -> LoopResult:
        """Step, then follow ``handoff_to`` until a coordinator stops or none is named."""
        steps: list[StepRecord] = []
        current: str | Coordinator = coordinator
        for _ in range(self.max_steps):
            record = self.step(handle, current, user_message)
            steps.append(record)
            stop = _stop_reason(record.result)
            if stop:
                return LoopResult(tuple(steps), handle.snapshot(), stop)
            current = self._next(record, steps, handle.snapshot())
        return LoopResult(tuple(steps), handle.snapshot(), "max_steps")

    def _next(self, record: StepRecord, steps: list[StepRecord], snapshot: ContextSnapshot) -> str:
        """The coordinator to hand off to; unknown: an error that keeps the steps already made."""
        name = record.result.handoff_to
        assert name is not None
        if name not in self.coordinators:
            known = ", ".join(sorted(self.coordinators)) or "none"
            raise UnknownHandoffError(
                f"{record.coordinator} handed off to {name!r}, which is not registered "
                f"(registered: {known}); the {len(steps)} step(s) before it stand",
                loop_result=LoopResult(tuple(steps), snapshot, f"unknown handoff {name!r}"),
            )
        return name

    async def arun(
        self, handle: ScopeHandle, coordinator: str | Coordinator, user_message: str
    ) -> LoopResult:
        """The asyncio twin of :meth:`run`."""
        steps: list[StepRecord] = []
        current: str | Coordinator = coordinator
        for _ in range(self.max_steps):
            record = await self.astep(handle, current, user_message)
            steps.append(record)
            stop = _stop_reason(record.result)
            if stop:
                return LoopResult(tuple(steps), await handle.asnapshot(), stop)
            current = self._next(record, steps, await handle.asnapshot())
        return LoopResult(tuple(steps), await handle.asnapshot(), "max_steps")

    def nested(
        self, snapshot: ContextSnapshot, user_message: str, *coordinators: str | Coordinator
    ) -> CoordinatorResult:
        """Call several coordinators on the same snapshot and merge their results."""
        return merge(*(_call_sync(self._resolve(c)[1], snapshot, user_message) for c in coordinators))


def _stop_reason(result: CoordinatorResult) -> str | None:
    if not result.should_continue:
        return "should_continue=False"
    if not result.handoff_to:
        return "no handoff"
    return None


def _log(name: str, result: CoordinatorResult) -> None:
    if result.reasoning:
        logger.info("coordinator %s (confidence %.2f): %s", name, result.confidence, result.reasoning)


def _checked(name: str, result: Any) -> CoordinatorResult:
    if not isinstance(result, CoordinatorResult):
        raise VictorActorsError(
            f"coordinator {name} returned {type(result).__name__}, not a CoordinatorResult"
        )
    return result


def _call_sync(coordinator: Coordinator, snapshot: ContextSnapshot, user_message: str) -> CoordinatorResult:
    name = type(coordinator).__name__
    result = coordinator.process(snapshot, user_message)
    if inspect.isawaitable(result):
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return _checked(name, asyncio.run(_await(result)))
        if inspect.iscoroutine(result):
            result.close()  # never started: close it rather than leave it unawaited
        raise VictorActorsError(
            f"coordinator {name} is async and an event loop is running here: use the runner's arun/astep"
        )
    return _checked(name, result)


async def _await(awaitable: Awaitable[CoordinatorResult]) -> CoordinatorResult:
    return await awaitable
