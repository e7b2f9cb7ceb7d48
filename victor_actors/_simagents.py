"""The agents of ``victor-actors simulate``: coordinators, the shared tally, thread and asyncio agents.

Every agent owns one conversation and runs turns until the load ends. A turn
is a plain step (a message naming the agent and its sequence number, and +1
on the team's counter, as one cross-scope batch, through the coordinator
runner or ``transact``), or one of: a tool turn (the step, then a handoff to a
coordinator that requests a tool), a batch that must be rejected, an injected
crash followed by a step, or a run that times out or raises and is rolled
back. Half the agents are threads (``run``/``step``/``transact``), half asyncio
tasks (``arun``/``astep``/``atransact``/``arun`` runs). The seq of a message
that did not commit is used again, so a conversation's seqs have no gaps
except the messages of rolled-back runs. See ``docs/simulate.md``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from victor_actors._coordinator import Coordinator, CoordinatorRunner
from victor_actors._errors import (
    DeadlineExceededError,
    ScopeAccessError,
    ScopeFailedError,
    TransitionValidationError,
    VersionConflictError,
    VictorActorsError,
)
from victor_actors._handle import ScopeHandle
from victor_actors._invariants import AgentLedger, RunLedger
from victor_actors._manager import GlobalStateManager
from victor_actors._model import CoordinatorResult, ScopeRef, StateScope, TransitionBatch
from victor_actors._rollback import RunFailedError
from victor_actors._state import ContextSnapshot
from victor_actors._tools import ToolCall
from victor_actors.testing import inject_fault

__all__ = ["KINDS", "Agent", "AsyncAgent", "Hub", "SimConfig", "SimulatedCrash", "SimulatedFailure"]

KINDS = ("tool", "reject", "crash", "timeout", "raise")
REJECTS = ("access", "conflict", "validation")
Sink = Callable[[dict[str, Any]], None]


class SimulatedCrash(RuntimeError):
    """Injected into a scope's actor: a failure its supervisor restarts."""


class SimulatedFailure(RuntimeError):
    """Raised inside a run on purpose: the run must roll back."""


@dataclass
class SimConfig:
    teams: int = 2
    workflows: int = 2  # per team
    conversations: int = 4  # per workflow: one agent each
    seconds: float = 25.0
    steps: int | None = None  # turns per agent (instead of --seconds)
    tool_rate: float = 0.08
    reject_rate: float = 0.04
    crash_rate: float = 0.02
    timeout_rate: float = 0.02
    raise_rate: float = 0.02
    team_crash_share: float = 0.2  # of crashes, the share injected into the team rather than the agent
    transact_share: float = 0.5  # of plain steps, the share done with transact rather than the runner
    run_timeout: float = 0.25
    run_steps: int = 1  # counter steps per failing run (more than 1 meets a rollback bug, see the docs)
    seed: int = 7
    durability: str = "sync"  # "async": acknowledged before durable, which --kill must catch

    def rate(self, kind: str) -> float:
        return float(getattr(self, f"{kind}_rate"))


def message(agent: str, seq: int, inc: int, kind: str) -> dict[str, Any]:
    return {"role": "assistant", "agent": agent, "seq": seq, "inc": inc, "kind": kind}


def step_batch(
    agent: str, seq: int, snap: ContextSnapshot, kind: str = "step", inc: int = 1
) -> TransitionBatch:
    """The agent's message and the team counter's change: one atomic cross-scope batch."""
    counter = int(snap.get_state("counter", 0))
    return (
        TransitionBatch()
        .add_message(message(agent, seq, inc, kind))
        .update_state("counter", counter + inc, scope="team")
    )


def _parse(user_message: str) -> tuple[str, int, str]:
    agent, seq, then = user_message.split(" ")
    return agent, int(seq), then


class Work:
    """Message + team counter; hands off to ``tool`` when the turn asks for one."""

    def __init__(self, kind: str = "step") -> None:
        self.kind = kind

    def process(self, snapshot: ContextSnapshot, user_message: str) -> CoordinatorResult:
        agent, seq, then = _parse(user_message)
        batch = step_batch(agent, seq, snapshot, self.kind)
        if then == "tool":
            return CoordinatorResult(batch, reasoning=f"step {seq}, then a tool", handoff_to="tool")
        return CoordinatorResult(batch, reasoning=f"step {seq}", should_continue=False)


class AsyncWork(Work):
    async def process(self, snapshot: ContextSnapshot, user_message: str) -> CoordinatorResult:  # type: ignore[override]
        return Work.process(self, snapshot, user_message)


class ToolRequest:
    """A single-scope commit (see the orchestrators guide): a message and an EXECUTE_TOOL."""

    def __init__(self, tool: str) -> None:
        self.tool = tool

    def process(self, snapshot: ContextSnapshot, user_message: str) -> CoordinatorResult:
        agent, seq, _ = _parse(user_message)
        batch = TransitionBatch().add_message(message(agent, seq + 1, 0, "tool_request"))
        batch.execute_tool(self.tool, {"agent": agent, "seq": seq + 1})
        return CoordinatorResult(batch, reasoning="needs a lookup", should_continue=False)


def lookup(call: ToolCall) -> dict[str, Any]:
    time.sleep(0.002)
    return {"agent": call.arguments["agent"], "seq": call.arguments["seq"], "found": True}


async def alookup(call: ToolCall) -> dict[str, Any]:
    await asyncio.sleep(0.002)
    return {"agent": call.arguments["agent"], "seq": call.arguments["seq"], "found": True}


def _runner(async_: bool) -> CoordinatorRunner:
    work = AsyncWork if async_ else Work
    coordinators: dict[str, Coordinator] = {
        "work": work(),
        "tool": ToolRequest("alookup" if async_ else "lookup"),
        "run": work("run_step"),
    }
    return CoordinatorRunner(coordinators, max_retries=200)


class Hub:
    """What every agent shares: the manager, the clock, and the tallies (under one lock)."""

    def __init__(self, manager: GlobalStateManager, config: SimConfig, sink: Sink | None = None) -> None:
        self.manager = manager
        self.config = config
        self.sink = sink
        self.lock = threading.Lock()
        self.started = time.monotonic()
        self.stop_at = self.started + config.seconds
        self.stopping = False
        self.turns = self.commits = self.crashes = self.team_crashes = self.restarts = 0
        self.compensations = self.ambiguous = 0
        self.rejected: dict[str, list[int]] = {kind: [0, 0] for kind in REJECTS}
        self.errors: Counter[str] = Counter()
        self.examples: dict[str, str] = {}  # the first message of each kind of error
        self.unexpected: list[str] = []
        self.runs: list[RunLedger] = []
        self.subtree = 1 + config.workflows * (1 + config.conversations)  # a team and its descendants

    def emit(self, record: dict[str, Any]) -> None:
        if self.sink is not None:
            self.sink(record)

    def ack(self, ledger: AgentLedger, seq: int, inc: int, kind: str) -> None:
        with self.lock:
            ledger.acked.append(seq)
            ledger.increment += inc
            ledger.next_seq = seq + 1
            self.commits += 1
            if kind == "tool_request":
                ledger.tool_requests.append(seq)
            self.emit({"t": "ack", "agent": ledger.name, "seq": seq, "inc": inc, "kind": kind})

    def error(self, exc: BaseException | str) -> None:
        name = exc if isinstance(exc, str) else type(exc).__name__
        with self.lock:
            self.errors[name] += 1
            if name not in self.examples and not isinstance(exc, str):
                self.examples[name] = " ".join([str(exc), *getattr(exc, "__notes__", ())])

    def unexpected_error(self, exc: BaseException) -> None:
        """An exception no agent step expects: a bug here or in the runtime."""
        text = f"{type(exc).__name__}: {exc}"
        with self.lock:
            self.unexpected.append(text)
        self.emit({"t": "unexpected", "error": text})

    def failures(self) -> int:
        with self.lock:
            rejected = sum(r[1] for r in self.rejected.values())
            return len(self.runs) + rejected + sum(self.errors.values()) + len(self.unexpected)


class _Base:
    """Bookkeeping and batch-building shared by the thread and the asyncio agent."""

    is_async = False

    def __init__(self, hub: Hub, team: str, workflow: str, name: str, sibling: str | None) -> None:
        self.hub, self.config, self.name = hub, hub.config, name
        self.conv: ScopeHandle = hub.manager.get_conversation_state(name, workflow_id=workflow, team_id=team)
        self.team_ref = ScopeRef(StateScope.TEAM, team)
        self.foreign = f"conversation:{sibling}" if sibling else "team:no-such-team"
        self.ledger = AgentLedger(name, team, name)
        self.runner = _runner(self.is_async)
        self.rng = random.Random(f"{self.config.seed}:{name}")
        self.warmup = [k for k in KINDS if self.config.rate(k) > 0]  # each enabled kind early on
        self.rng.shuffle(self.warmup)
        self.turns = 0
        hub.emit({"t": "agent", "agent": name, "team": team, "conversation": name})

    def more(self) -> bool:
        if self.hub.stopping:
            return False
        if self.config.steps is not None:
            return self.turns < self.config.steps
        return time.monotonic() < self.hub.stop_at

    def next_kind(self) -> str:
        self.turns += 1
        with self.hub.lock:
            self.hub.turns += 1
        if self.turns > 1 and self.warmup:
            return self.warmup.pop()
        r = self.rng.random()
        for kind in KINDS:
            if r < self.config.rate(kind):
                return kind
            r -= self.config.rate(kind)
        return "step"

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
        kind = self.rng.choice(REJECTS)
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

    def compensated(self, rec: RunLedger, seq: int, leftover: int) -> None:
        self.hub.ack(self.ledger, seq, -leftover, "compensation")
        rec.compensated = True
        with self.hub.lock:
            self.hub.compensations += 1

    def tool_missing(self) -> None:
        self.hub.error("ToolResultMissing")


class Agent(_Base):
    """An agent in its own thread: the sync API."""

    def run(self) -> None:
        while self.more():
            try:
                self.turn(self.next_kind())
            except Exception as exc:  # unexpected: tallied (and fails the verdict), never fatal
                self.hub.unexpected_error(exc)

    def turn(self, kind: str) -> None:
        if kind == "tool":
            self.tool_turn()
        elif kind == "reject":
            name, batch, expected, error = self.rejected_batch()
            for _ in range(3):
                try:
                    self.conv.apply(batch, expected_version=expected)
                except VictorActorsError as exc:
                    if self.rejected_outcome(name, exc, error):
                        break
                else:
                    self.rejected_outcome(name, None, error)
                    break
        elif kind in ("timeout", "raise"):
            self.failing_run(kind)
        else:
            if kind == "crash":
                self.crash()
            self.plain()

    def plain(self) -> None:
        seq = self.ledger.next_seq
        try:
            if self.use_transact():
                self.conv.transact(lambda snap: step_batch(self.name, seq, snap), lock=["team"])
            else:
                self.runner.run(self.conv, "work", f"{self.name} {seq} -")
        except VictorActorsError as exc:  # a cross-scope batch: nothing was applied
            self.hub.error(exc)
            return
        self.hub.ack(self.ledger, seq, 1, "step")

    def tool_turn(self) -> None:
        seq = self.ledger.next_seq
        text = f"{self.name} {seq} tool"
        try:
            first = self.runner.step(self.conv, "work", text)
        except VictorActorsError as exc:
            self.hub.error(exc)
            return
        self.hub.ack(self.ledger, seq, 1, "step")
        try:
            self.runner.step(self.conv, first.result.handoff_to or "tool", text)
        except VictorActorsError as exc:
            self.hub.error(exc)
            if not (isinstance(exc, DeadlineExceededError) and self.resolve(seq + 1)):
                return
        self.hub.ack(self.ledger, seq + 1, 0, "tool_request")
        deadline = time.monotonic() + 10.0
        while self.conv.snapshot().pending_tool_requests:
            if time.monotonic() > deadline:
                return self.tool_missing()
            time.sleep(0.005)

    def resolve(self, seq: int) -> bool:
        """A single-scope request timed out: it may still commit. Wait it out, then look."""
        with self.hub.lock:
            self.hub.ambiguous += 1
        for _ in range(5):
            try:
                self.conv.apply(TransitionBatch())  # behind it in the mailbox: decided once this returns
                break
            except VictorActorsError:
                continue
        return self.present(self.conv.snapshot(), seq)

    def failing_run(self, kind: str) -> None:
        start = self.ledger.next_seq
        rec = RunLedger("", self.name, kind)
        self.run_mark()
        try:
            with self.hub.manager.run(self.name, timeout=self.config.run_timeout) as run:
                rec.run_id = run.id
                for i in range(self.config.run_steps):
                    try:
                        self.runner.run(self.conv, "run", f"{self.name} {start + i} -")
                    except VictorActorsError as exc:
                        rec.step_error = type(exc).__name__
                        raise
                    rec.committed += 1
                if kind == "raise":
                    raise SimulatedFailure(f"{self.name}: the model provider went away")
                time.sleep(self.config.run_timeout * 1.5)  # overrun
        except Exception as exc:
            leftover = self.run_failed(rec, start, exc)
            if leftover:
                self.compensate(rec, leftover)
        else:
            with self.hub.lock:
                self.hub.runs.append(rec)  # a run that should have failed; the checker reports it
        self.run_mark(rec)

    def compensate(self, rec: RunLedger, leftover: int) -> None:
        for _ in range(20):
            seq = self.ledger.next_seq
            try:
                self.conv.transact(
                    lambda snap, seq=seq: step_batch(self.name, seq, snap, "compensation", -leftover),  # type: ignore[misc]
                    lock=["team"],
                )
            except VictorActorsError as exc:
                self.hub.error(exc)
                continue
            return self.compensated(rec, seq, leftover)


class AsyncAgent(_Base):
    """An agent as an asyncio task: the ``a``-prefixed twins."""

    is_async = True

    async def run(self) -> None:
        while self.more():
            try:
                await self.turn(self.next_kind())
            except Exception as exc:
                self.hub.unexpected_error(exc)

    async def turn(self, kind: str) -> None:
        if kind == "tool":
            await self.tool_turn()
        elif kind == "reject":
            name, batch, expected, error = self.rejected_batch()
            for _ in range(3):
                try:
                    await self.conv.aapply(batch, expected_version=expected)
                except VictorActorsError as exc:
                    if self.rejected_outcome(name, exc, error):
                        break
                else:
                    self.rejected_outcome(name, None, error)
                    break
        elif kind in ("timeout", "raise"):
            await self.failing_run(kind)
        else:
            if kind == "crash":
                self.crash()
            seq = self.ledger.next_seq
            try:
                if self.use_transact():
                    await self.conv.atransact(lambda snap: step_batch(self.name, seq, snap), lock=["team"])
                else:
                    await self.runner.arun(self.conv, "work", f"{self.name} {seq} -")
            except VictorActorsError as exc:
                self.hub.error(exc)
                return
            self.hub.ack(self.ledger, seq, 1, "step")

    async def tool_turn(self) -> None:
        seq = self.ledger.next_seq
        text = f"{self.name} {seq} tool"
        try:
            first = await self.runner.astep(self.conv, "work", text)
        except VictorActorsError as exc:
            self.hub.error(exc)
            return
        self.hub.ack(self.ledger, seq, 1, "step")
        try:
            await self.runner.astep(self.conv, first.result.handoff_to or "tool", text)
        except VictorActorsError as exc:
            self.hub.error(exc)
            if not (isinstance(exc, DeadlineExceededError) and await self.resolve(seq + 1)):
                return
        self.hub.ack(self.ledger, seq + 1, 0, "tool_request")
        deadline = time.monotonic() + 10.0
        while (await self.conv.asnapshot()).pending_tool_requests:
            if time.monotonic() > deadline:
                return self.tool_missing()
            await asyncio.sleep(0.005)

    async def resolve(self, seq: int, count: bool = True) -> bool:
        with self.hub.lock:
            self.hub.ambiguous += count
        for _ in range(5):
            try:
                await self.conv.aapply(TransitionBatch())
                break
            except VictorActorsError:
                continue
        return self.present(await self.conv.asnapshot(), seq)

    async def failing_run(self, kind: str) -> None:
        start = self.ledger.next_seq
        rec = RunLedger("", self.name, kind)
        self.run_mark()
        in_step = False
        try:
            async with self.hub.manager.arun(self.name, timeout=self.config.run_timeout) as run:
                rec.run_id = run.id
                for i in range(self.config.run_steps):
                    in_step = True
                    try:
                        await self.runner.arun(self.conv, "run", f"{self.name} {start + i} -")
                    except VictorActorsError as exc:
                        rec.step_error = type(exc).__name__
                        raise
                    in_step = False
                    rec.committed += 1
                if kind == "raise":
                    raise SimulatedFailure(f"{self.name}: the model provider went away")
                await asyncio.sleep(self.config.run_timeout * 1.5)  # overrun: the timeout cancels this
        except Exception as exc:
            in_flight = None
            if in_step and rec.step_error is None:  # the timeout cancelled a step: did it commit?
                rec.step_error = "cancelled"
                in_flight = await self.resolve(start + rec.committed, count=False)
            leftover = self.run_failed(rec, start, exc, in_flight)
            if leftover:
                await self.compensate(rec, leftover)
        else:
            with self.hub.lock:
                self.hub.runs.append(rec)
        self.run_mark(rec)

    async def compensate(self, rec: RunLedger, leftover: int) -> None:
        for _ in range(20):
            seq = self.ledger.next_seq
            try:
                await self.conv.atransact(
                    lambda snap, seq=seq: step_batch(self.name, seq, snap, "compensation", -leftover),  # type: ignore[misc]
                    lock=["team"],
                )
            except VictorActorsError as exc:
                self.hub.error(exc)
                continue
            return self.compensated(rec, seq, leftover)
