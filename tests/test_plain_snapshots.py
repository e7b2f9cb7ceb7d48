"""ContextSnapshot built by hand from the seed's fields, and how it relates to one taken from a scope.

The state-passed document's testing story: a coordinator is unit-tested with a snapshot made
directly (``ContextSnapshot(messages=..., session_id=..., ...)``), no manager and no mock. Before
issue 25 a snapshot could only be taken from a live scope, and every test here failed at its first
line (``ContextSnapshot()`` took a ScopeState).
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from victor_actors import (
    ContextSnapshot,
    GlobalStateManager,
    TransitionBatch,
    TransitionValidationError,
    create_snapshot,
    thaw,
)
from victor_actors.lowlevel import FrozenDict


class Settings:
    """An orchestrator's settings object: held as it is, never copied."""

    tool_budget = 10


SEED_FIELDS: dict[str, Any] = dict(
    messages=({"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}),
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


def test_the_seeds_snapshot_construction() -> None:
    snapshot = ContextSnapshot(**SEED_FIELDS)
    assert snapshot.message_count == 2
    assert snapshot.session_id == "test" and snapshot.conversation_stage == "initial"
    assert snapshot.settings is SEED_FIELDS["settings"]
    assert (snapshot.model, snapshot.provider, snapshot.max_tokens, snapshot.temperature) == (
        "test",
        "test",
        4096,
        0.7,
    )
    assert snapshot.conversation_state == {} and snapshot.session_state == {}
    assert snapshot.observed_files == () and snapshot.capabilities == {}
    assert snapshot.is_complete is False and snapshot.version == 0 and snapshot.ancestors == ()
    assert snapshot.messages == SEED_FIELDS["messages"]


def test_frozen_and_copied_on_construction() -> None:
    messages = [{"role": "user", "content": "hi"}]
    conversation_state = {"plan": ["a", "b"], "nested": {"k": 1}}
    capabilities = {"planning_mode": True}
    files = ["src/a.py"]
    snapshot = ContextSnapshot(
        messages=messages,
        session_id="s",
        conversation_state=conversation_state,
        session_state={"team": "red"},
        capabilities=capabilities,
        observed_files=files,
    )
    messages.append({"role": "user", "content": "later"})
    messages[0]["content"] = "changed"
    conversation_state["plan"].append("c")
    conversation_state["new"] = 1
    capabilities["planning_mode"] = False
    files.append("src/b.py")

    assert snapshot.message_count == 1 and snapshot.messages[0]["content"] == "hi"
    assert snapshot.get_state("plan") == ("a", "b") and snapshot.get_state("new") is None
    assert snapshot.has_capability("planning_mode") and snapshot.observed_files == ("src/a.py",)
    assert isinstance(snapshot.observed_files, tuple) and isinstance(snapshot.messages[0], FrozenDict)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        snapshot.session_id = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        snapshot.conversation_state["plan"] = ()  # type: ignore[index]
    with pytest.raises(TypeError):
        snapshot.get_state("nested")["k"] = 2
    # thaw gives a plain, mutable copy
    plain = thaw(snapshot.get_state("nested"))
    plain["k"] = 2
    assert plain == {"k": 2} and snapshot.get_state("nested") == {"k": 1}


def test_get_state_reads_the_conversation_first_then_the_session() -> None:
    snapshot = ContextSnapshot(
        session_id="s",
        conversation_state={"key": "conversation", "none": None},
        session_state={"key": "session", "only_session": 1, "none": "session"},
    )
    assert snapshot.get_state("key") == "conversation"
    assert snapshot.get_state("only_session") == 1
    assert snapshot.get_state("none", "default") is None  # an own None still shadows
    assert snapshot.get_state("missing", default="d") == "d"
    assert snapshot.get_state("missing") is None


def test_is_complete_and_capabilities() -> None:
    assert ContextSnapshot(session_id="s", conversation_stage="complete").is_complete
    assert not ContextSnapshot(session_id="s", conversation_stage="planning").is_complete
    snapshot = ContextSnapshot(session_id="s", capabilities={"a": 1, "b": 0})
    assert snapshot.has_capability("a") and not snapshot.has_capability("b")
    assert not snapshot.has_capability("c") and snapshot.get_capability_value("a") == 1


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({}, "session_id"),
        ({"session_id": ""}, "session_id"),
        ({"session_id": 7}, "session_id"),
        ({"session_id": "s", "messages": "not a sequence of messages"}, "messages"),
        ({"session_id": "s", "messages": {"role": "user"}}, "messages"),
        ({"session_id": "s", "conversation_stage": ""}, "conversation_stage"),
        ({"session_id": "s", "conversation_state": [("k", 1)]}, "conversation_state"),
        ({"session_id": "s", "session_state": {3: "x"}}, "session_state"),
        ({"session_id": "s", "capabilities": {1: True}}, "capabilities"),
        ({"session_id": "s", "observed_files": "a.py"}, "observed_files"),
        ({"session_id": "s", "observed_files": [3]}, "observed_files"),
        ({"session_id": "s", "model": 3}, "model"),
        ({"session_id": "s", "max_tokens": "4096"}, "max_tokens"),
        ({"session_id": "s", "max_tokens": True}, "max_tokens"),
        ({"session_id": "s", "temperature": "hot"}, "temperature"),
    ],
)
def test_bad_fields_are_refused_naming_the_field(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(TransitionValidationError, match=f"field '{field}'") as info:
        ContextSnapshot(**fields)
    assert info.value.field == field
    assert "no snapshot was made" in str(info.value)


def test_what_the_store_could_not_hold_is_held_as_it_is_in_read_only_containers() -> None:
    """Victor's own tests build snapshots of mocks and provider message objects: they are kept."""
    from types import MappingProxyType
    from unittest.mock import MagicMock

    mock, provider_message = MagicMock(), Settings()
    nested = {"role": "tool", "content": [provider_message], "meta": {"k": 1}}
    snapshot = ContextSnapshot(
        messages=(mock, provider_message, nested),
        session_id="s",
        settings=mock,
        conversation_state={"client": mock, "ids": {1, 2}},
    )
    nested["content"].append("later")
    assert snapshot.message_count == 3
    assert snapshot.messages[0] is mock and snapshot.messages[1] is provider_message
    held = snapshot.messages[2]
    assert isinstance(held, MappingProxyType) and held["content"] == (provider_message,)
    assert held["meta"] == {"k": 1} and isinstance(held["meta"], FrozenDict)
    assert snapshot.get_state("client") is mock and snapshot.get_state("ids") == frozenset({1, 2})
    # such a value still cannot enter a scope: it is refused when a transition is made
    with pytest.raises(TransitionValidationError):
        TransitionBatch().add_message(held)


def test_unknown_fields_and_positional_fields_are_type_errors() -> None:
    with pytest.raises(TypeError, match="unknown field"):
        ContextSnapshot(session_id="s", mesages=())  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="by keyword"):
        ContextSnapshot((), "s")  # type: ignore[call-overload]


def test_a_snapshot_from_a_scope_is_the_same_class_with_the_same_reads(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("s", workflow_id="wf", team_id="t")
    manager.get_team_state("t").update({"key": "team", "only_team": 1})
    manager.get_workflow_state("wf").update({"key": "workflow"})
    conv.apply(
        TransitionBatch()
        .add_message({"role": "user", "content": "hi"})
        .update_state("own", 1)
        .update_capability("planning_mode")
        .update_stage("planning")
    )
    taken = conv.snapshot()
    built = ContextSnapshot(
        messages=({"role": "user", "content": "hi"},),
        session_id="s",
        conversation_stage="planning",
        conversation_state={"own": 1},
        session_state={"key": "workflow", "only_team": 1},
        capabilities={"planning_mode": True},
    )
    assert type(taken) is type(built) is ContextSnapshot
    for name in ("own", "key", "only_team", "missing"):
        assert taken.get_state(name) == built.get_state(name)
    assert taken.conversation_state == taken.state == built.conversation_state
    assert dict(taken.session_state) == dict(built.session_state) == {"key": "workflow", "only_team": 1}
    assert taken.messages == built.messages and taken.message_count == built.message_count
    assert (taken.conversation_stage, taken.has_capability("planning_mode")) == ("planning", True)
    # what only a taken snapshot has: a version, ancestors; the orchestrator's fields are unknown
    assert taken.version == 1 and len(taken.ancestors) == 3 and built.version == 0
    assert (taken.settings, taken.model, taken.max_tokens, taken.observed_files) == (None, None, None, ())


class PlainOrchestrator:
    """An orchestrator that is not on a manager yet: the seed's attributes, plain Python objects."""

    def __init__(self) -> None:
        self.session_id = "plain-1"
        self.messages = [{"role": "user", "content": "hi"}]
        self.conversation_stage = "planning"
        self.conversation_state: dict[str, Any] = {"plan": ["a"]}
        self.session_state: dict[str, Any] = {"team": "red"}
        self._capabilities = {"planning_mode": True}
        self.observed_files = ["src/a.py"]
        self.settings = Settings()
        self.model = "m"
        self.provider_name = "p"
        self.max_tokens = 1024
        self.temperature = 0.2


def test_create_snapshot_copies_a_plain_orchestrator() -> None:
    orchestrator = PlainOrchestrator()
    snapshot = create_snapshot(orchestrator)
    orchestrator.messages.append({"role": "assistant", "content": "later"})
    orchestrator.conversation_state["plan"].append("b")
    orchestrator.session_state["team"] = "blue"
    assert snapshot.session_id == "plain-1" and snapshot.message_count == 1
    assert snapshot.get_state("plan") == ("a",) and snapshot.get_state("team") == "red"
    assert snapshot.has_capability("planning_mode") and snapshot.conversation_stage == "planning"
    assert (snapshot.model, snapshot.provider, snapshot.max_tokens, snapshot.temperature) == (
        "m",
        "p",
        1024,
        0.2,
    )
    assert snapshot.settings is orchestrator.settings and snapshot.observed_files == ("src/a.py",)


def test_create_snapshot_refuses_what_it_cannot_read() -> None:
    with pytest.raises(TypeError, match="session_id"):
        create_snapshot(object())
    orchestrator = PlainOrchestrator()
    orchestrator.conversation_state = {7: "a key that is not a str"}
    with pytest.raises(TransitionValidationError) as info:
        create_snapshot(orchestrator)
    assert info.value.field == "conversation_state"
