"""Supervision: parents restart failed children from their last committed state.

A tree as in Erlang/OTP, with a few strategies and restart limits, nothing
more. The global scope supervises teams (and workflows and conversations
created directly under it), teams supervise their workflows and
conversations, workflows their conversations, and a conversation the
sessions it created.

A *failure* is an unexpected exception inside a scope's actor while it
handles a request (a bug, an injected fault, a ``BaseException`` from user
code), not a rejected batch, which is an ordinary error reply. The request
that hit it gets :class:`ScopeFailedError` at once and applies nothing. Then
the failed scope's supervisor (its parent) applies its strategy:

- ``one_for_one`` (default): restart the failed scope;
- ``one_for_all``: restart every child of the supervisor;
- ``rest_for_one``: restart the failed scope and the children created after it.

Restarting a scope rebuilds its actor's state from its last committed state
(reloaded from LMDB when the manager has a store, else the committed
immutable value, never empty) and restarts its own descendants with it.
Requests queued behind the failing one stay in the mailbox and are handled
after the restart.

Intensity: a supervisor restarts at most ``max_restarts`` times within
``within`` seconds. One more failure escalates: the supervisor itself counts
as failed and its own supervisor applies its strategy to it (restarting it
restarts its whole subtree). Past the root (the global scope's own policy),
the failed scope gives up: it answers every request with
:class:`ScopeFailedError` until ``manager.restart_scope(ref)``.

Every failure, restart, escalation and give-up is a :class:`SupervisionEvent`
for ``manager.subscribe_supervision(callback)``.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import attrs
import pykka

from victor_actors import _clock, _trace
from victor_actors._cell import ScopeCell
from victor_actors._events import Subscription
from victor_actors._kernel import Kernel
from victor_actors._messages import RestartRequest
from victor_actors._model import ScopeRef
from victor_actors._options import STRATEGIES, Strategy, one_of
from victor_actors._state import ScopeState

__all__ = ["Supervision", "SupervisionEvent", "SupervisionPolicy", "Supervisor"]

logger = logging.getLogger("victor_actors")


def _positive(_inst: Any, attr: Any, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{attr.name} must be positive, not {value!r}")


@attrs.frozen(slots=True)
class SupervisionPolicy:
    """How a supervisor treats its children's failures."""

    strategy: Strategy = attrs.field(default="one_for_one", validator=one_of(STRATEGIES))
    max_restarts: int = attrs.field(default=3, validator=_positive)
    within: float = attrs.field(default=5.0, validator=_positive)


@attrs.frozen(slots=True)
class SupervisionEvent:
    """``kind`` is ``"failed"``, ``"restarted"``, ``"escalated"`` or ``"gave_up"``."""

    kind: str
    ref: ScopeRef
    supervisor: ScopeRef | None
    reason: str
    timestamp: float


class Supervisor:
    """The supervision decisions for one manager (thread-safe; called from actor threads).

    ``children(ref)`` lists a scope's children in creation order (``None``:
    the root's only child, global); ``restart(ref)`` asks a scope to restart
    (a message to its actor); ``give_up(ref, reason)`` marks it failed;
    ``publish(event)`` hands an event to subscribers.
    """

    def __init__(
        self,
        children: Callable[[ScopeRef | None], list[ScopeRef]],
        parent: Callable[[ScopeRef], ScopeRef | None],
        restart: Callable[[ScopeRef, str], None],
        give_up: Callable[[ScopeRef, str], None],
        publish: Callable[[SupervisionEvent], None],
        default: SupervisionPolicy | None = None,
    ) -> None:
        self._children = children
        self._parent = parent
        self._restart = restart
        self._give_up = give_up
        self._publish = publish
        self.default = default or SupervisionPolicy()
        self.policies: dict[ScopeRef | None, SupervisionPolicy] = {}
        self._history: dict[ScopeRef | None, deque[float]] = {}
        self._lock = threading.Lock()
        self.failures = 0
        self.restarts = 0
        self.escalations = 0

    def policy(self, supervisor: ScopeRef | None) -> SupervisionPolicy:
        return self.policies.get(supervisor, self.default)

    def _event(self, kind: str, ref: ScopeRef, supervisor: ScopeRef | None, reason: str) -> None:
        self._publish(SupervisionEvent(kind, ref, supervisor, reason, _clock.time()))

    def failed(self, ref: ScopeRef, exc: BaseException) -> None:
        """``ref``'s actor failed; decide and start the restarts (called on its thread)."""
        reason = f"{type(exc).__name__}: {exc}"
        with self._lock:
            self.failures += 1
        self._event("failed", ref, self._parent(ref), reason)
        self._handle(ref, reason)

    def _handle(self, ref: ScopeRef, reason: str) -> None:
        supervisor = self._parent(ref)
        policy = self.policy(supervisor)
        now = _clock.monotonic()
        with self._lock:
            history = self._history.setdefault(supervisor, deque())
            while history and now - history[0] > policy.within:
                history.popleft()
            exceeded = len(history) >= policy.max_restarts
            if not exceeded:
                history.append(now)
        if exceeded:
            with self._lock:
                self.escalations += 1
            why = f"{supervisor or 'the root'} exceeded {policy.max_restarts} restarts in {policy.within} s"
            self._event("escalated", ref, supervisor, why)
            if supervisor is None:
                logger.error("%s gave up: %s (%s)", ref, why, reason)
                self._give_up(ref, f"{why}; last failure: {reason}")
                self._event("gave_up", ref, None, reason)
                return
            self._handle(supervisor, f"escalated from {ref}: {reason}")
            return
        siblings = self._children(supervisor)
        if policy.strategy == "one_for_all":
            targets = siblings
        elif policy.strategy == "rest_for_one" and ref in siblings:
            targets = siblings[siblings.index(ref) :]
        else:
            targets = [ref]
        for target in targets:
            self._restart_tree(target, reason, supervisor)

    def _restart_tree(self, ref: ScopeRef, reason: str, supervisor: ScopeRef | None) -> None:
        self._restart(ref, reason)
        with self._lock:
            self.restarts += 1
            self._history.pop(ref, None)  # a restarted supervisor starts with a fresh restart count
        self._event("restarted", ref, supervisor, reason)
        for child in self._children(ref):
            self._restart_tree(child, f"its supervisor {ref} restarted", ref)


class Supervision:
    """Supervision for one kernel: the decisions (:class:`Supervisor`), restarts, give-ups, events.

    A restart rebuilds a cell's state from ``load_committed(cell)`` (the
    store's copy when there is one) on the cell's own actor thread, before
    its next queued request: from a message when another thread asks, in
    place when the failing actor itself does, and directly when the scope
    is passivated (no thread to race with).
    """

    def __init__(
        self,
        kernel: Kernel,
        *,
        children: Callable[[ScopeRef | None], list[ScopeRef]],
        parent: Callable[[ScopeRef], ScopeRef | None],
        load_committed: Callable[[ScopeCell], ScopeState],
        default: SupervisionPolicy | None = None,
    ) -> None:
        self.kernel = kernel
        self._load_committed = load_committed
        self._subs: tuple[Subscription, ...] = ()
        self.supervisor = Supervisor(
            children=children,
            parent=parent,
            restart=self._restart_request,
            give_up=self._give_up,
            publish=self._publish,
            default=default,
        )

    def set_policy(self, supervisor: ScopeRef | None, policy: SupervisionPolicy) -> None:
        self.supervisor.policies[supervisor] = policy

    def failed(self, ref: ScopeRef, exc: BaseException) -> None:
        """A scope's actor failed (called on its thread)."""
        self.supervisor.failed(ref, exc)

    def subscribe(self, callback: Callable[[SupervisionEvent], object]) -> Subscription:
        """Call ``callback`` with every failure, restart, escalation and give-up, in order."""

        def remove(sub: Subscription) -> None:
            with self.kernel.lock:
                self._subs = tuple(s for s in self._subs if s is not sub)

        sub = Subscription(None, callback, remove)
        with self.kernel.lock:
            self._subs = (*self._subs, sub)
        return sub

    def _publish(self, event: SupervisionEvent) -> None:
        subs = self._subs
        if subs:
            self.kernel.bus.publish(subs, event)

    def reload(self, cell: ScopeCell, reason: str) -> None:
        """Rebuild ``cell``'s state from its last committed state (on its actor's thread)."""
        hooks = _trace.hooks
        if hooks is None:
            self._reload(cell, reason)
            return
        with hooks.restart(cell, reason):  # traced: the restart's span
            self._reload(cell, reason)

    def _reload(self, cell: ScopeCell, reason: str) -> None:
        state = cell.state
        try:
            loaded = self._load_committed(cell)
        except Exception:
            logger.exception(
                "restarting %s from the store failed; using its committed state in memory", state.ref
            )
            loaded = state
        if loaded.version != state.version:
            logger.warning(
                "%s: the store holds version %d, memory %d; restarting from memory",
                state.ref,
                loaded.version,
                state.version,
            )
            loaded = state
        cell.state = loaded
        cell.restarts += 1
        cell.failed_reason = None
        logger.info("restarted %s at version %d (%s)", state.ref, loaded.version, reason)

    def _restart_request(self, ref: ScopeRef, reason: str) -> None:
        cell = self.kernel.cells.get(ref)
        if cell is None:
            return
        if threading.current_thread() is cell.owner:
            self.reload(cell, reason)  # the failed scope itself: before its queued requests
            return
        with cell.lock:
            actor = cell.actor
            if actor is None:  # passivated: no thread to race with, restart it here
                self.reload(cell, reason)
                return
            try:
                actor.tell(RestartRequest(reason))
            except pykka.ActorDeadError:
                pass

    def _give_up(self, ref: ScopeRef, reason: str) -> None:
        cell = self.kernel.cells.get(ref)
        if cell is not None:
            cell.failed_reason = reason
