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

:class:`Names` is how one manager's scope ids reach the hooks: in the clear,
or, for a manager on an encrypted store, as keyed hashes (see the class).
The runtime hands the hooks the manager's names with each call that starts a
trace (``call``, ``capture``, ``run``) and on each cell (``cell.names``).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar

__all__ = ["CLEAR", "Call", "Carrier", "Hooks", "Names", "RunTrace", "hooks", "install"]

T = TypeVar("T")


class Names:
    """How one manager's scope ids, and the ids and messages made from them, appear in telemetry.

    In the clear (:data:`CLEAR`) for a manager in memory or on a plain store.
    For an encrypted store, whose keys hold no scope id, telemetry must not
    hold one either: a scope is named ``level:~<hash>``, the hash an
    HMAC-SHA-256 of its id under a key derived from the store's id key, so
    one scope has one name in every span and across restarts, but the name
    says nothing without the key. Ids that contain a scope id (run ids, tool
    request ids, session ids) are hashed the same way, and error texts,
    which quote ids, are reduced to the error's type.
    """

    __slots__ = ("_key",)

    def __init__(self, id_key: bytes | None = None) -> None:
        self._key = (
            None if id_key is None else hmac.new(id_key, b"victor-actors telemetry v1", "sha256").digest()
        )

    @property
    def hidden(self) -> bool:
        """Whether ids are hashed (the manager's store is encrypted)."""
        return self._key is not None

    def text(self, value: str) -> str:
        """An id (a run id, a request id, a session id): itself, or ``~`` and its keyed hash."""
        if self._key is None:
            return value
        return (
            "~" + hmac.new(self._key, value.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()[:32]
        )

    def scope(self, ref: Any) -> str:
        """A scope (a ``ScopeRef``): ``conversation:alice``, or ``conversation:~<hash>``."""
        if self._key is None:
            return str(ref)
        return f"{ref.scope.value}:{self.text(ref.id)}"

    def error(self, text: str) -> str:
        """An error's or a reason's text (``"ExcType: message"``): as it is, or, hidden, the type alone.

        A text that does not start with an error type's name (a restart escalated from another
        scope, say) is replaced by ``"(hidden)"``: free text may quote any id.
        """
        if self._key is None or text in _SAFE_TEXTS:
            return text
        head = text.split(":", 1)[0]
        return head if head.replace(".", "_").isidentifier() else "(hidden)"


CLEAR = Names()
_SAFE_TEXTS = frozenset({"timed out"})  # the runtime's own reasons that never hold an id


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

    def call(self, name: str, ref: Any, request: Any, cross_scope: bool, names: Names) -> Call:
        """Start the caller's span of ``request`` (an ``ApplyRequest``) to ``ref``; make it current."""
        ...

    def capture(self, names: Names) -> Carrier:
        """The current context, to carry to another thread (with the names of the manager it is for)."""
        ...

    def run(self, run: Any, names: Names) -> RunTrace:
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
