"""The testing kit (victor_actors.testing): its fixtures, its recorder, and its assertions.

The assertions are shown to pass on real concurrent workloads (threads, asyncio, an LMDB store) and to
fail, with a message naming the problem, on planted faults: a message or key leaked into another
conversation, a cross-scope commit one scope never published, an event showing less than its request,
and event lists out of order. Planted recorder data is built by replaying a real recording through
``Recorder.observe`` with entries dropped or changed; leaks are planted by changing a scope's committed
state behind its actor's back, as a runtime bug would.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import attrs
import pytest

from victor_actors import (
    GlobalStateManager,
    RunFailedError,
    ScopeHandle,
    ScopeRef,
    StateChanged,
    TransitionBatch,
    TransitionValidationError,
)
from victor_actors.testing import (
    Published,
    Received,
    Recorder,
    _kit,  # the kit's clock, moved by one test
    assert_commit_order,
    assert_isolated,
    assert_no_partial_batch,
)
from victor_actors.testing._hooks import kernel_of  # the kit's own tests look at the observer slot

TEAM = ScopeRef("team", "t")
WORKFLOW = ScopeRef("workflow", "wf")


# -- workloads ------------------------------------------------------------------------------------


def _agent_step(conv: ScopeHandle, name: str, step: int) -> TransitionBatch:
    """One agent step: a common message, an own message, own keys, and every third step a team key."""
    batch = (
        TransitionBatch()
        .add_message({"role": "user", "content": "continue"})  # the same text in every conversation
        .add_message({"role": "assistant", "content": f"{name} step {step}"})
        .update_state("step", step)
        .update_state(f"notes-{name}", f"{name} knows {step}")
    )
    if step % 3 == 0:
        batch.update_state(f"progress-{name}", step, scope="team")
    return batch


def _threaded_agents(manager: GlobalStateManager, agents: int, steps: int) -> list[ScopeHandle]:
    """``agents`` threads, each one conversation: plain and cross-scope batches, a team counter, a
    rejected cross-scope batch and a run that fails and is rolled back."""
    convs = [
        manager.get_conversation_state(f"agent-{i}", workflow_id="wf", team_id="t") for i in range(agents)
    ]
    errors: list[BaseException] = []

    def agent(conv: ScopeHandle) -> None:
        try:
            name = conv.ref.id
            for step in range(steps):
                conv.apply(_agent_step(conv, name, step))
                if step % 4 == 1:
                    conv.transact(
                        lambda snap: TransitionBatch().update_state(
                            "counter", snap.get_state("counter", 0) + 1, scope="team"
                        ),
                        lock=["team"],
                    )
            # rejected by the conversation after the team voted yes: the transaction aborts
            with pytest.raises(TransitionValidationError):
                conv.apply(
                    TransitionBatch()
                    .update_state(f"never-{name}", 1, scope="team")
                    .tool_result("search", "x", request_id="nobody-asked")
                )
            with pytest.raises(RunFailedError), manager.run(name, timeout=5):
                conv.apply(TransitionBatch().add_message(f"{name}: doomed").update_state("doomed", True))
                raise RuntimeError("the agent crashed")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=agent, args=(c,)) for c in convs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    return convs


async def _async_agents(manager: GlobalStateManager, agents: int, steps: int) -> list[ScopeHandle]:
    convs = [
        manager.get_conversation_state(f"async-{i}", workflow_id="wf", team_id="t") for i in range(agents)
    ]

    async def agent(conv: ScopeHandle) -> None:
        name = conv.ref.id
        for step in range(steps):
            await conv.aapply(_agent_step(conv, name, step))
            if step % 4 == 1:
                await conv.atransact(
                    lambda snap: TransitionBatch().update_state(
                        "counter", snap.get_state("counter", 0) + 1, scope="team"
                    ),
                    lock=["team"],
                )
            await conv.aset("last", name)

    await asyncio.gather(*(agent(c) for c in convs))
    return convs


def _replay(source: Recorder, change: Callable[[Received | Published], object] | None = None) -> Recorder:
    """A detached recorder fed ``source``'s entries through ``observe``; ``change`` may return None to
    drop an entry, or another message or event to plant instead."""
    planted = Recorder(source.manager, attach=False)
    for entry in source.entries():
        obj: object = entry.message if isinstance(entry, Received) else entry.event
        if change is not None:
            obj = change(entry)
            if obj is None:
                continue
        planted.observe("received" if isinstance(entry, Received) else "published", entry.ref, obj)
    return planted


def _leak(
    manager: GlobalStateManager,
    ref: ScopeRef,
    *,
    messages: tuple[Any, ...] = (),
    values: dict[str, Any] | None = None,
) -> None:
    """Append ``messages`` to ``ref``'s committed state and set ``values`` in it, without a commit:
    what a runtime bug would do.

    There is no public way to corrupt a scope, by design, so this is the one place this module
    reaches into the runtime's private attributes (the scope's cell).
    """
    cell = manager.scope(ref)._cell
    state = cell.state
    new_values = state.values
    for key, value in (values or {}).items():
        new_values = new_values.set(key, value)
    cell.state = attrs.evolve(state, messages=state.messages.extended(list(messages)), values=new_values)


# -- fixtures -------------------------------------------------------------------------------------


def test_state_manager_is_in_memory_by_default(state_manager: GlobalStateManager) -> None:
    assert state_manager.store is None
    assert state_manager.get_team_state("t").set("k", 1).version == 1


@pytest.mark.victor_store
def test_state_manager_has_a_store_when_marked(state_manager: GlobalStateManager) -> None:
    assert state_manager.store is not None
    assert state_manager.durability == "sync"
    conv = state_manager.get_conversation_state("c", team_id="t")
    conv.apply(TransitionBatch().add_message("hi").update_state("k", 1, scope="team"))
    assert state_manager.state_at(TEAM, 1).state["k"] == 1


def test_recorder_fixture_is_attached_to_state_manager(
    state_manager: GlobalStateManager, recorder: Recorder
) -> None:
    assert recorder.manager is state_manager and recorder.attached
    state_manager.get_global_state().set("k", 1)
    assert [e.new_version for e in recorder.published("global:global")] == [1]


# -- the recorder ---------------------------------------------------------------------------------


def test_recorder_records_each_scope_in_order(state_manager: GlobalStateManager, recorder: Recorder) -> None:
    conv = state_manager.get_conversation_state("alice", workflow_id="wf", team_id="t")
    single = conv.apply(TransitionBatch().add_message("hello").update_state("draft", 1))
    cross = conv.apply(TransitionBatch().add_message("outline").update_state("outline", "v1", scope="team"))
    locked = recorder.track(
        conv.transact(lambda snap: TransitionBatch().update_state("n", 1, scope="team"), lock=["team"])
    )
    with state_manager.run("alice") as run:
        in_run = conv.add_message("in a run")

    received = recorder.received(conv)
    assert [r.kind for r in received] == ["apply", "prepare", "lock", "apply"]
    assert received[0].transitions == single.transitions and received[0].message_type == "ApplyRequest"
    assert received[1].commit_id == cross.commit_id
    assert received[1].transitions == cross.transitions  # the conversation's part only
    assert received[2].transitions is None and received[2].commit_id == locked.commit_id
    assert received[3].run_id == run.id
    assert [r.kind for r in recorder.received("team:t")] == ["prepare", "lock"]

    # events name every involved scope; only the returned record carries the others as related
    assert recorder.published(conv) == [single, attrs.evolve(cross, related=()), in_run]
    assert [p.request for p in recorder.commits(conv)] == [received[0], received[1], received[3]]
    team_events = recorder.published(TEAM)
    assert [e.commit_id for e in team_events] == [cross.commit_id, locked.commit_id]
    assert team_events[0].transitions == tuple(t for t in cross.related[0].transitions)

    assert recorder.scopes() == [conv.ref, TEAM]
    seqs = [e.seq for e in recorder.entries()]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    baseline = recorder.baseline(conv)
    assert baseline is not None and baseline.version == 0
    assert recorder.wait_quiet(timeout=1.0)
    assert "attached" in repr(recorder)


def test_recorder_clear_detach_and_context_manager(state_manager: GlobalStateManager) -> None:
    conv = state_manager.get_conversation_state("c")
    with Recorder(state_manager) as rec:
        conv.add_message("one")
        assert len(rec.published(conv)) == 1
        rec.clear()
        assert rec.entries() == [] and rec.scopes() == []
        baseline = rec.baseline(conv)
        assert baseline is not None and baseline.version == 1  # the state when cleared
        conv.add_message("two")
    assert not rec.attached and kernel_of(state_manager).observer is None
    assert_isolated(rec, conv)  # "one" is in the baseline, "two" was recorded
    assert_commit_order(rec)
    conv.add_message("three")  # not recorded: the recorder cannot vouch for it
    assert [e.added_messages for e in rec.published(conv)] == [("two",)]
    rec.detach()  # idempotent
    with pytest.raises(AssertionError, match=r"'three' at index 2.*no recorded request sent it anywhere"):
        assert_isolated(rec, conv)


def test_recorders_stack_and_detach_in_any_order(state_manager: GlobalStateManager) -> None:
    conv = state_manager.get_conversation_state("c")
    first = Recorder(state_manager)
    second = Recorder(state_manager)
    conv.add_message("both see this")
    assert len(first.published(conv)) == len(second.published(conv)) == 1
    second.detach()
    assert kernel_of(state_manager).observer == first.observe
    conv.add_message("only the first")
    first.detach()
    assert kernel_of(state_manager).observer is None
    assert (len(first.published(conv)), len(second.published(conv))) == (2, 1)


class _Clock:
    """The kit's monotonic clock, moved by the test: time passes only when the test says so."""

    def __init__(self) -> None:
        self._now = time.monotonic()
        self._lock = threading.Lock()
        self.readers: set[threading.Thread] = set()
        self.read = threading.Condition(self._lock)

    def monotonic(self) -> float:
        with self._lock:
            self.readers.add(threading.current_thread())
            self.read.notify_all()
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds

    def wait_read_by(self, thread: threading.Thread) -> bool:
        with self._lock:
            return self.read.wait_for(lambda: thread in self.readers, timeout=10)


def test_wait_quiet_waits_for_a_busy_scope(
    state_manager: GlobalStateManager, recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``wait_quiet`` returns False while a scope keeps committing, True once it has been quiet.

    Regression (issue 29, item 1): this was a real-time assertion (a writer thread committing in a
    loop, ``wait_quiet(quiet=0.2, timeout=0.4) is False``) and failed under load, when the writer
    was not scheduled for 0.2 s. Now the kit's clock is the test's: a commit every 0.1 s of it, a
    0.2 s quiet period, and nothing depends on how fast the threads run."""
    clock = _Clock()
    monkeypatch.setattr(_kit, "time", clock)  # the kit's clock only (it reads time.monotonic alone)
    conv = state_manager.get_conversation_state("busy")
    conv.add_message("tick")
    outcome: list[bool] = []
    waiter = threading.Thread(target=lambda: outcome.append(recorder.wait_quiet(quiet=0.2, timeout=1.0)))
    waiter.start()
    assert clock.wait_read_by(waiter)  # its deadline is set: 1.0 s of the clock from now
    for _ in range(15):  # 1.5 s of the clock, never 0.2 s without a commit
        clock.advance(0.1)
        conv.add_message("tick")  # recorded before it returns
    waiter.join(10)
    assert outcome == [False]
    clock.advance(0.25)  # then nothing for 0.25 s
    assert recorder.wait_quiet(quiet=0.2, timeout=5.0) is True
    assert_commit_order(recorder, conv)


# -- the assertions on real workloads -----------------------------------------------------------


def test_assertions_pass_on_threaded_agents(state_manager: GlobalStateManager, recorder: Recorder) -> None:
    events: list[StateChanged] = []
    delivered = threading.Event()
    team = state_manager.get_team_state("t")

    def on_team_event(event: StateChanged) -> None:
        events.append(event)
        delivered.set()

    sub = team.subscribe(on_team_event)
    convs = _threaded_agents(state_manager, agents=8, steps=12)
    sub.close()

    assert_isolated(recorder, *convs)
    assert_isolated(state_manager)  # the manager's recorder; every conversation
    assert_no_partial_batch(recorder)
    assert_commit_order(recorder)
    assert delivered.wait(2)
    assert_commit_order(events)  # what a subscriber saw, in commit order

    kinds = {r.kind for r in recorder.received()}
    assert {"apply", "prepare", "lock", "reset"} <= kinds  # every path was exercised
    assert team.get("counter") == 8 * 3
    assert all("doomed" not in c.snapshot().state for c in convs)  # the runs were rolled back
    aborted = [r for r in recorder.received(TEAM) if r.kind == "prepare" and r.message.txn.state == "aborted"]
    assert len(aborted) == 8 and not any(k.startswith("never-") for k in team.snapshot().state)


def test_assertions_pass_on_asyncio_agents(state_manager: GlobalStateManager, recorder: Recorder) -> None:
    convs = asyncio.run(_async_agents(state_manager, agents=10, steps=8))
    assert_isolated(recorder, *convs)
    assert_no_partial_batch(recorder)
    assert_commit_order(recorder)
    assert state_manager.get_team_state("t").get("counter") == 10 * 2


@pytest.mark.victor_store
def test_assertions_pass_on_a_durable_store(state_manager: GlobalStateManager, recorder: Recorder) -> None:
    convs = _threaded_agents(state_manager, agents=4, steps=6)
    assert_isolated(recorder, *convs)
    assert_no_partial_batch(recorder)
    assert_commit_order(recorder)


# -- assert_isolated catches leaks --------------------------------------------------------------


def test_assert_isolated_catches_a_leaked_message(
    state_manager: GlobalStateManager, recorder: Recorder
) -> None:
    a = state_manager.get_conversation_state("a", team_id="t")
    b = state_manager.get_conversation_state("b", team_id="t")
    a.add_message({"role": "user", "content": "my card number is 4242"})
    b.add_message({"role": "user", "content": "hello"})
    assert_isolated(recorder, a, b)

    secret = a.snapshot().messages[0]
    _leak(state_manager, b.ref, messages=(secret,))
    with pytest.raises(AssertionError) as info:
        assert_isolated(recorder, a, b)
    text = str(info.value)
    assert "conversations are not isolated: 1 problem(s)" in text
    assert "conversation:b holds message" in text and "4242" in text and "at index 1" in text
    assert "sent only to conversation:a" in text
    assert_isolated(recorder, a)  # a itself is fine


def test_assert_isolated_catches_a_leaked_key(state_manager: GlobalStateManager, recorder: Recorder) -> None:
    a = state_manager.get_conversation_state("a")
    b = state_manager.get_conversation_state("b")
    a.update({"plan": "a's plan"})
    b.update({"plan": "b's plan"})
    _leak(state_manager, b.ref, values={"plan": "a's plan", "only_a": 1})
    a.set("only_a", 1)
    with pytest.raises(AssertionError) as info:
        assert_isolated(state_manager, "a", "conversation:b")
    text = str(info.value)
    assert "2 problem(s)" in text
    assert (
        "conversation:b holds key 'plan' = \"a's plan\", which no request sent to conversation:b wrote"
        in text
    )
    assert "key 'only_a' = 1" in text and "written only to conversation:a" in text


def test_assert_isolated_counts_messages(state_manager: GlobalStateManager, recorder: Recorder) -> None:
    conv = state_manager.get_conversation_state("c")
    conv.add_message("ok")
    _leak(state_manager, conv.ref, messages=("ok",))  # sent once, shown twice
    with pytest.raises(AssertionError, match=r"holds message 'ok' at index 1.*not that many times"):
        assert_isolated(recorder, conv)


def test_assert_isolated_without_a_recorder_compares_by_value(state_manager: GlobalStateManager) -> None:
    a = state_manager.get_conversation_state("a")
    b = state_manager.get_conversation_state("b")
    a.apply(TransitionBatch().add_message("from a").update_state("k", "a"))
    b.apply(TransitionBatch().add_message("from b").update_state("k", "b"))
    assert_isolated(state_manager)
    _leak(state_manager, b.ref, messages=("from a",))
    with pytest.raises(AssertionError) as info:
        assert_isolated(state_manager, a, b)
    assert "compared by value" in str(info.value)
    assert "conversation:b holds message 'from a' at index 1, as conversation:a does" in str(info.value)


# -- assert_no_partial_batch catches partial batches -----------------------------------------------


def test_assert_no_partial_batch_catches_a_missing_participant(
    state_manager: GlobalStateManager, recorder: Recorder
) -> None:
    conv = state_manager.get_conversation_state("alice", workflow_id="wf", team_id="t")
    record = conv.apply(
        TransitionBatch()
        .add_message("drafted")
        .update_state("outline", "v1", scope="team")
        .update_state("step", 2, scope="workflow")
    )
    assert set(record.involved) == {conv.ref, TEAM, WORKFLOW}
    assert_no_partial_batch(recorder)

    def drop_team_event(entry: Received | Published) -> object:
        if isinstance(entry, Published) and entry.ref == TEAM:
            return None
        return entry.message if isinstance(entry, Received) else entry.event

    with pytest.raises(AssertionError) as info:
        assert_no_partial_batch(_replay(recorder, drop_team_event))
    text = str(info.value)
    assert (
        f"partial batch: commit {record.commit_id} was published by conversation:alice, workflow:wf" in text
    )
    assert "but not by team:t (their parts: team:t: [UPDATE_STATE(outline='v1' @team)])" in text


def test_assert_no_partial_batch_catches_a_missing_transact_participant(
    state_manager: GlobalStateManager, recorder: Recorder
) -> None:
    conv = state_manager.get_conversation_state("alice", team_id="t")
    record = recorder.track(
        conv.transact(
            lambda snap: TransitionBatch().add_message("counted").update_state("n", 1, scope="team")
        )
    )
    assert_no_partial_batch(recorder)

    def drop_conversation_event(entry: Received | Published) -> object:
        if isinstance(entry, Published) and entry.ref == conv.ref:
            return None
        return entry.message if isinstance(entry, Received) else entry.event

    planted = _replay(recorder, drop_conversation_event)
    planted.track(record)
    with pytest.raises(
        AssertionError, match=rf"commit {record.commit_id} was published by team:t but not by "
    ):
        assert_no_partial_batch(planted)


def test_assert_no_partial_batch_catches_a_commit_showing_less_than_its_request(
    state_manager: GlobalStateManager, recorder: Recorder
) -> None:
    conv = state_manager.get_conversation_state("c")
    conv.apply(TransitionBatch().add_message("one").add_message("two").update_state("k", 1))

    def halve(entry: Received | Published) -> object:
        if isinstance(entry, Received):
            return entry.message
        e = entry.event
        return attrs.evolve(e, transitions=e.transitions[:1])

    with pytest.raises(AssertionError) as info:
        assert_no_partial_batch(_replay(recorder, halve))
    assert "applied 1 of the 3 transitions of its request" in str(info.value)
    assert "missing [ADD_MESSAGE('two'), UPDATE_STATE(k=1)]" in str(info.value)

    def forget_the_key(entry: Received | Published) -> object:
        if isinstance(entry, Received):
            return entry.message
        return attrs.evolve(entry.event, changes=(), added_messages=("one",))

    with pytest.raises(AssertionError) as info:
        assert_no_partial_batch(_replay(recorder, forget_the_key))
    assert "added 1 message(s) ('one',) but its transitions add 2" in str(info.value)
    assert "should set 'k' = 1 but shows no change" in str(info.value)


def test_assert_no_partial_batch_catches_an_aborted_commit_that_was_published(
    state_manager: GlobalStateManager, recorder: Recorder
) -> None:
    conv = state_manager.get_conversation_state("c", team_id="t")
    with pytest.raises(TransitionValidationError):
        conv.apply(
            TransitionBatch().update_state("k", 1, scope="team").tool_result("t", "r", request_id="none")
        )
    prepare = recorder.received(TEAM)[0]
    assert prepare.kind == "prepare" and prepare.message.txn.state == "aborted"
    assert recorder.published() == []
    assert_no_partial_batch(recorder)

    planted = _replay(recorder)
    ghost = StateChanged(TEAM, prepare.commit_id or "", 0, 1, prepare.transitions or ())
    planted.observe("published", TEAM, ghost)
    with pytest.raises(
        AssertionError, match=rf"transaction {prepare.commit_id} aborted but team:t published it"
    ):
        assert_no_partial_batch(planted)


# -- assert_commit_order catches disorder -------------------------------------------------------


def test_assert_commit_order_catches_events_out_of_order(state_manager: GlobalStateManager) -> None:
    conv = state_manager.get_conversation_state("c")
    events: list[StateChanged] = []
    done = threading.Event()

    def on_event(event: StateChanged) -> None:
        events.append(event)
        if event.new_version == 5:
            done.set()

    sub = conv.subscribe(on_event)
    for i in range(5):
        conv.set("i", i)
    assert done.wait(2)
    sub.close()
    assert_commit_order(events)
    assert_commit_order(events, conv)

    swapped = [events[0], events[2], events[1], events[3], events[4]]
    with pytest.raises(AssertionError) as info:
        assert_commit_order(swapped)
    text = str(info.value)
    assert "events out of commit order" in text
    assert (
        f"conversation:c: event 2 of 5 ({events[2].commit_id} v2->v3) starts from v2, but the previous"
        in text
    )
    assert "ended at v1" in text and f"*{events[2].commit_id} v2->v3" in text

    with pytest.raises(AssertionError, match=r"event 3 of 3 .* repeats the commit id of event 2"):
        assert_commit_order([events[0], events[1], events[1]])
    with pytest.raises(AssertionError, match=r"starts from v3, but the previous event ended at v1"):
        assert_commit_order([events[0], events[3]])
    with pytest.raises(AssertionError, match=r"does not advance the version by one"):
        assert_commit_order([attrs.evolve(events[0], new_version=3)])
    assert_commit_order([events[0], events[3]], "conversation:other")  # only that scope's events


def test_assert_commit_order_catches_a_recording_out_of_order(
    state_manager: GlobalStateManager, recorder: Recorder
) -> None:
    a = state_manager.get_conversation_state("a")
    b = state_manager.get_conversation_state("b")
    for i in range(3):
        a.set("i", i)
        b.set("i", i)
    assert_commit_order(recorder)

    a_events = recorder.published(a)

    def swap_a(entry: Received | Published) -> object:
        if isinstance(entry, Received):
            return entry.message
        if entry.event is a_events[1]:
            return a_events[2]
        if entry.event is a_events[2]:
            return a_events[1]
        return entry.event

    planted = _replay(recorder, swap_a)
    assert_commit_order(planted, b)
    with pytest.raises(AssertionError, match=r"conversation:a: event 2 of 3 .* starts from v2"):
        assert_commit_order(planted)


def test_assert_commit_order_checks_the_first_event_against_the_baseline(
    state_manager: GlobalStateManager,
) -> None:
    conv = state_manager.get_conversation_state("c")
    conv.set("i", 0)
    rec = Recorder(state_manager)  # the baseline is version 1
    first = conv.set("i", 1)
    assert_commit_order(rec)
    rec.observe("published", conv.ref, attrs.evolve(first, commit_id="planted", old_version=3, new_version=4))
    rec.detach()
    with pytest.raises(AssertionError, match=r"event 2 of 2 .* starts from v3, but the previous event ended"):
        assert_commit_order(rec)
    late = Recorder(state_manager, attach=False)
    late.clear()  # every scope's current state (conv at version 2) is its baseline: as if attached now
    late.observe("published", conv.ref, first)
    with pytest.raises(AssertionError, match=r"starts from v1, but the scope was at v2 when the recorder"):
        assert_commit_order(late)


def test_the_assertions_reject_what_they_cannot_check(state_manager: GlobalStateManager) -> None:
    with pytest.raises(TypeError, match="needs a Recorder"):
        assert_no_partial_batch(state_manager)
    with pytest.raises(TypeError, match="needs a Recorder"):
        assert_commit_order(state_manager)
    with pytest.raises(TypeError, match="StateChanged"):
        assert_commit_order(["not an event"])  # type: ignore[list-item]


def test_the_recorder_follows_scopes_through_passivation() -> None:
    with GlobalStateManager.open(max_live_actors=2) as manager, Recorder(manager) as rec:
        convs = [manager.get_conversation_state(f"c{i}", team_id="t") for i in range(5)]
        for step in range(3):
            for conv in convs:
                conv.apply(_agent_step(conv, conv.ref.id, step))
        assert manager.stats()["passivations"] > 0
        assert all(len(rec.published(c)) == 3 for c in convs)
        assert_isolated(rec, *convs)
        assert_no_partial_batch(rec)
        assert_commit_order(rec)
