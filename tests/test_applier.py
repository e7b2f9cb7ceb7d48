"""TransitionApplier and create_snapshot (the state-passed document's components 5 and 6).

Each transition type is applied through the applier, on each kind of target (a handle, a manager
and a session id, a host), through ``await apply`` and through the blocking twins (the ``mode``
fixture). UPDATE_STATE's ``scope`` routes into that scope of the conversation's chain, atomically
across scopes: a batch that fails anywhere leaves every scope as it was. Before issue 25 neither
name existed and the seed's ``"session"`` scope was refused when a transition was made.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from victor_actors import (
    ContextSnapshot,
    CoordinatorResult,
    GlobalStateManager,
    ScopeAccessError,
    ScopeClosedError,
    ScopeRef,
    StateChanged,
    StateTransition,
    TransitionApplier,
    TransitionBatch,
    TransitionType,
    TransitionValidationError,
    create_snapshot,
)

T = TransitionType


class Host:
    """An orchestrator keeping its conversation in a manager (``state_manager`` and ``session_id``)."""

    def __init__(self, manager: GlobalStateManager, session_id: str, **where: str) -> None:
        self.state_manager = manager
        self.session_id = session_id
        for name, value in where.items():
            setattr(self, name, value)
        self.model = "m"
        self.observed_files = ["a.py"]


Apply = Callable[[TransitionApplier, Any], StateChanged]


@pytest.fixture(params=["asyncio", "sync"])
def mode(request: pytest.FixtureRequest) -> Apply:
    """Apply one transition or a batch, through ``await apply(_batch)`` or their blocking twins."""

    def run(applier: TransitionApplier, what: Any) -> StateChanged:
        one = isinstance(what, StateTransition)
        if request.param == "sync":
            return applier.apply_sync(what) if one else applier.apply_batch_sync(what)
        return asyncio.run(applier.apply(what) if one else applier.apply_batch(what))

    return run


@pytest.fixture(params=["handle", "manager", "host"])
def target(request: pytest.FixtureRequest, manager: GlobalStateManager) -> Any:
    """The conversation ``c`` under workflow ``wf`` under team ``t``, as each kind of target."""
    conv = manager.get_conversation_state("c", workflow_id="wf", team_id="t")
    if request.param == "handle":
        return (conv,)
    if request.param == "manager":
        return (manager, "c")
    return (Host(manager, "c", workflow_id="wf", team_id="t"),)


def _t(ttype: TransitionType, **data: Any) -> StateTransition:
    return StateTransition(ttype, data)


def test_add_message_and_add_messages(manager: GlobalStateManager, target: Any, mode: Apply) -> None:
    applier = TransitionApplier(*target)
    mode(applier, _t(T.ADD_MESSAGE, message={"role": "user", "content": "hi"}))
    record = mode(applier, _t(T.ADD_MESSAGES, messages=["a", "b"]))
    assert record.added_messages == ("a", "b") and record.first_message_index == 1
    assert manager.get_conversation_state("c").snapshot().messages == (
        {"role": "user", "content": "hi"},
        "a",
        "b",
    )


@pytest.mark.parametrize(
    ("scope", "where"),
    [
        (None, "conversation:c"),
        ("conversation", "conversation:c"),
        ("session", "workflow:wf"),
        ("workflow", "workflow:wf"),
        ("team", "team:t"),
        ("global", "global:global"),
        ("team:t", "team:t"),
    ],
)
def test_update_and_delete_state_route_by_scope(
    manager: GlobalStateManager, target: Any, mode: Apply, scope: str | None, where: str
) -> None:
    applier = TransitionApplier(*target)
    data: dict[str, Any] = {"key": "k", "value": [1, 2]}
    if scope is not None:
        data["scope"] = scope
    record = mode(applier, StateTransition(T.UPDATE_STATE, data))
    written = manager.scope(where)
    assert written.to_dict() == {"k": [1, 2]}
    others = [manager.scope(r) for r in ("conversation:c", "workflow:wf", "team:t", "global:global")]
    assert [h.ref for h in others if h.to_dict()] == [ScopeRef.parse(where)]
    # the record names where it wrote; a "session" write names the workflow, never "session"
    assert ScopeRef.parse(where) in (record.ref, *record.involved)
    assert all(t.data.get("scope") != "session" for r in (record, *record.related) for t in r.transitions)
    del data["value"]
    mode(applier, StateTransition(T.DELETE_STATE, data))
    assert written.to_dict() == {}


def test_session_state_reads_back_through_the_snapshot(manager: GlobalStateManager, target: Any) -> None:
    applier = TransitionApplier(*target)
    applier.apply_batch_sync(
        TransitionBatch().update_state("k", "session", scope="session").update_state("c", 1)
    )
    snapshot = create_snapshot(*target)
    assert snapshot.session_state["k"] == "session" and snapshot.conversation_state == {"c": 1}
    assert snapshot.get_state("k") == "session"


def test_session_scope_under_global_is_refused_and_changes_nothing(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("lone")  # directly under global
    applier = TransitionApplier(conv)
    with pytest.raises(ScopeAccessError, match="directly under global") as info:
        applier.apply_batch_sync(TransitionBatch().update_state("a", 1).update_state("k", 1, scope="session"))
    assert info.value.index == 1
    assert conv.version == 0 and manager.get_global_state().version == 0


def test_a_batch_across_scopes_is_atomic(manager: GlobalStateManager, target: Any, mode: Apply) -> None:
    applier = TransitionApplier(*target)
    ok = (
        TransitionBatch()
        .update_state("c", 1, scope="conversation")
        .update_state("s", 1, scope="session")
        .update_state("t", 1, scope="team")
        .update_state("g", 1, scope="global")
    )
    record = mode(applier, ok)
    assert len({record.commit_id, *(r.commit_id for r in record.related)}) == 1
    assert len(record.involved) == 4
    versions = {
        str(r): manager.scope(r).version for r in ("conversation:c", "workflow:wf", "team:t", "global:global")
    }
    # the last transition cannot apply (a duplicate tool request id): nothing of it anywhere
    bad = (
        TransitionBatch()
        .update_state("c", 2, scope="conversation")
        .update_state("s", 2, scope="session")
        .update_state("g", 2, scope="global")
        .execute_tool("ls", {}, request_id="r1")
        .execute_tool("ls", {}, request_id="r1")
    )
    with pytest.raises(TransitionValidationError, match="already pending"):
        mode(applier, bad)
    assert {str(r): manager.scope(r).version for r in versions} == versions
    assert manager.scope("workflow:wf").get("s") == 1 and manager.get_global_state().get("g") == 1


def test_tools_capabilities_stage(manager: GlobalStateManager, target: Any, mode: Apply) -> None:
    applier = TransitionApplier(*target)
    conv = manager.get_conversation_state("c")
    record = mode(applier, _t(T.EXECUTE_TOOL, tool_name="search", arguments={"q": "x"}, request_id="r1"))
    assert [r["request_id"] for r in record.tool_requests] == ["r1"]
    assert list(conv.snapshot().pending_tool_requests) == ["r1"]
    mode(applier, _t(T.TOOL_RESULT, tool_name="search", result=["hit"], request_id="r1"))
    snap = conv.snapshot()
    assert not snap.pending_tool_requests and snap.messages[-1]["content"] == ("hit",)
    mode(applier, _t(T.UPDATE_CAPABILITY, capability="planning_mode"))
    mode(applier, _t(T.UPDATE_STAGE, stage="planning"))
    snap = conv.snapshot()
    assert snap.has_capability("planning_mode") and snap.conversation_stage == "planning"


def test_sessions_and_nested_batches(manager: GlobalStateManager, target: Any, mode: Apply) -> None:
    applier = TransitionApplier(*target)
    conv = manager.get_conversation_state("c")
    inner = StateTransition(
        T.BATCH, {"transitions": [_t(T.UPDATE_STATE, key="a", value=1), _t(T.ADD_MESSAGE, message="m")]}
    )
    record = mode(applier, inner)
    assert record.version == 1 and conv.snapshot().state == {"a": 1}
    record = mode(applier, _t(T.CREATE_SESSION, session_id="child", metadata={"agent": "reviewer"}))
    assert record.sessions_created == ("child",)
    assert manager.get_conversation_state("child").parent == conv.ref
    record = mode(applier, _t(T.CLOSE_SESSION, reason="done"))
    assert record.closed and conv.snapshot().is_closed
    with pytest.raises(ScopeClosedError):
        mode(applier, _t(T.UPDATE_STATE, key="late", value=1))
    assert conv.get("late") is None


def test_apply_batch_takes_a_coordinator_result_and_apply_takes_one_transition(
    manager: GlobalStateManager,
) -> None:
    applier = TransitionApplier(manager, "c")
    result = CoordinatorResult(TransitionBatch().update_state("a", 1), reasoning="r")
    assert applier.apply_batch_sync(result).version == 1
    assert applier.apply_batch_sync([_t(T.UPDATE_STATE, key="b", value=2)]).version == 2
    with pytest.raises(TransitionValidationError, match="apply takes one StateTransition"):
        applier.apply_sync(TransitionBatch().update_state("c", 3))  # type: ignore[arg-type]
    with pytest.raises(TransitionValidationError):
        asyncio.run(applier.apply_batch("not a batch"))  # type: ignore[arg-type]
    assert manager.get_conversation_state("c").version == 2


def test_a_host_is_read_at_each_call(manager: GlobalStateManager) -> None:
    host = Host(manager, "first")
    applier = TransitionApplier(host)
    applier.apply_batch_sync(TransitionBatch().update_state("n", 1))
    host.session_id = "second"
    applier.apply_batch_sync(TransitionBatch().update_state("n", 2))
    assert manager.get_conversation_state("first").get("n") == 1
    assert manager.get_conversation_state("second").get("n") == 2


def test_create_snapshot_of_each_target(manager: GlobalStateManager, target: Any) -> None:
    TransitionApplier(*target).apply_batch_sync(TransitionBatch().add_message("hi").update_state("k", 1))
    snapshot = create_snapshot(*target)
    assert isinstance(snapshot, ContextSnapshot)
    assert snapshot.ref == ScopeRef("conversation", "c") and snapshot.version == 1
    assert snapshot.messages == ("hi",) and snapshot.conversation_state == {"k": 1}
    if isinstance(target[0], Host):
        assert snapshot.model == "m" and snapshot.observed_files == ("a.py",)
    assert create_snapshot(snapshot) is snapshot


def test_bad_targets_are_refused(manager: GlobalStateManager) -> None:
    for bad in ((object(),), (manager,), (manager.get_conversation_state("c"), "c"), (manager, 7)):
        with pytest.raises(TypeError) as info:
            TransitionApplier(*bad)
        assert isinstance(info.value, ScopeAccessError)  # a NoConversationError: both
        with pytest.raises(ScopeAccessError):
            create_snapshot(*bad)
    assert [str(r) for r in manager.scopes()] == ["global:global", "conversation:c"]


def test_the_applier_and_create_snapshot_with_a_remote_client(tmp_path: Any) -> None:
    import victor_actors

    url = f"unix://{tmp_path}/owner.sock"
    with GlobalStateManager.open(tmp_path / "store", listen=url) as owner:
        owner.get_conversation_state("c", workflow_id="wf")
        with victor_actors.connect(url) as client:
            applier = TransitionApplier(client, "c")
            record = asyncio.run(
                applier.apply_batch(
                    TransitionBatch().update_state("k", 1).update_state("s", 2, scope="session")
                )
            )
            assert record.version == 1
            snapshot = create_snapshot(client.get_conversation_state("c"))
            assert snapshot.conversation_state == {"k": 1} and snapshot.session_state == {"s": 2}
            assert owner.get_workflow_state("wf").get("s") == 2
