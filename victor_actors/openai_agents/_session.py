"""``VictorActorsSession``: the OpenAI Agents SDK's ``Session`` protocol over a conversation scope."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar, cast

try:
    from agents.items import TResponseInputItem
    from agents.memory.session_settings import SessionSettings, resolve_session_limit
except ImportError as exc:  # pragma: no cover - the extra is installed wherever this module is used
    raise ImportError(
        "victor_actors.openai_agents needs the openai-agents package: "
        "pip install 'victor-actors[openai-agents]'"
    ) from exc

from victor_actors._agentsdk import Handle, Manager, check_manager, name, open_conversation
from victor_actors._model import TransitionBatch
from victor_actors._values import thaw

__all__ = ["VictorActorsSession"]

T = TypeVar("T")


async def _outcome(write: Awaitable[T]) -> T:
    """Await ``write`` to its end even if the caller is cancelled meanwhile, then honour the cancel.

    A write handed to a scope's actor commits or fails whatever its caller does; a caller that
    heard CancelledError at once could not tell which, and might write again. Here it hears it
    only once the write's outcome is settled (and the store holds it, if it committed).
    """
    task = asyncio.ensure_future(write)
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.wait((task,))
        except asyncio.CancelledError as exc:
            cancelled = cancelled or exc
    if cancelled is not None:
        if not task.cancelled():
            task.exception()  # seen: the caller asked to stop, so the cancel is what it gets
        raise cancelled
    return task.result()


class VictorActorsSession:
    """A ``Session`` (``agents.memory.Session``) whose items are one conversation scope's messages.

    ``session_id`` names the conversation scope (``manager.get_conversation_state(session_id)``
    reads the same items), created on the first write under ``workflow_id`` / ``team_id``
    if given. ``manager`` is a :class:`~victor_actors.GlobalStateManager` or a
    :class:`~victor_actors.RemoteStateManager`; many sessions, in many processes, may share it.

    What the SDK's contract asks and how it holds here:

    - ``add_items(items)`` appends the items as one batch: all of them or none, next to each
      other, whatever other writers do at the same time, and the first write of a new session
      loses nothing to a concurrent one (the scope's actor orders them).
    - ``pop_item()`` removes the last item and returns it (None on an empty session); two
      concurrent calls never return the same item.
    - ``clear_session()`` removes every item at once. The scope stays (with any state other code
      keeps in it); its next items start a new history.
    - ``get_items(limit)`` returns the newest ``limit`` items in order (all with None, or
      ``session_settings.limit``), read from one committed version: never half of a batch.

    A write whose caller is cancelled is awaited to its end before the cancel propagates, so
    the caller never has to guess whether it landed (and never writes it twice).

    Items are stored as victor_actors values (JSON-like dicts and lists come back as plain
    dicts and lists). An item that cannot be stored (an arbitrary object) raises
    :class:`~victor_actors.TransitionValidationError` and nothing of its batch is added.
    Inside ``manager.run(...)`` the session's writes belong to the run and are undone with
    it, pops included (the popped item is put back).
    """

    session_settings: SessionSettings | None

    def __init__(
        self,
        session_id: str,
        manager: Manager,
        *,
        workflow_id: str | None = None,
        team_id: str | None = None,
        session_settings: SessionSettings | None = None,
    ) -> None:
        self.session_id = name(session_id, "a session id")
        self._manager = check_manager(manager, "VictorActorsSession")
        self._parents = (workflow_id, team_id)
        self.session_settings = session_settings if session_settings is not None else SessionSettings()
        self._handle: Handle | None = None

    def __repr__(self) -> str:
        return f"<VictorActorsSession {self.session_id!r} on {self._manager!r}>"

    async def _scope(self, create: bool) -> Handle | None:
        handle = self._handle
        if handle is None:
            workflow_id, team_id = self._parents
            handle = await open_conversation(
                self._manager, self.session_id, workflow_id=workflow_id, team_id=team_id, create=create
            )
            self._handle = handle
        return handle

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The newest ``limit`` items, oldest first (all of them with None and no settings limit)."""
        wanted = resolve_session_limit(limit, self.session_settings)
        handle = await self._scope(create=False)
        if handle is None:
            return []
        messages = (await handle.asnapshot()).messages
        if wanted is None or wanted < 0:  # a negative limit reads everything, as SQLite's LIMIT does
            chosen: Any = messages
        elif wanted == 0:
            return []
        else:
            chosen = messages[-wanted:]
        return [cast("TResponseInputItem", thaw(item)) for item in chosen]

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append ``items`` as one atomic batch (nothing for an empty list).

        Raises:
            TransitionValidationError: an item cannot be stored; none of them was added.
        """
        if not items:
            return
        batch = TransitionBatch().add_messages(list(items))  # validated and frozen here, on the caller
        handle = await self._scope(create=True)
        assert handle is not None
        await _outcome(handle.aapply(batch))

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove the newest item and return it; None when the session holds none."""
        handle = await self._scope(create=False)
        if handle is None:
            return None
        record = await _outcome(handle.aapply(TransitionBatch().pop_message()))
        if not record.removed_messages:
            return None
        return cast("TResponseInputItem", thaw(record.removed_messages[-1]))

    async def clear_session(self) -> None:
        """Remove every item of this session."""
        handle = await self._scope(create=False)
        if handle is not None:
            await _outcome(handle.aapply(TransitionBatch().clear_messages()))

    def close(self) -> None:
        """Nothing to release: the manager is the caller's, and stays open."""
