"""The scope actor: the one writer of one scope instance.

It serialises the scope's mutations through its mailbox, asks the pure
reducer for the next state, publishes the new immutable state in the scope's
cell (where snapshots read it without a round trip), and hands the change
event to the event thread.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, Protocol

import attrs
import pykka

from victor_actors import _clock
from victor_actors._cell import ScopeCell
from victor_actors._context import RUN_ID
from victor_actors._errors import (
    DeadlineExceededError,
    ScopeFailedError,
    VersionConflictError,
    VictorActorsError,
)
from victor_actors._events import Subscription
from victor_actors._inbox import ScopeInbox
from victor_actors._messages import (
    ApplyRequest,
    Barrier,
    CheckpointRequest,
    PrepareRequest,
    RestartRequest,
    SuperviseRequest,
    answer_all,
)
from victor_actors._model import ScopeRef
from victor_actors._reducer import reduce
from victor_actors._reducer import reset as _reset_step
from victor_actors._state import ScopeState, StateChanged
from victor_actors._threads import run_on_actor_thread

__all__ = ["ActorHost", "Checkpointer", "Persist", "ScopeActor", "Stager", "stop_actor"]

logger = logging.getLogger("victor_actors")
_actor_numbers = itertools.count(1)


# Makes a commit durable before it is published; raises if it cannot.
Persist = Callable[[ScopeCell, ScopeState, StateChanged, ApplyRequest], None]
# Writes a checkpoint of the cell's committed state (on the actor's thread); returns its id.
Checkpointer = Callable[[ScopeCell, CheckpointRequest], str]


class Stager(Protocol):
    """Group commit for one scope's requests: ``ops`` encodes a commit, ``commit`` makes many durable.

    ``commit(ops)`` writes every op in one store job (so in one LMDB
    transaction) and returns once it is durable; it raises, and writes
    nothing, if the transaction fails.
    """

    def ops(
        self, cell: ScopeCell, new_state: ScopeState, record: StateChanged, req: ApplyRequest
    ) -> list[Any]: ...
    def commit(self, ops: list[Any]) -> None: ...


class _Staged:
    """A commit reduced and encoded, waiting for its group's transaction before it is published."""

    __slots__ = ("new", "old", "ops", "record", "req")

    def __init__(
        self, old: ScopeState, new: ScopeState, record: StateChanged, req: ApplyRequest, ops: list[Any]
    ) -> None:
        self.old = old
        self.new = new
        self.record = record
        self.req = req
        self.ops = ops


class ActorHost(Protocol):
    """What an actor asks of the runtime above it: commit ids, events, sessions, supervision.

    Declared here, implemented above (``_runtime.py``), so that the actor
    imports nothing of the layers that use it.
    """

    def new_commit_id(self) -> str: ...
    def publish_event(self, subscribers: tuple[Subscription, ...], record: StateChanged) -> None: ...
    def reserve_sessions(self, parent: ScopeRef, session_ids: tuple[str, ...]) -> None: ...
    def release_sessions(self, session_ids: tuple[str, ...]) -> None: ...
    def adopt_sessions(self, parent: ScopeRef, session_ids: tuple[str, ...]) -> None: ...
    def scope_failed(self, ref: ScopeRef, exc: BaseException) -> None: ...
    def tools_committed(
        self, ref: ScopeRef, requests: tuple[Any, ...], run_id: str | None = None
    ) -> None: ...
    def run_committed(self, record: StateChanged) -> None: ...
    def reload(self, cell: ScopeCell, reason: str) -> None: ...


def stop_actor(actor: pykka.ActorRef[Any]) -> pykka.Future[Any] | None:
    """Stop a scope's actor: at once if its thread never started (None), else by message (its future).

    The caller holds the cell's lock and has taken the actor out of the cell.
    """
    inbox = actor.actor_inbox
    # an actor whose thread never started is kept alive by its inbox's ``launch`` alone: hold it
    # before taking that away
    scope = actor._actor_weakref()
    if scope is not None and inbox.__class__ is ScopeInbox and inbox.take_unlaunched():
        scope.discard()
        return None
    return actor.stop(block=False)


class ScopeActor(pykka.ThreadingActor):
    """One scope instance's actor. Only this thread ever changes the scope.

    Failure handling: an error the caller can act on (validation, version
    conflict, closed scope, access) goes back to the caller as itself. Any
    other exception, and any ``BaseException`` such as ``SystemExit``, while
    handling a request becomes a :class:`ScopeFailedError` for that caller;
    the actor's committed state is untouched (the reducer is pure) and it
    goes on serving. A ``BaseException`` never reaches pykka, which would
    otherwise stop every actor in the process.
    """

    use_daemon_thread = True

    def __init__(
        self,
        cell: ScopeCell,
        host: ActorHost,
        persist: Persist | None = None,
        stager: Stager | None = None,
        checkpointer: Checkpointer | None = None,
    ) -> None:
        # pykka's own __init__ names every actor with uuid.uuid4(): a user's test that patches
        # uuid4 (LangGraph's suite does) would see its ids consumed by our actors. Set the same
        # three fields it sets, with a name drawn from a counter instead.
        self.actor_urn = f"urn:victor-actors:{next(_actor_numbers)}:{cell.state.ref}"
        self.actor_inbox: ScopeInbox = ScopeInbox()
        self.actor_stopped = threading.Event()
        self._actor_ref = pykka.ActorRef(self)
        self._persist = persist
        self._stager = stager
        self._checkpointer = checkpointer
        self._staged: list[_Staged] = []
        self._answers: list[tuple[Any, Any]] = []  # committed, published, not yet answered (see _reply)
        self._host = host
        self._cell = cell
        # a failure of a step run on a caller's thread, to be supervised on this actor's thread
        self.supervision: pykka.Future[Any] | None = None

    def on_start(self) -> None:
        self._cell.owner = threading.current_thread()

    def on_stop(self) -> None:
        if self._staged:
            self._settle()
        if self._answers:
            self._answer()
        # pykka's actor and its ref point at each other: without this the cell (and its state)
        # would wait for the cyclic collector after an eviction instead of going at once
        self._cell.owner = None
        del self._cell, self._host, self._persist, self._stager, self._checkpointer

    @classmethod
    def start(cls, *args: Any, **kwargs: Any) -> pykka.ActorRef[Any]:
        """pykka's ``start`` without its process-wide registry (a list every stop scans, under a
        lock): nothing here looks scope actors up there, and a runtime with thousands of live
        scopes would pay it on every passivation."""
        actor = cls(*args, **kwargs)
        actor._start_actor_loop()
        return actor.actor_ref

    def _start_actor_loop(self) -> None:
        # one thread per live actor, as pykka has it, but threads are reused (see _threads), and
        # started only with the actor's first message: callers' steps need no thread (ADR 0032)
        self.actor_inbox.launch = self._launch

    def _launch(self) -> None:
        run_on_actor_thread(self._actor_loop)

    def discard(self) -> None:
        """Stop an actor whose thread never started, here (the inbox said so: ``take_unlaunched``)."""
        self._stop()

    def _handle_receive(self, message: Any) -> Any:
        # every message (pykka's own stop included) waits for a caller's step in progress, and
        # counts as outstanding until it is handled (see _inbox): the scope is idle only after
        inbox = self.actor_inbox
        inbox.begin()
        try:
            return super()._handle_receive(message)
        finally:
            inbox.done()

    # -- a step on the caller's thread (ADR 0032) ----------------------------------------------

    def step_here(self, req: ApplyRequest) -> StateChanged:
        """Handle ``req`` on the calling thread, which holds the inbox's step token.

        The same step as :meth:`_apply` on the actor's thread: admission,
        the reducer, the durable write, publication, events, tools and the
        run's bookkeeping, in this scope's commit order. Only supervision of
        a real fault is not done here: it is queued to the actor's thread
        (``supervision``, ahead of anything sent after this request) and the
        caller waits for it once it has released the token.
        """
        token = RUN_ID.set(req.run_id) if req.run_id is not None else None
        try:
            observer = self._cell.observer
            if observer is not None:
                observer("received", self._cell.state.ref, req)
            return self._apply(req, self._supervise_later)
        finally:
            if token is not None:
                RUN_ID.reset(token)

    def _supervise_later(self, exc: BaseException) -> None:
        self.supervision = self.actor_ref.ask(SuperviseRequest(exc), block=False)

    def on_receive(self, message: Any) -> Any:
        cell = self._cell
        cell.busy = True
        try:
            if message.__class__ is ApplyRequest and self._stages(message):
                self._stage(message)
                if self._staged and self.actor_inbox.empty():
                    self._settle()
                return None
            if self._staged:  # anything else sees only durable, published commits
                self._settle()
            return self._dispatch(message)
        finally:
            if self._answers and self.actor_inbox.empty():
                self._answer()
            cell.busy = bool(self._staged)  # staged commits keep the scope from being passivated
            cell.last_active = _clock.monotonic()

    # -- group commit of one scope's requests ------------------------------------------------
    #
    # An asyncio caller's request (it has a reply object) to a scope in sync durability is
    # reduced on top of the commits staged before it and staged itself; once the mailbox is
    # empty the whole group is written in one store job, so in one LMDB transaction, and only
    # when that is durable are its states published and its callers answered, in order. While
    # the transaction syncs, new requests wait in the mailbox, and become the next group. If the
    # transaction fails, every commit of the group fails with the store's error and the scope
    # stays at its last durable version: nothing staged was ever visible.

    def _stages(self, req: ApplyRequest) -> bool:
        return (
            self._stager is not None
            and req.reply is not None
            and req.trace is None
            and req.reset_to is None
            and self._cell.durability == "sync"
        )

    def _stage(self, req: ApplyRequest) -> None:
        cell = self._cell
        reply = req.reply
        assert reply is not None and self._stager is not None
        state = self._staged[-1].new if self._staged else cell.state
        token = RUN_ID.set(req.run_id) if req.run_id is not None else None
        try:
            observer = cell.observer
            if observer is not None:
                observer("received", state.ref, req)
            stager = self._stager
            new_state, record, ops = self._step(state, req, lambda new, rec: stager.ops(cell, new, rec, req))
            self._staged.append(_Staged(state, new_state, record, req, ops or []))
        except VictorActorsError as exc:
            reply.fail(exc)
        except BaseException as exc:
            logger.warning("%s failed while handling a request", state.ref, exc_info=True)
            err = self._failed(state, exc)
            err.__cause__ = exc
            if self._staged:
                self._settle()  # the group before it is not this request's failure
            reply.fail(err)
            self._supervise(exc)
        finally:
            if token is not None:
                RUN_ID.reset(token)

    def _answer(self) -> None:
        answers, self._answers = self._answers, []
        answer_all(answers)

    def _settle(self) -> None:
        """Write the staged group in one transaction; publish and answer it, or fail it whole."""
        cell = self._cell
        staged, self._staged = self._staged, []
        ops = [op for item in staged for op in item.ops]
        try:
            if ops:
                assert self._stager is not None
                self._stager.commit(ops)
        except BaseException as exc:
            version = cell.state.version
            logger.warning("%s: a group of %d commits failed in the store", cell.state.ref, len(staged))
            for item in staged:
                if item.record.sessions_created:
                    self._host.release_sessions(item.record.sessions_created)
                err = ScopeFailedError(
                    f"{cell.state.ref}: the store could not commit ({exc}); nothing of the request "
                    f"was applied and the scope stays at version {version}"
                )
                err.__cause__ = exc
                assert item.req.reply is not None
                item.req.reply.fail(err)
            return
        answers: list[tuple[Any, StateChanged]] = []
        for item in staged:
            if item.new is not item.old:
                cell.state = item.new
                self._after_publish(item.old, item.record)
            answers.append((item.req.reply, item.record))
        answer_all(answers)

    def _dispatch(self, message: Any) -> Any:
        if message.__class__ is Barrier:
            return None
        observer = self._cell.observer
        if observer is not None:
            observer("received", self._cell.state.ref, message)
        if message.__class__ is PrepareRequest:
            token = RUN_ID.set(message.run_id) if message.run_id is not None else None
            try:
                if message.trace is None:
                    self._prepare(message)
                else:  # traced: the same work, in a child span of the coordinator's
                    message.trace.actor(self._prepare, self._cell)(message)
            finally:
                if token is not None:
                    RUN_ID.reset(token)
            return None
        if message.__class__ is RestartRequest:
            self._host.reload(self._cell, message.reason)
            return None
        if message.__class__ is SuperviseRequest:
            self._supervise(message.error)
            return None
        if message.__class__ is CheckpointRequest:
            return self._checkpoint(message)
        if message.__class__ is ApplyRequest:
            token = RUN_ID.set(message.run_id) if message.run_id is not None else None
            try:
                # traced: the same work, in a child span of the caller's
                apply = self._apply if message.trace is None else message.trace.actor(self._apply, self._cell)
                reply = message.reply
                if reply is None:
                    return apply(message)
                try:
                    result = apply(message)
                except Exception as exc:
                    reply.fail(exc)
                else:
                    # published already; the answer waits for the mailbox to empty, so a burst of
                    # asyncio callers is answered with one wake-up of their event loop
                    self._answers.append((reply, result))
                return None
            finally:
                if token is not None:
                    RUN_ID.reset(token)
        return super().on_receive(message)

    def _checkpoint(self, req: CheckpointRequest) -> str:
        """Write a checkpoint of the committed state (staged commits were settled before this).

        A failure goes back to the caller and leaves the scope as it was (a
        checkpoint changes no state); it is not the scope's failure, so it is
        not supervised.
        """
        cell = self._cell
        if self._checkpointer is None:
            raise ScopeFailedError(f"{cell.state.ref} has no store to checkpoint into; nothing was written")
        try:
            return self._checkpointer(cell, req)
        except Exception:
            raise
        except BaseException as exc:  # never to pykka, which would stop every actor
            raise ScopeFailedError(
                f"{cell.state.ref}: writing a checkpoint was interrupted ({type(exc).__name__}); "
                f"the scope stays at version {cell.state.version}"
            ) from exc

    def _prepare(self, req: PrepareRequest) -> None:
        """Vote on this scope's part of a cross-scope batch; if yes, hold until it is decided."""
        cell = self._cell
        state = cell.state
        txn = req.txn
        created: tuple[str, ...] = ()
        try:
            self._admit(state, txn.deadline, req.expected_version, "batch")
            transitions, indices = req.transitions, req.indices
            if transitions is None:  # lock first; the part comes once the coordinator has read us
                assert req.work is not None
                txn.votes.put((True, state))
                try:
                    item = req.work.get(timeout=max(_clock.remaining(txn.deadline + 1.0), 0.001))
                except queue.Empty:
                    item = None
                if item is None:
                    txn.finish_if_pending()
                    return
                transitions, indices = item
            new_state, record = reduce(
                state,
                transitions,
                commit_id=req.commit_id,
                run_id=req.run_id,
                timestamp=req.timestamp,
                indices=indices,
            )
            created = record.sessions_created
            if created:
                self._host.reserve_sessions(state.ref, created)
        except VictorActorsError as exc:
            txn.votes.put((False, exc))
            return
        except BaseException as exc:
            logger.warning("%s failed while preparing a batch", state.ref, exc_info=True)
            txn.votes.put((False, self._failed(state, exc)))
            self._supervise(exc)
            return
        # the cell this actor serves: the coordinator publishes into it, even if the cell it
        # started from was evicted (and this one rebuilt) before the prepare reached us
        txn.votes.put((True, (state, new_state, record, cell)))
        outcome = txn.wait_outcome()  # this scope takes nothing else until the batch is decided
        try:
            if outcome == "committed" and new_state is not state:
                self._after_publish(state, attrs.evolve(record, involved=txn.involved))
            elif created:
                self._host.release_sessions(created)
        finally:
            txn.participant_done()

    def _supervise(self, exc: BaseException) -> None:
        """Report a failure to the supervisor, which may restart this scope right here."""
        try:
            self._host.scope_failed(self._cell.state.ref, exc)
        except Exception:  # supervision must never take the actor down
            logger.exception("supervising the failure of %s failed", self._cell.state.ref)

    def _admit(self, state: ScopeState, deadline: float | None, expected: int | None, what: str) -> None:
        """The checks before any work: given up on, expired in the mailbox, an injected fault, stale."""
        cell = self._cell
        if cell.failed_reason is not None:
            raise ScopeFailedError(
                f"{state.ref} has failed for good ({cell.failed_reason}); nothing was applied"
            )
        if deadline is not None and _clock.monotonic() > deadline:
            raise DeadlineExceededError(
                f"{state.ref}: the {what}'s deadline passed while it waited in the mailbox; "
                "nothing was applied"
            )
        if cell.faults:
            self._run_fault(cell)
        if expected is not None and expected != state.version:
            raise VersionConflictError(state.ref, expected, state.version)

    @staticmethod
    def _run_fault(cell: ScopeCell) -> None:
        fault = cell.faults.pop(0)
        if isinstance(fault, BaseException):
            raise fault
        fault()

    @staticmethod
    def _failed(state: ScopeState, exc: BaseException) -> ScopeFailedError:
        err = ScopeFailedError(
            f"{state.ref} failed while handling the request ({type(exc).__name__}: {exc}); "
            f"nothing was applied and the scope stays at version {state.version}"
        )
        err.__cause__ = exc
        return err

    def _after_publish(self, old: ScopeState, record: StateChanged) -> None:
        self._cell.commits += 1
        if record.sessions_created:
            self._host.adopt_sessions(old.ref, record.sessions_created)
        if record.tool_requests:
            # the outbox: after the commit; results of a run's requests belong to the run
            self._host.tools_committed(old.ref, record.tool_requests, record.run_id)
        if record.run_id is not None:
            self._host.run_committed(record)  # so a run knows its commits even if its caller gave up
        subscribers = self._cell.subscribers
        if subscribers:
            self._host.publish_event(subscribers, record)
        observer = self._cell.observer
        if observer is not None:
            observer("published", old.ref, record)

    def _step(
        self, state: ScopeState, req: ApplyRequest, write: Callable[[ScopeState, StateChanged], Any]
    ) -> tuple[ScopeState, StateChanged, Any]:
        """Admit ``req``, reduce it on top of ``state`` and ``write`` the result (if it changes anything).

        The work both commit paths share (``_apply`` writes durably now, ``_stage`` encodes for
        its group). Sessions the commit creates are claimed before anything is written, and
        released again if ``write`` fails. Returns the new state, the record and what ``write``
        returned (None for a commit that changes nothing).
        """
        self._admit(state, req.deadline, req.expected_version, "request")
        commit_id = self._host.new_commit_id()
        if req.reset_to is None:
            new_state, record = reduce(
                state, req.transitions, commit_id=commit_id, run_id=req.run_id, timestamp=_clock.time()
            )
        else:
            target = req.reset_to(state) if callable(req.reset_to) else req.reset_to
            if target is None:  # nothing to reset
                new_state, record = reduce(state, (), commit_id=commit_id, run_id=req.run_id)
            else:
                new_state, record = _reset_step(
                    state, target, commit_id=commit_id, run_id=req.run_id, timestamp=_clock.time()
                )
        if new_state is state:
            return new_state, record, None
        created = record.sessions_created
        if created:
            self._host.reserve_sessions(state.ref, created)  # before anything is durable
        try:
            return new_state, record, write(new_state, record)
        except BaseException:
            if created:
                self._host.release_sessions(created)
            raise

    def _apply(
        self, req: ApplyRequest, supervise: Callable[[BaseException], None] | None = None
    ) -> StateChanged:
        cell = self._cell
        state = cell.state
        persist = self._persist
        try:
            # durable before anyone can see it
            new_state, record, _ = self._step(
                state, req, lambda new, rec: None if persist is None else persist(cell, new, rec, req)
            )
        except VictorActorsError:
            raise
        except BaseException as exc:
            logger.warning("%s failed while handling a request", state.ref, exc_info=True)
            err = self._failed(state, exc)
            (self._supervise if supervise is None else supervise)(exc)
            raise err from exc
        if new_state is not state:
            cell.state = new_state
            self._after_publish(state, record)
        return record
