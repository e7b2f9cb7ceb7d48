"""One simulated agent, written once for a thread and for an asyncio task.

Every agent owns one conversation and runs turns until the load ends. A turn
is a plain step (a message naming the agent and its sequence number, and +1
on the team's counter, as one cross-scope batch, through the coordinator
runner or ``transact``), or one of: a tool turn (the step, then a handoff to a
coordinator that requests a tool), a batch that must be rejected, an injected
crash followed by a step, or a run that times out or raises and is rolled
back. The seq of a message that did not commit is used again, so a
conversation's seqs have no gaps except the messages of rolled-back runs.
See ``docs/simulate.md``.

Each turn is a generator that yields the blocking calls it needs as
``Step(sync, async_, ...)`` values (``victor_actors/_twins.py``):
:meth:`Agent.run` drives it with blocking calls in a thread,
:meth:`Agent.arun` with awaits on the event loop. A thread agent and an
asyncio agent share every line of their logic; they differ in how a step
waits, and in the coordinators and tool they are given (plain or async).
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from victor_actors import (
    ContextSnapshot,
    DeadlineExceededError,
    Run,
    RunContext,
    RunFailedError,
    ScopeAccessError,
    ScopeFailedError,
    ScopeHandle,
    ScopeRef,
    StateScope,
    TransitionBatch,
    TransitionValidationError,
    VersionConflictError,
    VictorActorsError,
)
from victor_actors.lowlevel import Step, StepGen, adrive, drive
from victor_actors.sim._config import KINDS, SimConfig
from victor_actors.sim._coordinators import message, runner, step_batch
from victor_actors.sim._hub import Hub
from victor_actors.sim._ledger import AgentLedger, RunLedger
from victor_actors.sim._schedule import clock_sleep
from victor_actors.testing import inject_fault

__all__ = ["Agent", "SimulatedCrash", "SimulatedFailure"]

Turn = StepGen[None]


class SimulatedCrash(RuntimeError):
    """Injected into a scope's actor: a failure its supervisor restarts."""


class SimulatedFailure(RuntimeError):
    """Raised inside a run on purpose: the run must roll back."""


def _sleep(seconds: float) -> Step:
    return Step(clock_sleep, asyncio.sleep, seconds)  # --replay: in the schedule's virtual time


def _within(cm: RunContext, body: Callable[[Run], Turn]) -> Turn:
    """``with cm as run: body(run)`` as steps: ``__enter__``/``__exit__`` driven, the twins awaited."""
    run = yield Step(cm.__enter__, cm.__aenter__)
    try:
        yield from body(run)
    except BaseException as exc:
        if not (yield Step(cm.__exit__, cm.__aexit__, type(exc), exc, exc.__traceback__)):
            raise
    else:
        yield Step(cm.__exit__, cm.__aexit__, None, None, None)


class TurnLoop:
    """The turn loop every simulated agent shares (local and Ray): take turns while time or steps
    last, the warm-up kinds first and then by the configured rates; an unexpected error is tallied
    and never ends the agent. Subclasses give ``KINDS`` and ``_turn``."""

    KINDS: tuple[str, ...] = ()
    hub: Any
    config: SimConfig
    rng: random.Random
    warmup: list[str]
    turns: int

    def run(self) -> None:
        drive(self._run())

    async def arun(self) -> None:
        await adrive(self._run())

    def _run(self) -> Turn:
        while self.more():
            yield from self.turn_once()

    def turn_once(self) -> Turn:
        """One turn (what a :class:`Simulation` drives): an unexpected error is tallied, never fatal."""
        try:
            yield from self._turn(self.next_kind())
        except Exception as exc:  # unexpected: tallied (and fails the verdict), never fatal
            self.hub.unexpected_error(exc)

    def _turn(self, kind: str) -> Turn:
        raise NotImplementedError

    def more(self) -> bool:
        if self.hub.stopping:
            return False
        if self.config.steps is not None:
            return bool(self.turns < self.config.steps)
        return bool(time.monotonic() < self.hub.stop_at)

    def next_kind(self) -> str:
        self.turns += 1
        with self.hub.lock:
            self.hub.turns += 1
        if self.turns > 1 and self.warmup:
            return self.warmup.pop()
        r = self.rng.random()
        for kind in self.KINDS:
            if r < self.config.rate(kind):
                return kind
            r -= self.config.rate(kind)
        return "step"


class Agent(TurnLoop):
    """An agent: :meth:`run` in its own thread (the sync API), or :meth:`arun` as an asyncio task."""

    KINDS = KINDS

    def __init__(
        self, hub: Hub, team: str, workflow: str, name: str, sibling: str | None, *, is_async: bool = False
    ) -> None:
        self.hub, self.config, self.name, self.is_async = hub, hub.config, name, is_async
        self.conv: ScopeHandle = hub.manager.get_conversation_state(name, workflow_id=workflow, team_id=team)
        self.team_ref = ScopeRef(StateScope.TEAM, team)
        self.foreign = f"conversation:{sibling}" if sibling else "team:no-such-team"
        self.ledger = AgentLedger(name, team, name)
        self.runner = runner(is_async)
        self.rng = random.Random(f"{self.config.seed}:{name}")
        self.warmup = [k for k in KINDS if self.config.rate(k) > 0]  # each enabled kind early on
        self.rng.shuffle(self.warmup)
        self.turns = 0
        hub.emit({"t": "agent", "agent": name, "team": team, "conversation": name})

    # -- the turns ----------------------------------------------------------------------------------

    def _turn(self, kind: str) -> Turn:
        if kind == "tool":
            yield from self._tool_turn()
        elif kind == "reject":
            yield from self._rejected_turn()
        elif kind in ("timeout", "raise"):
            yield from self._failing_run(kind)
        else:
            if kind == "crash":
                self.crash()
            yield from self._plain()

    def _plain(self) -> Turn:
        seq = self.ledger.next_seq
        try:
            if self.use_transact():
                batch = partial(step_batch, self.name, seq)
                yield Step(self.conv.transact, self.conv.atransact, batch, lock=["team"])
            else:
                yield Step(self.runner.run, self.runner.arun, self.conv, "work", f"{self.name} {seq} -")
        except VictorActorsError as exc:  # a cross-scope batch: nothing was applied
            self.hub.error(exc)
            return
        self.hub.ack(self.ledger, seq, 1, "step")

    def _rejected_turn(self) -> Turn:
        kind, batch, expected, error = self.rejected_batch()
        for _ in range(3):
            try:
                yield Step(self.conv.apply, self.conv.aapply, batch, expected_version=expected)
            except VictorActorsError as exc:
                if self.rejected_outcome(kind, exc, error):
                    return
            else:
                self.rejected_outcome(kind, None, error)
                return

    def _tool_turn(self) -> Turn:
        seq = self.ledger.next_seq
        text = f"{self.name} {seq} tool"
        step = partial(Step, self.runner.step, self.runner.astep, self.conv)
        try:
            first = yield step("work", text)
        except VictorActorsError as exc:
            self.hub.error(exc)
            return
        self.hub.ack(self.ledger, seq, 1, "step")
        try:
            yield step(first.result.handoff_to or "tool", text)
        except VictorActorsError as exc:
            self.hub.error(exc)
            if not isinstance(exc, DeadlineExceededError) or not (yield from self._resolve(seq + 1)):
                return
        self.hub.ack(self.ledger, seq + 1, 0, "tool_request")
        deadline = time.monotonic() + 10.0
        while (yield Step(self.conv.snapshot, self.conv.asnapshot)).pending_tool_requests:
            if time.monotonic() > deadline:
                self.hub.error("ToolResultMissing")
                return
            yield _sleep(0.005)

    def _resolve(self, seq: int, count: bool = True) -> StepGen[bool]:
        """A request timed out or was cancelled: it may still commit. Wait it out, then look."""
        with self.hub.lock:
            self.hub.ambiguous += count
        for _ in range(5):
            try:  # behind it in the mailbox: decided once this returns
                yield Step(self.conv.apply, self.conv.aapply, TransitionBatch())
                break
            except VictorActorsError:
                continue
        return self.present((yield Step(self.conv.snapshot, self.conv.asnapshot)), seq)

    def _failing_run(self, kind: str) -> Turn:
        start = self.ledger.next_seq
        rec = RunLedger("", self.name, kind)
        self.run_mark()
        open_run = self.hub.manager.arun if self.is_async else self.hub.manager.run
        try:
            yield from _within(
                open_run(self.name, timeout=self.config.run_timeout), partial(self._run_body, rec, start)
            )
        except Exception as exc:
            in_flight = None
            if rec.step_error == "cancelled":  # the timeout cancelled a step: did it commit?
                in_flight = yield from self._resolve(start + rec.committed, count=False)
            leftover = self.run_failed(rec, start, exc, in_flight)
            if leftover:
                yield from self._compensate(rec, leftover)
        else:
            with self.hub.lock:
                self.hub.runs.append(rec)  # a run that should have failed; the checker reports it
        self.run_mark(rec)

    def _run_body(self, rec: RunLedger, start: int, run: Run) -> Turn:
        rec.run_id = run.id
        for i in range(self.config.run_steps):
            try:
                yield Step(self.runner.run, self.runner.arun, self.conv, "run", f"{self.name} {start + i} -")
            except VictorActorsError as exc:
                rec.step_error = type(exc).__name__
                raise
            except asyncio.CancelledError:  # asyncio: the run's timeout cancelled the step
                rec.step_error = "cancelled"
                raise
            rec.committed += 1
        if rec.kind == "raise":
            raise SimulatedFailure(f"{self.name}: the model provider went away")
        yield _sleep(self.config.run_timeout * 1.5)  # overrun (asyncio: the timeout cancels this sleep)

    def _compensate(self, rec: RunLedger, leftover: int) -> Turn:
        for _ in range(20):
            seq = self.ledger.next_seq
            batch = partial(step_batch, self.name, seq, kind="compensation", inc=-leftover)
            try:
                yield Step(self.conv.transact, self.conv.atransact, batch, lock=["team"])
            except VictorActorsError as exc:
                self.hub.error(exc)
                continue
            self.hub.ack(self.ledger, seq, -leftover, "compensation")
            rec.compensated = True
            with self.hub.lock:
                self.hub.compensations += 1
            return

    # -- bookkeeping --------------------------------------------------------------------------------

    def use_transact(self) -> bool:
        return self.rng.random() < self.config.transact_share

    def crash(self) -> None:
        team = self.rng.random() < self.config.team_crash_share
        ref = self.team_ref if team else self.conv.ref
        inject_fault(self.hub.manager, ref, SimulatedCrash(f"{self.name} crashed {ref} on purpose"))
        with self.hub.lock:
            self.hub.crashes += 1
            self.hub.team_crashes += team
            self.hub.restarts += self.hub.subtree if team else 1

    def rejected_batch(self) -> tuple[str, TransitionBatch, dict[str, int] | None, type[Exception]]:
        kind = self.hub.next_reject()
        batch = TransitionBatch().add_message(message(self.name, -1, 0, "rejected"))
        batch.update_state("counter", -1_000_000, scope="team")
        expected = None
        if kind == "access":  # a sibling's conversation (or a team that is not ours)
            batch.update_state("intrusion", self.name, scope=self.foreign)
            error: type[Exception] = ScopeAccessError
        elif kind == "conflict":
            expected, error = {"conversation": self.conv.version + 1}, VersionConflictError
        else:  # a result for a tool request nobody made: refused by the conversation after the team voted yes
            batch.tool_result("lookup", "forged", request_id=f"{self.name}-forged-{self.turns}")
            error = TransitionValidationError
        return kind, batch, expected, error

    def rejected_outcome(self, kind: str, exc: BaseException | None, error: type[Exception]) -> bool:
        """Tally a batch that had to fail; False if it met an injected crash first (send it again)."""
        if isinstance(exc, ScopeFailedError) and isinstance(exc.__cause__, SimulatedCrash):
            self.hub.error(exc)
            return False
        refused = isinstance(exc, error)
        got = type(exc).__name__ if exc else "a commit"
        self.hub.emit({"t": "rejected", "kind": kind, "refused": refused, "got": got})
        with self.hub.lock:
            self.hub.rejected[kind][0] += 1
            self.hub.rejected[kind][1] += refused
        if not refused:
            self.hub.error(f"rejected batch ({kind}) got {got}")
        return True

    def present(self, snap: ContextSnapshot, seq: int) -> bool:
        return any(
            isinstance(m, Mapping) and m.get("agent") == self.name and m.get("seq") == seq
            for m in snap.messages
        )

    def run_mark(self, rec: RunLedger | None = None) -> None:
        """A run begins (None), or ends with its ledger: a SIGKILL between the two leaves it open."""
        ledger = None if rec is None else dataclasses.asdict(rec)
        self.hub.emit({"t": "run", "agent": self.name, "team": self.ledger.team, "ledger": ledger})

    def run_failed(
        self, rec: RunLedger, start: int, exc: BaseException, in_flight: bool | None = None
    ) -> int:
        """Read the rollback report; return the counter increments the rollback left in place.

        ``in_flight``: the run's timeout cancelled a step whose outcome was then looked up:
        True if its message is there (it committed after the rollback), False if not.
        """
        cause = exc.error if isinstance(exc, RunFailedError) else exc  # the body's own error
        # a run's timeout is a RunTimeoutError: the ledger records the family, DeadlineExceededError
        rec.raised = (
            "DeadlineExceededError" if isinstance(cause, DeadlineExceededError) else type(cause).__name__
        )
        report = getattr(exc, "rollback_report", None)
        rec.has_report = report is not None
        for scope in () if report is None else report.scopes:
            if scope.ref == self.conv.ref:
                rec.messages_removed += scope.messages_removed
            elif scope.ref == self.team_ref:
                if "counter" in scope.keys_restored:
                    rec.counter = "restored"
                elif any("'counter'" in c for c in scope.conflicts):
                    rec.counter = "conflict"
                elif scope.conflicts:
                    rec.counter = "failed"
        if in_flight is not None:
            undone = not in_flight and rec.messages_removed == rec.committed + 1
            rec.cancelled_step = "survived" if in_flight else "undone" if undone else "not committed"
            rec.committed += in_flight or undone
        seqs = list(range(start, start + rec.committed))
        leftover = rec.committed if rec.counter in ("conflict", "failed") else 0
        with self.hub.lock:
            self.ledger.rolled_back.extend(seqs)
            self.ledger.next_seq = start + rec.committed
            self.ledger.increment += leftover
            self.ledger.leftover += leftover
            self.hub.runs.append(rec)
            self.hub.emit({"t": "rolled_back", "agent": self.name, "seqs": seqs, "leftover": leftover})
        return leftover
