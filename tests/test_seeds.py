"""Every code example of the seed documents, run on victor_actors with only the imports changed.

The seeds (``shared/seeds/``) are what this project was asked to build: ADR-002 (four-scope
state), the state-passed coordinator architecture, and an issue on isolation, rollback and
timeouts. Each test below holds one of their examples as the document writes it, and asserts what
the document says it does. What differs from the documents, and nothing else:

* imports: ``from victor.state import ...`` and ``from victor.agent.coordinators... import ...``
  become ``from victor_actors import ...`` (and ADR-002's example uses ``StateScope`` without
  importing it: it is imported here);
* Victor's own services and types the examples use (``OrchestrationFacade``, the chat, tool and
  session services, the exploration, safety and prompt coordinators, ``Settings``, ``Message``,
  the orchestrator's ``_handoff`` and ``logger``) are stubbed in this module, as the documents
  use them; ``AgentOrchestrator`` is a stub host whose conversation lives in a manager;
* the documents' tests use ``await`` inside a plain ``def`` (a SyntaxError in Python): they are
  ``async def`` here, run with ``asyncio.run``;
* what the documents elide is given a value: ADR-002's ``[...]`` messages, ``msg1``, ``msg2``,
  ``steps``, ``message``, ``other_batch``, the issue's ``cleanup_resources``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Optional
from unittest.mock import AsyncMock, MagicMock

import pytest

from victor_actors import (
    ContextSnapshot,
    CoordinatorResult,
    GlobalStateManager,
    RunFailedError,
    RunTimeoutError,
    StateScope,
    StateTransition,
    TransitionApplier,
    TransitionBatch,
    TransitionType,
    create_snapshot,
    current_run_id,
)
from victor_actors.lowlevel import register_message_type

logger = logging.getLogger("seed-orchestrator")


# -- Victor's own names, stubbed ----------------------------------------------------------------


@dataclass(frozen=True)
class Message:
    """Victor's provider message (``victor.providers.base.Message``), stubbed."""

    role: str
    content: str


register_message_type(Message)  # so it comes back as a Message from snapshots


@dataclass
class Settings:
    """Victor's ``Settings``, stubbed."""

    model: str = "test"
    tool_budget: int = 10


msg1 = Message("user", "List the files, please.")
msg2 = Message("assistant", "Looking.")
MESSAGES = [msg1, msg2]  # what ADR-002's example writes as [...]


@pytest.fixture
def default_manager() -> Iterator[None]:
    """A fresh process default for ADR-002's get_instance(), closed afterwards."""
    GlobalStateManager._configured = None
    GlobalStateManager.get_instance().close()
    try:
        yield
    finally:
        GlobalStateManager.get_instance().close()
        GlobalStateManager._configured = None


# -- ADR-002: State Management System -----------------------------------------------------------


async def adr002_code_example() -> Any:
    """ADR-002's "Code Example", as written (its [...] filled in)."""
    from victor_actors import GlobalStateManager, StateScope  # was: from victor.state import ...

    # Get state manager
    manager = GlobalStateManager.get_instance()

    # Access conversation state
    conversation = manager.get_conversation_state("session-123")

    # Update state (copy-on-write)
    conversation.update({"messages": MESSAGES, "stage": "complete"})

    # Save checkpoint
    await manager.save_checkpoint(StateScope.CONVERSATION, conversation.to_dict())

    # Later, restore
    restored = await manager.load_checkpoint(StateScope.CONVERSATION, "session-123")
    return restored


def test_adr002_code_example_runs_as_written(default_manager: None) -> None:
    manager = GlobalStateManager.get_instance()
    before = manager.get_conversation_state("session-123").snapshot()

    restored = asyncio.run(adr002_code_example())

    # load_checkpoint gives back the state that was checkpointed, as a dict, messages as Messages
    assert restored == {"messages": MESSAGES, "stage": "complete"}
    assert isinstance(restored, dict) and isinstance(restored["messages"][0], Message)
    # the default manager is one per process, in memory, and it kept the checkpoint in memory
    assert GlobalStateManager.get_instance() is manager and manager.store is None
    conversation = manager.get_conversation_state("session-123")
    assert [c.checkpoint_id for c in manager.list_checkpoints(conversation.ref)] == [
        "conversation:session-123@1"
    ]
    # copy-on-write: the snapshot taken before the update did not change
    assert before.state == {} and conversation.snapshot().state["stage"] == "complete"
    # "Later, restore": the checkpoint is what comes back after the conversation moved on
    conversation.update({"stage": "drafting"})
    again = asyncio.run(manager.load_checkpoint(StateScope.CONVERSATION, "session-123"))
    assert again["stage"] == "complete" and conversation.get("stage") == "drafting"


def test_adr002_architecture_calls(default_manager: None) -> None:
    """The ADR's GlobalStateManager sketch: four accessors and two awaited checkpoint operations."""
    manager = GlobalStateManager.get_instance()
    conversation = manager.get_conversation_state("session-1")
    workflow = manager.get_workflow_state("wf-1")
    team = manager.get_team_state("team-1")
    glob = manager.get_global_state()
    assert [h.ref.scope for h in (glob, team, workflow, conversation)] == list(StateScope)

    async def checkpoints() -> Any:
        glob.update({"feature_flags": {"planning": True}})
        saved = await manager.save_checkpoint(StateScope.GLOBAL, glob.to_dict())
        # the sketch's load_checkpoint(scope) names no instance: the global scope has only one
        return saved, await manager.load_checkpoint(StateScope.GLOBAL)

    saved, loaded = asyncio.run(checkpoints())
    assert saved == "global:global@1"
    assert loaded == {"feature_flags": {"planning": True}}


def test_adr002_key_features(default_manager: None) -> None:
    """Unified access, copy-on-write, checkpointing, observable changes (protocols: typing_protocols.py)."""
    manager = GlobalStateManager.get_instance()
    conversation = manager.get_conversation_state("c", workflow_id="wf", team_id="t")
    seen: list[int] = []
    sub = conversation.subscribe(lambda event: seen.append(event.new_version))
    snap0 = conversation.snapshot()
    conversation.update({"draft": "v1"})
    manager.get_team_state("t").update({"goal": "ship"})
    snap1 = conversation.snapshot()
    manager.quiesce()
    sub.close()
    assert seen == [1]  # Observable
    assert snap0.state == {} and snap1.state == {"draft": "v1"}  # Copy-on-write: old snapshots stay
    assert snap1.get_state("goal") == "ship"  # one entry point, four scopes, read through the chain
    checkpoint = manager.save_checkpoint(conversation.ref)
    conversation.update({"draft": "v2"})
    manager.restore(conversation.ref, checkpoint)  # Checkpointing: save and restore at any point
    assert conversation.get("draft") == "v1"


# -- State-Passed Architecture for Victor Orchestrator ---------------------------------------------


class _Service:
    """Victor's chat, tool and session services, stubbed."""


class OrchestrationFacade:
    """Victor's ``OrchestrationFacade``, stubbed: it holds what it is given."""

    def __init__(self, **services: Any) -> None:
        self.__dict__.update(services)


class ExplorationCoordinator:
    """Victor's read-only exploration helper, stubbed: it finds the files of a snapshot."""

    async def explore_parallel(self, question: str, *, project_root: str) -> dict[str, Any]:
        return {"question": question, "root": project_root, "files": ["victor/agent/orchestrator.py"]}


class ExplorationStatePassedCoordinator:
    def process(self, context: ContextSnapshot, user_message: str) -> CoordinatorResult:
        return CoordinatorResult(TransitionBatch().update_state("explored", user_message))


class SystemPromptStatePassedCoordinator:
    def __init__(self, task_analyzer: Any) -> None:
        self.task_analyzer = task_analyzer


class SafetyStatePassedCoordinator:
    def process(self, context: ContextSnapshot, user_message: str) -> CoordinatorResult:
        verdict = "blocked" if "rm -rf" in user_message else "ok"
        return CoordinatorResult(TransitionBatch().update_state("safety", verdict), confidence=0.9)


def test_facade_wiring_example() -> None:
    chat_service, tool_service, session_service = _Service(), _Service(), _Service()
    task_analyzer, project_root = object(), "/srv/project"

    async def example() -> Any:
        facade = OrchestrationFacade(
            chat_service=chat_service,
            tool_service=tool_service,
            session_service=session_service,
            exploration_state_passed=ExplorationStatePassedCoordinator(),
            system_prompt_state_passed=SystemPromptStatePassedCoordinator(task_analyzer=task_analyzer),
            safety_state_passed=SafetyStatePassedCoordinator(),
        )

        findings = await ExplorationCoordinator().explore_parallel(
            "Trace the failing import boundary",
            project_root=project_root,
        )
        return facade, findings

    facade, findings = asyncio.run(example())
    assert findings["files"] and findings["root"] == project_root
    # the state-passed wrappers the facade holds are pure: a snapshot in, transitions out
    snapshot = ContextSnapshot(session_id="s")
    result = facade.safety_state_passed.process(snapshot, "rm -rf /")
    assert [t.data["value"] for t in result.transitions] == ["blocked"]


def _hand_snapshot(**overrides: Any) -> ContextSnapshot:
    fields: dict[str, Any] = dict(
        messages=(msg1, msg2),
        session_id="test",
        conversation_stage="initial",
        settings=Settings(),
        model="test",
        provider="test",
        max_tokens=4096,
        temperature=0.7,
        conversation_state={},
        session_state={},
        observed_files=(),
        capabilities={},
    )
    fields.update(overrides)
    return ContextSnapshot(**fields)


def test_context_snapshot_usage(manager: GlobalStateManager) -> None:
    """Component 1's "Usage", on a snapshot built by hand and on one taken from a scope."""
    conv = manager.get_conversation_state("s", workflow_id="wf")
    manager.get_workflow_state("wf").update({"key": "from the session"})
    conv.apply(
        TransitionBatch().add_message(msg1).update_capability("planning_mode").update_stage("planning")
    )
    for context in (
        _hand_snapshot(
            conversation_stage="planning",
            session_state={"key": "from the session"},
            capabilities={"planning_mode": True},
            messages=(msg1,),
        ),
        conv.snapshot(),
    ):
        planned = False
        # Read from context
        message_count = context.message_count
        stage = context.conversation_stage
        value = context.get_state("key", default=None)

        # Check capabilities
        if context.has_capability("planning_mode"):
            planned = True

        assert (message_count, stage, value, planned) == (1, "planning", "from the session", True)
        assert context.messages[0] == msg1 and isinstance(context.messages[0], Message)


def test_state_transition_usage(manager: GlobalStateManager) -> None:
    steps = ["list the files", "read the failing module"]

    # Create transitions
    transition1 = StateTransition(
        transition_type=TransitionType.UPDATE_STATE,
        data={"key": "plan_steps", "value": steps, "scope": "conversation"},
    )

    transition2 = StateTransition(
        transition_type=TransitionType.EXECUTE_TOOL,
        data={"tool_name": "list_files", "arguments": {"path": "."}},
    )

    steps.append("changed afterwards")  # the transition holds a frozen copy
    conv = manager.get_conversation_state("s")
    record = conv.apply(TransitionBatch([transition1, transition2]))
    snap = conv.snapshot()
    assert snap.get_state("plan_steps") == ("list the files", "read the failing module")
    assert [r["tool_name"] for r in record.tool_requests] == ["list_files"]
    assert [r["arguments"] for r in snap.pending_tool_requests.values()] == [{"path": "."}]


def test_transition_batch_helper_methods() -> None:
    message = {"role": "assistant", "content": "Done."}
    other_batch = TransitionBatch().update_stage("complete")

    batch = TransitionBatch()

    # Method chaining for fluent API
    batch.update_state("key", "value") \
         .add_message(message) \
         .execute_tool("tool_name", {"arg": "value"})  # fmt: skip

    # Extend with other batches
    batch.extend(other_batch)

    assert [t.transition_type for t in batch.transitions] == [
        TransitionType.UPDATE_STATE,
        TransitionType.ADD_MESSAGE,
        TransitionType.EXECUTE_TOOL,
        TransitionType.UPDATE_STAGE,
    ]
    assert len(other_batch) == 1  # extend copies the other batch's transitions in


def test_coordinator_result_factory_methods() -> None:
    transition1 = StateTransition(TransitionType.UPDATE_STATE, {"key": "a", "value": 1})
    transition2 = StateTransition(TransitionType.UPDATE_STAGE, {"stage": "planning"})

    # No-op result
    result = CoordinatorResult.no_op(reasoning="Nothing to do")
    assert result.transitions.is_empty() and result.reasoning == "Nothing to do"

    # Result with transitions
    result = CoordinatorResult.transitions_only(transition1, transition2, reasoning="Applied updates")
    assert result.transitions.transitions == [transition1, transition2]
    assert (result.reasoning, result.confidence, result.should_continue) == ("Applied updates", 1.0, True)


def test_transition_applier_and_create_snapshot(manager: GlobalStateManager) -> None:
    """Components 5 and 6 as the document declares them: ``await apply``, ``await apply_batch``,
    ``create_snapshot(orchestrator) -> ContextSnapshot``."""
    orchestrator = AgentOrchestrator(manager, "s")
    applier = TransitionApplier(orchestrator)
    transition = StateTransition(TransitionType.ADD_MESSAGE, {"message": msg1})
    batch = TransitionBatch().update_state("a", 1).update_state("b", 2)

    async def apply() -> None:
        await applier.apply(transition)
        await applier.apply_batch(batch)

    asyncio.run(apply())
    snapshot = create_snapshot(orchestrator)
    assert isinstance(snapshot, ContextSnapshot)
    assert snapshot.messages == (msg1,) and snapshot.conversation_state == {"a": 1, "b": 2}
    assert snapshot.version == 2  # the batch was one commit: applied atomically
    assert (snapshot.model, snapshot.provider, snapshot.max_tokens) == ("test-model", "test", 4096)


# The "Before" pattern, as written: a coordinator holding the orchestrator and mutating it.
class BeforeExampleCoordinator:
    def __init__(self, orchestrator):  # type: ignore[no-untyped-def]
        self._orchestrator = orchestrator  # Holds reference

    async def process(self, user_message):  # type: ignore[no-untyped-def]
        # Direct state access and mutation
        messages = self._orchestrator.messages  # noqa: F841
        self._orchestrator.conversation_state["key"] = "value"
        await self._orchestrator.execute_tool("tool", {})


def test_before_pattern_needs_a_full_mock() -> None:
    """ "Before (Needs Full Mock)", as written: it works, and only against a mock orchestrator."""

    async def test_coordinator() -> Any:
        # Need complex mock setup
        orchestrator = MagicMock()
        orchestrator.messages = [msg1, msg2]
        orchestrator.conversation_state = {}
        orchestrator.execute_tool = AsyncMock()

        coordinator = BeforeExampleCoordinator(orchestrator)
        await coordinator.process("test")

        # Verify orchestrator was called
        orchestrator.execute_tool.assert_called_once()
        return orchestrator

    orchestrator = asyncio.run(test_coordinator())
    assert orchestrator.conversation_state == {"key": "value"}  # mutated in place: the issue


# The "After" pattern, as written.
class ExampleCoordinator:
    # No __init__ needed (or only config)

    async def process(self, context: ContextSnapshot, user_message: str) -> CoordinatorResult:
        # Pure function: read from context, return transitions
        messages = context.messages  # Read from immutable snapshot  # noqa: F841

        batch = TransitionBatch()
        batch.update_state("key", "value", scope="conversation")
        batch.execute_tool("tool", {})

        return CoordinatorResult(
            transitions=batch,
            reasoning="Updated state and executed tool",
        )


ExampleStatePassedCoordinator = ExampleCoordinator  # the document's later name for it


def test_after_pattern_with_a_simple_snapshot() -> None:
    """ "After (Simple Snapshot)", as written (async def): no orchestrator, no mock."""

    async def test_coordinator() -> CoordinatorResult:
        # Just create a snapshot
        snapshot = ContextSnapshot(
            messages=(msg1, msg2),
            session_id="test",
            conversation_stage="initial",
            settings=Settings(),
            model="test",
            provider="test",
            max_tokens=4096,
            temperature=0.7,
            conversation_state={},
            session_state={},
            observed_files=(),
            capabilities={},
        )

        coordinator = ExampleStatePassedCoordinator()
        result = await coordinator.process(snapshot, "test")

        # Verify transitions (no orchestrator mock needed!)
        assert not result.transitions.is_empty()
        assert result.confidence > 0.5
        return result

    result = asyncio.run(test_coordinator())
    assert [t.transition_type for t in result.transitions] == [
        TransitionType.UPDATE_STATE,
        TransitionType.EXECUTE_TOOL,
    ]


class AgentOrchestrator:
    """Victor's orchestrator, stubbed as a host: its conversation lives in a manager.

    ``process_with_coordinator`` is the document's "Orchestrator Integration", as written.
    """

    def __init__(self, state_manager: Any, session_id: str, workflow_id: str | None = None) -> None:
        self.state_manager = state_manager
        self.session_id = session_id
        self.workflow_id = workflow_id
        self.settings = Settings()
        self.model = "test-model"
        self.provider_name = "test"
        self.max_tokens = 4096
        self.temperature = 0.7
        self.handoffs: list[tuple[str, ContextSnapshot, str]] = []

    async def _handoff(self, name: str, snapshot: ContextSnapshot, user_message: str) -> None:
        self.handoffs.append((name, snapshot, user_message))

    async def process_with_coordinator(self, user_message: str):  # type: ignore[no-untyped-def]
        from victor_actors import (  # was: from victor.agent.coordinators.state_context import ...
            TransitionApplier,
            create_snapshot,
        )

        # 1. Create coordinator (no orchestrator reference)
        coordinator = ExampleStatePassedCoordinator()

        # 2. Create snapshot
        snapshot = create_snapshot(self)

        # 3. Call coordinator (pure function)
        result = await coordinator.process(snapshot, user_message)

        # 4. Apply transitions
        applier = TransitionApplier(self)
        await applier.apply_batch(result.transitions)

        # 5. Use result metadata
        if result.reasoning:
            logger.info(f"Coordinator: {result.reasoning}")

        if not result.should_continue:
            return  # Stop processing

        if result.handoff_to:
            # Hand off to next coordinator
            await self._handoff(result.handoff_to, snapshot, user_message)


def test_orchestrator_integration(manager: GlobalStateManager, caplog: pytest.LogCaptureFixture) -> None:
    executed: list[dict[str, Any]] = []
    manager.register_tool("tool", lambda call: executed.append(dict(call.arguments)) or "done")
    orchestrator = AgentOrchestrator(manager, "session-1")
    conversation = manager.get_conversation_state("session-1")
    conversation.add_message(msg1)

    with caplog.at_level(logging.INFO, logger="seed-orchestrator"):
        asyncio.run(orchestrator.process_with_coordinator("Trace the import"))

    assert "Coordinator: Updated state and executed tool" in caplog.text
    snap = conversation.snapshot()
    assert snap.get_state("key") == "value"
    assert manager.tools.wait_idle(5.0) and executed == [{}]  # EXECUTE_TOOL ran after the commit
    tool_message = conversation.snapshot().messages[-1]
    assert tool_message["role"] == "tool" and tool_message["content"] == "done"
    assert orchestrator.handoffs == []  # should_continue with no handoff_to: nothing to hand to


def test_faq_nested_coordinators_share_one_snapshot(manager: GlobalStateManager) -> None:
    """FAQ: "Pass the same snapshot. Each coordinator returns its own transitions. The orchestrator
    merges and applies them." """
    from victor_actors.lowlevel import merge

    conv = manager.get_conversation_state("nested")
    snapshot = create_snapshot(conv)
    results = [
        SafetyStatePassedCoordinator().process(snapshot, "list files"),
        ExplorationStatePassedCoordinator().process(snapshot, "list files"),
    ]
    merged = merge(*results)
    record = asyncio.run(TransitionApplier(conv).apply_batch(merged.transitions))
    assert record.version == 1 and conv.snapshot().state == {"safety": "ok", "explored": "list files"}
    assert merged.confidence == 0.9


def test_faq_async_operations_are_execute_tool_transitions(manager: GlobalStateManager) -> None:
    """FAQ: "Return an EXECUTE_TOOL transition. The orchestrator will apply it and handle the async
    execution." """

    async def list_files(call: Any) -> list[str]:
        await asyncio.sleep(0)
        return ["README.md"]

    manager.register_tool("list_files", list_files)
    conv = manager.get_conversation_state("tools")
    applier = TransitionApplier(manager, "tools")
    applier.apply_batch_sync(TransitionBatch().execute_tool("list_files", {"path": "."}))
    assert manager.tools.wait_idle(5.0)
    assert conv.snapshot().messages[-1]["content"] == ("README.md",)
    assert not conv.snapshot().pending_tool_requests


# -- Architecture: Agent State Management and ContextVar Issues ---------------------------------------

from contextvars import ContextVar  # noqa: E402  (the issue's first example imports these)

current_run_id_var: ContextVar[str] = ContextVar("current_run_id", default="")


async def set_run_id(run_id: str):  # type: ignore[no-untyped-def]
    current_run_id_var.set(run_id)
    # Ensure context is properly propagated
    task = asyncio.current_task()
    if task:
        task.context = {**getattr(task, "context", {}), "run_id": run_id}  # type: ignore[attr-defined]


def test_issue_contextvar_example_and_run_ids(manager: GlobalStateManager) -> None:
    """The issue's ContextVar example runs; its claim (the run id is right in every task of a run,
    and concurrent runs do not see each other's) holds for ``current_run_id()``."""

    async def proposed() -> str:
        await set_run_id("run-1")
        return current_run_id_var.get()

    assert asyncio.run(proposed()) == "run-1"

    async def agent(name: str) -> tuple[str, str | None, set[str | None]]:
        conv = manager.get_conversation_state(name)
        async with manager.arun(name, timeout=10.0) as run:
            seen = await asyncio.gather(
                asyncio.create_task(_current()),
                asyncio.to_thread(current_run_id),
                _current(),
            )
            await conv.aset("by", current_run_id())
        return run.id, conv.get("by"), set(seen)

    async def both() -> list[tuple[str, str | None, set[str | None]]]:
        return list(await asyncio.gather(agent("a"), agent("b")))

    (id_a, by_a, seen_a), (id_b, by_b, seen_b) = asyncio.run(both())
    assert id_a != id_b
    assert (by_a, seen_a) == (id_a, {id_a}) and (by_b, seen_b) == (id_b, {id_b})
    assert current_run_id() is None


async def _current() -> str | None:
    return current_run_id()


@dataclass
class AgentState:
    repo_name: str
    target_issue: Optional[int] = None  # noqa: UP045  (as the issue writes it)
    architect_directive: str = ""
    idea: str = ""
    pm_decision: str = ""
    code: str = ""
    review: str = ""
    issue_number: int = 0
    pr_number: int = 0
    branch_name: str = ""
    iteration: int = 0
    log_messages: list = field(default_factory=list)  # type: ignore[type-arg]

    def copy(self):  # type: ignore[no-untyped-def]
        return AgentState(**self.__dict__)


def test_issue_agent_state_isolation(manager: GlobalStateManager) -> None:
    """The issue's AgentState, as written: its copy() shares log_messages, so copies are not isolated.
    Kept in a scope, every read is its own instance and two agents never share state."""
    state = AgentState("victor")
    copied = state.copy()
    copied.log_messages.append("leaked")
    assert state.log_messages == ["leaked"]  # the proposed copy() does not isolate

    manager.register_message_type(AgentState)
    first, second = (manager.get_conversation_state(n) for n in ("agent-1", "agent-2"))
    first.set("agent", AgentState("victor"))
    second.set("agent", AgentState("victor", iteration=3))
    mine = first.get("agent")
    assert isinstance(mine, AgentState)
    mine.log_messages.append("local only")  # changes this instance, not the stored state
    assert first.get("agent").log_messages == [] and first.get("agent") is not mine
    assert second.get("agent").iteration == 3 and first.get("agent").iteration == 0
    assert dataclasses.asdict(first.get("agent")) == dataclasses.asdict(AgentState("victor"))


def test_issue_safe_execution_rollback_and_timeout(manager: GlobalStateManager) -> None:
    """The issue's safe_agent_execution, as written, returns a copy on error but leaves the writes
    the agent made; a run rolls them back, and a run that outlives its timeout too."""
    cleaned: list[str] = []

    async def cleanup_resources() -> None:
        cleaned.append("done")

    async def safe_agent_execution(agent_func, state):  # type: ignore[no-untyped-def]
        try:
            return await agent_func(state)
        except Exception as e:
            # Log error and return safe state
            logger.error(f"Agent execution failed: {e}")
            return state.copy()
        finally:
            # Cleanup
            await cleanup_resources()

    conv = manager.get_conversation_state("agent")
    conv.set("iteration", 0)

    async def failing_agent(state: AgentState) -> AgentState:
        state.iteration += 1
        await conv.aset("iteration", state.iteration)  # a write the proposal cannot undo
        raise RuntimeError("the provider went away")

    out = asyncio.run(safe_agent_execution(failing_agent, AgentState("victor")))
    assert out.iteration == 1 and conv.get("iteration") == 1 and cleaned == ["done"]

    async def in_a_run(timeout: float, body: Any) -> None:
        async with manager.arun("agent", timeout=timeout):
            await conv.aset("iteration", 2)
            await body()

    async def fails() -> None:
        raise RuntimeError("the provider went away")

    with pytest.raises(RunFailedError) as failed:
        asyncio.run(in_a_run(10.0, fails))
    assert conv.get("iteration") == 1 and failed.value.rollback_report is not None

    async def hangs() -> None:
        await asyncio.Event().wait()

    with pytest.raises(RunTimeoutError):
        asyncio.run(in_a_run(0.2, hangs))
    assert conv.get("iteration") == 1
