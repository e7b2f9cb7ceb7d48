"""The tracing hook slot: how the runtime reports to an observer above it without importing it.

The runtime's layers never import OpenTelemetry, nor the package that talks
to it (``victor_actors.otel``, on top). Instead this module, at the bottom,
declares what the runtime calls (:class:`Hooks`, and the :class:`Carrier` a
request takes with it) and holds one slot, :data:`hooks`, with the active
hooks object or None. ``VictorActorsInstrumentor().instrument()`` fills the
slot; ``uninstrument()`` empties it.

The cost when nothing is instrumented is the point of the design: a call
site reads the slot once per request (``_trace.hooks``, one global read)
and branches on None. The request then carries the answer (``req.trace``
is None), so the actor and the services further along branch on that slot
of the message instead of reading the global again. Nothing is allocated,
no context is captured and no clock is read.

Everything here is typed with ``Any`` where a runtime type would be: this
module is in the lowest layer and imports nothing of the package.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar

__all__ = ["Call", "Carrier", "Hooks", "RunTrace", "hooks", "install"]

T = TypeVar("T")


class Carrier(Protocol):
    """A trace context captured where a request started, carried with it to other threads."""

    def actor(self, work: Callable[[Any], T], cell: Any) -> Callable[[Any], T]:
        """``work(message)`` as run on the scope's actor thread, in a child span of this context.

        ``cell`` is the scope's cell (its state, durability). The span is
        current while ``work`` runs, so whatever ``work`` starts (events,
        tool requests, a restart) is a child of it. An exception from
        ``work`` is recorded on the span and propagates unchanged.
        """
        ...

    def bind(self, fn: Callable[..., T]) -> Callable[..., T]:
        """``fn`` run with this context current, without a span of its own."""
        ...

    def deliver(self, subscribers: tuple[Any, ...], event: Any) -> None:
        """Call ``subscriber.deliver(event)`` for each subscriber, each in a child span of this context."""
        ...

    def tool(self, fn: Callable[[Any], Any], call: Any, is_async: bool) -> Callable[[Any], Any]:
        """A tool executor ``fn(call)`` run in a child span of this context (``async`` stays ``async``)."""
        ...


class Call(Carrier, Protocol):
    """The caller's span of one ``apply``/``aapply``: current on the caller's side until :meth:`end`."""

    def end(self, record: Any, error: BaseException | None) -> None:
        """The call returned ``record`` or raised ``error``; end the span, restore the caller's context.

        Called exactly once, on the thread (or in the task) that started it.
        """
        ...


class RunTrace(Protocol):
    """The span of one run, current in the run's body."""

    def rolled_back(self, report: Any) -> None:
        """The run's writes were rolled back; ``report`` is its ``RollbackReport``."""
        ...

    def end(self, status: str) -> None:
        """The run is over with ``status``; end the span, restore the context (where it was started)."""
        ...


class Hooks(Protocol):
    """What the runtime calls while the slot holds an object (see the module's documentation)."""

    def call(self, name: str, ref: Any, request: Any, cross_scope: bool) -> Call:
        """Start the caller's span of ``request`` (an ``ApplyRequest``) to ``ref``; make it current."""
        ...

    def capture(self) -> Carrier:
        """The current context, to carry to another thread."""
        ...

    def run(self, run: Any) -> RunTrace:
        """Start the span of ``run`` (a ``Run``) and make it current."""
        ...

    def restart(self, cell: Any, reason: str) -> AbstractContextManager[None]:
        """A span around restarting ``cell``'s scope from its last committed state."""
        ...

    def group_commit(self, size: int) -> None:
        """The commit this thread waited for shared its store transaction with ``size`` jobs in all."""
        ...

    def store_transaction(self, size: int) -> None:
        """A store write transaction committed ``size`` jobs (on the thread that led it)."""
        ...

    def backpressure(self, ref: Any) -> None:
        """A request to ``ref`` was refused: its mailbox was full."""
        ...


hooks: Hooks | None = None


def install(new: Hooks | None) -> Hooks | None:
    """Put ``new`` (or None) in the slot; return what was there.

    Requests already under way keep the carrier they took; only requests
    made afterwards see the change.
    """
    global hooks
    old, hooks = hooks, new
    return old
