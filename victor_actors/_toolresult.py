"""Waiting for one tool request's result: ``handle.wait_tool_result(request_id)`` and its twin.

A tool result is a TOOL_RESULT message in the requesting scope. Waiting for
one is a subscription to the scope, a first look at its snapshot (the result
may already be there), and then the commit events: the one that adds the
message ends the wait. A commit that sets the scope as a whole (a run's
rollback, a restore) may release the request without a result, so after one
the snapshot is looked at again.

The subscription is taken before the first look, so a result committed in
between is seen by one or the other. Outcomes:

- the TOOL_RESULT message (a frozen mapping: ``role``, ``tool_name``,
  ``content``, ``request_id``, ``error``): an executor that failed or timed
  out is a result too, with ``error`` set;
- :class:`ToolRequestNotFoundError` when the request is neither pending nor
  answered in the scope (never made there, or released by a rollback);
- :class:`DeadlineExceededError` when ``timeout`` passes first; the request
  is left pending.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from victor_actors import _clock
from victor_actors._errors import DeadlineExceededError, ToolRequestNotFoundError
from victor_actors._model import ScopeRef
from victor_actors._snapshot import ContextSnapshot
from victor_actors._state import StateChanged

__all__ = ["await_tool_result", "request_id_of", "wait_tool_result"]


class _Closable(Protocol):
    def close(self) -> None: ...


Subscribe = Callable[[Callable[[StateChanged], object]], _Closable]


def request_id_of(request: str | Mapping[str, Any]) -> str:
    """A request id from the id itself or from a request (``commit.tool_requests[i]``)."""
    rid = request.get("request_id") if isinstance(request, Mapping) else request
    if not isinstance(rid, str) or not rid:
        raise TypeError(
            "wait for a tool result by its request id (a non-empty str) or by the request itself "
            f"(an item of commit.tool_requests), not {request!r}"
        )
    return rid


def _is_result(message: Any, request_id: str) -> bool:
    return (
        isinstance(message, Mapping)
        and message.get("role") == "tool"
        and message.get("request_id") == request_id
    )


def _in_event(event: StateChanged, request_id: str) -> Any | None:
    for message in event.added_messages:
        if _is_result(message, request_id):
            return message
    return None


def _look(snapshot: ContextSnapshot, request_id: str) -> tuple[bool, Any | None]:
    """(still pending, the result message if the scope holds one)."""
    if request_id in snapshot.pending_tool_requests:
        return True, None
    messages = snapshot.messages
    for i in range(len(messages) - 1, -1, -1):  # results are recent: look from the end
        if _is_result(messages[i], request_id):
            return False, messages[i]
    return False, None


def _not_found(ref: ScopeRef, request_id: str) -> ToolRequestNotFoundError:
    return ToolRequestNotFoundError(
        f"{ref} has no pending tool request {request_id!r} and no result for it (never requested in "
        "this scope, or released by a run's rollback); nothing was changed"
    )


def _timed_out(ref: ScopeRef, request_id: str, timeout: float) -> DeadlineExceededError:
    return DeadlineExceededError(
        f"{ref}: no result for tool request {request_id!r} within {timeout} s; it is still pending "
        "(manager.tools.unhandled lists it if its tool has no executor)"
    )


def wait_tool_result(
    ref: ScopeRef,
    subscribe: Subscribe,
    snapshot: Callable[[], ContextSnapshot],
    request: str | Mapping[str, Any],
    timeout: float,
) -> Any:
    """Block until the result of ``request`` is in the scope; return its TOOL_RESULT message."""
    request_id = request_id_of(request)
    found: list[Any] = []
    woken = threading.Event()

    def on_commit(event: StateChanged) -> None:
        message = _in_event(event, request_id)
        if message is not None:
            found.append(message)
            woken.set()
        elif event.reset or event.closed:
            woken.set()  # look again: the request may have been released

    left_of = _clock.timer(_clock.monotonic() + timeout)
    sub = subscribe(on_commit)
    try:
        while True:
            woken.clear()
            if found:
                return found[0]
            pending, message = _look(snapshot(), request_id)
            if message is not None:
                return message
            if not pending:
                raise _not_found(ref, request_id)
            left = left_of()
            if left <= 0 or not woken.wait(left):
                if found:
                    return found[0]
                raise _timed_out(ref, request_id, timeout)
    finally:
        sub.close()


async def await_tool_result(
    ref: ScopeRef,
    subscribe: Subscribe,
    snapshot: Callable[[], Awaitable[ContextSnapshot]],
    request: str | Mapping[str, Any],
    timeout: float,
) -> Any:
    """The asyncio twin of :func:`wait_tool_result`: the event loop stays free while it waits."""
    request_id = request_id_of(request)
    loop = asyncio.get_running_loop()
    found: list[Any] = []
    woken = asyncio.Event()

    def on_commit(event: StateChanged) -> None:  # on the manager's event thread
        message = _in_event(event, request_id)
        if message is not None or event.reset or event.closed:
            loop.call_soon_threadsafe(_wake, found, woken, message)

    left_of = _clock.timer(_clock.monotonic() + timeout)
    sub = subscribe(on_commit)
    try:
        while True:
            woken.clear()
            if found:
                return found[0]
            pending, message = _look(await snapshot(), request_id)
            if message is not None:
                return message
            if not pending:
                raise _not_found(ref, request_id)
            left = left_of()
            try:
                if left <= 0:
                    raise TimeoutError
                await asyncio.wait_for(woken.wait(), left)
            except TimeoutError:
                if found:
                    return found[0]
                raise _timed_out(ref, request_id, timeout) from None
    finally:
        sub.close()


def _wake(found: list[Any], woken: asyncio.Event, message: Any | None) -> None:
    if message is not None:
        found.append(message)
    woken.set()
