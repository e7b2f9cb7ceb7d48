"""One simulated agent on a Ray cluster (``simulate --ray``), written once for a thread and an asyncio task.

The same conversation, seqs and ledger as :class:`victor_actors.sim._agent.Agent`,
adapted to what :class:`victor_actors.ray.RayStateManager` offers. A turn is:

- a step: the agent's message and ``counter + 1`` on its team, and for
  ``GLOBAL_SHARE`` of the steps also ``gcounter + 1`` on the global scope (a
  two-phase commit across shards when the conversation is not on the global
  scope's shard), applied with ``expected_version`` on every scope it reads
  and retried on a conflict (there is no ``transact`` or coordinator runner
  over Ray);
- a batch that must be rejected, which also writes the global scope, so a
  refused cross-shard batch must leave both shards untouched;
- a run (``manager.run``) that times out or raises and is rolled back; its
  steps write only the conversation (see ``docs/simulate.md``: a Ray run
  restores whole scopes, so a shared counter has no place in one).

Tools and injected actor crashes are local-only; the Ray run's faults are
shard kills (:mod:`._ray_load`). A write whose outcome the runtime could not
tell (``ShardUnavailableError`` with ``may_have_applied``, or a deadline)
is settled by waiting until the shards hold nothing in doubt and reading the
conversation: its message is there (acknowledged) or not (its seq is reused).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from victor_actors import (
    DeadlineExceededError,
    ScopeAccessError,
    ScopeFailedError,
    TransitionBatch,
    TransitionValidationError,
    VersionConflictError,
    VictorActorsError,
)
from victor_actors._rollback import RollbackReport, RunFailedError
from victor_actors.lowlevel import Step, StepGen
from victor_actors.sim._agent import SimulatedFailure, TurnLoop
from victor_actors.sim._config import SimConfig
from victor_actors.sim._coordinators import message
from victor_actors.sim._hub import Hub
from victor_actors.sim._ledger import AgentLedger, RunLedger

__all__ = ["GLOBAL_SHARE", "RAY_KINDS", "RayAgent", "RayHub"]

RAY_KINDS = ("reject", "timeout", "raise")  # the turns besides a plain step that a Ray run has
GLOBAL_SHARE = 0.25  # of the steps, the share that also adds 1 to the global counter
RETRIES = 200  # optimistic attempts of one step before the agent gives up (a VersionConflictError)

Turn = StepGen[None]


class RayHub(Hub):
    """:class:`Hub` with the tallies only a Ray run has."""

    def __init__(self, manager: Any, config: SimConfig) -> None:
        super().__init__(manager, config)
        self.ray_manager: Any = manager  # a RayStateManager (Hub's annotation is the local manager)
        self.shard_commits: Counter[int] = Counter()  # acknowledged steps, by the conversation's shard
        self.repaired_rollbacks = 0  # rollbacks a shard kill broke, finished by the agent
        self.interrupted_rollbacks = 0  # rollbacks that raised ShardUnavailableError themselves
        self.driver = 0  # which driver process runs these agents (``--drivers``), in every step's message


def _in_thread(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The async twin of a blocking call: the same call in a worker thread."""

    async def run(*args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(fn, *args, **kwargs)

    return run


def _ambiguous(exc: BaseException) -> bool:
    """A write error after which the batch may still have been applied."""
    return isinstance(exc, DeadlineExceededError) or bool(getattr(exc, "may_have_applied", False))


def _unavailable(exc: BaseException) -> bool:
    """A shard was away or restarting (``ShardUnavailableError``, a deadline, an aborted 2PC)."""
    return isinstance(exc, (DeadlineExceededError, ScopeFailedError)) or hasattr(exc, "may_have_applied")


class RayAgent(TurnLoop):
    """An agent over Ray: :meth:`run` in its own thread (the sync API), or :meth:`arun` as an asyncio task."""

    KINDS = RAY_KINDS

    def __init__(
        self,
        hub: RayHub,
        team: str,
        workflow: str,
        name: str,
        sibling: str | None,
        *,
        is_async: bool = False,
    ) -> None:
        self.hub: RayHub = hub
        self.config, self.name, self.is_async = hub.config, name, is_async
        self.manager: Any = hub.ray_manager
        self.conv: Any = self.manager.get_conversation_state(name, workflow_id=workflow, team_id=team)
        self.foreign = f"conversation:{sibling}" if sibling else "team:no-such-team"
        self.ledger = AgentLedger(name, team, name)
        self.global_increment = 0  # acknowledged +1s on the global counter
        self.rng = random.Random(f"{self.config.seed}:{name}")
        self.warmup = [k for k in RAY_KINDS if self.config.rate(k) > 0]
        self.rng.shuffle(self.warmup)
        self.turns = 0
        self.settle = Step(self.manager.settle, _in_thread(self.manager.settle), 60.0)

    def _turn(self, kind: str) -> Turn:
        if kind == "reject":
            yield from self._rejected_turn()
        elif kind in ("timeout", "raise"):
            yield Step(self._failing_run, _in_thread(self._failing_run), kind)
        else:
            yield from self._step()

    # -- a step ---------------------------------------------------------------------------------

    def _step(self) -> Turn:
        seq = self.ledger.next_seq
        ginc = int(self.rng.random() < GLOBAL_SHARE)
        for _ in range(RETRIES):
            snap = yield from self._snapshot()
            versions = {ref.scope.value: v for ref, v in snap.versions().items()}
            batch = TransitionBatch().add_message(
                {**message(self.name, seq, 1, "step"), "ginc": ginc, "driver": self.hub.driver}
            )
            batch.update_state("counter", int(snap.get_state("counter", 0)) + 1, scope="team")
            expected = {"conversation": versions["conversation"], "team": versions["team"]}
            if ginc:
                batch.update_state("gcounter", int(snap.get_state("gcounter", 0)) + 1, scope="global")
                expected["global"] = versions["global"]
            try:
                yield Step(self.conv.apply, self.conv.aapply, batch, expected_version=expected)
            except VersionConflictError:
                continue
            except VictorActorsError as exc:  # a shard went away, or a cross-shard commit aborted
                self.hub.error(exc)
                if not (yield from self._resolve(seq, _ambiguous(exc))):
                    return
            self.ack(seq, 1, ginc)
            return
        self.hub.error("VersionConflictError")  # gave up: nothing was applied

    def _snapshot(self) -> StepGen[Any]:
        """The conversation's snapshot; a shard away past the request deadline is waited out."""
        for _ in range(10):
            try:
                return (yield Step(self.conv.snapshot, self.conv.asnapshot))
            except VictorActorsError as exc:  # a read: nothing was applied
                self.hub.error(exc)
        return (yield Step(self.conv.snapshot, self.conv.asnapshot))

    def _resolve(self, seq: int, ambiguous: bool) -> StepGen[bool]:
        """A write failed: once no shard holds anything in doubt, is its message there?

        Looked up after every failure, not only the ones the runtime calls
        ambiguous: a commit the runtime said was not applied must not be there.
        """
        with self.hub.lock:
            self.hub.ambiguous += ambiguous
        try:
            yield self.settle
        except VictorActorsError as exc:
            self.hub.error(exc)
        snap = yield from self._snapshot()
        return self.present(snap.messages, seq)

    def ack(self, seq: int, inc: int, ginc: int) -> None:
        self.hub.ack(self.ledger, seq, inc, "step")
        with self.hub.lock:
            self.global_increment += ginc
            self.hub.shard_commits[self.conv.shard] += 1

    def present(self, messages: Any, seq: int) -> bool:
        return any(
            isinstance(m, Mapping) and m.get("agent") == self.name and m.get("seq") == seq for m in messages
        )

    # -- a batch that must fail -----------------------------------------------------------------

    def _rejected_turn(self) -> Turn:
        kind = self.hub.next_reject()
        batch = TransitionBatch().add_message(message(self.name, -1, 0, "rejected"))
        batch.update_state("counter", -1_000_000, scope="team")
        batch.update_state("gcounter", -1_000_000, scope="global")  # crosses shards unless on home
        expected = None
        if kind == "access":  # a sibling's conversation (or a team that is not ours)
            batch.update_state("intrusion", self.name, scope=self.foreign)
            error: type[Exception] = ScopeAccessError
        elif kind == "conflict":
            snap = yield from self._snapshot()
            expected, error = {"conversation": snap.version + 1}, VersionConflictError
        else:  # a result for a tool request nobody made
            batch.tool_result("lookup", "forged", request_id=f"{self.name}-forged-{self.turns}")
            error = TransitionValidationError
        for _ in range(5):
            try:
                yield Step(self.conv.apply, self.conv.aapply, batch, expected_version=expected)
            except VictorActorsError as exc:
                if not isinstance(exc, error) and _unavailable(exc):
                    self.hub.error(exc)  # a shard went away first: send it again (it must still fail)
                    yield self.settle
                    continue
                self.rejected_outcome(kind, exc, error)
                return
            else:
                self.rejected_outcome(kind, None, error)
                return

    def rejected_outcome(self, kind: str, exc: BaseException | None, error: type[Exception]) -> None:
        refused = isinstance(exc, error)
        with self.hub.lock:
            self.hub.rejected[kind][0] += 1
            self.hub.rejected[kind][1] += refused
        if not refused:
            self.hub.error(f"rejected batch ({kind}) got {type(exc).__name__ if exc else 'a commit'}")

    # -- a run that fails -----------------------------------------------------------------------

    def _failing_run(self, kind: str) -> None:
        """A run meant to fail, on the sync API (an asyncio agent runs this in a worker thread).

        The turn is written once for both kinds of agent, with the blocking
        ``manager.run``; an asyncio agent keeps it off its event loop.
        """
        start = self.ledger.next_seq
        rec = RunLedger("", self.name, kind)
        attempted = 0
        before = self._version_before()
        if before is None:
            return
        try:
            with self.manager.run(self.name, timeout=self.config.run_timeout) as run:
                rec.run_id = run.id
                for i in range(self.config.run_steps):
                    attempted += 1
                    try:
                        self.conv.apply(
                            TransitionBatch().add_message(message(self.name, start + i, 0, "run_step"))
                        )
                    except VictorActorsError as exc:
                        rec.step_error = type(exc).__name__
                        raise
                    rec.committed += 1
                if kind == "raise":
                    raise SimulatedFailure(f"{self.name}: the model provider went away")
                time.sleep(self.config.run_timeout * 1.5)  # overrun: the run fails on leaving the block
        except Exception as raised:
            # as locally: a failed run raises RunFailedError carrying the body's own error
            cause = raised.error if isinstance(raised, RunFailedError) else raised
            rec.raised = (
                "DeadlineExceededError" if isinstance(cause, DeadlineExceededError) else type(cause).__name__
            )
            rec.has_report = run.rolled_back
            if rec.step_error is None and _an_undo_failed(run.rollback_report):
                # a scope's undo met a shard that stayed away (it is in the report): finished below
                rec.step_error = "rollback: a scope's undo failed"
                with self.hub.lock:
                    self.hub.interrupted_rollbacks += 1
            if rec.step_error is None and not rec.has_report and isinstance(cause, VictorActorsError):
                # the rollback itself met a shard that was away: its error replaced the run's
                rec.step_error = f"rollback: {type(cause).__name__}"
                self.hub.error(cause)
                with self.hub.lock:
                    self.hub.interrupted_rollbacks += 1
        seqs = list(range(start, start + attempted))
        rec.messages_removed = self._removed(seqs, before, rec)
        with self.hub.lock:
            self.ledger.rolled_back.extend(seqs)
            self.ledger.next_seq = start + attempted
            self.hub.runs.append(rec)

    def _version_before(self) -> int | None:
        for _ in range(10):
            try:
                return int(self.conv.version)
            except VictorActorsError as exc:
                self.hub.error(exc)
        return None

    def _removed(self, seqs: list[int], before: int, rec: RunLedger) -> int:
        """How many of the run's messages are gone; a rollback a shard kill broke is finished here.

        The agent is its conversation's only writer, so restoring it to the
        version before the run undoes exactly the run (a step whose outcome
        was unknown included, once the shards settled).
        """
        for _ in range(10):
            try:
                if rec.step_error is not None or not rec.has_report:
                    self.manager.settle(60.0)
                    if any(self.present(self.conv.snapshot().messages, s) for s in seqs):
                        self.manager.restore(self.conv, before)
                        with self.hub.lock:
                            self.hub.repaired_rollbacks += 1
                left = [s for s in seqs if self.present(self.conv.snapshot().messages, s)]
                rec.has_report = rec.has_report or (rec.step_error is not None and not left)
                return rec.committed - len(left)
            except VictorActorsError as exc:
                self.hub.error(exc)
        return 0

    # -- bookkeeping ----------------------------------------------------------------------------


def _an_undo_failed(report: RollbackReport | None) -> bool:
    """Whether the report lists a scope whose undo failed (``RayStateManager`` reports, not raises, it)."""
    return report is not None and any(
        s.version is None and s.conflicts[:1] and s.conflicts[0].startswith("the rollback of ")
        for s in report.scopes
    )
