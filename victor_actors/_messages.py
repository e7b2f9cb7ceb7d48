"""The requests a scope actor takes, and nothing else.

- :class:`ApplyRequest`: apply transitions all or nothing (or reset the
  scope to a state, for restores and run rollbacks);
- :class:`PrepareRequest`: vote on this scope's part of a cross-scope batch
  and hold until the transaction is decided;
- :class:`RestartRequest`: rebuild the scope from its last committed state
  (sent by its supervisor);
- :class:`CheckpointRequest`: write a checkpoint of the scope's committed
  state (or compact the scope to it), in order with its commits;
- :class:`Barrier`: answered as soon as it is reached (``quiesce``).

:class:`AsyncReply` is how an ``a``-prefixed call gets its answer: the actor
settles an asyncio future through ``loop.call_soon_threadsafe``, never by
blocking the loop.
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import Callable
from typing import Any

import attrs

from victor_actors._crosstxn import CrossTxn
from victor_actors._model import StateTransition
from victor_actors._state import ScopeState
from victor_actors._trace import Call, Carrier

__all__ = [
    "ApplyRequest",
    "AsyncReply",
    "Barrier",
    "CheckpointRequest",
    "PrepareRequest",
    "ResetTo",
    "RestartRequest",
    "SuperviseRequest",
    "answer_all",
]

# Set the scope to this state as one commit (restore), or to what this function computes from
# the current state on the actor's thread (run rollback; None: nothing to reset).
ResetTo = ScopeState | Callable[[ScopeState], ScopeState | None]


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


def answer_all(answers: list[tuple[Any, Any]]) -> None:
    """Answer many replies at once: one wake-up per event loop, not one per request."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any]]] = {}
    for reply, value in answers:
        if reply.__class__ is AsyncReply:
            by_loop.setdefault(reply.loop, []).append((reply.future, value))
        else:
            reply.ok(value)
    for loop, pairs in by_loop.items():
        try:
            loop.call_soon_threadsafe(_set_results, pairs)
        except RuntimeError:  # the loop was closed; nobody is waiting any more
            pass


def _set_results(pairs: list[tuple[asyncio.Future[Any], Any]]) -> None:
    for future, value in pairs:
        if not future.done():
            future.set_result(value)


def _set_result(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _set_exception(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


class ApplyRequest:
    """Apply these transitions to the scope, all or nothing."""

    __slots__ = ("deadline", "expected_version", "reply", "reset_to", "run_id", "trace", "transitions")

    def __init__(
        self,
        transitions: tuple[StateTransition, ...],
        expected_version: int | None,
        deadline: float | None,
        run_id: str | None = None,
        reply: AsyncReply | None = None,
        reset_to: ResetTo | None = None,
    ) -> None:
        self.transitions = transitions
        self.expected_version = expected_version
        self.deadline = deadline
        self.run_id = run_id
        self.reply = reply
        self.reset_to = reset_to
        self.trace: Call | None = None  # the caller's span, when traced (set by the handle)


@attrs.frozen(slots=True)
class PrepareRequest:
    """Check this scope's part of a cross-scope batch, vote, and hold until decided."""

    txn: CrossTxn
    transitions: tuple[StateTransition, ...] | None  # None: lock first, the part comes on ``work``
    indices: tuple[int, ...]
    expected_version: int | None
    commit_id: str
    timestamp: float
    run_id: str | None = None
    work: queue.SimpleQueue[tuple[tuple[StateTransition, ...], tuple[int, ...]] | None] | None = None
    trace: Carrier | None = None  # the coordinator's trace context, when traced


class RestartRequest:
    """Rebuild this scope's state from its last committed state (sent by its supervisor)."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


class SuperviseRequest:
    """Supervise this failure of a step that ran on a caller's thread (on the actor's thread)."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class CheckpointRequest:
    """Write a checkpoint of the scope's committed state, on its actor, between two of its commits.

    Every checkpoint that is not part of a commit comes here (``save_checkpoint``,
    ``compact``, leaving ``manual`` durability), so it reads exactly the state
    the actor last committed and the incremental-checkpoint tracker's base,
    and no commit of the scope can interleave with it. ``compact``: the
    checkpoint becomes the scope's only stored base (older checkpoints and
    the log up to it are dropped). ``durability``: the scope's mode to set
    once the checkpoint is durable (None: unchanged).
    """

    __slots__ = ("compact", "durability", "label")

    def __init__(self, label: str | None, *, compact: bool = False, durability: str | None = None) -> None:
        self.label = label
        self.compact = compact
        self.durability = durability


class Barrier:
    """Answered as soon as the actor reaches it: everything sent before it was handled."""

    __slots__ = ()
