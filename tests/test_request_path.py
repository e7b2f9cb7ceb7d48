"""The request path's fast paths (issue 30 item 2) make what the general paths make.

The fluent builders' common transitions (``update_state(key, value)`` and
``add_message(m)`` without a scope) are built without the generic field
checks; a batch of builder-made transitions naming no scope is captured in
one pass, without session resolution or the cross-scope split; the reducer
builds its records positionally; the inbox wakes its actor on release only
when the actor waits. Each test here pins one of those to the general path
it short-cuts, or to the behaviour it must keep.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from victor_actors import (
    GlobalStateManager,
    StateScope,
    StateTransition,
    TransitionBatch,
    TransitionType,
    TransitionValidationError,
)
from victor_actors.lowlevel import KeyChange
from victor_actors.testing import set_observer
from victor_actors.testing._hooks import kernel_of

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.binary(max_size=20),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.tuples(inner, inner),
        st.dictionaries(st.text(max_size=8), inner, max_size=4),
    ),
    max_leaves=12,
)


def _same(fast: StateTransition, general: StateTransition) -> None:
    assert fast == general
    assert fast.transition_type is general.transition_type
    assert fast.metadata == general.metadata
    assert list(fast.data) == list(general.data)  # field order, which the encoding keeps
    # the height and the size bound the record-size check and the codec read
    assert fast.data._height == general.data._height
    assert fast.data._size == general.data._size


@settings(max_examples=300, deadline=None)
@given(key=st.text(min_size=1, max_size=30), value=_values)
def test_update_state_built_fast_is_what_the_general_path_builds(key: str, value: Any) -> None:
    fast = TransitionBatch().update_state(key, value).transitions[0]
    _same(fast, StateTransition(TransitionType.UPDATE_STATE, {"key": key, "value": value}))


@settings(max_examples=300, deadline=None)
@given(message=_values.filter(lambda m: m is not None))
def test_add_message_built_fast_is_what_the_general_path_builds(message: Any) -> None:
    fast = TransitionBatch().add_message(message).transitions[0]
    _same(fast, StateTransition(TransitionType.ADD_MESSAGE, {"message": message}))


class _Opaque:
    pass


@pytest.mark.parametrize(
    ("build", "data"),
    [
        (lambda: TransitionBatch().update_state("k", _Opaque()), {"key": "k", "value": _Opaque()}),
        (lambda: TransitionBatch().update_state("k", "a\ud800b"), {"key": "k", "value": "a\ud800b"}),
        (lambda: TransitionBatch().update_state("k", {1: "x"}), {"key": "k", "value": {1: "x"}}),
        (lambda: TransitionBatch().update_state("", 1), {"key": "", "value": 1}),
        (lambda: TransitionBatch().update_state(3, 1), {"key": 3, "value": 1}),  # type: ignore[arg-type]
        (lambda: TransitionBatch().update_state("k\udc00", 1), {"key": "k\udc00", "value": 1}),
        (lambda: TransitionBatch().add_message(None), {"message": None}),
        (lambda: TransitionBatch().add_message({"a": {_Opaque()}}), {"message": {"a": {_Opaque()}}}),
    ],
)
def test_the_fast_builders_refuse_what_the_general_path_refuses(build: Any, data: dict[str, Any]) -> None:
    ttype = TransitionType.ADD_MESSAGE if "message" in data else TransitionType.UPDATE_STATE
    with pytest.raises(TransitionValidationError) as general:
        StateTransition(ttype, data)
    with pytest.raises(TransitionValidationError) as fast:
        build()
    assert str(fast.value) == str(general.value)
    assert fast.value.field == general.value.field
    assert fast.value.transition_type == general.value.transition_type


def test_a_builder_that_fails_leaves_its_batch_as_it_was() -> None:
    batch = TransitionBatch().update_state("a", 1)
    with pytest.raises(TransitionValidationError):
        batch.update_state("b", _Opaque())
    assert [t.data["key"] for t in batch.transitions] == ["a"]


def test_plain_and_scoped_batches_each_commit_where_they_name(manager: GlobalStateManager) -> None:
    """A batch naming no scope takes the one-pass capture; one naming a scope still splits."""
    conv = manager.get_conversation_state("c", workflow_id="wf", team_id="t")
    plain = conv.apply(TransitionBatch().update_state("k", 1).add_message("m"))
    assert plain.involved == () and plain.new_version == 1
    scoped = conv.apply(TransitionBatch().update_state("k", 2).update_state("shared", 1, scope="team"))
    assert {str(r) for r in scoped.involved} == {"conversation:c", "team:t"}
    session = conv.apply(TransitionBatch().update_state("s", 1, scope="session"))
    assert {str(r) for r in session.involved} == {"workflow:wf"}
    assert conv.snapshot().state == {"k": 2}
    assert manager.get_team_state("t").snapshot().state == {"shared": 1}
    assert manager.get_workflow_state("wf").snapshot().state == {"s": 1}
    # a nested BATCH transition is flattened, as before
    nested = [StateTransition("update_state", {"key": "n", "value": 1})]
    inner = StateTransition(TransitionType.BATCH, {"transitions": nested})
    conv.apply(TransitionBatch([inner]))
    assert conv.snapshot().state["n"] == 1


def test_garbage_in_a_batch_is_refused_whole(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c")
    batch = TransitionBatch().update_state("k", 1)
    batch.transitions.append("not a transition")  # type: ignore[arg-type]
    with pytest.raises(TransitionValidationError) as err:
        conv.apply(batch)
    assert err.value.index == 1
    forged = TransitionBatch().update_state("k", 1)
    object.__setattr__(forged.transitions[0], "data", {"key": "k", "value": 1})
    with pytest.raises(TransitionValidationError):
        conv.apply(forged)
    tupled = TransitionBatch()
    tupled.transitions = (StateTransition("update_state", {"key": "k", "value": 1}),)  # type: ignore[assignment]
    with pytest.raises(TransitionValidationError):
        conv.apply(tupled)
    assert conv.snapshot().version == 0 and conv.snapshot().state == {}


def test_validators_run_on_a_plain_batch(tmp_path: Path) -> None:
    def positive(value: Any) -> None:
        if value.__class__ is not int or value < 0:
            raise ValueError("must be a non-negative int")

    with GlobalStateManager.open(tmp_path / "s", validators={"count": positive}) as manager:
        conv = manager.get_conversation_state("c")
        conv.apply(TransitionBatch().update_state("count", 1))
        with pytest.raises(TransitionValidationError):
            conv.apply(TransitionBatch().update_state("count", -1))
        assert conv.snapshot().state == {"count": 1} and conv.snapshot().version == 1


def test_a_commit_records_its_key_changes_as_key_changes(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c")
    conv.apply(TransitionBatch().update_state("a", 1))
    rec = conv.apply(TransitionBatch().update_state("a", 2).update_state("b", None).delete_state("gone"))
    assert rec.changes == (KeyChange("a", 1, 2, True, True), KeyChange("b", None, None, False, True))
    assert all(type(c) is KeyChange for c in rec.changes)
    assert rec.changes[0].key == "a" and not rec.changes[0].is_delete
    gone = conv.apply(TransitionBatch().delete_state("a"))
    assert gone.changes[0].is_delete and gone.changes[0].old_value == 2
    assert rec.ref.scope is StateScope.CONVERSATION and rec.first_message_index == 0


def test_an_actor_waiting_for_a_callers_step_is_woken_when_it_ends(manager: GlobalStateManager) -> None:
    """The inbox notifies on release only when its actor waits: the actor must still be woken.

    A caller's step is held open (its observer waits on an event) while an
    asyncio-style request (a tell to the actor) arrives; the actor's thread
    waits for the token in ``begin``. Releasing the token must wake it: a
    lost wake-up would leave the second request unanswered.
    """
    conv = manager.get_conversation_state("c")
    conv.apply(TransitionBatch().update_state("warm", 1))  # the scope exists, its actor is idle
    inbox = kernel_of(manager).cell(conv.ref).actor.actor_inbox  # type: ignore[union-attr]
    in_step, finish = threading.Event(), threading.Event()
    results: list[Any] = []
    first = threading.Thread(
        target=lambda: results.append(conv.apply(TransitionBatch().update_state("a", 1)))
    )

    def observer(kind: str, _ref: Any, _obj: object) -> None:
        if kind == "received" and threading.current_thread() is first and not in_step.is_set():
            in_step.set()
            assert finish.wait(30)

    set_observer(manager, observer)
    first.start()
    assert in_step.wait(30)

    def second_request() -> None:
        results.append(asyncio.run(conv.aapply(TransitionBatch().update_state("b", 1))))

    second = threading.Thread(target=second_request)
    second.start()
    while inbox.waiting < 1:  # the actor's thread has the message and waits for the token
        second.join(0.001)
    finish.set()
    first.join(30)
    second.join(30)
    assert not second.is_alive(), "the actor was not woken when the caller's step ended"
    assert sorted(r.new_version for r in results) == [2, 3]
    assert conv.snapshot().state == {"warm": 1, "a": 1, "b": 1}
