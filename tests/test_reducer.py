"""The pure reducer, called directly: no manager, no actors, no clock."""

from __future__ import annotations

import threading
from typing import Any

import immutables
import pytest

from victor_actors import (
    ScopeAccessError,
    ScopeClosedError,
    ScopeRef,
    StateChanged,
    StateScope,
    StateTransition,
    TransitionBatch,
    TransitionType,
    TransitionValidationError,
)
from victor_actors.lowlevel import KeyChange, ScopeState, reduce

GLOBAL = ScopeRef(StateScope.GLOBAL, "global")
TEAM = ScopeRef(StateScope.TEAM, "t1")
CONV = ScopeRef(StateScope.CONVERSATION, "c1")


def _conv(**fields: Any) -> ScopeState:
    """A conversation under team t1 under global."""
    return ScopeState(ref=CONV, lineage=(TEAM, GLOBAL), **fields)


def _run(state: ScopeState, batch: TransitionBatch, commit_id: str = "c") -> tuple[ScopeState, StateChanged]:
    return reduce(state, batch.freeze(), commit_id=commit_id)


def _fields(state: ScopeState) -> tuple[Any, ...]:
    """Everything a state holds, as plain values, for before/after comparisons."""
    return (
        state.ref,
        state.lineage,
        state.version,
        dict(state.values.items()),
        tuple(state.messages),
        dict(state.capabilities.items()),
        state.stage,
        state.closed,
        dict(state.pending_tools.items()),
        dict(state.sessions.items()),
    )


def test_reduce_needs_no_runtime_and_starts_no_threads() -> None:
    threads = set(threading.enumerate())
    state, record = reduce(
        _conv(),
        TransitionBatch().update_state("k", 1).freeze(),
        commit_id="commit-7",
        run_id="run-3",
        timestamp=12.5,
    )
    assert set(threading.enumerate()) == threads
    assert state.values == immutables.Map({"k": 1})
    # Everything that varies comes in as arguments and goes out unchanged.
    assert record.commit_id == "commit-7"
    assert record.run_id == "run-3"
    assert record.timestamp == 12.5
    assert record.ref == CONV


def test_defaults_of_an_empty_state() -> None:
    state = _conv()
    assert state.version == 0
    assert state.parent == TEAM
    assert state.stage == "initial"
    assert state.closed is False
    assert len(state.messages) == 0
    assert ScopeState(ref=GLOBAL).parent is None


def test_input_state_is_unchanged_after_success() -> None:
    base, _ = _run(_conv(), TransitionBatch().update_state("a", 1).add_message("m0").update_capability("c"))
    before = _fields(base)
    new, record = _run(
        base,
        TransitionBatch()
        .update_state("a", 2)
        .update_state("b", [1])
        .delete_state("a")
        .add_messages(["m1", "m2"])
        .update_capability("c", False)
        .update_stage("planning")
        .execute_tool("search", {"q": 1}, request_id="r")
        .create_session("s"),
    )
    assert record.committed
    assert _fields(base) == before
    assert new is not base
    assert new.version == base.version + 1
    assert tuple(new.messages) == ("m0", "m1", "m2")
    assert tuple(base.messages) == ("m0",)


@pytest.mark.parametrize(
    "bad",
    [
        TransitionBatch().update_state("t", 1, scope="team"),
        TransitionBatch().update_state("w", 1, scope="workflow"),
        TransitionBatch().execute_tool("x", {}, request_id="r1"),
        TransitionBatch().create_session("s1"),
        TransitionBatch().close_session("other"),
        TransitionBatch().close_session().update_state("after", 1),
    ],
    ids=["ancestor", "unknown", "dup-tool", "dup-session", "close-other", "after-close"],
)
def test_input_state_is_unchanged_after_failure(bad: TransitionBatch) -> None:
    base, _ = _run(
        _conv(),
        TransitionBatch()
        .update_state("a", 1)
        .add_message("m")
        .execute_tool("x", {}, request_id="r1")
        .create_session("s1"),
    )
    before = _fields(base)
    prefix = TransitionBatch().update_state("a", 2).delete_state("a").add_message("n").update_stage("z")
    with pytest.raises((ScopeAccessError, ScopeClosedError, TransitionValidationError)) as info:
        _run(base, prefix.extend(bad))
    assert _fields(base) == before
    assert info.value.index >= 4  # type: ignore[attr-defined]
    assert "nothing was applied" in str(info.value)


def test_version_increases_by_one_per_commit() -> None:
    state = _conv()
    versions = []
    for i in range(5):
        new, record = _run(state, TransitionBatch().update_state("n", i).add_message(str(i)))
        assert (record.old_version, record.new_version) == (state.version, state.version + 1)
        assert record.version == new.version
        versions.append(new.version)
        state = new
    assert versions == [1, 2, 3, 4, 5]
    # Several transitions in one batch still make one commit.
    new, _ = _run(state, TransitionBatch().update_state("a", 1).update_state("b", 2).add_message("x"))
    assert new.version == 6


def test_empty_batch_is_a_noop() -> None:
    state = _conv(version=3)
    new, record = reduce(state, (), commit_id="c")
    assert new is state
    assert record.committed is False
    assert record.old_version == record.new_version == 3
    assert record.transitions == ()
    assert record.changes == ()


@pytest.mark.parametrize(
    "batch",
    [
        TransitionBatch().delete_state("missing"),
        TransitionBatch().delete_state("missing").delete_state("also-missing"),
        TransitionBatch().update_state("temp", 1).delete_state("temp"),
    ],
    ids=["delete-missing", "two-deletes", "set-then-delete"],
)
def test_batches_that_change_nothing_are_noops(batch: TransitionBatch) -> None:
    state, _ = _run(_conv(), TransitionBatch().update_state("kept", 1))
    new, record = _run(state, batch)
    assert new is state
    assert record.committed is False
    assert record.new_version == record.old_version == 1
    assert record.changes == ()


def test_delete_is_distinguishable_from_set_to_none() -> None:
    state, _ = _run(_conv(), TransitionBatch().update_state("a", 1).update_state("b", 2))
    new, record = _run(state, TransitionBatch().update_state("a", None).delete_state("b"))
    by_key = {c.key: c for c in record.changes}
    assert by_key["a"] == KeyChange("a", 1, None, old_present=True, new_present=True)
    assert by_key["b"] == KeyChange("b", 2, None, old_present=True, new_present=False)
    assert by_key["a"].is_delete is False
    assert by_key["b"].is_delete is True
    assert "a" in new.values and new.values["a"] is None
    assert "b" not in new.values


def test_changes_list_old_and_new_values() -> None:
    state, first = _run(_conv(), TransitionBatch().update_state("a", 1))
    assert first.changes == (KeyChange("a", None, 1, False, True),)
    new, record = _run(
        state,
        TransitionBatch()
        .update_state("a", 2)
        .update_state("a", 3)  # several writes to one key: one change, first old to last new
        .update_state("b", {"x": [1]})
        .delete_state("nope"),  # a missing key deleted is not a change
    )
    assert record.changes == (
        KeyChange("a", 1, 3, True, True),
        KeyChange("b", None, {"x": (1,)}, False, True),
    )
    assert record.changed_keys == ("a", "b")
    assert record.old_version == 1
    assert dict(new.values.items()) == {"a": 3, "b": {"x": (1,)}}


def test_capability_and_stage_changes_are_recorded() -> None:
    state, _ = _run(_conv(), TransitionBatch().update_capability("fast", True))
    new, record = _run(state, TransitionBatch().update_capability("fast", False).update_capability("new", 5))
    assert record.capability_changes == (
        KeyChange("fast", True, False, True, True),
        KeyChange("new", None, 5, False, True),
    )
    assert record.old_stage is None and record.new_stage is None  # no stage change
    _, staged = _run(new, TransitionBatch().update_stage("a").update_stage("b"))
    assert (staged.old_stage, staged.new_stage) == ("initial", "b")


def test_record_lists_the_transitions_and_what_they_added() -> None:
    batch = TransitionBatch().add_message("m").add_messages(["n", "o"]).execute_tool("t", {}, request_id="r")
    batch.create_session("s")
    transitions = batch.freeze()
    _, record = reduce(_conv(), transitions, commit_id="c")
    assert record.transitions == transitions
    assert record.added_messages == ("m", "n", "o")
    assert [r["request_id"] for r in record.tool_requests] == ["r"]
    assert record.sessions_created == ("s",)
    assert record.closed is False


@pytest.mark.parametrize(
    ("scope", "text"),
    [("team", "ancestor"), ("global", "ancestor"), ("workflow", "neither")],
)
def test_targeting_another_scope_is_an_access_error(scope: str, text: str) -> None:
    batch = TransitionBatch().update_state("a", 1).add_message("m").delete_state("k", scope=scope)
    with pytest.raises(ScopeAccessError, match=text) as info:
        _run(_conv(), batch)
    assert info.value.index == 2  # type: ignore[attr-defined]
    assert info.value.transition_type == "DELETE_STATE"  # type: ignore[attr-defined]


def test_global_scope_has_no_ancestors_to_target() -> None:
    glob = ScopeState(ref=GLOBAL)
    with pytest.raises(ScopeAccessError) as info:
        _run(glob, TransitionBatch().update_state("a", 1, scope="team"))
    assert info.value.index == 0  # type: ignore[attr-defined]
    new, _ = _run(glob, TransitionBatch().update_state("a", 1, scope="global"))
    assert new.values["a"] == 1


def test_targeting_its_own_scope_explicitly_is_allowed() -> None:
    new, record = _run(_conv(), TransitionBatch().update_state("a", 1, scope="conversation"))
    assert record.committed
    assert new.values["a"] == 1
    team = ScopeState(ref=TEAM, lineage=(GLOBAL,))
    new, _ = _run(team, TransitionBatch().add_message("m", scope="team"))
    assert tuple(new.messages) == ("m",)


def test_closed_scope_rejects_batches() -> None:
    state, record = _run(_conv(), TransitionBatch().update_state("a", 1).close_session())
    assert record.closed is True
    assert state.closed is True
    for batch in (TransitionBatch().update_state("a", 2), TransitionBatch().delete_state("missing")):
        with pytest.raises(ScopeClosedError, match="closed"):
            _run(state, batch)
    assert state.values["a"] == 1
    assert state.version == 1


def test_closing_a_scope_by_its_own_id_and_not_another() -> None:
    new, _ = _run(_conv(), TransitionBatch().close_session("c1"))
    assert new.closed is True
    with pytest.raises(ScopeAccessError, match="closes only itself") as info:
        _run(_conv(), TransitionBatch().close_session("c2"))
    assert info.value.transition_type == "CLOSE_SESSION"  # type: ignore[attr-defined]


def test_nothing_may_follow_close_in_the_same_batch() -> None:
    with pytest.raises(ScopeClosedError) as info:
        _run(_conv(), TransitionBatch().close_session().add_message("late"))
    assert info.value.index == 1  # type: ignore[attr-defined]
    assert info.value.transition_type == "ADD_MESSAGE"  # type: ignore[attr-defined]


def test_duplicate_tool_request_id_is_rejected() -> None:
    state, _ = _run(_conv(), TransitionBatch().execute_tool("search", {"q": 1}, request_id="r1"))
    assert set(state.pending_tools) == {"r1"}
    with pytest.raises(TransitionValidationError, match="r1") as info:
        _run(state, TransitionBatch().update_state("a", 1).execute_tool("ls", {}, request_id="r1"))
    assert info.value.index == 1
    assert info.value.transition_type == "EXECUTE_TOOL"
    # Within one batch too.
    with pytest.raises(TransitionValidationError) as info:
        _run(
            _conv(),
            TransitionBatch().execute_tool("a", {}, request_id="x").execute_tool("b", {}, request_id="x"),
        )
    assert info.value.index == 1
    # Once its result is in, the id may be used again.
    done, _ = _run(state, TransitionBatch().tool_result("search", "ok", request_id="r1"))
    again, _ = _run(done, TransitionBatch().execute_tool("search", {"q": 2}, request_id="r1"))
    assert again.pending_tools["r1"]["arguments"] == {"q": 2}


def test_tool_result_clears_pending_and_adds_a_tool_message() -> None:
    state, record = _run(_conv(), TransitionBatch().execute_tool("search", {}).execute_tool("ls", {}))
    generated = [r["request_id"] for r in record.tool_requests]
    assert len(set(generated)) == 2
    assert set(state.pending_tools) == set(generated)
    new, result = _run(state, TransitionBatch().tool_result("search", [1], request_id=generated[0]))
    assert set(new.pending_tools) == {generated[1]}
    assert result.added_messages == (
        {"role": "tool", "tool_name": "search", "content": (1,), "request_id": generated[0], "error": None},
    )
    # A result for no pending request (answered already, or never asked) is refused: at most once.
    for stale in ("unknown", generated[0]):
        with pytest.raises(TransitionValidationError, match="no pending tool request") as info:
            _run(new, TransitionBatch().tool_result("ls", "x", request_id=stale))
        assert info.value.transition_type == "TOOL_RESULT"
    # Without a request id it is a plain tool message, as in Victor's state-passed model.
    other, plain = _run(new, TransitionBatch().tool_result("ls", "x"))
    assert plain.committed
    assert set(other.pending_tools) == {generated[1]}
    assert len(other.messages) == 2


def test_duplicate_session_id_is_rejected() -> None:
    state, _ = _run(_conv(), TransitionBatch().create_session("s1"))
    with pytest.raises(TransitionValidationError, match="s1") as info:
        _run(state, TransitionBatch().create_session("s1"))
    assert info.value.transition_type == "CREATE_SESSION"
    with pytest.raises(TransitionValidationError) as info:
        _run(_conv(), TransitionBatch().create_session("s2").create_session("s2"))
    assert info.value.index == 1


def test_unflattened_batch_transition_is_rejected() -> None:
    inner = StateTransition(TransitionType.BATCH, {"transitions": TransitionBatch().update_state("a", 1)})
    with pytest.raises(TransitionValidationError) as info:
        reduce(_conv(), (StateTransition(TransitionType.ADD_MESSAGE, {"message": "m"}), inner), commit_id="c")
    assert info.value.index == 1
    assert info.value.transition_type == "BATCH"
    new, _ = reduce(_conv(), tuple(inner.flatten()), commit_id="c")
    assert new.values["a"] == 1


def test_reduce_is_deterministic() -> None:
    base, _ = _run(_conv(), TransitionBatch().update_state("a", 1).add_message("m"))
    batch = (
        TransitionBatch()
        .update_state("a", 2)
        .delete_state("zzz")
        .add_messages([{"role": "user", "content": "hi"}])
        .update_capability("c", [1, 2])
        .update_stage("s")
        .execute_tool("t", {"x": 1})  # generated request id
        .create_session()  # generated session id
        .tool_result("t", "r")
    ).freeze()
    first = reduce(base, batch, commit_id="id", run_id="run", timestamp=1.0)
    second = reduce(base, batch, commit_id="id", run_id="run", timestamp=1.0)
    assert first == second
    assert _fields(first[0]) == _fields(second[0])
    assert first[1].tool_requests == second[1].tool_requests
    assert first[1].sessions_created == second[1].sessions_created
    # Different commit ids change only the record.
    third = reduce(base, batch, commit_id="other", run_id="run", timestamp=1.0)
    assert third[0] == first[0]
    assert third[1].commit_id == "other"
