"""The scope cell: what a scope's actor shares with everyone who reads or sends to it.

A cell outlives its actors: passivation stops the actor and a later request
starts a new one for the same cell, so handles, subscriptions and parent
links, which all hang off the cell, never notice.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

import pykka

from victor_actors import _clock, _trace
from victor_actors._events import Subscription
from victor_actors._model import ScopeRef
from victor_actors._snapshot import ContextSnapshot
from victor_actors._state import ScopeState

__all__ = ["Observer", "ScopeCell", "mailbox_depth"]

# observer(kind, ref, obj) on the thread running the step (the actor's, or a blocking caller's for an
# idle scope, ADR 0032): ("received", ref, message) for every request,
# ("published", ref, event) for every commit. For test recorders; None: off.
Observer = Callable[[str, ScopeRef, Any], None]


class ScopeCell:
    """One scope instance: its last committed state, its live actor, its subscribers.

    ``state`` is the last committed immutable state; only the scope's actor
    (or a cross-scope commit it takes part in) assigns it, and readers take
    it with one attribute read. ``subscribers`` is a tuple replaced, never
    changed in place. ``ancestors`` are the parent's cell, the grandparent's,
    and so on up to global: a snapshot reads them without any lookup.

    ``actor`` is the live actor, or None while the scope is passivated.
    Senders and the passivator take ``lock`` around reading it and putting
    a message in its mailbox, so a message never lands in the mailbox of an
    actor that is being stopped.

    ``evicted`` is set (under ``lock``, with no actor) when the cell leaves
    the registry: the scope's state lives on in the store (or, without one,
    encoded in memory), and whoever still holds this cell must look the
    scope up again (``Kernel.resolve``), which builds a new cell. Nothing
    is ever sent to an evicted cell, so it can never commit again.
    """

    __slots__ = (
        "__weakref__",
        "actor",
        "ancestors",
        "busy",
        "commits",
        "durability",
        "evicted",
        "failed_reason",
        "faults",
        "fresh",
        "handle",
        "last_active",
        "lock",
        "names",
        "observer",
        "owner",
        "restarts",
        "source",
        "state",
        "stopping",
        "subscribers",
    )

    def __init__(
        self, state: ScopeState, ancestors: tuple[ScopeCell, ...] = (), durability: str = "memory"
    ) -> None:
        self.state = state
        self.ancestors = ancestors
        self.subscribers: tuple[Subscription, ...] = ()
        self.faults: list[BaseException | Callable[[], Any]] = []
        # a read-only manager's last snapshot, with the store's newest transaction id when it was read
        self.fresh: tuple[int, ContextSnapshot] | None = None
        self.durability = durability
        self.names = _trace.CLEAR  # how telemetry spells this scope's id (the manager's Names)
        self.restarts = 0
        self.failed_reason: str | None = None  # set when supervision gave up on this scope
        self.owner: Any = None  # the actor's thread, once it runs
        self.observer: Observer | None = None
        self.actor: pykka.ActorRef[Any] | None = None
        self.lock = threading.Lock()
        self.stopping: Any = None  # the stop future of the previous actor, until it has exited
        self.busy = False  # inside a message (a prepared cross-scope part waits in here)
        self.last_active = _clock.monotonic()
        self.commits = 0
        self.handle: Any = None  # the facade's handle on this scope, cached here by the manager
        self.evicted = False
        # where the cell's state came from, until its first actor: "new", "memory" or "store"
        self.source = "new"

    @property
    def ref(self) -> ScopeRef:
        return self.state.ref

    def __repr__(self) -> str:
        return f"<ScopeCell {self.state.ref} v{self.state.version}>"


def mailbox_depth(actor: pykka.ActorRef[Any]) -> int:
    """Requests waiting in a threading actor's mailbox (a queue.Queue)."""
    inbox: queue.Queue[Any] = actor.actor_inbox  # type: ignore[assignment]
    return inbox.qsize()
