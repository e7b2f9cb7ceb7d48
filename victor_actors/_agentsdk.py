"""What the agent-SDK session stores share: finding their scopes on a local or a remote manager.

``victor_actors.adk``, ``victor_actors.openai_agents`` and ``victor_actors.claude_agent``
store an SDK's sessions in scopes (docs/adr/0028). Each takes a manager, local
(:class:`GlobalStateManager`) or a client of an owner in another process
(:class:`RemoteStateManager`, from ``victor_actors.connect``); the two have the same
handle API (``aapply``, ``asnapshot``, ``atransact``), but only the client can open a
scope without blocking its event loop. This module hides that difference and the
escaping of SDK names into scope ids; nothing here knows an SDK.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeAlias
from urllib.parse import quote

from victor_actors._errors import ScopeAccessError, TransitionValidationError, VersionConflictError
from victor_actors._handle import ScopeHandle
from victor_actors._manager import GlobalStateManager
from victor_actors._model import MAX_ID_BYTES, ScopeRef, TransitionBatch
from victor_actors._snapshot import ContextSnapshot
from victor_actors._state import StateChanged
from victor_actors.remote import RemoteStateManager
from victor_actors.remote._handle import RemoteScopeHandle

__all__ = [
    "Handle",
    "Manager",
    "check_manager",
    "escape",
    "name",
    "open_conversation",
    "open_team",
    "open_workflow",
    "scope_id",
    "write_if_unmoved",
]

# Optimistic tries before a contended read-modify-write takes the scope's lock instead.
TRIES = 2

Manager: TypeAlias = GlobalStateManager | RemoteStateManager
Handle: TypeAlias = ScopeHandle | RemoteScopeHandle


def check_manager(manager: Any, owner: str) -> Manager:
    """``manager`` if it is one the stores work on.

    Raises:
        TypeError: anything else (say what ``owner`` takes).
    """
    if not isinstance(manager, (GlobalStateManager, RemoteStateManager)):
        raise TypeError(
            f"{owner} takes a GlobalStateManager or a RemoteStateManager (victor_actors.connect), "
            f"not {type(manager).__name__}"
        )
    return manager


def name(value: Any, what: str) -> str:
    """``value`` if it is a non-empty ``str``, else a typed error naming ``what``.

    Raises:
        TransitionValidationError: ``value`` is not a non-empty str; nothing was done.
    """
    if not isinstance(value, str) or not value:
        raise TransitionValidationError(
            f"{what} must be a non-empty str, not {value!r:.80}; nothing was done"
        )
    return value


def escape(value: str) -> str:
    """One SDK name as one component of a scope id: ``/`` and ``%`` can never come out of it."""
    return quote(value, safe="")


def scope_id(prefix: str, *parts: str) -> str:
    """``prefix/part/part...``, each part escaped: distinct names never share an id.

    Raises:
        TransitionValidationError: the id would pass the store's key limit; nothing was done.
    """
    text = "/".join((prefix, *(escape(p) for p in parts)))
    if len(text.encode("utf-8")) > MAX_ID_BYTES:
        raise TransitionValidationError(
            f"{'/'.join(parts)!r:.80} is too long for a scope id once escaped ({len(text.encode())} bytes, "
            f"at most {MAX_ID_BYTES}); nothing was done"
        )
    return text


async def open_conversation(
    manager: Manager,
    conversation: str,
    *,
    workflow_id: str | None = None,
    team_id: str | None = None,
    create: bool,
) -> Handle | None:
    """The conversation scope's handle (its parents made on the way when ``create``), or None.

    None when ``create`` is False and the scope (or a parent named) does not
    exist yet: a read of a session nobody wrote creates nothing.

    Raises:
        ScopeAccessError: the conversation exists under other parents (and ``create``).
    """
    try:
        if isinstance(manager, RemoteStateManager):
            return await manager.aget_conversation_state(conversation, workflow_id, team_id, create=create)
        # a local open is a memory lookup, or a load from the store on first use (the same
        # load a handle's aapply does for an evicted scope)
        return manager.get_conversation_state(conversation, workflow_id, team_id, create=create)
    except ScopeAccessError:
        if create:
            raise
        return None


async def open_team(manager: Manager, team_id: str) -> Handle | None:
    """The team scope's handle, or None if it does not exist (nothing is created)."""
    try:
        if isinstance(manager, RemoteStateManager):
            return await manager.aget_team_state(team_id, create=False)
        return manager.get_team_state(team_id, create=False)
    except ScopeAccessError:
        return None


async def open_workflow(manager: Manager, workflow_id: str, team_id: str) -> Handle | None:
    """The workflow scope's handle (under ``team_id``), or None if it does not exist (nothing is created)."""
    try:
        if isinstance(manager, RemoteStateManager):
            return await manager.aget_workflow_state(workflow_id, team_id, create=False)
        return manager.get_workflow_state(workflow_id, team_id, create=False)
    except ScopeAccessError:
        return None


Build = Callable[[ContextSnapshot], TransitionBatch | None]


async def write_if_unmoved(
    handle: Handle, build: Build, lock: Callable[[ContextSnapshot], Iterable[ScopeRef]]
) -> StateChanged | None:
    """Read the scope, ``build(snapshot)`` a batch from what it holds, apply it only if the scope has
    not moved since; None when ``build`` returns None (nothing to write).

    The check is on this scope alone: the batch may also write its ancestors (an index, the
    user's or the app's state) without waiting for their other writers. A scope busy with
    other writers is retried a few times, then locked (``atransact`` over ``lock(snapshot)``,
    the scopes the batch writes) so the write always makes progress. ``build`` may run
    several times: keep it free of side effects; an error it raises propagates and nothing
    is written.
    """
    for _ in range(TRIES):
        snapshot = await handle.asnapshot()
        batch = build(snapshot)
        if batch is None:
            return None
        try:
            return await handle.aapply(batch, expected_version=snapshot.version)
        except VersionConflictError:
            # the winner may be staged but not yet published (group commit): an empty request is
            # answered once it is, so the next snapshot shows it
            await handle.aapply(TransitionBatch())
    snapshot = await handle.asnapshot()
    built: list[bool] = []

    def locked(current: ContextSnapshot) -> TransitionBatch:
        batch = build(current)
        built.append(batch is not None)
        return TransitionBatch() if batch is None else batch

    record = await handle.atransact(locked, lock=tuple(lock(snapshot)))
    return record if built and built[-1] else None
