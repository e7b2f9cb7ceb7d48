"""Hypothesis properties: the actor path equals a replay through the pure reducer,
snapshots never change after they are taken, and freeze/thaw round-trip values."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from victor_actors import (
    GlobalStateManager,
    ScopeAccessError,
    StateTransition,
    TransitionBatch,
    TransitionType,
    TransitionValidationError,
)
from victor_actors.lowlevel import FrozenDict, ScopeState, freeze, reduce, thaw

_IDS = itertools.count()

KEYS = ("a", "b", "c")
SMALL_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.text(max_size=3),
    st.lists(st.integers(0, 3), max_size=2),
    st.dictionaries(st.sampled_from(["x", "y"]), st.integers(0, 3), max_size=2),
)

# One operation: (kind, *args). "bad_*" kinds target an ancestor and must fail the batch.
OPS = st.one_of(
    st.tuples(st.just("set"), st.sampled_from(KEYS), SMALL_VALUES),
    st.tuples(st.just("own"), st.sampled_from(KEYS), SMALL_VALUES),
    st.tuples(st.just("del"), st.sampled_from(KEYS)),
    st.tuples(st.just("msg"), st.text(max_size=4)),
    st.tuples(st.just("cap"), st.sampled_from(["x", "y"]), st.one_of(st.booleans(), st.integers(0, 2))),
    st.tuples(st.just("stage"), st.sampled_from(["initial", "planning", "done"])),
    st.tuples(st.just("pop")),
    st.tuples(st.just("trunc"), st.integers(0, 4)),
    st.tuples(st.just("drop"), st.integers(0, 3)),
    st.tuples(st.just("clear")),
    st.tuples(st.just("bad_team"), st.sampled_from(KEYS)),
    st.tuples(st.just("bad_global"), st.sampled_from(KEYS)),
)
BATCHES = st.lists(st.tuples(st.lists(OPS, max_size=5), st.booleans()), max_size=8)


def _build(ops: list[tuple[Any, ...]]) -> TransitionBatch:
    batch = TransitionBatch()
    for op in ops:
        kind = op[0]
        if kind == "set":
            batch.update_state(op[1], op[2])
        elif kind == "own":
            batch.update_state(op[1], op[2], scope="conversation")
        elif kind == "del":
            batch.delete_state(op[1])
        elif kind == "msg":
            batch.add_message({"role": "user", "content": op[1]})
        elif kind == "cap":
            batch.update_capability(op[1], op[2])
        elif kind == "stage":
            batch.update_stage(op[1])
        elif kind == "pop":
            batch.pop_message()
        elif kind == "trunc":
            batch.truncate_messages(op[1])
        elif kind == "drop":
            batch.drop_messages(op[1])
        elif kind == "clear":
            batch.clear_messages()
        elif kind == "bad_team":
            batch.update_state(op[1], 1, scope="team")
        else:
            batch.delete_state(op[1], scope="workflow")  # no workflow above this conversation
    return batch


class _Model:
    """Plain Python bookkeeping of what a conversation should hold."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.messages: list[Any] = []
        self.caps: dict[str, Any] = {}
        self.stage = "initial"

    def apply(self, ops: list[tuple[Any, ...]]) -> bool:
        """Apply ops; return whether the reducer must count them as a commit."""
        before = dict(self.values)
        touched: set[str] = set()
        other = False
        old = len(self.messages)
        kept = old  # the old log's messages still there: a removal of one of them is a change
        for op in ops:
            kind = op[0]
            if kind in ("set", "own"):
                self.values[op[1]] = thaw(freeze(op[2]))
                touched.add(op[1])
            elif kind == "del":
                self.values.pop(op[1], None)
                touched.add(op[1])
            elif kind == "msg":
                self.messages.append({"role": "user", "content": op[1]})
            elif kind in ("pop", "trunc", "drop", "clear"):
                n = len(self.messages)
                if kind == "pop":
                    length = n - 1
                elif kind == "trunc":
                    length = op[1]
                elif kind == "drop":
                    length = n - op[1]
                else:
                    length = 0
                del self.messages[max(0, length) :]
                kept = min(kept, len(self.messages))
            elif kind == "cap":
                self.caps[op[1]] = op[2]
                other = True
            elif kind == "stage":
                self.stage = op[1]
                other = True
        # The log changed if it lost an old message or holds a new one.
        other = other or kept < old or len(self.messages) > kept
        # A key counts as changed unless it was absent both before and after.
        return other or any(k in before or k in self.values for k in touched)


@settings(
    max_examples=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(batches=BATCHES)
@example(batches=[([], False), ([("del", "a")], False), ([("set", "b", 1), ("del", "b")], True)])
@example(
    batches=[([("set", "a", 1)], False), ([("msg", "m"), ("bad_team", "a")], False), ([("del", "a")], True)]
)
def test_actor_path_equals_reducer_replay(
    manager: GlobalStateManager, batches: list[tuple[list[tuple[Any, ...]], bool]]
) -> None:
    # Each example gets its own conversation (under global), so the shared manager is fine.
    conv = manager.get_conversation_state(f"prop-{next(_IDS)}")
    model = _Model()
    committed: list[tuple[StateTransition, ...]] = []
    taken: list[tuple[Any, int, dict[str, Any]]] = []
    for ops, nest in batches:
        batch = _build(ops)
        sent = (
            TransitionBatch([StateTransition(TransitionType.BATCH, {"transitions": batch})])
            if nest
            else batch
        )
        must_fail = any(op[0].startswith("bad_") for op in ops)
        before = conv.snapshot()
        if must_fail:
            with pytest.raises(ScopeAccessError) as info:
                conv.apply(sent)
            first_bad = next(i for i, op in enumerate(ops) if op[0].startswith("bad_"))
            assert info.value.index == first_bad  # type: ignore[attr-defined]
            # Atomic: nothing of the failed batch is visible.
            assert conv.snapshot() == before
            assert conv.version == before.version
        else:
            record = conv.apply(sent)
            expect_commit = model.apply(ops)
            assert record.committed is expect_commit
            if record.committed:
                committed.append(batch.freeze())
                assert record.version == before.version + 1
            else:
                assert conv.snapshot() == before
        snap = conv.snapshot()
        taken.append((snap, snap.version, snap.to_dict()))

    final = conv.snapshot()
    # (a) the version counts the commits, and a replay through the pure reducer agrees.
    assert final.version == len(committed)
    replay = ScopeState(ref=conv.ref, lineage=final.ancestors)
    for i, transitions in enumerate(committed):
        replay, _ = reduce(replay, transitions, commit_id=f"replay-{i}")
    assert replay.version == final.version
    assert final.state == dict(replay.values.items())
    assert final.messages == tuple(replay.messages)
    assert final.capabilities == dict(replay.capabilities.items())
    assert final.conversation_stage == replay.stage
    # ... and so does plain bookkeeping.
    assert thaw(dict(final.state.items())) == model.values
    assert [thaw(m) for m in final.messages] == model.messages
    assert dict(final.capabilities.items()) == model.caps
    assert final.conversation_stage == model.stage

    # (b) every snapshot taken along the way still shows what it showed then.
    for snap, version, shown in taken:
        assert snap.version == version
        assert snap.to_dict() == shown


# -- freeze / thaw ---------------------------------------------------------------

INT64 = st.integers(-(2**63), 2**63 - 1)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    INT64,
    st.floats(allow_nan=False),
    st.text(max_size=6),
    st.binary(max_size=6),
)


def _json(leaves: st.SearchStrategy[Any], with_lists: bool = True) -> st.SearchStrategy[Any]:
    def extend(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        dicts = st.dictionaries(st.text(max_size=4), children, max_size=4)
        if not with_lists:
            return dicts
        return st.one_of(st.lists(children, max_size=4), st.lists(children, max_size=4).map(tuple), dicts)

    return st.recursive(leaves, extend, max_leaves=12)


JSON = _json(SCALARS)


def _lists(value: Any) -> Any:
    """Normalise tuples to lists (and mappings to dicts), all the way down."""
    if isinstance(value, (list, tuple)):
        return [_lists(v) for v in value]
    if isinstance(value, dict):
        return {k: _lists(v) for k, v in value.items()}
    return value


def _tuples(value: Any) -> Any:
    """Normalise lists to tuples, all the way down: what freeze keeps."""
    if isinstance(value, (list, tuple)):
        return tuple(_tuples(v) for v in value)
    if isinstance(value, dict):
        return {k: _tuples(v) for k, v in value.items()}
    return value


def _deeply_frozen(value: Any) -> bool:
    if isinstance(value, FrozenDict):
        return all(isinstance(k, str) and _deeply_frozen(v) for k, v in value.items())
    if isinstance(value, tuple):
        return all(_deeply_frozen(v) for v in value)
    return value is None or type(value) in (bool, int, float, str, bytes)


@settings(max_examples=75, deadline=None, database=None)
@given(value=JSON)
def test_thaw_of_freeze_round_trips(value: Any) -> None:
    frozen = freeze(value)
    assert thaw(frozen) == _lists(value)
    assert _deeply_frozen(frozen)
    hash(frozen)  # every frozen value is hashable


@settings(max_examples=50, deadline=None, database=None)
@given(value=JSON)
def test_freeze_is_idempotent(value: Any) -> None:
    once = freeze(value)
    twice = freeze(once)
    assert twice == once
    assert hash(twice) == hash(once)
    if isinstance(once, FrozenDict):
        assert twice is once
    assert freeze(thaw(once)) == once


@settings(max_examples=40, deadline=None, database=None)
@given(
    plain=st.dictionaries(st.text(max_size=4), _json(SCALARS, with_lists=False), max_size=4),
    general=st.dictionaries(st.text(max_size=4), JSON, max_size=4),
)
def test_frozen_dict_equals_the_dict_it_came_from(plain: dict[str, Any], general: dict[str, Any]) -> None:
    frozen = freeze(plain)
    assert isinstance(frozen, FrozenDict)
    assert frozen == plain
    assert plain == frozen
    assert FrozenDict(plain) == plain
    assert FrozenDict(**plain) == frozen
    assert thaw(frozen) == plain
    # With lists inside, the frozen form holds tuples in their place.
    assert freeze(general) == _tuples(general)
    assert len(freeze(general)) == len(general)


class _Opaque:
    pass


BAD_VALUES: list[Callable[[], Any]] = [
    lambda: {1, 2},
    lambda: frozenset({"a"}),
    set,
    lambda: {1: "int key"},
    lambda: {None: "none key"},
    lambda: {("t",): "tuple key"},
    lambda: {b"k": "bytes key"},
    object,
    _Opaque,
    lambda: lambda: None,
    lambda: 2**64,
    lambda: -(2**63) - 1,
    lambda: 2**100,
    lambda: -(2**200),
]


@settings(max_examples=40, deadline=None, database=None)
@given(
    ok=JSON,
    make_bad=st.sampled_from(BAD_VALUES),
    where=st.sampled_from(["root", "dict", "list", "deep"]),
)
def test_unstorable_values_are_rejected(ok: Any, make_bad: Callable[[], Any], where: str) -> None:
    bad = make_bad()
    value = {
        "root": bad,
        "dict": {"ok": ok, "bad": bad},
        "list": [ok, bad],
        "deep": {"ok": [ok, {"inner": (ok, [bad])}]},
    }[where]
    with pytest.raises(TransitionValidationError) as info:
        freeze(value)
    assert isinstance(info.value, ValueError)
    assert "cannot be stored" in str(info.value)
    # The same value is refused when a transition is made, naming its field.
    with pytest.raises(TransitionValidationError) as tinfo:
        TransitionBatch().update_state("k", value)
    assert tinfo.value.field == "value"
    assert tinfo.value.transition_type == "UPDATE_STATE"


def test_int_bounds_of_freeze() -> None:
    for ok in (-(2**63), 2**63 - 1, 0, -1):
        assert freeze(ok) == ok
    for bad in (2**64, -(2**63) - 1):
        with pytest.raises(TransitionValidationError, match="64-bit"):
            freeze(bad)
