"""The kernel: what every layer above the actors shares, and the one way to reach an actor.

It owns the options, the registry of resident cells and their resident
children, the subscriptions, commit ids, the publish lock, the event bus,
the run registry, and three ports the services above plug into: ``persist``
(how a cross-scope commit becomes durable), ``activator`` (how a passivated
scope gets an actor again) and ``resolver`` (how an evicted scope is found
again, from the store or its encoded copy). ``tell``/``ask``/``asend`` put a
message in a cell's mailbox, activating the scope if needed, looking an
evicted cell up again, and applying the mailbox bound.

Only resident scopes have an entry here: an evicted scope costs the kernel
nothing but, if someone subscribed to it, its entry in ``subscriptions``.

Nothing here knows handles, the manager or any service: where the kernel
needs one, it declares a ``Protocol`` and the layer above passes itself in.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, Protocol, TypeVar

import pykka

from victor_actors import _clock, _trace
from victor_actors._cell import Observer, ScopeCell, mailbox_depth
from victor_actors._errors import (
    BackpressureError,
    DeadlineExceededError,
    RuntimeClosedError,
    ScopeFailedError,
)
from victor_actors._events import EventBus, Subscription
from victor_actors._inbox import ScopeInbox
from victor_actors._messages import ApplyRequest
from victor_actors._model import ScopeRef, StateTransition
from victor_actors._options import Options
from victor_actors._snapshot import ContextSnapshot
from victor_actors._state import ScopeState, StateChanged
from victor_actors._trace import CLEAR, Names
from victor_actors.store import Store

__all__ = ["Activator", "CallObserver", "Kernel", "PersistPort", "Resolver", "RunLike"]

# calls(kind, ref, obj) on a caller's thread: see ``Kernel.calls``
CallObserver = Callable[[str, ScopeRef | None, Any], None]

_manager_ids = itertools.count(1)
_T = TypeVar("_T")


class Activator(Protocol):
    """Starts an actor for a passivated cell (the caller holds ``cell.lock``), and keeps the cap."""

    def activate(self, cell: ScopeCell) -> pykka.ActorRef[Any]: ...
    def after_activation(self) -> None: ...


class Resolver(Protocol):
    """Finds the cell of an existing scope, rebuilding an evicted one; raises ScopeAccessError if none."""

    def resolve(self, ref: ScopeRef) -> ScopeCell: ...


class PersistPort(Protocol):
    """Makes the parts of one cross-scope commit durable together (one store job)."""

    def persist_many(self, parts: list[tuple[ScopeCell, ScopeState, StateChanged, Any]]) -> None: ...


class RunLike(Protocol):
    """What the kernel's run registry holds: a run that learns of its commits."""

    id: str

    def record(self, commit: StateChanged) -> None: ...
    def refs(self) -> set[ScopeRef]: ...


def _send(
    bound: int | None, message: Any, ask: bool, _cell: ScopeCell, actor: pykka.ActorRef[Any]
) -> tuple[bool, Any]:
    """Under the cell's lock: put ``message`` in ``actor``'s mailbox; (False, None) at its bound."""
    if bound is not None and mailbox_depth(actor) >= bound:
        return False, None
    if ask:
        return True, actor.ask(message, block=False)
    actor.tell(message)
    return True, None


def _end_step(cell: ScopeCell, inbox: Any, scope: Any, timeout: float) -> None:
    """A step taken off the actor's thread is over: the token back, then a real fault's supervision."""
    supervision, scope.supervision = scope.supervision, None
    cell.busy = False
    inbox.release()
    if supervision is not None:
        try:
            supervision.get(timeout=timeout)
        except Exception:  # the failure is the caller's answer; supervision logs its own
            pass


def _claim_unlaunched(cell: ScopeCell, actor: pykka.ActorRef[Any]) -> tuple[ScopeCell, Any, Any] | None:
    """:func:`_claim`, for a scope whose actor's thread was never started (its inbox can still launch it)."""
    if getattr(actor.actor_inbox, "launch", None) is None:
        return None
    return _claim(cell, actor)


def _claim(cell: ScopeCell, actor: pykka.ActorRef[Any]) -> tuple[ScopeCell, Any, Any] | None:
    """Under ``cell``'s lock: take the step token of an idle scope (see :meth:`Kernel.step_here`)."""
    inbox: Any = actor.actor_inbox
    if cell.faults or inbox.__class__ is not ScopeInbox or not inbox.try_claim():
        return None
    scope: Any = actor._actor_weakref()
    if scope is None:
        inbox.release()
        return None
    cell.busy = True
    return cell, inbox, scope


class Kernel:
    """Shared state and message transport of one runtime (one manager)."""

    def __init__(self, options: Options, store: Store | None) -> None:
        self.options = options
        self.store = store
        self.read_only = store is not None and store.read_only
        self.durability = options.durability if store is not None else "memory"
        self.closed = False
        self.forked = False  # this process is a fork of the one that opened the manager
        # runs asyncio callers' steps on idle scopes whose commits never wait for the disk (ADR 0036)
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self.closed_reason: str | None = None
        self.lock = threading.RLock()  # guards the registry, the child lists and the subscriptions
        self.cells: dict[ScopeRef, ScopeCell] = {}  # resident scopes only
        # resident children of each resident scope, in the order they became resident; a scope
        # with resident children stays resident (their cells hold its cell as an ancestor)
        # (a dict as an ordered set: an eviction takes a child out in O(1))
        self.children: dict[ScopeRef | None, dict[ScopeRef, None]] = {}
        # subscribers of each subscribed scope, resident or not: a new cell takes them from here
        self.subscriptions: dict[ScopeRef, tuple[Subscription, ...]] = {}
        self.evicted_commits = 0  # commits counted by cells that have since been evicted
        self.runs: dict[str, RunLike] = {}
        self.observer: Observer | None = None
        # calls(kind, ref, obj) on the caller's thread, for the testing kit's recorder (None: off):
        # ("read", ref, snapshot) for every snapshot a handle hands out; ("write", ref,
        # (via, transitions, expected_version, record, error)) after every apply, aapply, transact
        # and atransact, whatever its outcome; ("run", None, (event, run, detail)) when a run
        # starts ("start", None) and ends ("end", its rollback report or None)
        self.calls: CallObserver | None = None
        self.persist: PersistPort | None = None
        self.activator: Activator | None = None
        self.resolver: Resolver | None = None
        # a read-only manager's reads: a snapshot at the store's newest consistent cut (the
        # durability service's ``fresh_snapshot``); None for a manager that owns its scopes
        self.fresh: Callable[[ScopeCell], ContextSnapshot] | None = None
        # how this manager's scope ids appear in telemetry: hashed when the store is encrypted
        self.names = CLEAR if store is None or store.layout.id_key is None else Names(store.layout.id_key)
        # the application's rules on what state may hold (the manager's ``validators``), checked by
        # handles at the edge before a batch is sent; None when there are none
        self.validate: Callable[[ScopeCell, tuple[StateTransition, ...]], None] | None = None
        name = f"victor-actors-{next(_manager_ids)}"
        self.bus = EventBus(name, self.names)
        # Commit ids: unique per process and runtime; next() on a count is atomic.
        self._commit_prefix = f"{os.getpid():x}.{next(_manager_ids):x}"
        self._commit_counter = itertools.count(1)
        # Held while a cross-scope commit publishes its states, and by snapshots reading several
        # scopes, so a snapshot sees all of such a commit or none of it.
        self.publish_lock = threading.Lock()

    # -- identity and registry ---------------------------------------------

    def new_commit_id(self) -> str:
        return f"{self._commit_prefix}.{next(self._commit_counter):x}"

    def cell(self, ref: ScopeRef) -> ScopeCell | None:
        """The live (registered) cell of ``ref``, or None."""
        return self.cells.get(ref)

    def all_cells(self) -> list[ScopeCell]:
        return list(self.cells.values())

    def register(self, cell: ScopeCell) -> None:
        """Add a new cell to the registry and its parent's children. Holds ``lock``."""
        ref = cell.state.ref
        cell.subscribers = self.subscriptions.get(ref, ())
        cell.observer = self.observer
        self.cells[ref] = cell
        self.children.setdefault(cell.state.parent, {})[ref] = None

    def unregister(self, cell: ScopeCell) -> None:
        """Take an evicted cell out of the registry and its parent's children. Holds ``lock``."""
        ref = cell.state.ref
        if self.cells.get(ref) is not cell:
            return
        del self.cells[ref]
        self.children.pop(ref, None)
        siblings = self.children.get(cell.state.parent)
        if siblings is not None:
            siblings.pop(ref, None)
            if not siblings:
                del self.children[cell.state.parent]
        self.evicted_commits += cell.commits

    def resolve(self, ref: ScopeRef) -> ScopeCell:
        """The resident cell of an existing scope, rebuilt from the store (or memory) if evicted.

        Raises:
            ScopeAccessError: no such scope exists.
        """
        cell = self.cells.get(ref)
        if cell is not None and not cell.evicted:
            return cell
        if self.resolver is None:
            raise ScopeFailedError(f"{ref} was evicted and nothing can bring it back; nothing was applied")
        return self.resolver.resolve(ref)

    def commits(self) -> int:
        """Commits made so far by every scope, resident or evicted."""
        with self.lock:
            return self.evicted_commits + sum(c.commits for c in self.cells.values())

    def run_refs(self) -> set[ScopeRef]:
        """Scopes a run in progress has touched."""
        refs: set[ScopeRef] = set()
        for run in list(self.runs.values()):
            refs.update(run.refs())
        return refs

    # -- subscriptions ------------------------------------------------------

    def subscribe(self, cell: ScopeCell, callback: Callable[[StateChanged], object]) -> Subscription:
        """Subscribe ``callback`` to ``cell``'s scope: kept in ``subscriptions``, so it survives eviction."""
        ref = cell.state.ref

        def remove(sub: Subscription) -> None:
            with self.lock:
                subs = tuple(s for s in self.subscriptions.get(ref, ()) if s is not sub)
                if subs:
                    self.subscriptions[ref] = subs
                else:
                    self.subscriptions.pop(ref, None)
                live = self.cells.get(ref)
                if live is not None:
                    live.subscribers = subs

        sub = Subscription(ref, callback, remove)
        with self.lock:
            subs = (*self.subscriptions.get(ref, ()), sub)
            self.subscriptions[ref] = subs
            live = self.cells.get(ref)
            for target in (cell, live):
                if target is not None:
                    target.subscribers = subs
        return sub

    def set_observer(self, observer: Observer | None) -> None:
        with self.lock:
            self.observer = observer
            for cell in self.cells.values():
                cell.observer = observer

    # -- the mailbox ---------------------------------------------------------

    def check_open(self, ref: ScopeRef) -> None:
        if self.closed:
            raise RuntimeClosedError(self.closed_reason or f"the manager is closed; {ref} takes no requests")

    def mark_forked(self, parent: int) -> None:
        """In a forked child: nothing of this manager may be used here (its threads stayed behind)."""
        self.forked = True
        self.closed = True
        self.closed_reason = (
            f"this manager was opened in process {parent} and this process ({os.getpid()}) is a fork "
            "of it: its actors, threads and store stayed in the parent, so nothing was done. Open the "
            "manager after the fork (e.g. in gunicorn's post_fork hook, or without --preload), or let "
            "one owner serve every worker: victor_actors.connect(url) (see docs/deploying.md)"
        )
        if self.store is not None:
            self.store.forget_after_fork()

    def _at_actor(self, cell: ScopeCell, fn: Callable[[ScopeCell, pykka.ActorRef[Any]], _T]) -> _T:
        """``fn(cell, actor)`` under the cell's lock, with its live actor (a passivated scope's is started).

        An evicted cell is looked up again first (outside its lock: the
        kernel's lock comes before any cell's); ``fn`` gets the cell it runs
        under, which may be the scope's new one.

        Raises:
            ScopeFailedError: the scope has no actor and nothing can start one.
        """
        with cell.lock:  # the common case first: a live cell with its actor running
            actor = cell.actor
            if actor is not None and not cell.evicted:
                return fn(cell, actor)
        activated = False
        try:
            while True:
                while cell.evicted:  # someone held on to an evicted cell: the scope's new cell takes it
                    cell = self.resolve(cell.state.ref)
                with cell.lock:
                    if cell.evicted:
                        continue
                    actor = cell.actor
                    if actor is None:
                        if self.activator is None:
                            raise ScopeFailedError(f"{cell.state.ref} has no actor; nothing was applied")
                        actor = self.activator.activate(cell)
                        activated = True
                    return fn(cell, actor)
        finally:
            if activated and self.activator is not None:
                self.activator.after_activation()  # keep the live-actor cap, outside the lock

    def _try_send(self, cell: ScopeCell, message: Any, ask: bool) -> tuple[bool, Any]:
        """Put ``message`` in the live actor's mailbox; (False, None) when the mailbox is at its bound."""

        return self._at_actor(cell, partial(_send, self.options.mailbox_size, message, ask))

    def _full(self, ref: ScopeRef, deadline: float) -> float:
        """The mailbox is full: raise, or say how long to wait before trying again."""
        bound = self.options.mailbox_size
        if self.options.backpressure == "reject":
            raise _refused(ref, f"{ref}'s mailbox holds {bound} requests; nothing was applied")
        if _clock.monotonic() >= deadline:
            raise _refused(
                ref,
                f"{ref}'s mailbox stayed full ({bound}) until the request's deadline; nothing was applied",
            )
        return 0.001

    def dead(self, ref: ScopeRef) -> Exception:
        """The error for a request whose actor stopped under it."""
        if self.closed:
            return RuntimeClosedError(self.closed_reason or f"the manager is closed; {ref} takes no requests")
        return ScopeFailedError(f"{ref}'s actor is not running; nothing was applied")

    def tell(self, cell: ScopeCell, message: Any, deadline: float | None = None) -> None:
        """Put ``message`` in ``cell``'s mailbox; with a full mailbox, wait or refuse (backpressure).

        Raises:
            BackpressureError: the mailbox is full (``reject``) or stayed full until ``deadline``.
            RuntimeClosedError, ScopeFailedError: the scope takes no messages.
        """
        end = _clock.monotonic() + self.options.request_timeout if deadline is None else deadline
        try:
            while True:
                sent, _ = self._try_send(cell, message, False)
                if sent:
                    return
                time.sleep(self._full(cell.state.ref, end))
        except pykka.ActorDeadError:
            raise self.dead(cell.state.ref) from None

    def ask(self, cell: ScopeCell, message: Any, timeout: float) -> Any:
        """Send ``message`` and wait for the actor's answer (its error is raised here).

        A blocking apply to an idle scope is not sent: the caller runs the
        scope's step itself (:meth:`step_here`, ADR 0032).

        Raises:
            DeadlineExceededError: no answer within ``timeout``; the request may still be handled.
            BackpressureError, RuntimeClosedError, ScopeFailedError: as for :meth:`tell`.
        """
        if message.__class__ is ApplyRequest and message.reply is None and message.trace is None:
            done, answer = self.step_here(cell, message, timeout)
            if done:
                return answer
        end = _clock.monotonic() + timeout
        try:
            while True:
                sent, future = self._try_send(cell, message, True)
                if sent:
                    return future.get(timeout=_clock.remaining(end))
                time.sleep(self._full(cell.state.ref, end))
        except pykka.Timeout:
            raise DeadlineExceededError(
                f"{cell.state.ref}: no reply within {timeout} s; the request may still be applied, "
                "read the scope's version to tell"
            ) from None
        except pykka.ActorDeadError:
            raise self.dead(cell.state.ref) from None

    def step_here(self, cell: ScopeCell, req: ApplyRequest, timeout: float) -> tuple[bool, Any]:
        """Run ``req``'s step on this thread if the scope is idle; (False, None) if it is not.

        Idle: the scope has an actor (one is started for a passivated scope,
        as a send would), nothing in its mailbox or in hand, no caller's step
        in progress, and no injected fault waiting (faults are a testing hook
        that must run where the test put them: on the actor's thread). The
        step token is taken under the cell's lock with ``busy`` set, so the
        passivator cannot stop the actor under the step; messages sent
        meanwhile wait for it. A real fault's supervision runs on the actor's
        thread before anything sent after this request; the caller waits
        for it (up to ``timeout``) before the error is raised, as it would
        have had the actor taken the step.
        """

        claimed = self._at_actor(cell, _claim)
        if claimed is None:
            return False, None
        cell, inbox, scope = claimed
        try:
            return True, scope.step_here(req)
        finally:
            _end_step(cell, inbox, scope, timeout)

    def step_soon(self, cell: ScopeCell, req: ApplyRequest) -> bool:
        """Run an asyncio caller's ``req`` on the step pool if its scope is idle (ADR 0036).

        Only a request whose commit never waits for the disk (an in-memory
        manager, or a scope in ``async`` or ``manual`` durability), with an
        asyncio reply and no trace, to a scope whose actor's thread never
        started (once it runs, a hand-off to it costs what one to the pool
        does, and a burst keeps one thread): the pool thread takes the scope's step
        as a blocking caller would (ADR 0032) and answers through the
        request's reply. The event loop never runs the step. False: the
        scope is not idle (or the pool is shut): send the request instead.
        """
        if cell.durability == "sync" or req.trace is not None or req.reply is None:
            return False
        actor = cell.actor  # read without the lock: the claim checks again under it
        if actor is not None and getattr(actor.actor_inbox, "launch", None) is None:
            return False  # its thread runs: the request goes to it
        claimed = self._at_actor(cell, _claim_unlaunched)
        if claimed is None:
            return False
        pool = self._step_pool()
        try:
            if pool is None:
                raise RuntimeError("the step pool is shut")
            pool.submit(self._run_claimed, claimed, req)
        except RuntimeError:  # the manager closed meanwhile: give the step back; the send decides
            _end_step(*claimed, 0.0)
            return False
        return True

    def _step_pool(self) -> concurrent.futures.ThreadPoolExecutor | None:
        pool = self._pool
        if pool is None:
            with self._pool_lock:
                if self._pool is None and not self.closed:
                    self._pool = concurrent.futures.ThreadPoolExecutor(
                        max_workers=2, thread_name_prefix="victor-actors-step"
                    )
                pool = self._pool
        return pool

    def _run_claimed(self, claimed: tuple[ScopeCell, Any, Any], req: ApplyRequest) -> None:
        """On a pool thread: the claimed scope's step for ``req``, then its answer."""
        cell, inbox, scope = claimed
        reply = req.reply
        assert reply is not None
        record: Any = None
        error: BaseException | None = None
        try:
            record = scope.step_here(req)
        except Exception as exc:  # the caller's answer, as the actor would give it
            error = exc
        finally:
            wait = 0.0 if req.deadline is None else max(_clock.remaining(req.deadline), 0.0)
            _end_step(cell, inbox, scope, wait)
        if error is not None:
            reply.fail(error)
        else:
            reply.ok(record)

    def shut_steps(self) -> None:
        """Wait for the step pool's steps in progress, and take no more (on close)."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def post(self, cell: ScopeCell, message: Any, deadline: float) -> Any:
        """Put ``message`` in the mailbox and return the pykka future of its answer, without waiting.

        Raises:
            BackpressureError, RuntimeClosedError, ScopeFailedError: as for :meth:`tell`.
        """
        try:
            while True:
                sent, future = self._try_send(cell, message, True)
                if sent:
                    return future
                time.sleep(self._full(cell.state.ref, deadline))
        except pykka.ActorDeadError:
            raise self.dead(cell.state.ref) from None

    def try_tell(self, cell: ScopeCell, message: Any) -> bool:
        """Put ``message`` in the mailbox if it has room (no waiting); False at its bound.

        Raises:
            RuntimeClosedError, ScopeFailedError: the scope takes no messages.
        """
        try:
            return self._try_send(cell, message, False)[0]
        except pykka.ActorDeadError:
            raise self.dead(cell.state.ref) from None

    async def asend(self, cell: ScopeCell, message: Any, deadline: float) -> None:
        """:meth:`tell` for the event loop: a full mailbox is waited for with ``asyncio.sleep``."""
        try:
            while True:
                sent, _ = self._try_send(cell, message, False)
                if sent:
                    return
                await asyncio.sleep(self._full(cell.state.ref, deadline))
        except pykka.ActorDeadError:
            raise self.dead(cell.state.ref) from None

    def barrier(self, cells: Iterable[ScopeCell], message: Any, deadline: float) -> bool:
        """Ask each live actor among ``cells`` for ``message`` (a barrier); False if one did not answer.

        An actor whose mailbox is idle (nothing queued or in hand, no caller's step) has handled
        everything sent to it: it counts as reached without a message (which would start its thread).
        """
        futures = []
        for cell in cells:
            with cell.lock:
                actor = cell.actor
                if actor is not None:
                    inbox: Any = actor.actor_inbox
                    if inbox.__class__ is ScopeInbox and inbox.idle():
                        continue  # everything sent to it was handled: reached, without waking a thread
                    futures.append(actor.ask(message, block=False))
        answered = True
        for future in futures:
            try:
                # a quiet actor answers within microseconds: give each at least a moment, even at
                # a deadline already passed, so that a check with no time to spare can find it quiet
                future.get(timeout=max(_clock.remaining(deadline), 0.05))
            except pykka.Timeout:
                answered = False
            except pykka.ActorDeadError:
                pass
        return answered


def _refused(ref: ScopeRef, message: str) -> BackpressureError:
    """The error for a refused request (counted when traced)."""
    hooks = _trace.hooks
    if hooks is not None:
        hooks.backpressure(ref)
    return BackpressureError(message)
