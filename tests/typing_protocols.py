"""Protocol conformance, checked by mypy (``tests/test_protocols.py`` runs it; CI's mypy covers it too).

Not a test module pytest collects: a file of assignments and calls that type-check only if our
handles and managers, local and remote, implement ``victor_actors.protocols``. A handle or
manager that loses a method, or changes a signature the protocols promise, fails here.
"""

from __future__ import annotations

from victor_actors import GlobalStateManager, RemoteStateManager, ScopeHandle, TransitionBatch
from victor_actors.protocols import (
    ConversationReader,
    ConversationState,
    GlobalReader,
    GlobalState,
    ScopeReader,
    ScopeWriter,
    StateHost,
    StateManager,
    TeamReader,
    TeamState,
    WorkflowReader,
    WorkflowState,
)
from victor_actors.remote import RemoteScopeHandle


def local(manager: GlobalStateManager) -> None:
    conversation: ConversationState = manager.get_conversation_state("c")
    workflow: WorkflowState = manager.get_workflow_state("wf")
    team: TeamState = manager.get_team_state("t")
    glob: GlobalState = manager.get_global_state()
    readers: list[ScopeReader] = [conversation, workflow, team, glob]
    writers: list[ScopeWriter] = [conversation, workflow, team, glob]
    handle: ScopeHandle = manager.get_conversation_state("c")
    level_readers: tuple[ConversationReader, WorkflowReader, TeamReader, GlobalReader] = (
        handle,
        handle,
        handle,
        handle,
    )
    entry: StateManager = manager
    del readers, writers, level_readers, entry


def remote(client: RemoteStateManager) -> None:
    conversation: ConversationState = client.get_conversation_state("c")
    workflow: WorkflowState = client.get_workflow_state("wf")
    team: TeamState = client.get_team_state("t")
    glob: GlobalState = client.get_global_state()
    handle: RemoteScopeHandle = client.get_conversation_state("c")
    reader: ConversationReader = handle
    entry: StateManager = client
    del conversation, workflow, team, glob, reader, entry


def orchestrator_code(conversation: ConversationState, team: TeamState) -> int:
    """Code typed against the protocols runs on any of them."""
    conversation.add_message({"role": "user", "content": "hi"})
    team.apply(TransitionBatch().update_state("k", 1))
    team.modify(lambda snap: TransitionBatch().update_state("n", (snap.get_state("n") or 0) + 1))
    sub = conversation.subscribe(lambda event: None)
    sub.close()
    return conversation.snapshot().message_count + team.version


class Orchestrator:
    def __init__(self, manager: StateManager, session_id: str) -> None:
        self._manager = manager
        self._session_id = session_id

    @property
    def state_manager(self) -> StateManager:
        return self._manager

    @property
    def session_id(self) -> str:
        return self._session_id


def host(manager: GlobalStateManager, client: RemoteStateManager) -> None:
    hosts: list[StateHost] = [Orchestrator(manager, "a"), Orchestrator(client, "b")]
    del hosts
