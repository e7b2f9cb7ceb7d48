"""Sessions: CREATE_SESSION makes a child conversation, CLOSE_SESSION closes the scope applying it.

Real managers, real actors, real LMDB in temporary directories.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from victor_actors import (
    GlobalStateManager,
    ScopeAccessError,
    ScopeClosedError,
    ScopeHandle,
    ScopeRef,
    StateChanged,
    TransitionBatch,
    TransitionValidationError,
)

# -- CREATE_SESSION -----------------------------------------------------------------


def test_create_session_makes_a_child_conversation(manager: GlobalStateManager) -> None:
    parent = manager.get_conversation_state("p", workflow_id="wf", team_id="t")
    parent.set("persona", "helpful")
    commit = parent.apply(
        TransitionBatch().add_message("spawning a helper").create_session("helper", {"task": "research"})
    )
    assert commit.sessions_created == ("helper",)
    snap = parent.snapshot()
    assert snap.sessions == {"helper": {"task": "research"}}
    assert snap.to_dict()["sessions"] == {"helper": {"task": "research"}}
    # the child exists as soon as apply returns, under the scope that created it
    child = manager.get_conversation_state("helper")
    assert child.parent == parent.ref
    assert manager.scope("conversation:helper") is child
    assert child.snapshot().ancestors == (
        parent.ref,
        ScopeRef("workflow", "wf"),
        ScopeRef("team", "t"),
        ScopeRef("global", "global"),
    )
    assert child.get("persona") == "helpful"  # it reads its parent's state
    assert child.version == 0
    assert child.set("found", 42).version == 1
    assert parent.get("found") is None  # and writes only its own
    # and the child can write its parent in one atomic batch
    both = child.apply(
        TransitionBatch().add_message("done").update_state("helper_done", True, scope="conversation:p")
    )
    assert set(both.involved) == {child.ref, parent.ref}
    assert parent.get("helper_done") is True


def test_a_generated_session_id(manager: GlobalStateManager) -> None:
    parent = manager.get_conversation_state("p")
    parent.set("k", 1)
    commit = parent.apply(TransitionBatch().add_message("m").create_session())
    (sid,) = commit.sessions_created
    assert sid == "p.2.1"  # parent id, version, position in the batch
    assert manager.get_conversation_state(sid).parent == parent.ref
    assert parent.snapshot().sessions == {sid: {}}


def test_several_sessions_in_one_batch_and_nested_sessions(manager: GlobalStateManager) -> None:
    root = manager.get_conversation_state("root", team_id="t")
    root.apply(TransitionBatch().create_session("a").create_session("b"))
    a = manager.get_conversation_state("a")
    a.apply(TransitionBatch().create_session("a.1"))
    grandchild = manager.get_conversation_state("a.1")
    assert manager.get_conversation_state("b").parent == root.ref
    assert grandchild.snapshot().ancestors[:2] == (a.ref, root.ref)
    assert set(root.snapshot().sessions) == {"a", "b"} and set(a.snapshot().sessions) == {"a.1"}


def test_a_workflow_or_team_can_create_sessions(manager: GlobalStateManager) -> None:
    team = manager.get_team_state("t")
    team.apply(TransitionBatch().create_session("agent-1"))
    assert manager.get_conversation_state("agent-1").parent == team.ref
    # asking for it under the team it lives in finds it too
    assert manager.get_conversation_state("agent-1", team_id="t").parent == team.ref


def test_session_ids_are_checked_and_a_failed_batch_creates_nothing(manager: GlobalStateManager) -> None:
    parent = manager.get_conversation_state("p")
    parent.apply(TransitionBatch().create_session("kid"))
    with pytest.raises(TransitionValidationError, match="already exists"):
        parent.apply(TransitionBatch().create_session("kid"))
    with pytest.raises(TransitionValidationError, match="already exists"):
        parent.apply(TransitionBatch().create_session("twin").create_session("twin"))
    manager.get_conversation_state("elsewhere", team_id="t")
    with pytest.raises(ScopeAccessError, match="already exists under team:t"):
        parent.apply(TransitionBatch().add_message("x").create_session("elsewhere"))
    with pytest.raises(ScopeAccessError):
        parent.apply(TransitionBatch().create_session("never").update_state("k", 1, scope="team"))
    for sid in ("twin", "never"):
        with pytest.raises(ScopeAccessError):
            manager.scope(f"conversation:{sid}")
    snap = parent.snapshot()
    assert set(snap.sessions) == {"kid"} and snap.version == 1 and snap.message_count == 0
    assert manager.get_conversation_state("elsewhere").parent == ScopeRef("team", "t")


def test_sessions_survive_a_reopen(tmp_path: Path) -> None:
    with GlobalStateManager.open(tmp_path) as manager:
        parent = manager.get_conversation_state("p", team_id="t")
        parent.apply(TransitionBatch().create_session("kid", {"role": "critic"}).create_session())
        generated = parent.snapshot().sessions.keys() - {"kid"}
        manager.get_conversation_state("kid").set("note", "hi")
    with GlobalStateManager.open(tmp_path) as manager:
        assert ScopeRef("conversation", "kid") in manager.scopes()
        kid = manager.get_conversation_state("kid")
        assert kid.parent == ScopeRef("conversation", "p")
        assert kid.get("note") == "hi" and kid.version == 1
        (gen,) = generated
        assert manager.get_conversation_state(gen).parent == ScopeRef("conversation", "p")
        parent = manager.get_conversation_state("p")
        assert parent.snapshot().sessions == {"kid": {"role": "critic"}, gen: {}}
        with pytest.raises(ScopeAccessError):
            manager.get_conversation_state("kid", team_id="t")  # it keeps the parent it was created under
        with pytest.raises(TransitionValidationError):
            parent.apply(TransitionBatch().create_session("kid"))


# -- CLOSE_SESSION ------------------------------------------------------------------


def _closed_conversation(manager: GlobalStateManager) -> tuple[StateChanged, ScopeHandle]:
    conv = manager.get_conversation_state("c", team_id="t")
    conv.apply(TransitionBatch().add_message("hello").update_state("answer", 42).update_stage("working"))
    commit = conv.apply(TransitionBatch().add_message("bye").close_session(reason="user left"))
    return commit, conv


def test_close_session_closes_the_applying_scope(manager: GlobalStateManager) -> None:
    commit, _ = _closed_conversation(manager)
    conv = manager.get_conversation_state("c")
    assert commit.closed and commit.version == 2
    snap = conv.snapshot()
    assert snap.is_closed and snap.is_complete
    assert snap.conversation_stage == "working"  # complete because closed, whatever the stage
    assert snap.to_dict()["closed"] is True
    assert manager.get_team_state("t").snapshot().is_closed is False  # the parent stays open


@pytest.mark.parametrize(
    "write",
    [
        lambda c: c.apply(TransitionBatch().add_message("more")),
        lambda c: c.set("k", 1),
        lambda c: c.update({"k": 1}),
        lambda c: c.delete("answer"),
        lambda c: c.delete("never-there"),
        lambda c: c.add_message("late"),
        lambda c: c.apply(TransitionBatch().close_session()),
        lambda c: c.apply(TransitionBatch().create_session("child-of-closed")),
        lambda c: c.apply(TransitionBatch().update_state("x", 1).update_state("y", 1, scope="team")),
        lambda c: c.transact(lambda snap: TransitionBatch().update_state("k", 1), lock=()),
        lambda c: asyncio.run(c.aset("k", 1)),
    ],
    ids=[
        "apply",
        "set",
        "update",
        "delete",
        "delete-missing",
        "add_message",
        "close-again",
        "create-session",
        "cross-scope",
        "transact",
        "aset",
    ],
)
def test_a_closed_scope_takes_no_batches(
    manager: GlobalStateManager, write: Callable[[ScopeHandle], object]
) -> None:
    _, conv = _closed_conversation(manager)
    team = manager.get_team_state("t")
    before = conv.snapshot()
    with pytest.raises(ScopeClosedError, match="closed"):
        write(conv)
    after = conv.snapshot()
    assert after.version == before.version == 2
    assert after.messages == before.messages and after.state == before.state
    assert team.version == 0  # a cross-scope batch applied in neither scope
    with pytest.raises(ScopeAccessError):
        manager.scope("conversation:child-of-closed")


def test_an_empty_batch_on_a_closed_scope_is_refused_too(manager: GlobalStateManager) -> None:
    """Empty batches too: a closed scope answers every batch with ScopeClosedError, not with a no-op."""
    _, conv = _closed_conversation(manager)
    with pytest.raises(ScopeClosedError):
        conv.apply(TransitionBatch())


def test_a_closed_scope_stays_readable(manager: GlobalStateManager) -> None:
    _, conv = _closed_conversation(manager)
    snap = conv.snapshot()
    assert snap.messages == ("hello", "bye")
    assert snap.get_state("answer") == 42
    assert conv.get("answer") == 42
    assert conv.to_dict() == {"answer": 42}
    assert asyncio.run(conv.asnapshot()).version == 2
    # and its parent and siblings carry on
    assert manager.get_team_state("t").set("k", 1).version == 1
    assert manager.get_conversation_state("sibling", team_id="t").set("k", 1).version == 1


def test_a_batch_closing_the_scope_midway_applies_nothing_after_the_close(
    manager: GlobalStateManager,
) -> None:
    conv = manager.get_conversation_state("c")
    with pytest.raises(ScopeClosedError, match="closed earlier in this batch") as info:
        conv.apply(TransitionBatch().add_message("a").close_session().add_message("b"))
    assert info.value.index == 2
    snap = conv.snapshot()
    assert not snap.is_closed and snap.version == 0 and snap.message_count == 0
    commit = conv.apply(TransitionBatch().add_message("last words").close_session(session_id="c"))
    assert commit.closed and commit.added_messages == ("last words",)


def test_closing_another_scope_by_id_is_an_access_error(manager: GlobalStateManager) -> None:
    parent = manager.get_conversation_state("p", team_id="t")
    parent.apply(TransitionBatch().create_session("kid"))
    kid = manager.get_conversation_state("kid")
    sibling = manager.get_conversation_state("sibling", team_id="t")
    for applier, target in ((parent, "kid"), (kid, "p"), (sibling, "p"), (kid, "t"), (parent, "nobody")):
        with pytest.raises(ScopeAccessError, match="closes only itself") as info:
            applier.apply(TransitionBatch().add_message("x").close_session(target))
        assert info.value.index == 1
        assert info.value.transition_type == "CLOSE_SESSION"
    for h in (parent, kid, sibling):
        snap = h.snapshot()
        assert not snap.is_closed and snap.message_count == 0
    # closing the child does not close the parent, and vice versa
    kid.apply(TransitionBatch().close_session())
    assert kid.snapshot().is_closed and not parent.snapshot().is_closed
    assert parent.set("k", 1).committed


def test_a_closed_scope_can_be_checkpointed_and_stays_closed_after_a_reopen(tmp_path: Path) -> None:
    with GlobalStateManager.open(tmp_path) as manager:
        _, conv = _closed_conversation(manager)
        cid = manager.save_checkpoint(conv.ref, label="closed")
        assert cid == "conversation:c@2"
        assert manager.list_checkpoints("conversation:c")[0].label == "closed"
        stored = manager.load_checkpoint("conversation:c", cid)
        assert stored.is_closed and stored.messages == ("hello", "bye")
    with GlobalStateManager.open(tmp_path) as manager:
        conv2 = manager.get_conversation_state("c")
        snap = conv2.snapshot()
        assert snap.is_closed and snap.is_complete and snap.version == 2
        assert conv2.to_dict() == {"answer": 42}
        with pytest.raises(ScopeClosedError):
            conv2.add_message("after the reopen")
        assert manager.save_checkpoint(conv2.ref) == "conversation:c@2"


def test_restoring_a_closed_scope_to_before_the_close_reopens_it(tmp_path: Path) -> None:
    """reset()'s docstring: "It also applies to a closed scope: restoring or rolling back is how a close
    is undone". (docs/orchestrators.md says the opposite: "Restoring a closed scope is refused".)"""
    with GlobalStateManager.open(tmp_path) as manager:
        conv = manager.get_conversation_state("c")
        conv.set("k", 1)
        cid = manager.save_checkpoint(conv.ref)
        conv.apply(TransitionBatch().close_session())
        commit = manager.restore(conv.ref, cid)
        assert commit.reset and commit.version == 3
        snap = conv.snapshot()
        assert not snap.is_closed and snap.get_state("k") == 1
        assert conv.set("k", 2).version == 4
