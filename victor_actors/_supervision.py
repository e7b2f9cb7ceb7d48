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
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import attrs

from victor_actors._model import ScopeRef

__all__ = ["STRATEGIES", "SupervisionEvent", "SupervisionPolicy", "Supervisor"]

logger = logging.getLogger("victor_actors")

STRATEGIES = ("one_for_one", "one_for_all", "rest_for_one")


def _check_strategy(_inst: Any, _attr: Any, value: str) -> None:
    if value not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, not {value!r}")


def _positive(_inst: Any, attr: Any, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{attr.name} must be positive, not {value!r}")


@attrs.frozen(slots=True)
class SupervisionPolicy:
    """How a supervisor treats its children's failures."""

    strategy: str = attrs.field(default="one_for_one", validator=_check_strategy)
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
        self._publish(SupervisionEvent(kind, ref, supervisor, reason, time.time()))

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
        now = time.monotonic()
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
