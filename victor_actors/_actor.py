"""The scope actor: the one writer of one scope instance.

It serialises the scope's mutations through its mailbox, asks the pure
reducer for the next state, publishes the new immutable state in the scope's
cell (where snapshots read it without a round trip), and hands the change
event to the event thread.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import attrs
import pykka

from victor_actors._context import RUN_ID
from victor_actors._crossscope import PrepareRequest
from victor_actors._errors import (
    DeadlineExceededError,
    ScopeFailedError,
    VersionConflictError,
    VictorActorsError,
)
from victor_actors._events import EventBus, Subscription
from victor_actors._model import ScopeRef, StateTransition
from victor_actors._reducer import reduce
from victor_actors._reducer import reset as _reset_step
from victor_actors._state import ScopeState, StateChanged

__all__ = ["ApplyRequest", "AsyncReply", "Barrier", "ScopeActor", "ScopeCell", "mailbox_depth"]

logger = logging.getLogger("victor_actors")
_stack_lock = threading.Lock()


class ScopeCell:
    """What a scope's actor shares with its handles.

    ``state`` is the last committed immutable state; only the actor assigns
    it, and readers take it with one attribute read. ``subscribers`` is a
    tuple replaced (never changed in place) when subscriptions change.
    """

    __slots__ = (
        "actor",
        "busy",
        "commits",
        "durability",
        "failed_reason",
        "faults",
        "last_active",
        "lock",
        "observer",
        "owner",
        "restarts",
        "state",
        "stopping",
        "subscribers",
    )

    def __init__(self, state: ScopeState, durability: str = "memory") -> None:
        self.state = state
        self.subscribers: tuple[Subscription, ...] = ()
        self.faults: list[BaseException | Callable[[], Any]] = []
        self.durability = durability
        self.restarts = 0
        self.failed_reason: str | None = None  # set when supervision gave up on this scope
        self.owner: Any = None  # the actor's thread, once it runs
        # Called as observer(kind, ref, obj) on the actor's thread: ("received", ref, message) for
        # every message, ("published", ref, event) for every commit. For test recorders; None: off.
        self.observer: Callable[[str, ScopeRef, Any], None] | None = None
        # The live actor, or None while the scope is passivated. Senders and the passivator take
        # ``lock`` around reading it and putting a message in its mailbox, so a message never
        # lands in the mailbox of an actor that is being stopped.
        self.actor: pykka.ActorRef[Any] | None = None
        self.lock = threading.Lock()
        self.stopping: Any = None  # the stop future of the previous actor, until it has exited
        self.busy = False  # inside a message (a prepared cross-scope part waits in here)
        self.last_active = time.monotonic()
        self.commits = 0


def mailbox_depth(actor: pykka.ActorRef[Any]) -> int:
    """Requests waiting in a threading actor's mailbox (a queue.Queue)."""
    inbox: queue.Queue[Any] = actor.actor_inbox  # type: ignore[assignment]
    return inbox.qsize()


class AsyncReply:
    """Settles an asyncio future from the actor's thread, without blocking either side."""

    __slots__ = ("future", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any]) -> None:
        self.loop = loop
        self.future = future

    def _call(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop was closed; nobody is waiting any more
            pass

    def ok(self, value: Any) -> None:
        self._call(_set_result, self.future, value)

    def fail(self, exc: BaseException) -> None:
        self._call(_set_exception, self.future, exc)


def _set_result(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _set_exception(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


class ApplyRequest:
    """Apply these transitions to the scope, all or nothing."""

    __slots__ = ("deadline", "expected_version", "reply", "reset_to", "run_id", "transitions")

    def __init__(
        self,
        transitions: tuple[StateTransition, ...],
        expected_version: int | None,
        deadline: float | None,
        run_id: str | None = None,
        reply: AsyncReply | None = None,
        reset_to: ScopeState | Callable[[ScopeState], ScopeState | None] | None = None,
    ) -> None:
        self.transitions = transitions
        self.expected_version = expected_version
        self.deadline = deadline
        self.run_id = run_id
        self.reply = reply
        # Set the scope to this state as one commit (restore), or to what this function
        # computes from the current state, on the actor's thread (run rollback).
        self.reset_to = reset_to


# Makes a commit durable before it is published; raises if it cannot.
Persist = Callable[[ScopeState, StateChanged, ApplyRequest], None]


class Barrier:
    """Answered as soon as the actor reaches it: everything sent before it was handled."""

    __slots__ = ()


class RestartRequest:
    """Rebuild this scope's state from its last committed state (sent by its supervisor)."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


class ActorHost(Protocol):
    """What an actor asks of its manager: sessions, supervision, restarts."""

    def reserve_sessions(self, parent: ScopeRef, session_ids: tuple[str, ...]) -> None: ...
    def release_sessions(self, session_ids: tuple[str, ...]) -> None: ...
    def adopt_sessions(self, parent: ScopeRef, session_ids: tuple[str, ...]) -> None: ...
    def scope_failed(self, ref: ScopeRef, exc: BaseException) -> None: ...
    def tools_committed(
        self, ref: ScopeRef, requests: tuple[Any, ...], run_id: str | None = None
    ) -> None: ...
    def run_committed(self, record: StateChanged) -> None: ...
    def reload(self, cell: ScopeCell, reason: str) -> None: ...


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
        bus: EventBus,
        commit_prefix: str,
        commit_counter: Iterator[int],
        persist: Persist | None = None,
        host: ActorHost | None = None,
    ) -> None:
        super().__init__()
        self._persist = persist
        self._sessions = host
        self._host = host
        self._cell = cell
        self._bus = bus
        self._commit_prefix = commit_prefix
        self._commit_counter = commit_counter

    def on_start(self) -> None:
        self._cell.owner = threading.current_thread()

    stack_size = 512 * 1024  # scope actors need little stack; thousands of threads add up

    def _start_actor_loop(self) -> None:
        # threading.stack_size is process-wide: set it only around this thread's start.
        with _stack_lock:
            previous = threading.stack_size(self.stack_size)
            try:
                super()._start_actor_loop()
            finally:
                threading.stack_size(previous)

    def on_receive(self, message: Any) -> Any:
        cell = self._cell
        cell.busy = True
        try:
            return self._dispatch(message)
        finally:
            cell.busy = False
            cell.last_active = time.monotonic()

    def _dispatch(self, message: Any) -> Any:
        if message.__class__ is Barrier:
            return None
        observer = self._cell.observer
        if observer is not None:
            observer("received", self._cell.state.ref, message)
        if message.__class__ is PrepareRequest:
            token = RUN_ID.set(message.run_id) if message.run_id is not None else None
            try:
                self._prepare(message)
            finally:
                if token is not None:
                    RUN_ID.reset(token)
            return None
        if message.__class__ is RestartRequest:
            if self._host is not None:
                self._host.reload(self._cell, message.reason)
            return None
        if message.__class__ is ApplyRequest:
            token = RUN_ID.set(message.run_id) if message.run_id is not None else None
            try:
                reply = message.reply
                if reply is None:
                    return self._apply(message)
                try:
                    result = self._apply(message)
                except Exception as exc:
                    reply.fail(exc)
                else:
                    reply.ok(result)
                return None
            finally:
                if token is not None:
                    RUN_ID.reset(token)
        return super().on_receive(message)

    def _prepare(self, req: PrepareRequest) -> None:
        """Vote on this scope's part of a cross-scope batch; if yes, hold until it is decided."""
        cell = self._cell
        state = cell.state
        txn = req.txn
        created: tuple[str, ...] = ()
        try:
            if cell.failed_reason is not None:
                raise ScopeFailedError(
                    f"{state.ref} has failed for good ({cell.failed_reason}); nothing was applied"
                )
            if time.monotonic() > txn.deadline:
                raise DeadlineExceededError(
                    f"{state.ref}: the batch's deadline passed while it waited in the mailbox; "
                    "nothing was applied"
                )
            if cell.faults:
                self._run_fault(cell)
            if req.expected_version is not None and req.expected_version != state.version:
                raise VersionConflictError(state.ref, req.expected_version, state.version)
            transitions, indices = req.transitions, req.indices
            if transitions is None:  # lock first; the part comes once the coordinator has read us
                assert req.work is not None
                txn.votes.put((True, state))
                try:
                    item = req.work.get(timeout=max(txn.deadline + 1.0 - time.monotonic(), 0.001))
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
            if created and self._sessions is not None:
                self._sessions.reserve_sessions(state.ref, created)
        except VictorActorsError as exc:
            txn.votes.put((False, exc))
            return
        except BaseException as exc:
            logger.warning("%s failed while preparing a batch", state.ref, exc_info=True)
            txn.votes.put((False, self._failed(state, exc)))
            self._supervise(exc)
            return
        txn.votes.put((True, (state, new_state, record)))
        outcome = txn.wait_outcome()  # this scope takes nothing else until the batch is decided
        try:
            if outcome == "committed" and new_state is not state:
                self._after_publish(state, attrs.evolve(record, involved=txn.involved))
            elif created and self._sessions is not None:
                self._sessions.release_sessions(created)
        finally:
            txn.participant_done()

    def _supervise(self, exc: BaseException) -> None:
        """Report a failure to the supervisor, which may restart this scope right here."""
        if self._host is None:
            return
        try:
            self._host.scope_failed(self._cell.state.ref, exc)
        except Exception:  # supervision must never take the actor down
            logger.exception("supervising the failure of %s failed", self._cell.state.ref)

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
        if record.sessions_created and self._sessions is not None:
            self._sessions.adopt_sessions(old.ref, record.sessions_created)
        if self._host is not None:
            if record.tool_requests:
                # the outbox: after the commit; results of a run's requests belong to the run
                self._host.tools_committed(old.ref, record.tool_requests, record.run_id)
            if record.run_id is not None:
                self._host.run_committed(record)  # so a run knows its commits even if its caller gave up
        subscribers = self._cell.subscribers
        if subscribers:
            self._bus.publish(subscribers, record)
        observer = self._cell.observer
        if observer is not None:
            observer("published", old.ref, record)

    def _apply(self, req: ApplyRequest) -> StateChanged:
        cell = self._cell
        state = cell.state
        try:
            if cell.failed_reason is not None:
                raise ScopeFailedError(
                    f"{state.ref} has failed for good ({cell.failed_reason}); nothing was applied"
                )
            if req.deadline is not None and time.monotonic() > req.deadline:
                raise DeadlineExceededError(
                    f"{state.ref}: the request's deadline passed while it waited in the mailbox; "
                    "nothing was applied"
                )
            if cell.faults:
                self._run_fault(cell)
            if req.expected_version is not None and req.expected_version != state.version:
                raise VersionConflictError(state.ref, req.expected_version, state.version)
            commit_id = f"{self._commit_prefix}.{next(self._commit_counter):x}"
            if req.reset_to is None:
                new_state, record = reduce(
                    state, req.transitions, commit_id=commit_id, run_id=req.run_id, timestamp=time.time()
                )
            else:
                target = req.reset_to(state) if callable(req.reset_to) else req.reset_to
                if target is None:  # nothing to reset
                    new_state, record = reduce(state, (), commit_id=commit_id, run_id=req.run_id)
                else:
                    new_state, record = _reset_step(
                        state, target, commit_id=commit_id, run_id=req.run_id, timestamp=time.time()
                    )
            created = record.sessions_created
            if created:
                if self._sessions is None:
                    raise ScopeFailedError("this scope cannot create sessions")
                self._sessions.reserve_sessions(state.ref, created)  # before anything is durable
            try:
                if new_state is not state and self._persist is not None:
                    self._persist(new_state, record, req)  # durable before anyone can see it
            except BaseException:
                if created and self._sessions is not None:
                    self._sessions.release_sessions(created)
                raise
        except VictorActorsError:
            raise
        except BaseException as exc:
            logger.warning("%s failed while handling a request", state.ref, exc_info=True)
            err = self._failed(state, exc)
            self._supervise(exc)
            raise err from exc
        if new_state is not state:
            cell.state = new_state
            self._after_publish(state, record)
        return record
