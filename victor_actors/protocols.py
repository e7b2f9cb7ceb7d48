"""Protocols for typing orchestrator code against scopes, whoever serves them.

ADR-002 promises "type-safe state access through protocols". These are
them: what code may call on a scope to read it and to write it, for each
level (global, team, workflow, conversation), and what a manager and a
host of coordinators offer. They are :class:`typing.Protocol` classes, so
nothing has to inherit from them: a local :class:`~victor_actors.ScopeHandle`,
a :class:`~victor_actors.remote.RemoteScopeHandle` from another process, and
a test double each conform by having the methods (``tests/typing_protocols.py``
checks ours under mypy in CI).

Levels: every scope can hold key-value state and messages, so the levels'
protocols have the same members except that only a conversation's writer
promises ``add_message``. They name intent in signatures
(``def plan(team: TeamState) -> None``); the type checker cannot tell a
team's handle from a workflow's, since both are handles.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Protocol

from victor_actors._handle import BatchLike
from victor_actors._model import ScopeRef, StateScope
from victor_actors._snapshot import ContextSnapshot
from victor_actors._state import StateChanged

__all__ = [
    "ConversationReader",
    "ConversationState",
    "GlobalReader",
    "GlobalState",
    "ScopeReader",
    "ScopeWriter",
    "StateHost",
    "StateManager",
    "Subscribed",
    "TeamReader",
    "TeamState",
    "WorkflowReader",
    "WorkflowState",
]

Expected = int | Mapping[Any, int] | None


class Subscribed(Protocol):
    """What ``subscribe`` returns: ``close()`` ends the subscription."""

    @property
    def closed(self) -> bool: ...

    def close(self) -> None: ...


class ScopeReader(Protocol):
    """What code that only reads one scope may call."""

    @property
    def ref(self) -> ScopeRef: ...

    @property
    def parent(self) -> ScopeRef | None: ...

    @property
    def version(self) -> int: ...

    def snapshot(self) -> ContextSnapshot: ...

    async def asnapshot(self) -> ContextSnapshot: ...

    def get(self, key: str, default: Any = None) -> Any: ...

    def to_dict(self) -> dict[str, Any]: ...


class ScopeWriter(ScopeReader, Protocol):
    """What code that writes one scope may call: batches, key-value shortcuts, read-modify-write, events.

    Every write is all or nothing and returns the commit record; each
    blocking call has its ``a``-prefixed asyncio twin.
    """

    def apply(
        self, batch: BatchLike, *, expected_version: Expected = None, timeout: float | None = None
    ) -> StateChanged: ...

    async def aapply(
        self, batch: BatchLike, *, expected_version: Expected = None, timeout: float | None = None
    ) -> StateChanged: ...

    def update(
        self, values: Mapping[str, Any], *, expected_version: Expected = None, timeout: float | None = None
    ) -> StateChanged: ...

    async def aupdate(
        self, values: Mapping[str, Any], *, expected_version: Expected = None, timeout: float | None = None
    ) -> StateChanged: ...

    def set(self, key: str, value: Any, *, timeout: float | None = None) -> StateChanged: ...

    async def aset(self, key: str, value: Any, *, timeout: float | None = None) -> StateChanged: ...

    def delete(self, key: str, *, timeout: float | None = None) -> StateChanged: ...

    async def adelete(self, key: str, *, timeout: float | None = None) -> StateChanged: ...

    def modify(
        self, fn: Callable[[ContextSnapshot], BatchLike], *, retries: int = 5, timeout: float | None = None
    ) -> StateChanged: ...

    async def amodify(
        self,
        fn: Callable[[ContextSnapshot], BatchLike | Awaitable[BatchLike]],
        *,
        retries: int = 5,
        timeout: float | None = None,
    ) -> StateChanged: ...

    def transact(
        self,
        fn: Callable[[ContextSnapshot], BatchLike],
        *,
        lock: Iterable[ScopeRef | StateScope | str] | None = None,
        timeout: float | None = None,
    ) -> StateChanged: ...

    async def atransact(
        self,
        fn: Callable[[ContextSnapshot], BatchLike],
        *,
        lock: Iterable[ScopeRef | StateScope | str] | None = None,
        timeout: float | None = None,
    ) -> StateChanged: ...

    def subscribe(self, callback: Callable[[StateChanged], object]) -> Subscribed: ...


class GlobalReader(ScopeReader, Protocol):
    """Reads the application-wide scope (settings, shared resources, caches)."""


class TeamReader(ScopeReader, Protocol):
    """Reads a team's scope (state shared between its agents)."""


class WorkflowReader(ScopeReader, Protocol):
    """Reads a workflow's scope (state shared across its nodes)."""


class ConversationReader(ScopeReader, Protocol):
    """Reads one agent's conversation: its messages and state through ``snapshot()``."""


class GlobalState(GlobalReader, ScopeWriter, Protocol):
    """Reads and writes the application-wide scope."""


class TeamState(TeamReader, ScopeWriter, Protocol):
    """Reads and writes a team's scope."""


class WorkflowState(WorkflowReader, ScopeWriter, Protocol):
    """Reads and writes a workflow's scope."""


class ConversationState(ConversationReader, ScopeWriter, Protocol):
    """Reads and writes one agent's conversation, messages included."""

    def add_message(self, message: Any, *, timeout: float | None = None) -> StateChanged: ...

    async def aadd_message(self, message: Any, *, timeout: float | None = None) -> StateChanged: ...


class StateManager(Protocol):
    """ADR-002's single entry point: each level's scope by id (``GlobalStateManager``, ``connect(url)``)."""

    def get_global_state(self) -> GlobalState: ...

    def get_team_state(self, team_id: str, *, create: bool = True) -> TeamState: ...

    def get_workflow_state(
        self, workflow_id: str, team_id: str | None = None, *, create: bool = True
    ) -> WorkflowState: ...

    def get_conversation_state(
        self,
        session_id: str,
        workflow_id: str | None = None,
        team_id: str | None = None,
        *,
        create: bool = True,
    ) -> ConversationState: ...


class StateHost(Protocol):
    """An orchestrator that keeps its conversation in a manager: what ``create_snapshot(host)`` and
    ``TransitionApplier(host)`` read (the seed's ``create_snapshot(self)``).

    It may also have ``workflow_id`` and ``team_id`` (where its conversation
    sits) and the seed's ``settings``, ``model``, ``provider``,
    ``max_tokens``, ``temperature`` and ``observed_files``, which
    ``create_snapshot`` copies into the snapshot.
    """

    @property
    def state_manager(self) -> StateManager: ...

    @property
    def session_id(self) -> str: ...
