"""Victor's 34 state-context tests, ported to victor_actors with its buggy behaviours reversed.

Each ``test_NN_*`` is named after the Victor test it replaces (see the checklist of
``tests/unit/agent/coordinators/test_state_context.py``). Victor built its snapshots
by hand and applied transitions to a mock orchestrator; here every snapshot comes from
a real scope (``handle.snapshot()``) after real batches went through the manager.

The mapping from Victor's model to ours:

* ``conversation_state`` vs ``session_state`` priority is own scope vs ancestor scope:
  ``get_state`` reads this scope first, then the nearest ancestor up to global.
* Victor's ``ValueError`` at creation is ``TransitionValidationError`` (a ``ValueError``),
  raised for missing *or wrong* data and naming the transition type and the field.
* UPDATE_STATE's default scope is None (the applying scope), not ``"conversation"``.
* Reversed bugs: DELETE_STATE deletes only in its own scope; a batch is atomic; a
  snapshot is deeply immutable and never changes after it is taken.

The tests after the 34 cover the checklist's gaps: ADD_MESSAGES, CREATE_SESSION,
CLOSE_SESSION, EXECUTE_TOOL, TOOL_RESULT, BATCH nesting, invalid scope strings and
creation validation for every transition type.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from victor_actors import (
    ContextSnapshot,
    CoordinatorResult,
    GlobalStateManager,
    ScopeAccessError,
    ScopeClosedError,
    ScopeRef,
    StateScope,
    StateTransition,
    TransitionBatch,
    TransitionType,
    TransitionValidationError,
    VictorActorsError,
)
from victor_actors.lowlevel import FrozenDict

T = TransitionType


def _user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


# -- TestContextSnapshot (1-7) ------------------------------------------------


def test_01_create_snapshot(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("test-123")
    snap = conv.snapshot()
    assert isinstance(snap, ContextSnapshot)
    assert snap.session_id == "test-123"
    assert snap.ref == ScopeRef(StateScope.CONVERSATION, "test-123")
    assert snap.scope is StateScope.CONVERSATION
    assert snap.conversation_stage == "initial"
    assert snap.message_count == 0
    assert snap.is_complete is False
    assert snap.is_closed is False
    assert snap.version == 0
    assert snap.state == {}
    assert snap.capabilities == {}
    assert snap.pending_tool_requests == {}
    assert snap.parent == ScopeRef(StateScope.GLOBAL, "global")


def test_02_get_state_conversation_priority(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c", workflow_id="wf", team_id="t")
    manager.get_global_state().update({"key": "global_value", "only_global": "g", "shared": "g"})
    manager.get_team_state("t").update({"key": "sess_value", "shared": "t"})
    manager.get_workflow_state("wf").update({"shared": "w"})
    conv.update({"key": "conv_value"})

    snap = conv.snapshot()
    assert snap.get_state("key") == "conv_value"  # own scope first
    assert snap.get_state("shared") == "w"  # then the nearest ancestor (workflow before team)
    assert snap.get_state("only_global") == "g"  # up to global
    assert snap.state == {"key": "conv_value"}  # own state does not include ancestors' keys
    assert snap.ancestor_state("team") == {"key": "sess_value", "shared": "t"}

    # Like Victor's ``key in conversation_state``: an own value of None still shadows.
    conv.set("key", None)
    assert conv.snapshot().get_state("key", "default") is None


def test_03_get_state_default(manager: GlobalStateManager) -> None:
    snap = manager.get_conversation_state("c").snapshot()
    assert snap.get_state("missing", "default") == "default"
    assert snap.get_state("missing") is None


def test_04_has_capability(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c")
    conv.apply(
        TransitionBatch()
        .update_capability("feature_a", True)
        .update_capability("feature_b", False)
        .update_capability("feature_d")  # value defaults to True
        .update_capability("zero", 0)
        .update_capability("text", "value_a")
    )
    snap = conv.snapshot()
    assert snap.has_capability("feature_a") is True
    assert snap.has_capability("feature_b") is False
    assert snap.has_capability("feature_c") is False
    assert snap.has_capability("feature_d") is True
    assert snap.has_capability("zero") is False  # truthiness, as in Victor
    assert snap.has_capability("text") is True


def test_05_get_capability_value(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c")
    conv.apply(
        TransitionBatch().update_capability("feature_a", "value_a").update_capability("feature_b", 123)
    )
    snap = conv.snapshot()
    assert snap.get_capability_value("feature_a") == "value_a"
    assert snap.get_capability_value("feature_b") == 123
    assert snap.get_capability_value("feature_c") is None
    assert snap.get_capability_value("feature_c", "fallback") == "fallback"
    assert snap.capabilities == {"feature_a": "value_a", "feature_b": 123}


def test_06_message_count(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c")
    conv.apply(TransitionBatch().add_message(_user("one")).add_message(_user("two")).add_message("three"))
    snap = conv.snapshot()
    assert snap.message_count == 3
    assert len(snap.messages) == 3
    assert snap.messages == (_user("one"), _user("two"), "three")
    assert snap.messages[-1] == "three"


def test_07_is_complete(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c")
    conv.apply(TransitionBatch().update_stage("planning"))
    assert conv.snapshot().is_complete is False
    conv.apply(TransitionBatch().update_stage("complete"))
    snap = conv.snapshot()
    assert snap.conversation_stage == "complete"
    assert snap.is_complete is True

    other = manager.get_conversation_state("other")
    other.apply(TransitionBatch().close_session())
    assert other.snapshot().is_complete is True  # a closed scope is complete too


# -- TestStateTransition (8-13) -----------------------------------------------


def test_08_add_message_validation() -> None:
    with pytest.raises(TransitionValidationError, match=r"ADD_MESSAGE.*message") as info:
        StateTransition(T.ADD_MESSAGE, {})
    assert isinstance(info.value, ValueError)
    assert info.value.transition_type == "ADD_MESSAGE"
    assert info.value.field == "message"

    with pytest.raises(TransitionValidationError, match=r"ADD_MESSAGE.*message") as info:
        StateTransition(T.ADD_MESSAGE, {"message": None})
    assert info.value.field == "message"


def test_09_add_message_valid() -> None:
    message = _user("hello")
    t = StateTransition(T.ADD_MESSAGE, {"message": message})
    assert t.transition_type is T.ADD_MESSAGE
    assert t.data["message"] == message
    assert isinstance(t.data["message"], FrozenDict)
    # The transition holds a frozen copy: the caller's dict is no alias of it.
    message["content"] = "changed"
    assert t.data["message"]["content"] == "hello"


def test_10_update_state_validation() -> None:
    with pytest.raises(TransitionValidationError, match=r"UPDATE_STATE.*'value'") as info:
        StateTransition(T.UPDATE_STATE, {"key": "test"})
    assert info.value.transition_type == "UPDATE_STATE"
    assert info.value.field == "value"

    with pytest.raises(TransitionValidationError, match=r"UPDATE_STATE.*'key'") as info:
        StateTransition(T.UPDATE_STATE, {"value": "v"})
    assert info.value.field == "key"

    # Types are checked too, not only presence.
    with pytest.raises(TransitionValidationError, match=r"UPDATE_STATE.*'key'"):
        StateTransition(T.UPDATE_STATE, {"key": 5, "value": "v"})


def test_11_update_state_valid() -> None:
    t = StateTransition(T.UPDATE_STATE, {"key": "test_key", "value": "test_value"})
    assert t.transition_type is T.UPDATE_STATE
    assert t.data["key"] == "test_key"
    assert t.data["value"] == "test_value"
    assert "scope" not in t.data
    assert t.scope is None  # the applying scope
    assert StateTransition(T.UPDATE_STATE, {"key": "k", "value": None}).data["value"] is None


def test_12_execute_tool_validation() -> None:
    with pytest.raises(TransitionValidationError, match=r"EXECUTE_TOOL.*'arguments'") as info:
        StateTransition(T.EXECUTE_TOOL, {"tool_name": "test"})
    assert info.value.transition_type == "EXECUTE_TOOL"
    assert info.value.field == "arguments"

    with pytest.raises(TransitionValidationError, match=r"EXECUTE_TOOL.*'tool_name'") as info:
        StateTransition(T.EXECUTE_TOOL, {"arguments": {}})
    assert info.value.field == "tool_name"

    with pytest.raises(TransitionValidationError, match=r"EXECUTE_TOOL.*'arguments'"):
        StateTransition(T.EXECUTE_TOOL, {"tool_name": "test", "arguments": ["not", "a", "mapping"]})


def test_13_execute_tool_valid() -> None:
    t = StateTransition(T.EXECUTE_TOOL, {"tool_name": "list_files", "arguments": {"path": "."}})
    assert t.transition_type is T.EXECUTE_TOOL
    assert t.data["tool_name"] == "list_files"
    assert t.data["arguments"] == {"path": "."}


# -- TestTransitionBatch (14-21) ----------------------------------------------


def test_14_create_empty_batch() -> None:
    batch = TransitionBatch()
    assert batch.is_empty()
    assert len(batch) == 0
    assert len(batch.transitions) == 0


def test_15_add_transition() -> None:
    batch = TransitionBatch()
    assert batch.add(StateTransition(T.UPDATE_STATE, {"key": "test", "value": "value"})) is batch
    assert not batch.is_empty()
    assert len(batch.transitions) == 1
    with pytest.raises(TransitionValidationError):
        batch.add({"key": "test", "value": "value"})  # type: ignore[arg-type]
    assert len(batch) == 1


def test_16_add_message() -> None:
    batch = TransitionBatch()
    assert batch.add_message(_user("hi")) is batch
    assert len(batch.transitions) == 1
    assert batch.transitions[0].transition_type is T.ADD_MESSAGE


def test_17_update_state() -> None:
    batch = TransitionBatch()
    assert batch.update_state("key", "value") is batch
    t = batch.transitions[0]
    assert t.data["key"] == "key"
    assert t.data["value"] == "value"
    # Reversed default: no scope means the applying scope, not "conversation".
    assert "scope" not in t.data
    assert t.scope is None


def test_18_update_state_session_scope() -> None:
    t = TransitionBatch().update_state("key", "value", scope="team").transitions[0]
    assert t.data["scope"] == "team"
    assert t.scope is StateScope.TEAM
    assert TransitionBatch().update_state("k", 1, scope=StateScope.GLOBAL).transitions[0].scope is (
        StateScope.GLOBAL
    )
    # Victor's "session" names the conversation's parent, a workflow or team (docs/adr/0025): it is
    # kept as written and resolved when the batch is applied (tests/test_applier.py). Any other
    # spelling is still rejected, not silently rerouted.
    t = TransitionBatch().update_state("key", "value", scope="session").transitions[0]
    assert t.data["scope"] == "session"
    assert t.scope is None
    with pytest.raises(TransitionValidationError, match="Session") as info:
        TransitionBatch().update_state("key", "value", scope="Session")
    assert info.value.field == "scope"
    assert info.value.transition_type == "UPDATE_STATE"


def test_19_execute_tool() -> None:
    batch = TransitionBatch()
    assert batch.execute_tool("test_tool", {"arg": "value"}) is batch
    assert len(batch.transitions) == 1
    t = batch.transitions[0]
    assert t.transition_type is T.EXECUTE_TOOL
    assert t.data["tool_name"] == "test_tool"
    assert t.data["arguments"] == {"arg": "value"}


def test_20_extend(manager: GlobalStateManager) -> None:
    batch1 = TransitionBatch().update_state("key1", "value1")
    batch2 = TransitionBatch().update_state("key2", "value2")
    batch2.metadata = {"source": "test"}
    assert batch1.extend(batch2) is batch1
    assert len(batch1.transitions) == 2
    assert batch1.metadata == {"source": "test"}
    assert len(batch2) == 1  # the other batch is left as it was

    conv = manager.get_conversation_state("c")
    conv.apply(batch1)
    assert conv.snapshot().state == {"key1": "value1", "key2": "value2"}


def test_21_chaining() -> None:
    batch = TransitionBatch().update_state("key1", "value1").update_state("key2", "value2")
    batch.execute_tool("test_tool", {})
    assert len(batch.transitions) == 3
    assert batch.transitions[2].data["arguments"] == {}


# -- TestCoordinatorResult (22-25) --------------------------------------------


def test_22_no_op(manager: GlobalStateManager) -> None:
    result = CoordinatorResult.no_op(reasoning="Nothing to do")
    assert result.transitions.is_empty()
    assert result.reasoning == "Nothing to do"
    assert result.should_continue is True
    assert result.has_transitions is False

    conv = manager.get_conversation_state("c")
    record = conv.apply(result)
    assert record.committed is False
    assert conv.version == 0


def test_23_transitions_only(manager: GlobalStateManager) -> None:
    t1 = StateTransition(T.UPDATE_STATE, {"key": "test", "value": "value"})
    t2 = StateTransition(T.UPDATE_CAPABILITY, {"capability": "test", "value": True})
    result = CoordinatorResult.transitions_only(t1, t2, reasoning="Multiple updates")
    assert len(result.transitions.transitions) == 2
    assert result.reasoning == "Multiple updates"
    with pytest.raises(TransitionValidationError, match=r"UPDATE_CAPABILITY.*capability"):
        StateTransition(T.UPDATE_CAPABILITY, {"value": True})

    conv = manager.get_conversation_state("c")
    record = conv.apply(result)
    assert record.version == 1
    snap = conv.snapshot()
    assert snap.get_state("test") == "value"
    assert snap.has_capability("test") is True


def test_24_add_message() -> None:
    result = CoordinatorResult(transitions=TransitionBatch())
    assert result.add_message(_user("hi")) is result
    assert len(result.transitions.transitions) == 1
    assert result.transitions.transitions[0].transition_type is T.ADD_MESSAGE


def test_25_update_state() -> None:
    result = CoordinatorResult(transitions=TransitionBatch())
    assert result.update_state("key", "value") is result
    assert len(result.transitions.transitions) == 1
    assert result.transitions.transitions[0].data["key"] == "key"


# -- TestTransitionApplier (26-32): apply() through a scope handle ---------------


def test_26_apply_add_message(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c")
    record = conv.apply(StateTransition(T.ADD_MESSAGE, {"message": "test message"}))
    assert record.added_messages == ("test message",)
    assert record.version == 1
    assert conv.snapshot().messages == ("test message",)


def test_27_apply_update_state_conversation(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c", team_id="t")
    record = conv.apply(
        StateTransition(T.UPDATE_STATE, {"key": "test_key", "value": "test_value", "scope": "conversation"})
    )
    assert record.changed_keys == ("test_key",)
    assert conv.snapshot().state == {"test_key": "test_value"}
    assert manager.get_team_state("t").snapshot().state == {}  # the ancestor is untouched


def test_28_apply_update_state_session(manager: GlobalStateManager) -> None:
    team = manager.get_team_state("t")
    conv = manager.get_conversation_state("c", team_id="t")
    data = {"key": "test_key", "value": "test_value", "scope": "team"}

    # Applied to the team's own scope, a team-scoped update writes the team.
    team.apply(StateTransition(T.UPDATE_STATE, data))
    assert team.snapshot().state == {"test_key": "test_value"}
    assert conv.snapshot().get_state("test_key") == "test_value"
    assert conv.snapshot().state == {}

    # Through the conversation it writes the team (a cross-scope batch), not the conversation.
    record = conv.apply(StateTransition(T.UPDATE_STATE, {**data, "value": "other"}))
    assert record.involved == (team.ref,) and not record.committed
    assert team.snapshot().state == {"test_key": "other"}
    assert team.version == 2
    assert conv.version == 0

    # A level the conversation does not have is refused, changing nothing.
    with pytest.raises(ScopeAccessError) as info:
        conv.apply(StateTransition(T.UPDATE_STATE, {**data, "scope": "workflow"}))
    assert info.value.index == 0  # type: ignore[attr-defined]
    assert info.value.transition_type == "UPDATE_STATE"  # type: ignore[attr-defined]
    assert team.version == 2 and conv.version == 0


def test_29_apply_delete_state(manager: GlobalStateManager) -> None:
    team = manager.get_team_state("t")
    conv = manager.get_conversation_state("c", team_id="t")
    team.update({"test_key": "team_value", "team_only": "kept"})
    conv.update({"test_key": "conv_value"})

    record = conv.apply(StateTransition(T.DELETE_STATE, {"key": "test_key", "scope": "conversation"}))
    assert record.committed
    assert "test_key" not in conv.snapshot().state
    # Reversed bug: the ancestor's key of the same name survives, and now shows through.
    assert team.snapshot().state == {"test_key": "team_value", "team_only": "kept"}
    assert conv.snapshot().get_state("test_key") == "team_value"

    # Deleting a key the conversation does not hold never reaches the team: a no-op.
    record = conv.apply(TransitionBatch().delete_state("team_only"))
    assert record.committed is False
    assert team.snapshot().state == {"test_key": "team_value", "team_only": "kept"}
    assert team.version == 1

    # A team-scoped delete through the conversation deletes in the team, and only there.
    conv_before = conv.snapshot()
    record = conv.apply(TransitionBatch().delete_state("team_only", scope="team"))
    assert record.involved == (team.ref,)
    assert "team_only" not in team.snapshot().state
    assert conv.snapshot().state == conv_before.state
    # A delete aimed at a level the conversation does not have is refused.
    with pytest.raises(ScopeAccessError):
        conv.apply(TransitionBatch().delete_state("team_only", scope="workflow"))


def test_30_apply_update_capability(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c")
    record = conv.apply(StateTransition(T.UPDATE_CAPABILITY, {"capability": "test_cap", "value": True}))
    assert [(c.key, c.old_present, c.new_value) for c in record.capability_changes] == [
        ("test_cap", False, True)
    ]
    assert conv.snapshot().get_capability_value("test_cap") is True
    # "name" is accepted as an alias of "capability".
    conv.apply(StateTransition(T.UPDATE_CAPABILITY, {"name": "other"}))
    assert conv.snapshot().capabilities == {"test_cap": True, "other": True}


def test_31_apply_update_stage(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c")
    assert conv.snapshot().conversation_stage == "initial"
    record = conv.apply(StateTransition(T.UPDATE_STAGE, {"stage": "planning"}))
    assert (record.old_stage, record.new_stage) == ("initial", "planning")
    assert conv.snapshot().conversation_stage == "planning"
    with pytest.raises(TransitionValidationError, match=r"UPDATE_STAGE.*stage"):
        StateTransition(T.UPDATE_STAGE, {"stage": ""})


def test_32_apply_batch(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c", team_id="t")
    record = conv.apply(TransitionBatch().add_message("message1").update_state("key", "value"))
    assert record.version == 1
    before = conv.snapshot()
    assert before.messages == ("message1",)
    assert before.state == {"key": "value"}

    # A failing transition late in the batch: nothing of the batch is applied.
    failing = (
        TransitionBatch()
        .add_message("message2")
        .update_state("key", "changed")
        .update_capability("cap")
        .update_state("team_key", "x", scope="workflow")  # this conversation has no workflow
        .update_stage("never")
    )
    with pytest.raises(ScopeAccessError) as info:
        conv.apply(failing)
    assert info.value.index == 3  # type: ignore[attr-defined]
    assert info.value.transition_type == "UPDATE_STATE"  # type: ignore[attr-defined]
    assert "nothing was applied" in str(info.value)
    assert conv.version == 1
    after = conv.snapshot()
    assert after == before
    assert after.messages == ("message1",)
    assert after.state == {"key": "value"}
    assert after.capabilities == {}
    assert after.conversation_stage == "initial"
    assert manager.get_team_state("t").snapshot().state == {}

    # A validation failure inside the reducer is atomic too and names its transition.
    conv.apply(TransitionBatch().execute_tool("search", {}, request_id="r1"))
    with pytest.raises(TransitionValidationError) as vinfo:
        conv.apply(TransitionBatch().update_state("key", "again").execute_tool("search", {}, request_id="r1"))
    assert vinfo.value.index == 1
    assert vinfo.value.transition_type == "EXECUTE_TOOL"
    assert conv.version == 2
    assert conv.snapshot().get_state("key") == "value"


# -- TestCreateSnapshot (33-34) -----------------------------------------------


def test_33_create_snapshot_from_scope(manager: GlobalStateManager) -> None:
    manager.get_global_state().update(
        {"model": "test-model", "provider": "test-provider", "max_tokens": 2048}
    )
    manager.get_team_state("t").update({"sess_key": "sess_value"})
    conv = manager.get_conversation_state("test-session", team_id="t")
    conv.apply(
        TransitionBatch()
        .add_messages(["msg1", "msg2"])
        .update_stage("planning")
        .update_state("key", "value")
        .update_state("observed_files", ["file1.py", "file2.py"])
        .update_state("temperature", 0.5)
        .update_capability("cap_a", True)
    )
    snap = conv.snapshot()
    assert snap.session_id == "test-session"
    assert snap.conversation_stage == "planning"
    assert snap.messages == ("msg1", "msg2")
    assert snap.state == {"key": "value", "observed_files": ("file1.py", "file2.py"), "temperature": 0.5}
    assert snap.get_state("observed_files") == ("file1.py", "file2.py")
    assert snap.ancestor_state("team") == {"sess_key": "sess_value"}
    assert snap.ancestor_state("workflow") is None
    assert snap.get_state("sess_key") == "sess_value"
    assert snap.get_state("model") == "test-model"
    assert snap.get_state("provider") == "test-provider"
    assert snap.get_state("max_tokens") == 2048
    assert snap.capabilities == {"cap_a": True}
    assert snap.version == 1
    assert snap.to_dict() == {
        "ref": "conversation:test-session",
        "version": 1,
        "state": {"key": "value", "observed_files": ["file1.py", "file2.py"], "temperature": 0.5},
        "messages": ["msg1", "msg2"],
        "capabilities": {"cap_a": True},
        "conversation_stage": "planning",
        "closed": False,
        "pending_tool_requests": {},
        "sessions": {},
    }


def test_34_create_snapshot_copies_state(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c")
    source: dict[str, Any] = {"inner": {"a": 1}, "items": [1, 2]}
    conv.apply(
        TransitionBatch()
        .update_state("key", "original")
        .update_state("nested", source)
        .add_message(_user("hi"))
        .update_capability("cap", {"x": [1]})
    )
    snap = conv.snapshot()

    # Reversed: the snapshot cannot be mutated, at any depth.
    with pytest.raises(TypeError):
        snap.state["key"] = "modified"  # type: ignore[index]
    with pytest.raises(TypeError):
        del snap.state["key"]  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        snap.capabilities["cap"] = False  # type: ignore[index]
    with pytest.raises(TypeError):
        snap.messages[0] = "other"  # type: ignore[index]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        snap._state = snap._state  # type: ignore[misc]
    nested = snap.get_state("nested")
    assert isinstance(nested, FrozenDict)
    assert isinstance(nested["inner"], FrozenDict)
    assert isinstance(nested["items"], tuple)
    with pytest.raises(TypeError):
        nested["inner"] = {}  # type: ignore[index]
    with pytest.raises(TypeError):
        nested["inner"]["a"] = 2  # type: ignore[index]
    with pytest.raises(AttributeError):
        nested["items"].append(3)
    with pytest.raises(AttributeError):
        nested.update({"x": 1})  # type: ignore[attr-defined]
    message = snap.messages[0]
    assert isinstance(message, FrozenDict)
    with pytest.raises(TypeError):
        message["content"] = "changed"  # type: ignore[index]
    assert isinstance(snap.get_capability_value("cap")["x"], tuple)

    # The caller's input was copied in: mutating it reaches neither state nor snapshot.
    source["inner"]["a"] = 99
    source["items"].append(3)
    assert snap.get_state("nested") == {"inner": {"a": 1}, "items": (1, 2)}
    assert conv.snapshot().get_state("nested") == {"inner": {"a": 1}, "items": (1, 2)}

    # to_dict() gives a mutable copy; changing it changes nothing else.
    copy = snap.to_dict()
    copy["state"]["key"] = "modified"
    copy["state"]["nested"]["items"].append(3)
    assert conv.snapshot().get_state("key") == "original"

    # Later commits do not change the earlier snapshot.
    conv.apply(
        TransitionBatch()
        .update_state("key", "modified")
        .delete_state("nested")
        .add_message("more")
        .update_capability("cap", False)
        .update_stage("done")
    )
    assert snap.version == 1
    assert snap.get_state("key") == "original"
    assert snap.get_state("nested") == {"inner": {"a": 1}, "items": (1, 2)}
    assert snap.message_count == 1
    assert snap.messages == (_user("hi"),)
    assert snap.capabilities == {"cap": {"x": (1,)}}
    assert snap.conversation_stage == "initial"
    assert conv.snapshot().get_state("key") == "modified"
    assert conv.snapshot().message_count == 2


# -- Gaps the checklist lists ---------------------------------------------------


def test_add_messages_appends_in_order(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c")
    conv.add_message("first")
    record = conv.apply(TransitionBatch().add_messages([_user("a"), "b"]).add_message("c"))
    assert record.added_messages == (_user("a"), "b", "c")
    assert conv.snapshot().messages == ("first", _user("a"), "b", "c")
    t = StateTransition(T.ADD_MESSAGES, {"messages": ("x", "y")})
    assert t.data["messages"] == ("x", "y")
    with pytest.raises(TransitionValidationError, match=r"ADD_MESSAGES.*messages"):
        StateTransition(T.ADD_MESSAGES, {"messages": "not a list"})
    with pytest.raises(TransitionValidationError, match=r"ADD_MESSAGES.*messages"):
        TransitionBatch().add_messages(["ok", None])


def test_create_session_creates_child_conversation(manager: GlobalStateManager) -> None:
    workflow = manager.get_workflow_state("wf", team_id="t")
    workflow.update({"goal": "report"})
    record = workflow.apply(TransitionBatch().create_session("child-1", metadata={"agent": "writer"}))
    assert record.sessions_created == ("child-1",)
    assert workflow.snapshot().sessions == {"child-1": {"agent": "writer"}}

    child = manager.get_conversation_state("child-1")
    assert child.ref == ScopeRef(StateScope.CONVERSATION, "child-1")
    assert child.parent == workflow.ref
    assert child.snapshot().ancestors == (workflow.ref, ScopeRef("team", "t"), ScopeRef("global", "global"))
    assert child.snapshot().get_state("goal") == "report"
    assert manager.scope("conversation:child-1") is child

    # Without an id one is generated, and the child exists under the applying scope.
    record = workflow.apply(TransitionBatch().create_session())
    (generated,) = record.sessions_created
    assert manager.get_conversation_state(generated).parent == workflow.ref

    # The same id twice is refused, atomically.
    version = workflow.version
    with pytest.raises(TransitionValidationError) as info:
        workflow.apply(TransitionBatch().update_state("x", 1).create_session("child-1"))
    assert info.value.index == 1
    assert info.value.transition_type == "CREATE_SESSION"
    assert workflow.version == version
    assert workflow.snapshot().get_state("x") is None


def test_create_session_under_another_parent_is_refused(manager: GlobalStateManager) -> None:
    manager.get_conversation_state("taken")  # under global
    team = manager.get_team_state("t")
    with pytest.raises(ScopeAccessError):
        team.apply(TransitionBatch().update_state("x", 1).create_session("taken"))
    assert team.version == 0
    assert team.snapshot().sessions == {}
    assert manager.get_conversation_state("taken").parent == ScopeRef("global", "global")


def test_create_session_with_generated_id_colliding_is_atomic(manager: GlobalStateManager) -> None:
    # A conversation already exists (under global) with the id the next generated
    # session id will take: "<scope id>.<new version>.<index>", here index 1.
    manager.get_conversation_state("c.1.1")
    conv = manager.get_conversation_state("c")
    try:
        record = conv.apply(TransitionBatch().update_state("x", 1).create_session())
    except ScopeAccessError:
        # apply() promises that when it raises, nothing of the batch was applied.
        assert conv.version == 0
        assert conv.snapshot().sessions == {}
        assert conv.snapshot().get_state("x") is None
    else:
        # Or the batch succeeds and its session really is a child of this scope.
        (session_id,) = record.sessions_created
        assert manager.get_conversation_state(session_id).parent == conv.ref
    assert manager.get_conversation_state("c.1.1").parent == ScopeRef("global", "global")


def test_close_session_rejects_later_batches_and_stays_readable(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c")
    conv.apply(TransitionBatch().add_message("hi").update_state("k", "v"))
    record = conv.apply(TransitionBatch().close_session(reason="done"))
    assert record.closed is True
    assert record.version == 2
    snap = conv.snapshot()
    assert snap.is_closed is True
    assert snap.is_complete is True

    for batch in (
        TransitionBatch().update_state("k", "w"),
        TransitionBatch().add_message("late"),
        TransitionBatch().delete_state("missing"),
        TransitionBatch().close_session(),
    ):
        with pytest.raises(ScopeClosedError):
            conv.apply(batch)
    assert conv.version == 2
    assert conv.get("k") == "v"
    assert conv.snapshot().messages == ("hi",)
    assert conv.snapshot() == snap


def test_close_session_in_batch_and_of_other_scope(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c")
    with pytest.raises(ScopeClosedError) as info:
        conv.apply(TransitionBatch().close_session().update_state("k", 1))
    assert info.value.index == 1  # type: ignore[attr-defined]
    assert conv.version == 0
    assert conv.snapshot().is_closed is False

    with pytest.raises(ScopeAccessError) as ainfo:
        conv.apply(TransitionBatch().close_session("someone-else"))
    assert ainfo.value.transition_type == "CLOSE_SESSION"  # type: ignore[attr-defined]
    assert conv.snapshot().is_closed is False

    assert conv.apply(TransitionBatch().close_session("c")).closed is True


def test_execute_tool_records_a_pending_request(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c")
    record = conv.apply(
        TransitionBatch().execute_tool("search", {"q": "figures"}, request_id="req-1").execute_tool("ls")
    )
    pending = conv.snapshot().pending_tool_requests
    assert set(pending) == {"req-1", *(r["request_id"] for r in record.tool_requests)}
    assert len(pending) == 2
    assert pending["req-1"] == {
        "request_id": "req-1",
        "tool_name": "search",
        "arguments": {"q": "figures"},
        "version": 1,
    }
    assert [r["tool_name"] for r in record.tool_requests] == ["search", "ls"]
    assert conv.snapshot().message_count == 0


def test_tool_result_clears_its_pending_request(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c")
    conv.apply(
        TransitionBatch()
        .execute_tool("search", {"q": 1}, request_id="r1")
        .execute_tool("ls", {}, request_id="r2")
    )
    record = conv.apply(TransitionBatch().tool_result("search", {"hits": [1, 2]}, request_id="r1"))
    assert record.committed
    snap = conv.snapshot()
    assert set(snap.pending_tool_requests) == {"r2"}
    assert snap.messages == (
        {
            "role": "tool",
            "tool_name": "search",
            "content": {"hits": (1, 2)},
            "request_id": "r1",
            "error": None,
        },
    )

    conv.apply(TransitionBatch().tool_result("ls", None, request_id="r2", error="permission denied"))
    snap = conv.snapshot()
    assert snap.pending_tool_requests == {}
    assert snap.messages[-1]["error"] == "permission denied"
    assert snap.message_count == 2


def test_batch_nesting_is_flattened(manager: GlobalStateManager) -> None:
    a = StateTransition(T.UPDATE_STATE, {"key": "a", "value": 1})
    b = StateTransition(T.ADD_MESSAGE, {"message": "m"})
    c = StateTransition(T.UPDATE_STATE, {"key": "c", "value": 3})
    inner = StateTransition(T.BATCH, {"transitions": [b, c]})
    outer = StateTransition(T.BATCH, {"transitions": TransitionBatch([a, inner])})
    assert list(outer.flatten()) == [a, b, c]
    batch = TransitionBatch([outer]).update_stage("s")
    assert batch.freeze() == (a, b, c, batch.transitions[1])

    conv = manager.get_conversation_state("c")
    record = conv.apply(batch)
    assert record.version == 1
    assert all(t.transition_type is not T.BATCH for t in record.transitions)
    assert len(record.transitions) == 4
    snap = conv.snapshot()
    assert snap.state == {"a": 1, "c": 3}
    assert snap.messages == ("m",)
    assert snap.conversation_stage == "s"

    with pytest.raises(TransitionValidationError, match=r"BATCH.*transitions"):
        StateTransition(T.BATCH, {"transitions": [{"key": "a"}]})
    with pytest.raises(TransitionValidationError, match=r"BATCH.*scope"):
        StateTransition(T.BATCH, {"transitions": [a], "scope": "team"})


@pytest.mark.parametrize("scope", ["sessions", "Session", "GLOBAL", "conversations", "", "nolevel:t", 5])
def test_invalid_scope_strings_are_rejected(scope: Any) -> None:
    with pytest.raises(TransitionValidationError) as info:
        StateTransition(T.UPDATE_STATE, {"key": "k", "value": 1, "scope": scope})
    assert info.value.field == "scope"
    assert info.value.transition_type == "UPDATE_STATE"
    with pytest.raises(TransitionValidationError):
        TransitionBatch().delete_state("k", scope=scope)
    with pytest.raises(TransitionValidationError):
        ScopeRef(scope, "x")


@pytest.mark.parametrize("scope", ["global", "team", "workflow", "conversation", StateScope.WORKFLOW])
def test_valid_scope_strings_are_normalised(scope: Any) -> None:
    t = StateTransition(T.DELETE_STATE, {"key": "k", "scope": scope})
    assert t.scope is StateScope(scope)
    assert t.data["scope"] == str(scope)


# (type, data, the field the error must name)
_INVALID: list[tuple[TransitionType, dict[str, Any], str]] = [
    (T.ADD_MESSAGE, {}, "message"),
    (T.ADD_MESSAGE, {"message": object()}, "message"),
    (T.ADD_MESSAGES, {}, "messages"),
    (T.ADD_MESSAGES, {"messages": {"a": 1}}, "messages"),
    (T.UPDATE_STATE, {"key": "k"}, "value"),
    (T.UPDATE_STATE, {"key": "", "value": 1}, "key"),
    (T.UPDATE_STATE, {"key": "k", "value": {1, 2}}, "value"),
    (T.UPDATE_STATE, {"key": "k", "value": 1, "extra": 2}, "extra"),
    (T.DELETE_STATE, {}, "key"),
    (T.DELETE_STATE, {"key": None}, "key"),
    (T.DELETE_STATE, {"key": "k", "value": 1}, "value"),
    (T.CREATE_SESSION, {"session_id": ""}, "session_id"),
    (T.CREATE_SESSION, {"session_id": 7}, "session_id"),
    (T.CREATE_SESSION, {"metadata": {1: "x"}}, "metadata"),
    (T.CREATE_SESSION, {"owner": "x"}, "owner"),
    (T.CLOSE_SESSION, {"session_id": ""}, "session_id"),
    (T.CLOSE_SESSION, {"why": "x"}, "why"),
    (T.EXECUTE_TOOL, {"tool_name": "t"}, "arguments"),
    (T.EXECUTE_TOOL, {"tool_name": "", "arguments": {}}, "tool_name"),
    (T.EXECUTE_TOOL, {"tool_name": "t", "arguments": {}, "request_id": ""}, "request_id"),
    (T.TOOL_RESULT, {"tool_name": "t"}, "result"),
    (T.TOOL_RESULT, {"result": 1}, "tool_name"),
    (T.TOOL_RESULT, {"tool_name": "t", "result": 1, "error": 5}, "error"),
    (T.TOOL_RESULT, {"tool_name": "t", "result": object()}, "result"),
    (T.UPDATE_CAPABILITY, {}, "capability"),
    (T.UPDATE_CAPABILITY, {"capability": ""}, "capability"),
    (T.UPDATE_CAPABILITY, {"capability": "c", "value": {1}}, "value"),
    (T.UPDATE_STAGE, {}, "stage"),
    (T.UPDATE_STAGE, {"stage": 3}, "stage"),
    (T.UPDATE_STAGE, {"stage": "s", "scope": "nowhere"}, "scope"),
    (T.BATCH, {}, "transitions"),
    (T.BATCH, {"transitions": "abc"}, "transitions"),
]


@pytest.mark.parametrize(
    ("ttype", "data", "field"), _INVALID, ids=[f"{t.name}-{f}-{i}" for i, (t, _, f) in enumerate(_INVALID)]
)
def test_creation_validation_every_type(ttype: TransitionType, data: dict[str, Any], field: str) -> None:
    with pytest.raises(TransitionValidationError) as info:
        StateTransition(ttype, data)
    err = info.value
    assert isinstance(err, ValueError)
    assert isinstance(err, VictorActorsError)
    assert err.transition_type == ttype.name
    assert err.field == field
    assert ttype.name in str(err)
    assert repr(field) in str(err)


def test_every_transition_type_has_a_valid_form() -> None:
    valid: dict[TransitionType, dict[str, Any]] = {
        T.ADD_MESSAGE: {"message": "m"},
        T.ADD_MESSAGES: {"messages": ["m"]},
        T.UPDATE_STATE: {"key": "k", "value": None},
        T.DELETE_STATE: {"key": "k"},
        T.CREATE_SESSION: {},
        T.CLOSE_SESSION: {},
        T.EXECUTE_TOOL: {"tool_name": "t", "arguments": {}},
        T.TOOL_RESULT: {"tool_name": "t", "result": None},
        T.UPDATE_CAPABILITY: {"capability": "c"},
        T.UPDATE_STAGE: {"stage": "s"},
        T.BATCH: {"transitions": []},
    }
    assert set(valid) == set(TransitionType)
    for ttype, data in valid.items():
        t = StateTransition(ttype.value, data)  # the string value is accepted too
        assert t.transition_type is ttype
        assert t == StateTransition(ttype, data)
    assert StateTransition(T.UPDATE_CAPABILITY, {"capability": "c"}).data["value"] is True
    with pytest.raises(TransitionValidationError, match="unknown transition type") as info:
        StateTransition("tool_call", {})
    assert info.value.field == "transition_type"
    with pytest.raises(TransitionValidationError, match="data must be a mapping"):
        StateTransition(T.UPDATE_STATE, [("key", "k"), ("value", 1)])  # type: ignore[arg-type]


def test_transition_is_immutable() -> None:
    t = StateTransition(T.UPDATE_STATE, {"key": "k", "value": [1, {"a": 2}]}, metadata={"by": "agent"})
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        t.data = FrozenDict({})  # type: ignore[misc]
    with pytest.raises(TypeError):
        t.data["key"] = "other"  # type: ignore[index]
    with pytest.raises(TypeError):
        t.metadata["by"] = "someone"  # type: ignore[index]
    assert t.data["value"] == (1, {"a": 2})
    assert hash(t) == hash(
        StateTransition(T.UPDATE_STATE, {"key": "k", "value": (1, {"a": 2})}, {"by": "agent"})
    )
