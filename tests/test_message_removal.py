"""Message removal as transitions: pop the last message, truncate (to a length, or by a suffix), clear.

Through the pure reducer, the actor path, events, runs and their rollback, the store (replay,
incremental checkpoints, encryption), and the many-processes client. docs/adr/0024.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import victor_actors
from victor_actors import (
    GlobalStateManager,
    Keyring,
    RunFailedError,
    ScopeAccessError,
    StateChanged,
    StateTransition,
    TransitionBatch,
    TransitionType,
    TransitionValidationError,
)
from victor_actors.lowlevel import ScopeState, reduce
from victor_actors.remote import _wire as w

REF = victor_actors.ScopeRef("conversation", "c")


def _m(i: int) -> dict[str, Any]:
    return {"role": "user", "content": f"m{i}"}


def _state(n: int) -> ScopeState:
    state = ScopeState(ref=REF, lineage=(victor_actors.ScopeRef("global", "global"),))
    if n:
        state, _ = reduce(state, TransitionBatch().add_messages([_m(i) for i in range(n)]).freeze(), commit_id="0")
    return state


def _contents(messages: Any) -> list[str]:
    return [m["content"] for m in messages]


# -- the values and the reducer ------------------------------------------------------------------


def test_the_seed_types_keep_their_values_and_the_new_ones_follow() -> None:
    assert [t.value for t in TransitionType][:11] == [
        "add_message", "add_messages", "update_state", "delete_state", "create_session", "close_session",
        "execute_tool", "tool_result", "update_capability", "update_stage", "batch",
    ]  # fmt: skip
    assert [t.value for t in TransitionType][11:] == ["pop_message", "truncate_messages", "clear_messages"]


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({}, "length"),
        ({"length": 1, "drop": 1}, "drop"),
        ({"length": -1}, "length"),
        ({"length": True}, "length"),
        ({"drop": 1.0}, "drop"),
        ({"drop": "2"}, "drop"),
        ({"length": 1, "extra": 2}, "extra"),
    ],
)
def test_a_malformed_truncate_is_refused_when_made(data: dict[str, Any], field: str) -> None:
    with pytest.raises(TransitionValidationError) as info:
        StateTransition(TransitionType.TRUNCATE_MESSAGES, data)
    assert info.value.field == field
    assert "TRUNCATE_MESSAGES" in str(info.value)


def test_pop_truncate_drop_and_clear_through_the_reducer() -> None:
    state = _state(5)
    popped, rec = reduce(state, TransitionBatch().pop_message().freeze(), commit_id="1")
    assert _contents(popped.messages) == ["m0", "m1", "m2", "m3"]
    assert rec.removed_messages == (_m(4),) and rec.first_message_index == 4 and rec.added_messages == ()
    cut, rec = reduce(state, TransitionBatch().truncate_messages(2).freeze(), commit_id="1")
    assert _contents(cut.messages) == ["m0", "m1"]
    assert _contents(rec.removed_messages) == ["m2", "m3", "m4"] and rec.first_message_index == 2
    dropped, rec = reduce(state, TransitionBatch().drop_messages(2).freeze(), commit_id="1")
    assert _contents(dropped.messages) == ["m0", "m1", "m2"] and _contents(rec.removed_messages) == ["m3", "m4"]
    cleared, rec = reduce(state, TransitionBatch().clear_messages().freeze(), commit_id="1")
    assert len(cleared.messages) == 0 and len(rec.removed_messages) == 5 and rec.first_message_index == 0
    # the state it started from is untouched (persistent values)
    assert _contents(state.messages) == [f"m{i}" for i in range(5)]


@pytest.mark.parametrize(
    ("n", "batch"),
    [
        (0, TransitionBatch().pop_message()),
        (0, TransitionBatch().clear_messages()),
        (3, TransitionBatch().truncate_messages(3)),
        (3, TransitionBatch().truncate_messages(9)),
        (3, TransitionBatch().drop_messages(0)),
        (3, TransitionBatch().add_message(_m(9)).pop_message()),
        (3, TransitionBatch().add_messages([_m(8), _m(9)]).drop_messages(2).delete_state("absent")),
    ],
)
def test_removing_what_is_not_there_changes_nothing(n: int, batch: TransitionBatch) -> None:
    """Like a delete of a missing key: no commit, no version, no event."""
    state = _state(n)
    new, rec = reduce(state, batch.freeze(), commit_id="1")
    assert new is state and not rec.committed


def test_a_batch_mixing_adds_and_removals_applies_in_order() -> None:
    state = _state(3)
    batch = (
        TransitionBatch()
        .add_message(_m(10))
        .pop_message()  # takes m10 back
        .pop_message()  # takes m2
        .add_messages([_m(11), _m(12)])
        .drop_messages(3)  # m12, m11, m1
        .add_message(_m(13))
    )
    new, rec = reduce(state, batch.freeze(), commit_id="1")
    assert _contents(new.messages) == ["m0", "m13"]
    # the record is the net change: the old log's first 1 message, then what was added
    assert rec.first_message_index == 1
    assert _contents(rec.removed_messages) == ["m1", "m2"]
    assert _contents(rec.added_messages) == ["m13"]


def test_a_tool_result_whose_message_is_removed_in_its_batch_still_commits() -> None:
    """The request it answers is settled; the batch is a commit even though the log is unchanged."""
    state = _state(1)
    state, _ = reduce(state, TransitionBatch().execute_tool("t", {}, request_id="r1").freeze(), commit_id="1")
    new, rec = reduce(
        state, TransitionBatch().tool_result("t", 1, request_id="r1").pop_message().freeze(), commit_id="2"
    )
    assert rec.committed and "r1" not in new.pending_tools and len(new.messages) == 1


def test_a_failing_transition_after_a_removal_applies_nothing(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c")
    conv.apply(TransitionBatch().add_messages([_m(0), _m(1)]))
    before = conv.snapshot()
    with pytest.raises(ScopeAccessError):
        conv.apply(TransitionBatch().clear_messages().update_state("k", 1, scope="team"))
    assert conv.snapshot() == before and _contents(conv.snapshot().messages) == ["m0", "m1"]


def test_events_and_the_reply_carry_what_was_removed(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c")
    conv.apply(TransitionBatch().add_messages([_m(0), _m(1), _m(2)]))
    got: list[StateChanged] = []
    done = threading.Event()

    def seen(event: StateChanged) -> None:
        got.append(event)
        done.set()

    sub = conv.subscribe(seen)
    reply = conv.apply(TransitionBatch().pop_message())
    assert done.wait(5)
    sub.close()
    assert reply.removed_messages == (_m(2),) == got[0].removed_messages
    assert got[0].version == reply.version == 2


def test_a_cross_scope_batch_removes_in_each_scope_it_names(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c", team_id="t")
    team = manager.get_team_state("t")
    team.apply(TransitionBatch().add_messages([_m(0), _m(1)]))
    conv.apply(TransitionBatch().add_message(_m(5)))
    rec = conv.apply(TransitionBatch().pop_message(scope="team").clear_messages())
    assert _contents(team.snapshot().messages) == ["m0"] and len(conv.snapshot().messages) == 0
    by_ref = {str(r.ref): r for r in (rec, *rec.related)}
    assert by_ref["team:t"].removed_messages == (_m(1),)
    assert by_ref["conversation:c"].removed_messages == (_m(5),)


# -- runs and rollback -----------------------------------------------------------------------------


def _fail_run(manager: GlobalStateManager, body: Any) -> Any:
    """Run ``body`` in a run that then fails; what the rollback did in the one scope it touched."""
    with pytest.raises(RunFailedError) as info, manager.run("c", timeout=30):
        body()
        raise RuntimeError("the agent failed")
    scopes = info.value.rollback_report.scopes
    assert len(scopes) <= 1
    return scopes[0] if scopes else victor_actors.lowlevel.ScopeRollback(REF)


def test_a_rolled_back_run_puts_back_what_it_popped(manager: GlobalStateManager) -> None:
    """Fails on the rollback that assumed messages are only appended: the popped message stayed gone."""
    conv = manager.get_conversation_state("c")
    conv.apply(TransitionBatch().add_messages([_m(0), _m(1), _m(2)]))
    report = _fail_run(manager, lambda: conv.apply(TransitionBatch().pop_message().pop_message()))
    assert _contents(conv.snapshot().messages) == ["m0", "m1", "m2"]
    assert report.messages_restored == 2 and report.messages_removed == 0 and not report.conflicts


def test_a_rolled_back_run_undoes_a_clear_and_what_it_added_after(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c")
    conv.apply(TransitionBatch().add_messages([_m(0), _m(1)]))

    def body() -> None:
        conv.apply(TransitionBatch().clear_messages().add_message(_m(7)))
        conv.apply(TransitionBatch().add_message(_m(8)))
        conv.apply(TransitionBatch().truncate_messages(1))  # leaves m7

    report = _fail_run(manager, body)
    assert _contents(conv.snapshot().messages) == ["m0", "m1"]
    assert (report.messages_removed, report.messages_restored) == (1, 2)


def test_a_run_that_pops_its_own_message_rolls_back_to_the_log_it_found(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c")
    conv.add_message(_m(0))

    def body() -> None:
        conv.add_message(_m(1))
        conv.add_message(_m(2))
        conv.apply(TransitionBatch().pop_message())  # m2, the run's own

    report = _fail_run(manager, body)
    assert _contents(conv.snapshot().messages) == ["m0"]
    assert (report.messages_removed, report.messages_restored) == (1, 0)


def test_messages_restored_go_back_before_what_others_appended_since(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c")
    conv.apply(TransitionBatch().add_messages([_m(0), _m(1)]))

    def body() -> None:
        conv.apply(TransitionBatch().pop_message())
        # another writer, outside the run (a plain thread carries no run id)
        other = threading.Thread(target=conv.add_message, args=(_m(5),))
        other.start()
        other.join()

    report = _fail_run(manager, body)
    assert _contents(conv.snapshot().messages) == ["m0", "m1", "m5"]
    assert report.messages_restored == 1 and not report.conflicts


def test_messages_a_run_removed_below_another_writers_removal_are_reported(manager: GlobalStateManager) -> None:
    """Another writer cleared the log after the run's pop: there is no place to put it back."""
    conv = manager.get_conversation_state("c")
    conv.apply(TransitionBatch().add_messages([_m(0), _m(1), _m(2)]))

    def body() -> None:
        conv.apply(TransitionBatch().pop_message())
        other = threading.Thread(target=conv.apply, args=(TransitionBatch().clear_messages(),))
        other.start()
        other.join()

    report = _fail_run(manager, body)
    assert len(conv.snapshot().messages) == 0
    assert report.messages_restored == 0
    assert any("were not put back" in c for c in report.conflicts)


RUN_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(1, 3)),
        st.tuples(st.just("pop")),
        st.tuples(st.just("trunc"), st.integers(0, 6)),
        st.tuples(st.just("drop"), st.integers(0, 3)),
        st.tuples(st.just("clear")),
        st.tuples(st.just("other")),
    ),
    max_size=8,
)
_CONVS = iter(range(10**6))


@settings(
    max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(start=st.integers(0, 4), ops=RUN_OPS)
def test_a_rolled_back_run_leaves_the_log_it_found_plus_what_others_appended(
    manager: GlobalStateManager, start: int, ops: list[tuple[Any, ...]]
) -> None:
    """Whatever a run adds, pops, truncates and clears, and whatever another writer appends
    between its commits (the run may remove that too), its rollback leaves the log it found
    followed by the other writer's messages, in order, with nothing reported as a conflict."""
    conv = manager.get_conversation_state(f"prop-{next(_CONVS)}")
    made = iter(range(100, 10**6))
    initial = [_m(i) for i in range(start)]
    if initial:
        conv.apply(TransitionBatch().add_messages(initial))
    others: list[dict[str, Any]] = []

    def body() -> None:
        for op in ops:
            if op[0] == "other":
                message = {"role": "other", "content": f"o{next(made)}"}
                others.append(message)
                writer = threading.Thread(target=conv.add_message, args=(message,))  # no run id
                writer.start()
                writer.join()
                continue
            batch = TransitionBatch()
            if op[0] == "add":
                batch.add_messages([_m(next(made)) for _ in range(op[1])])
            elif op[0] == "pop":
                batch.pop_message()
            elif op[0] == "trunc":
                batch.truncate_messages(op[1])
            elif op[0] == "drop":
                batch.drop_messages(op[1])
            else:
                batch.clear_messages()
            conv.apply(batch)

    report = _fail_run(manager, body)
    assert [dict(m) for m in conv.snapshot().messages] == initial + others
    assert not report.conflicts


# -- the store ---------------------------------------------------------------------------------------


RING = Keyring({"k1": bytes(range(32))}, active="k1")


@pytest.fixture(params=["plain", "encrypted"])
def keys(request: pytest.FixtureRequest) -> Keyring | None:
    return RING if request.param == "encrypted" else None


def test_a_reopen_after_removals_replays_them(tmp_path: Path, keys: Keyring | None) -> None:
    with GlobalStateManager.open(tmp_path, encryption=keys) as m:
        conv = m.get_conversation_state("c")
        for i in range(6):
            conv.add_message(_m(i))
        conv.apply(TransitionBatch().pop_message())
        conv.apply(TransitionBatch().drop_messages(2).add_message(_m(9)))
        with contextlib.suppress(RunFailedError), m.run("c", timeout=30):
            conv.apply(TransitionBatch().clear_messages())
            raise RuntimeError("rolled back")
        conv.apply(TransitionBatch().truncate_messages(2))
        conv.add_message(_m(10))
        expected = (conv.version, _contents(conv.snapshot().messages))
    assert expected == (12, ["m0", "m1", "m10"])
    with GlobalStateManager.open(tmp_path, encryption=keys) as m:
        conv = m.get_conversation_state("c")
        assert (conv.version, _contents(conv.snapshot().messages)) == expected
        assert all(r.clean for r in m.recovery_reports)


def _stored_logs(m: GlobalStateManager) -> dict[int, list[str]]:
    store = m.store
    assert store is not None
    return {i.version: _contents(store.checkpoint(REF, i.version).state.messages) for i in store.checkpoints(REF)}


def test_a_checkpoint_after_a_removal_below_the_last_one_starts_a_new_root(tmp_path: Path) -> None:
    """The log is cut below the last checkpoint's messages, then grows back with its very last
    message object in the same place: chunks of the old root would tile a different history.

    Failed before the incremental checkpoint's tracker knew of removals: the checkpoint at v6
    rebuilt m0 m1 m2 (the old root's chunk) where m0 x m2 was published.
    """
    with GlobalStateManager.open(tmp_path, checkpoint_every=3) as m:
        conv = m.get_conversation_state("c")
        conv.apply(TransitionBatch().add_messages([_m(0), _m(1)]))
        conv.add_message(_m(2))
        conv.add_message(_m(3))  # v3: the checkpoint holds m0..m3
        last = conv.snapshot().messages[3]
        conv.apply(TransitionBatch().truncate_messages(1).add_message({"role": "user", "content": "x"}))
        conv.add_message(_m(2))
        conv.add_message(last)  # v6: the same object at index 3 again
        published = _contents(conv.snapshot().messages)
        assert published == ["m0", "x", "m2", "m3"]
        assert _stored_logs(m)[6] == published
    with GlobalStateManager.open(tmp_path) as m:
        assert _contents(m.get_conversation_state("c").snapshot().messages) == published


def test_a_removal_after_the_last_checkpoints_messages_keeps_its_root(tmp_path: Path) -> None:
    """A pop of a message added since the last checkpoint leaves that checkpoint's chunks a prefix."""
    with GlobalStateManager.open(tmp_path, checkpoint_every=3) as m:
        conv = m.get_conversation_state("c")
        for i in range(3):
            conv.add_message(_m(i))  # v3: checkpoint
        conv.add_message(_m(3))
        conv.apply(TransitionBatch().pop_message())
        conv.add_message(_m(4))  # v6: checkpoint on the same root
        assert m.store is not None
        roots = {key[-16:-8] for key, _raw in m.store._scan("chunks", b"")}
        assert len(roots) == 1
        assert _stored_logs(m)[6] == ["m0", "m1", "m2", "m4"]


def test_a_reload_then_a_cut_below_the_loaded_checkpoint_starts_a_new_root(tmp_path: Path) -> None:
    """The scope's first checkpoint after a reload builds on the loaded root only if nothing cut
    below it since; failed before the tracker knew of removals (the same object trick as above)."""
    with GlobalStateManager.open(tmp_path, checkpoint_every=3) as m:
        conv = m.get_conversation_state("c")
        for i in range(3):
            conv.add_message(_m(i))  # v3: checkpoint m0 m1 m2
    with GlobalStateManager.open(tmp_path, checkpoint_every=3) as m:
        conv = m.get_conversation_state("c")
        last = conv.snapshot().messages[2]
        conv.apply(TransitionBatch().truncate_messages(1).add_message({"role": "user", "content": "x"}))
        conv.add_message(last)  # v5
        conv.add_message(_m(3))  # v6: checkpoint
        published = _contents(conv.snapshot().messages)
        assert _stored_logs(m)[6] == published == ["m0", "x", "m2", "m3"]


def test_a_random_history_of_removals_and_reloads_stores_every_checkpoint_as_published(tmp_path: Path) -> None:
    """Adds, pops, truncates, clears, re-adding objects read back from snapshots, evictions and
    reopens, with a checkpoint every 3 commits: each stored checkpoint rebuilds the log published
    at its version, and the reopened scope is the published one. Failed before the incremental
    checkpoint's tracker knew of removals (an edit left the old root's last object in place)."""
    import random

    rng = random.Random(26)
    published: dict[int, list[Any]] = {}
    for _round in range(3):
        with GlobalStateManager.open(tmp_path, checkpoint_every=3, keep_checkpoints=50) as m:
            conv = m.get_conversation_state("c")
            if published:
                assert conv.version == max(published)
                assert list(conv.snapshot().messages) == published[conv.version]
            for step in range(80):
                log = conv.snapshot().messages
                roll = rng.random()
                batch = TransitionBatch()
                if roll < 0.4 or not log:
                    batch.add_message(_m(rng.randrange(10**6)))
                elif roll < 0.55:
                    batch.pop_message()
                elif roll < 0.65:
                    batch.truncate_messages(rng.randrange(len(log)))
                elif roll < 0.7:
                    batch.drop_messages(rng.randrange(3)).add_message(_m(step))
                elif roll < 0.75:
                    batch.clear_messages()
                elif roll < 0.82:
                    batch.add_message(log[rng.randrange(len(log))])  # the very object, again
                elif roll < 0.9:  # an edit: one message rewritten, the ones after it kept (the same objects)
                    i = rng.randrange(len(log))
                    batch.truncate_messages(i).add_message(_m(-step)).add_messages(log[i + 1 :])
                else:
                    m.passivate_idle(0)
                    conv = m.get_conversation_state("c")
                    continue
                if conv.apply(batch).committed:
                    published[conv.version] = list(conv.snapshot().messages)
            stored = _stored_logs(m)
            assert stored and all(log == [_contents([x])[0] for x in published[v]] for v, log in stored.items())
    with GlobalStateManager.open(tmp_path) as m:
        conv = m.get_conversation_state("c")
        assert list(conv.snapshot().messages) == published[conv.version]


# -- the wire (many processes, Ray shards) -------------------------------------------------------------


def test_the_wire_carries_removed_messages_and_restored_counts() -> None:
    state = _state(2)
    _new, rec = reduce(state, TransitionBatch().pop_message().freeze(), commit_id="1")
    back = w.record_from(w.decode(w.encode({"x": w.record_to(rec)}))["x"])
    assert back.removed_messages == (_m(1),) and back.first_message_index == 1
    report = victor_actors.lowlevel.ScopeRollback(REF, messages_removed=1, messages_restored=2)
    assert w.rollback_from(w.decode(w.encode({"x": w.rollback_to(report)}))["x"]) == report


@pytest.fixture
def client(tmp_path: Path) -> Iterator[victor_actors.RemoteStateManager]:
    url = f"unix://{tmp_path}/owner.sock"
    with GlobalStateManager.open(tmp_path / "store", listen=url, encryption=RING), victor_actors.connect(url) as c:
        yield c


def test_removals_and_their_rollback_through_the_many_processes_client(
    client: victor_actors.RemoteStateManager,
) -> None:
    conv = client.get_conversation_state("c")
    conv.apply(TransitionBatch().add_messages([_m(0), _m(1), _m(2)]))
    rec = conv.apply(TransitionBatch().pop_message())
    assert rec.removed_messages == (_m(2),)
    with pytest.raises(RunFailedError) as info, client.run("c", timeout=30):
        conv.apply(TransitionBatch().clear_messages())
        raise RuntimeError("rolled back")
    assert info.value.rollback_report.scopes[0].messages_restored == 2
    assert _contents(conv.snapshot().messages) == ["m0", "m1"]


@attrs.frozen
class Said:
    """A typed message (issue 25's message_types): removal hands back and restores instances of it."""

    role: str
    text: str


def test_typed_messages_pop_and_roll_back_as_their_class_through_the_client(tmp_path: Path) -> None:
    """Removed typed messages cross the wire, and a run's rollback puts them back as their class."""
    url = f"unix://{tmp_path}/owner.sock"
    said = [Said("user", f"t{i}") for i in range(3)]
    with (
        GlobalStateManager.open(tmp_path / "store", listen=url, message_types=[Said]) as owner,
        victor_actors.connect(url) as client,
    ):
        conv = client.get_conversation_state("c")
        added = conv.apply(TransitionBatch().add_messages(said)).added_messages
        rec = conv.apply(TransitionBatch().pop_message())
        # a commit record holds messages in their stored (tagged) form, the removed as the added
        assert rec.removed_messages == added[2:] and rec.removed_messages[0]["text"] == "t2"
        with pytest.raises(RunFailedError), client.run("c", timeout=30):
            conv.apply(TransitionBatch().truncate_messages(length=0))
            raise RuntimeError("rolled back")
        assert list(conv.snapshot().messages) == said[:2]
        assert list(owner.get_conversation_state("c").snapshot().messages) == said[:2]
    with GlobalStateManager.open(tmp_path / "store", message_types=[Said]) as again:
        back = list(again.get_conversation_state("c").snapshot().messages)
        assert back == said[:2] and all(isinstance(m, Said) for m in back)
