"""The coordinator runner: snapshot, decide, apply with the snapshot's versions, follow the result.

Real managers, real actors, real threads; the coordinators are small classes defined here. The tests
that take ``via`` run twice: through the blocking ``step``/``run`` and through ``astep``/``arun``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest

from victor_actors import (
    ContextSnapshot,
    Coordinator,
    CoordinatorResult,
    CoordinatorRunner,
    GlobalStateManager,
    ScopeHandle,
    ScopeRef,
    TransitionBatch,
    VersionConflictError,
    VictorActorsError,
)
from victor_actors.lowlevel import LoopResult, StepRecord, merge

T = TypeVar("T")


class Via:
    """The runner's blocking methods, or their asyncio twins run to completion in a fresh event loop."""

    def __init__(self, aio: bool) -> None:
        self.aio = aio

    def step(
        self, runner: CoordinatorRunner, conv: ScopeHandle, coord: str | Coordinator, msg: str
    ) -> StepRecord:
        return self._call(runner.step, runner.astep, conv, coord, msg)

    def run(
        self, runner: CoordinatorRunner, conv: ScopeHandle, coord: str | Coordinator, msg: str
    ) -> LoopResult:
        return self._call(runner.run, runner.arun, conv, coord, msg)

    def _call(self, blocking: Callable[..., T], twin: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T:
        return asyncio.run(twin(*args)) if self.aio else blocking(*args)


@pytest.fixture(params=[False, True], ids=["sync", "asyncio"])
def via(request: pytest.FixtureRequest) -> Via:
    return Via(request.param)


def _in_threads(fn: Callable[[int], object], n: int, timeout: float = 30.0) -> None:
    """Run ``fn(0)``, ..., ``fn(n - 1)`` on ``n`` threads at once, wait for them, and fail on any error."""
    errors: list[BaseException] = []

    def target(i: int) -> None:
        try:
            fn(i)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=target, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors


def _in_thread(fn: Callable[[], object]) -> None:
    """Run ``fn`` on another thread and wait for it: a concurrent writer the coordinator cannot be."""
    _in_threads(lambda _: fn(), 1, timeout=10.0)


class Fixed:
    """Always returns the same kind of result, recording the snapshots it saw."""

    def __init__(self, make: Callable[[ContextSnapshot, str], CoordinatorResult]) -> None:
        self.make = make
        self.seen: list[ContextSnapshot] = []

    def process(self, snapshot: ContextSnapshot, user_message: str) -> CoordinatorResult:
        self.seen.append(snapshot)
        return self.make(snapshot, user_message)


class Counter:
    """Reads ``n`` from the snapshot and writes ``n + 1``; on chosen calls, another thread writes first."""

    def __init__(self, handle: ScopeHandle, interfere_on: set[int], *, key: str = "n") -> None:
        self.handle = handle
        self.interfere_on = interfere_on
        self.key = key
        self.calls = 0
        self.seen_versions: list[int] = []

    def process(self, snapshot: ContextSnapshot, user_message: str) -> CoordinatorResult:
        self.calls += 1
        self.seen_versions.append(snapshot.version)
        n = snapshot.get_state(self.key, 0)
        if self.calls in self.interfere_on:
            _in_thread(lambda: self.handle.set("other", self.calls))
        return CoordinatorResult(
            TransitionBatch().update_state(self.key, n + 1).add_message({"role": "assistant", "n": n + 1}),
            reasoning=f"{user_message}: counted to {n + 1}",
        )


# -- one step: optimistic concurrency -------------------------------------------


def test_step_applies_with_the_snapshot_version(via: Via, manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c", team_id="t")
    conv.set("n", 4)
    runner = CoordinatorRunner()
    coord = Counter(conv, set())
    record = via.step(runner, conv, coord, "go")
    assert record.attempts == 1
    assert record.coordinator == "Counter"
    assert record.commit is not None and record.commit.old_version == 1 and record.commit.version == 2
    assert conv.get("n") == 5
    assert coord.seen_versions == [1]
    assert record.result.reasoning == "go: counted to 5"


def test_a_concurrent_write_makes_the_runner_retry_with_a_fresh_snapshot(
    via: Via,
    manager: GlobalStateManager,
) -> None:
    conv = manager.get_conversation_state("c")
    conv.set("n", 0)
    coord = Counter(conv, {1})  # the first call lets another thread write the scope before returning
    record = via.step(CoordinatorRunner(), conv, coord, "go")
    assert record.attempts == 2
    assert coord.calls == 2
    assert coord.seen_versions == [1, 2]  # the second try saw the other writer's commit
    assert record.commit is not None and record.commit.old_version == 2 and record.commit.version == 3
    snap = conv.snapshot()
    assert snap.get_state("other") == 1 and snap.get_state("n") == 1
    assert snap.message_count == 1  # the first, conflicting decision left nothing behind


def test_no_retries_means_a_conflict_raises_with_a_note(via: Via, manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c")
    coord = Counter(conv, {1})
    runner = CoordinatorRunner(max_retries=0)
    with pytest.raises(VersionConflictError) as info:
        via.step(runner, conv, coord, "go")
    assert coord.calls == 1
    assert info.value.current_version == 1 and info.value.expected_version == 0
    notes = getattr(info.value, "__notes__", [])
    assert any("gave up after 1 attempts" in n for n in notes), notes
    assert conv.get("n") is None and conv.version == 1  # only the other writer's commit


def test_retries_are_bounded_then_the_error_says_so(via: Via, manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c")
    coord = Counter(conv, set(range(1, 100)))  # every call loses the race
    runner = CoordinatorRunner(max_retries=3)
    with pytest.raises(VersionConflictError) as info:
        via.step(runner, conv, coord, "go")
    assert coord.calls == 4  # one try plus three fresh snapshots
    notes = getattr(info.value, "__notes__", [])
    assert any("Counter: gave up after 4 attempts with fresh snapshots" in n for n in notes), notes
    assert conv.get("n") is None
    assert conv.version == 4  # the four interfering writes, nothing of the coordinator's


def test_retry_succeeds_on_the_last_allowed_attempt(via: Via, manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c")
    coord = Counter(conv, {1, 2, 3})
    record = via.step(CoordinatorRunner(max_retries=3), conv, coord, "go")
    assert record.attempts == 4
    assert conv.get("n") == 1 and conv.get("other") == 3


class Spender:
    """Decides from the team's ``budget`` but writes only the conversation; the first call loses a race."""

    def __init__(self, team: ScopeHandle) -> None:
        self.team = team
        self.budgets: list[int] = []

    def process(self, snapshot: ContextSnapshot, user_message: str) -> CoordinatorResult:
        self.budgets.append(snapshot.get_state("budget"))
        if len(self.budgets) == 1:
            _in_thread(lambda: self.team.set("budget", 0))  # the team's budget is gone meanwhile
        return CoordinatorResult(TransitionBatch().update_state("spent", snapshot.get_state("budget")))


def test_validate_reads_checks_every_scope_the_snapshot_saw(via: Via, manager: GlobalStateManager) -> None:
    team = manager.get_team_state("t")
    team.set("budget", 10)
    conv = manager.get_conversation_state("c", team_id="t")
    assert conv.snapshot().versions() == {conv.ref: 0, team.ref: 1, ScopeRef("global", "global"): 0}
    coord = Spender(team)
    record = via.step(CoordinatorRunner(validate_reads=True), conv, coord, "spend")
    # the decision made from budget=10 was retried once the team moved to budget=0
    assert record.attempts == 2 and coord.budgets == [10, 0]
    assert conv.get("spent") == 0
    assert team.version == 2 and conv.version == 1  # the read-only ancestors were checked, not written

    conv2 = manager.get_conversation_state("c2", team_id="t")
    team.set("budget", 5)
    with pytest.raises(VersionConflictError) as info:
        via.step(CoordinatorRunner(validate_reads=True, max_retries=0), conv2, Spender(team), "spend")
    assert info.value.current_version == 4
    assert conv2.version == 0


def test_by_default_only_the_written_scopes_versions_are_checked(
    via: Via, manager: GlobalStateManager
) -> None:
    """The runner's documented default (validate_reads=False): no update is lost, reads are not checked."""
    team = manager.get_team_state("t")
    team.set("budget", 10)
    conv = manager.get_conversation_state("c", team_id="t")
    coord = Spender(team)
    record = via.step(CoordinatorRunner(), conv, coord, "spend")
    assert record.attempts == 1 and coord.budgets == [10]
    assert conv.get("spent") == 10 and team.get("budget") == 0  # a decision resting on a stale read


def test_an_empty_decision_commits_nothing(via: Via, manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c")
    record = via.step(CoordinatorRunner(), conv, Fixed(lambda s, m: CoordinatorResult.no_op("nothing")), "x")
    assert record.commit is None and record.attempts == 1
    assert conv.version == 0


def test_a_result_of_the_wrong_type_is_an_error(via: Via, manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c")

    class Wrong:
        def process(self, snapshot: ContextSnapshot, user_message: str) -> object:
            return TransitionBatch().update_state("k", 1)

    with pytest.raises(VictorActorsError, match="not a CoordinatorResult"):
        via.step(CoordinatorRunner(), conv, Wrong(), "x")  # type: ignore[arg-type]
    assert conv.version == 0


def test_runner_arguments_are_checked() -> None:
    with pytest.raises(ValueError):
        CoordinatorRunner(max_retries=-1)
    with pytest.raises(ValueError):
        CoordinatorRunner(max_steps=0)
    runner = CoordinatorRunner()
    with pytest.raises(TypeError):
        runner.register("bad", object())  # type: ignore[arg-type]
    coord = Fixed(lambda s, m: CoordinatorResult.no_op())
    assert isinstance(coord, Coordinator)
    runner.register("ok", coord)
    assert runner.coordinators["ok"] is coord


# -- the loop: handoffs and stopping -----------------------------------------------


def _say(text: str, **kwargs: object) -> Fixed:
    return Fixed(lambda s, m: CoordinatorResult(TransitionBatch().add_message(text), **kwargs))  # type: ignore[arg-type]


def test_handoffs_are_followed_by_name_until_should_continue_is_false(
    via: Via, manager: GlobalStateManager
) -> None:
    conv = manager.get_conversation_state("c")
    planner = _say("plan", handoff_to="writer")
    writer = _say("draft", handoff_to="reviewer")
    reviewer = _say("approved", should_continue=False, handoff_to="writer")  # stopping wins
    runner = CoordinatorRunner({"planner": planner, "writer": writer})
    runner.register("reviewer", reviewer)
    loop = via.run(runner, conv, "planner", "write a report")
    assert loop.stopped_because == "should_continue=False"
    assert [s.coordinator for s in loop.steps] == ["planner", "writer", "reviewer"]
    assert [s.commit.version for s in loop.steps if s.commit] == [1, 2, 3]
    assert loop.snapshot.messages == ("plan", "draft", "approved")
    assert loop.snapshot.version == 3
    # each coordinator saw the commits of the ones before it
    assert [len(c.seen[0].messages) for c in (planner, writer, reviewer)] == [0, 1, 2]


def test_the_loop_stops_when_there_is_no_handoff(via: Via, manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c")
    runner = CoordinatorRunner({"a": _say("a", handoff_to="b"), "b": _say("b")})
    loop = via.run(runner, conv, "a", "hi")
    assert loop.stopped_because == "no handoff"
    assert [s.coordinator for s in loop.steps] == ["a", "b"]
    assert conv.snapshot().messages == ("a", "b")


def test_a_coordinator_object_can_start_the_loop(via: Via, manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c")
    runner = CoordinatorRunner({"b": _say("b", should_continue=False)})
    loop = via.run(runner, conv, _say("start", handoff_to="b"), "hi")
    assert [s.coordinator for s in loop.steps] == ["Fixed", "b"]
    assert loop.stopped_because == "should_continue=False"


def test_handoff_to_an_unknown_name_is_an_error_naming_it(via: Via, manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c")
    runner = CoordinatorRunner({"a": _say("a", handoff_to="nobody-here")})
    with pytest.raises(VictorActorsError, match="nobody-here") as info:
        via.run(runner, conv, "a", "hi")
    assert "registered: a" in str(info.value)
    assert conv.snapshot().messages == ("a",)  # the step before the bad handoff did commit
    with pytest.raises(VictorActorsError, match="'ghost'"):
        via.step(runner, conv, "ghost", "hi")


def test_max_steps_bounds_a_handoff_cycle(via: Via, manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c")
    runner = CoordinatorRunner(
        {"ping": _say("ping", handoff_to="pong"), "pong": _say("pong", handoff_to="ping")}, max_steps=5
    )
    loop = via.run(runner, conv, "ping", "go")
    assert loop.stopped_because == "max_steps"
    assert len(loop.steps) == 5
    assert [s.coordinator for s in loop.steps] == ["ping", "pong", "ping", "pong", "ping"]
    assert conv.snapshot().message_count == 5 == loop.snapshot.version


def test_reasoning_is_logged_at_info(
    via: Via, manager: GlobalStateManager, caplog: pytest.LogCaptureFixture
) -> None:
    conv = manager.get_conversation_state("c")
    runner = CoordinatorRunner(
        {
            "triage": _say("t", handoff_to="silent", reasoning="the user wants a refund", confidence=0.75),
            "silent": _say("s"),
        }
    )
    with caplog.at_level(logging.INFO, logger="victor_actors"):
        via.run(runner, conv, "triage", "refund please")
    logged = [r for r in caplog.records if r.name == "victor_actors" and r.levelno == logging.INFO]
    texts = [r.getMessage() for r in logged]
    assert "coordinator triage (confidence 0.75): the user wants a refund" in texts
    assert not any("silent" in t for t in texts)  # no reasoning, nothing logged


# -- nested coordinators ----------------------------------------------------------------


def test_nested_coordinators_share_one_snapshot_and_their_results_merge(
    manager: GlobalStateManager,
) -> None:
    conv = manager.get_conversation_state("c")
    conv.set("topic", "llamas")
    research = Fixed(
        lambda s, m: CoordinatorResult(
            TransitionBatch().update_state("facts", f"about {s.get_state('topic')}"),
            reasoning="looked it up",
            confidence=0.9,
            metadata={"source": "research", "shared": 1},
        )
    )
    style = Fixed(
        lambda s, m: CoordinatorResult(
            TransitionBatch().update_state("tone", "dry").add_message(m),
            reasoning="picked a tone",
            confidence=0.6,
            metadata={"shared": 2},
            handoff_to="editor",
        )
    )
    runner = CoordinatorRunner({"research": research, "style": style})
    outer_seen: list[ContextSnapshot] = []

    class Outer:
        def process(self, snapshot: ContextSnapshot, user_message: str) -> CoordinatorResult:
            outer_seen.append(snapshot)
            return runner.nested(snapshot, user_message, "research", style)

    record = runner.step(conv, Outer(), "write")
    assert research.seen[0] is outer_seen[0] and style.seen[0] is outer_seen[0]  # the very same snapshot
    merged = record.result
    assert [t.data["key"] for t in merged.transitions if "key" in t.data] == ["facts", "tone"]
    assert merged.reasoning == "looked it up; picked a tone"
    assert merged.confidence == 0.6
    assert merged.metadata == {"source": "research", "shared": 2}
    assert merged.handoff_to == "editor" and merged.should_continue
    # one commit carries both nested results
    assert record.commit is not None and record.commit.version == 2
    assert record.commit.changed_keys == ("facts", "tone")
    snap = conv.snapshot()
    assert snap.get_state("facts") == "about llamas" and snap.get_state("tone") == "dry"
    assert snap.messages == ("write",)


def test_merge_rules() -> None:
    a = CoordinatorResult(TransitionBatch().add_message("a"), handoff_to="x", should_continue=True)
    b = CoordinatorResult(TransitionBatch().add_message("b"), should_continue=False, confidence=0.2)
    c = CoordinatorResult(TransitionBatch().add_message("c"), handoff_to="y")
    m = merge(a, b, c)
    assert [t.data["message"] for t in m.transitions] == ["a", "b", "c"]
    assert m.handoff_to == "y" and not m.should_continue and m.confidence == 0.2
    assert m.reasoning is None
    assert merge(a, b).handoff_to == "x"
    empty = merge()
    assert empty.transitions.is_empty() and empty.confidence == 1.0 and empty.should_continue


# -- asyncio ---------------------------------------------------------------------


class AsyncSay:
    def __init__(self, text: str, **kwargs: object) -> None:
        self.text = text
        self.kwargs = kwargs
        self.calls = 0

    async def process(self, snapshot: ContextSnapshot, user_message: str) -> CoordinatorResult:
        self.calls += 1
        await asyncio.sleep(0)
        return CoordinatorResult(TransitionBatch().add_message(self.text), **self.kwargs)  # type: ignore[arg-type]


def test_arun_follows_async_and_sync_coordinators(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c")
    runner = CoordinatorRunner(
        {
            "a": AsyncSay("a", handoff_to="b"),
            "b": _say("b", handoff_to="c"),
            "c": AsyncSay("c", should_continue=False),
        }
    )
    loop = asyncio.run(runner.arun(conv, "a", "hi"))
    assert loop.stopped_because == "should_continue=False"
    assert [s.coordinator for s in loop.steps] == ["a", "b", "c"]
    assert loop.snapshot.messages == ("a", "b", "c")


def test_arun_stops_on_no_handoff_and_on_max_steps(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c")
    runner = CoordinatorRunner(
        {"a": AsyncSay("a"), "p": AsyncSay("p", handoff_to="q"), "q": AsyncSay("q", handoff_to="p")},
        max_steps=3,
    )
    assert asyncio.run(runner.arun(conv, "a", "x")).stopped_because == "no handoff"
    loop = asyncio.run(runner.arun(conv, "p", "x"))
    assert loop.stopped_because == "max_steps" and len(loop.steps) == 3


def test_astep_retries_after_a_concurrent_write(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c")

    class AsyncCounter:
        calls = 0

        async def process(self, snapshot: ContextSnapshot, user_message: str) -> CoordinatorResult:
            self.calls += 1
            if self.calls == 1:
                await asyncio.to_thread(conv.set, "other", 1)  # another writer wins the race
            return CoordinatorResult(TransitionBatch().update_state("n", snapshot.get_state("n", 0) + 1))

    coord = AsyncCounter()
    record = asyncio.run(CoordinatorRunner().astep(conv, coord, "go"))
    assert record.attempts == 2 and coord.calls == 2
    assert conv.get("n") == 1 and conv.version == 2

    class AlwaysLoses:
        calls = 0

        async def process(self, snapshot: ContextSnapshot, user_message: str) -> CoordinatorResult:
            self.calls += 1
            await conv.aset("other", self.calls)
            return CoordinatorResult(TransitionBatch().update_state("n", 99))

    loser = AlwaysLoses()
    with pytest.raises(VersionConflictError) as info:
        asyncio.run(CoordinatorRunner(max_retries=1).astep(conv, loser, "go"))
    assert loser.calls == 2
    assert any("gave up after 2 attempts" in n for n in getattr(info.value, "__notes__", []))
    assert conv.get("n") == 1


def test_an_async_coordinator_through_the_sync_run_outside_a_loop(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c")
    first = AsyncSay("async one", handoff_to="two")
    runner = CoordinatorRunner({"two": AsyncSay("async two")})
    loop = runner.run(conv, first, "hi")
    assert loop.stopped_because == "no handoff"
    assert conv.snapshot().messages == ("async one", "async two")
    assert first.calls == 1


def test_an_async_coordinator_through_the_sync_step_inside_a_loop_is_refused(
    manager: GlobalStateManager,
) -> None:
    conv = manager.get_conversation_state("c")
    runner = CoordinatorRunner()

    async def main() -> None:
        coordinator = AsyncSay("x")
        with pytest.raises(VictorActorsError, match=r"coordinator AsyncSay is async .* a-prefixed twin"):
            runner.step(conv, coordinator, "hi")
        assert coordinator.calls == 0  # its coroutine was closed, never run

    asyncio.run(main())
    assert conv.version == 0


def test_astep_refuses_a_result_of_the_wrong_type(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c")

    class Wrong:
        async def process(self, snapshot: ContextSnapshot, user_message: str) -> object:
            return {"not": "a result"}

    with pytest.raises(VictorActorsError, match="not a CoordinatorResult"):
        asyncio.run(CoordinatorRunner().astep(conv, Wrong(), "x"))  # type: ignore[arg-type]


# -- across scopes ----------------------------------------------------------------


class TeamCounter:
    """Bumps a team counter and records the step in the conversation: one batch, two scopes."""

    def __init__(self, team: ScopeHandle, interfere_first: bool) -> None:
        self.team = team
        self.interfere_first = interfere_first
        self.calls = 0

    def process(self, snapshot: ContextSnapshot, user_message: str) -> CoordinatorResult:
        self.calls += 1
        n = snapshot.get_state("count", 0)
        if self.interfere_first and self.calls == 1:
            _in_thread(lambda: self.team.update({"count": 100}))  # another agent bumps the team
        return CoordinatorResult(
            TransitionBatch()
            .update_state("count", n + 1, scope="team")
            .add_message({"role": "assistant", "content": f"count is {n + 1}"})
        )


def test_cross_scope_decisions_commit_atomically_in_both_scopes(
    via: Via, manager: GlobalStateManager
) -> None:
    team = manager.get_team_state("t")
    conv = manager.get_conversation_state("c", team_id="t")
    team.set("count", 1)
    record = via.step(CoordinatorRunner(), conv, TeamCounter(team, False), "go")
    commit = record.commit
    assert commit is not None and record.attempts == 1
    assert set(commit.involved) == {team.ref, conv.ref}
    (team_commit,) = commit.related
    assert team_commit.ref == team.ref and team_commit.commit_id == commit.commit_id
    assert team_commit.old_version == 1 and team_commit.version == 2
    assert commit.old_version == 0 and commit.version == 1
    assert team.get("count") == 2 and conv.snapshot().messages[0]["content"] == "count is 2"


def test_cross_scope_decisions_retry_when_the_team_moved(via: Via, manager: GlobalStateManager) -> None:
    team = manager.get_team_state("t")
    conv = manager.get_conversation_state("c", team_id="t")
    team.set("count", 1)
    coord = TeamCounter(team, True)
    record = via.step(CoordinatorRunner(), conv, coord, "go")
    assert record.attempts == 2 and coord.calls == 2
    assert team.get("count") == 101  # counted on top of the other agent's write, not over it
    snap = conv.snapshot()
    assert snap.messages == ({"role": "assistant", "content": "count is 101"},)  # one message, not two
    assert snap.version == 1 and team.version == 3


def test_cross_scope_conflict_without_retries_applies_in_neither_scope(
    via: Via, manager: GlobalStateManager
) -> None:
    team = manager.get_team_state("t")
    conv = manager.get_conversation_state("c", team_id="t")
    with pytest.raises(VersionConflictError) as info:
        via.step(CoordinatorRunner(max_retries=0), conv, TeamCounter(team, True), "go")
    assert info.value.current_version == 1
    assert conv.version == 0 and conv.snapshot().message_count == 0
    assert team.get("count") == 100 and team.version == 1


def test_concurrent_runners_on_one_team_lose_no_update(manager: GlobalStateManager) -> None:
    team = manager.get_team_state("t")
    convs = [manager.get_conversation_state(f"c{i}", team_id="t") for i in range(4)]
    runner = CoordinatorRunner(max_retries=1000)
    attempts: list[int] = []
    lock = threading.Lock()

    def agent(i: int) -> None:
        for _ in range(25):
            rec = runner.step(convs[i], TeamCounter(team, False), "go")
            with lock:
                attempts.append(rec.attempts)

    _in_threads(agent, len(convs))
    assert team.get("count") == 100
    assert all(c.snapshot().message_count == 25 for c in convs)
    assert len(attempts) == 100 and min(attempts) >= 1
