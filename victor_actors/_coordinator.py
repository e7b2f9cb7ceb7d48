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
Each step is the read-modify-write loop of :meth:`ScopeHandle.modify`, with
the runner's own additions (``validate_reads``, the attempt count); step and
loop are written once, as generators, for the blocking and the asyncio
methods (see ``_twins.py``).

Tool use needs no special path: a coordinator returns an EXECUTE_TOOL
transition, which commits with its batch and is dispatched afterwards (see
``_tools.py``); the result arrives as a TOOL_RESULT that the next snapshot
shows. Nested coordinators get the same snapshot and their results merge
(:meth:`CoordinatorRunner.nested`).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import attrs

from victor_actors._errors import VersionConflictError, VictorActorsError
from victor_actors._model import CoordinatorResult, TransitionBatch
from victor_actors._snapshot import ContextSnapshot
from victor_actors._state import StateChanged
from victor_actors._twins import Step, StepGen, adrive, drive, resolve_sync

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
            VictorActorsError: the coordinator is ``async`` and an event loop
                is running in this thread (use :meth:`astep`), or it returned
                something other than a :class:`CoordinatorResult`.
        """
        return drive(self._step(handle, coordinator, user_message))

    async def astep(
        self, handle: ScopeHandle, coordinator: str | Coordinator, user_message: str
    ) -> StepRecord:
        """The asyncio twin of :meth:`step`; the coordinator may be plain or ``async``."""
        return await adrive(self._step(handle, coordinator, user_message))

    def _step(
        self, handle: ScopeHandle, coordinator: str | Coordinator, user_message: str
    ) -> StepGen[StepRecord]:
        """One step, once for :meth:`step` and :meth:`astep`.

        The optimistic loop of ``handle.modify``, kept here because a step
        also checks, with ``validate_reads``, the scopes the snapshot only
        read, skips the round trip for an empty decision, and counts its
        attempts for the :class:`StepRecord`.
        """
        name, coord = self._resolve(coordinator)
        for attempt in range(1, self.max_retries + 2):
            snapshot = handle.snapshot()
            result: CoordinatorResult = yield Step(_decide, _adecide, name, coord, snapshot, user_message)
            _log(name, result)
            if result.transitions.is_empty():
                return StepRecord(name, result, None, attempt)
            expected = self._expected(handle, snapshot, result)
            apply = Step(handle.apply, handle.aapply, result.transitions, expected_version=expected)
            try:
                commit = yield apply
            except VersionConflictError as exc:
                if attempt > self.max_retries:
                    exc.add_note(f"{name}: gave up after {attempt} attempts with fresh snapshots")
                    raise
                continue
            return StepRecord(name, result, commit, attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    def _expected(
        self, handle: ScopeHandle, snapshot: ContextSnapshot, result: CoordinatorResult
    ) -> dict[Any, int]:
        """The versions to check: every scope the snapshot saw, or only those the batch writes."""
        versions = snapshot.versions()
        if self.validate_reads:
            return dict(versions)
        written = handle.written_scopes(result.transitions)
        return {ref: v for ref, v in versions.items() if ref in written}

    # -- the loop -----------------------------------------------------------

    def run(self, handle: ScopeHandle, coordinator: str | Coordinator, user_message: str) -> LoopResult:
        """Step, then follow ``handoff_to`` until a coordinator stops or none is named.

        Raises:
            UnknownHandoffError: a coordinator handed off to a name nobody
                registered; the steps before it stand.
            The errors of :meth:`step`.
        """
        return drive(self._run(handle, coordinator, user_message))

    async def arun(
        self, handle: ScopeHandle, coordinator: str | Coordinator, user_message: str
    ) -> LoopResult:
        """The asyncio twin of :meth:`run`."""
        return await adrive(self._run(handle, coordinator, user_message))

    def _run(
        self, handle: ScopeHandle, coordinator: str | Coordinator, user_message: str
    ) -> StepGen[LoopResult]:
        """The loop, once for :meth:`run` and :meth:`arun`."""
        steps: list[StepRecord] = []
        current: str | Coordinator = coordinator
        for _ in range(self.max_steps):
            record = yield from self._step(handle, current, user_message)
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

    def nested(
        self, snapshot: ContextSnapshot, user_message: str, *coordinators: str | Coordinator
    ) -> CoordinatorResult:
        """Call several coordinators on the same snapshot and merge their results."""
        return merge(*(_decide(*self._resolve(c), snapshot, user_message) for c in coordinators))


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


def _decide(
    name: str, coordinator: Coordinator, snapshot: ContextSnapshot, user_message: str
) -> CoordinatorResult:
    """``process`` for a sync caller: an ``async`` one runs to completion, unless a loop is running here."""
    result = resolve_sync(coordinator.process(snapshot, user_message), f"coordinator {name}")
    return _checked(name, result)


async def _adecide(
    name: str, coordinator: Coordinator, snapshot: ContextSnapshot, user_message: str
) -> CoordinatorResult:
    """``process`` for an asyncio caller, plain or ``async``."""
    result = coordinator.process(snapshot, user_message)
    if inspect.isawaitable(result):
        result = await result
    return _checked(name, result)
