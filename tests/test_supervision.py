"""Supervision: failed scopes restart from their last committed state; siblings never notice.

Real managers, real actors, real threads. Faults are injected with
``victor_actors.testing.inject_fault``; ``manager.quiesce()`` waits until every restart request has
been handled and every supervision event delivered.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import wait_for as _wait_for

from victor_actors import (
    GlobalStateManager,
    ScopeAccessError,
    ScopeClosedError,
    ScopeFailedError,
    ScopeHandle,
    ScopeRef,
    TransitionBatch,
    TransitionValidationError,
    VersionConflictError,
)
from victor_actors.lowlevel import SupervisionEvent
from victor_actors.testing import inject_fault

GLOBAL = "global:global"


class Recorder:
    """Collects supervision events, in the order they are delivered."""

    def __init__(self, manager: GlobalStateManager) -> None:
        self.manager = manager
        self._lock = threading.Lock()
        self._events: list[SupervisionEvent] = []
        self._history: list[SupervisionEvent] = []  # every event, kept through clear()
        self.sub = manager.subscribe_supervision(self._add)

    def _add(self, event: SupervisionEvent) -> None:
        with self._lock:
            self._events.append(event)
            self._history.append(event)

    @property
    def events(self) -> list[SupervisionEvent]:
        with self._lock:
            return list(self._events)

    def triples(self) -> list[tuple[str, str, str | None]]:
        return [
            (e.kind, str(e.ref), None if e.supervisor is None else str(e.supervisor)) for e in self.events
        ]

    def settle(self) -> list[tuple[str, str, str | None]]:
        """Wait until the runtime is quiet; return every event recorded.

        Supervision events are published (on the failing actor's thread) before the failed
        request's caller gets its error; quiesce returns once every restart request sent so far
        has been handled and every event delivered.
        """
        self.manager.quiesce(5.0)
        return self.triples()

    def restarts(self, *handles: ScopeHandle) -> list[int]:
        """How many times each scope was restarted since this recorder started (call settle first)."""
        with self._lock:
            history = list(self._history)
        return [sum(1 for e in history if e.kind == "restarted" and e.ref == h.ref) for h in handles]

    def clear(self) -> None:
        self.settle()
        with self._lock:
            self._events.clear()


def _fail(manager: GlobalStateManager, handle: ScopeHandle, exc: BaseException | None = None) -> None:
    """Make ``handle``'s actor fail on one write; the caller gets ScopeFailedError."""
    inject_fault(manager, handle.ref, exc if exc is not None else RuntimeError(f"{handle.ref} breaks"))
    with pytest.raises(ScopeFailedError, match="nothing was applied"):
        handle.set("never", "applied")


# -- one failure, one restart -------------------------------------------------


@pytest.mark.parametrize(
    "exc",
    [RuntimeError("boom"), SystemExit(3), KeyboardInterrupt()],
    ids=["RuntimeError", "SystemExit", "KeyboardInterrupt"],
)
def test_a_child_crashing_mid_batch_restarts_alone_from_its_committed_state(
    manager: GlobalStateManager, exc: BaseException
) -> None:
    team = manager.get_team_state("t")
    a = manager.get_conversation_state("a", team_id="t")
    b = manager.get_conversation_state("b", team_id="t")
    c = manager.get_conversation_state("c", team_id="t")
    team.set("goal", "ship")
    for h in (a, b, c):
        h.apply(TransitionBatch().update_state("k", 1).add_message("hello").update_capability("search"))
    a.apply(TransitionBatch().update_stage("planning").execute_tool("grep", {"q": "x"}, request_id="r1"))
    before = a.snapshot().to_dict()
    events = Recorder(manager)

    # Siblings keep being written from threads while ``a`` fails.
    stop = threading.Event()
    writes = {"b": 0, "c": 0}
    wrote = {"b": threading.Event(), "c": threading.Event()}
    errors: list[BaseException] = []

    def hammer(name: str, handle: ScopeHandle) -> None:
        try:
            while not stop.is_set() or writes[name] < 50:
                handle.apply(TransitionBatch().update_state("n", writes[name]).add_message(writes[name]))
                writes[name] += 1
                wrote[name].set()
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=hammer, args=(n, h)) for n, h in (("b", b), ("c", c))]
    for t in threads:
        t.start()
    assert all(e.wait(5) for e in wrote.values())  # ``a`` fails while its siblings are being written

    inject_fault(manager, a.ref, exc)
    batch = (
        TransitionBatch()
        .update_state("k", 2)
        .update_state("new", "x")
        .add_message("lost")
        .update_capability("search", False)
        .update_stage("acting")
        .tool_result("grep", "found", request_id="r1")
    )
    with pytest.raises(ScopeFailedError, match="nothing was applied") as info:
        a.apply(batch)
    assert isinstance(info.value.__cause__, type(exc))
    assert type(exc).__name__ in str(info.value)

    stop.set()
    for t in threads:
        t.join(10)
    assert not errors

    # Nothing of the batch is visible; the state and version are the last committed ones.
    assert a.snapshot().to_dict() == before
    assert a.version == 2
    manager.quiesce()
    assert events.restarts(a) == [1]
    assert a.snapshot().to_dict() == before

    assert events.settle() == [
        ("failed", "conversation:a", "team:t"),
        ("restarted", "conversation:a", "team:t"),
    ]
    assert all(type(exc).__name__ in e.reason for e in events.events)

    # The siblings and the supervisor were never disturbed.
    assert events.restarts(team, b, c, manager.get_global_state()) == [0, 0, 0, 0]
    assert team.version == 1
    for name, h in (("b", b), ("c", c)):
        assert h.version == 1 + writes[name]
        assert h.snapshot().messages == ("hello", *range(writes[name]))
        assert h.get("n") == writes[name] - 1

    # And the failed scope serves again.
    assert a.apply(TransitionBatch().tool_result("grep", "found", request_id="r1")).version == 3
    stats = manager.stats()
    assert (stats["failures"], stats["restarts"], stats["escalations"]) == (1, 1, 0)


def test_the_async_caller_gets_scope_failed_error_and_the_scope_restarts(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c")
    conv.set("k", 1)
    inject_fault(manager, conv.ref, RuntimeError("async boom"))

    async def main() -> None:
        with pytest.raises(ScopeFailedError, match="async boom"):
            await conv.aset("k", 2)
        assert (await conv.aset("k", 3)).version == 2

    asyncio.run(main())
    manager.quiesce()
    assert manager.stats()["restarts"] == 1  # the conversation, the only scope that failed
    assert conv.get("k") == 3


def test_a_failure_while_preparing_a_cross_scope_batch_applies_nowhere(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c", team_id="t")
    team = manager.get_team_state("t")
    conv.apply(TransitionBatch().update_state("k", 1).update_state("tk", 1, scope="team"))
    events = Recorder(manager)
    inject_fault(manager, team.ref, RuntimeError("team breaks in prepare"))
    with pytest.raises(ScopeFailedError):
        conv.apply(TransitionBatch().update_state("k", 2).update_state("tk", 2, scope="team"))
    assert (conv.get("k"), team.get("tk"), conv.version, team.version) == (1, 1, 1, 1)
    assert events.settle() == [
        ("failed", "team:t", GLOBAL),
        ("restarted", "team:t", GLOBAL),
        ("restarted", "conversation:c", "team:t"),
    ]
    assert events.restarts(team, conv) == [1, 1]
    assert conv.apply(TransitionBatch().update_state("k", 3).update_state("tk", 3, scope="team")).version == 2
    assert team.get("tk") == 3


def test_restart_with_a_durable_store_reloads_the_same_state_from_lmdb(tmp_path: Path) -> None:
    with GlobalStateManager.open(tmp_path) as manager:
        assert manager.durability == "sync"
        conv = manager.get_conversation_state("c", workflow_id="wf", team_id="t")
        for i in range(5):
            conv.apply(TransitionBatch().update_state(f"k{i}", {"i": i}).add_message(f"m{i}"))
        conv.apply(TransitionBatch().update_stage("acting").update_capability("tools", ["a", "b"]))
        in_memory = conv.snapshot()
        before = in_memory.to_dict()
        _fail(manager, conv)
        manager.quiesce()
        assert manager.stats()["restarts"] == 1
        # Reloaded from the store: an equal state, rebuilt rather than the objects held in memory
        # (a snapshot holds the scope's own message log, so its identity tells).
        assert conv.snapshot().messages is not in_memory.messages
        assert conv.snapshot().messages == in_memory.messages
        assert conv.snapshot().to_dict() == before
        assert conv.version == 6
        conv.add_message("after the restart")
    with GlobalStateManager.open(tmp_path) as manager:
        again = manager.get_conversation_state("c")
        assert again.version == 7
        assert again.snapshot().messages == ("m0", "m1", "m2", "m3", "m4", "after the restart")
        assert again.get("k3") == {"i": 3}


def test_requests_queued_behind_the_failing_one_are_served_after_the_restart(tmp_path: Path) -> None:
    """The failed scope restarts on its own thread before it takes the requests queued behind.

    With a store the restart is visible through the public API: it rebuilds the state from LMDB,
    so a snapshot taken after it holds a new message log, equal to the old one.
    """
    with GlobalStateManager.open(tmp_path) as manager:
        conv = manager.get_conversation_state("c", team_id="t")
        conv.apply(TransitionBatch().update_state("start", True).add_message("start"))
        before = conv.snapshot()
        entered = threading.Event()
        release = threading.Event()
        restarts_seen: list[tuple[int, bool]] = []

        def slow_crash() -> None:
            entered.set()
            release.wait(5.0)
            raise RuntimeError("crash after a while")

        def first_queued() -> None:
            # Runs on the first queued request, in the actor, before it applies: the restarts the
            # supervisor has made by then, and whether the state was rebuilt from the store already.
            restarts_seen.append(
                (manager.stats()["restarts"], conv.snapshot().messages is not before.messages)
            )

        inject_fault(manager, conv.ref, slow_crash)
        inject_fault(manager, conv.ref, first_queued)

        outcomes: dict[int, object] = {}

        def write(i: int) -> None:
            try:
                outcomes[i] = conv.apply(TransitionBatch().add_message(f"q{i}").update_state("last", i))
            except BaseException as err:
                outcomes[i] = err

        first = threading.Thread(target=write, args=(-1,))
        first.start()
        assert entered.wait(5.0)
        queued = []
        for i in range(6):
            t = threading.Thread(target=write, args=(i,))
            t.start()
            queued.append(t)
            # one at a time, so they queue in order; nothing signals a request reaching the mailbox
            assert _wait_for(lambda i=i: manager.stats()["mailbox_depth_max"] == i + 1), (
                "the request did not reach the mailbox"
            )
        release.set()
        for t in (first, *queued):
            t.join(10)

        assert isinstance(outcomes[-1], ScopeFailedError)
        assert restarts_seen == [(1, True)]  # the restart happened before the queued requests were handled
        versions = [outcomes[i].version for i in range(6)]  # type: ignore[attr-defined]
        assert versions == [2, 3, 4, 5, 6, 7]
        assert conv.snapshot().messages == ("start", *(f"q{i}" for i in range(6)))
        assert conv.get("last") == 5


# -- strategies -----------------------------------------------------------------


def test_one_for_all_restarts_exactly_the_supervisors_children(manager: GlobalStateManager) -> None:
    team = manager.get_team_state("t")
    kids = [manager.get_conversation_state(f"c{i}", team_id="t") for i in range(3)]
    other_team = manager.get_team_state("u")
    stranger = manager.get_conversation_state("d", team_id="u")
    for i, k in enumerate(kids):
        k.set("i", i)
    manager.set_supervision(team.ref, "one_for_all")
    events = Recorder(manager)

    _fail(manager, kids[1])

    assert events.settle() == [
        ("failed", "conversation:c1", "team:t"),
        ("restarted", "conversation:c0", "team:t"),
        ("restarted", "conversation:c1", "team:t"),
        ("restarted", "conversation:c2", "team:t"),
    ]
    assert events.restarts(*kids) == [1, 1, 1]
    assert events.restarts(team, other_team, stranger, manager.get_global_state()) == [0, 0, 0, 0]
    assert [k.get("i") for k in kids] == [0, 1, 2]
    assert [k.version for k in kids] == [1, 1, 1]
    stats = manager.stats()
    assert (stats["failures"], stats["restarts"], stats["escalations"]) == (1, 3, 0)


def test_rest_for_one_restarts_the_failed_child_and_those_created_after_it(
    manager: GlobalStateManager,
) -> None:
    team = manager.get_team_state("t")
    kids = [manager.get_conversation_state(f"c{i}", team_id="t") for i in range(4)]
    manager.set_supervision("team:t", "rest_for_one")
    events = Recorder(manager)

    _fail(manager, kids[1])

    assert events.settle() == [
        ("failed", "conversation:c1", "team:t"),
        ("restarted", "conversation:c1", "team:t"),
        ("restarted", "conversation:c2", "team:t"),
        ("restarted", "conversation:c3", "team:t"),
    ]
    assert events.restarts(*kids) == [0, 1, 1, 1]
    assert events.restarts(team, kids[0]) == [0, 0]


def test_restarting_a_scope_restarts_its_descendants(manager: GlobalStateManager) -> None:
    team = manager.get_team_state("t")
    wf = manager.get_workflow_state("wf", team_id="t")
    x = manager.get_conversation_state("x", workflow_id="wf", team_id="t")
    y = manager.get_conversation_state("y", workflow_id="wf", team_id="t")
    z = manager.get_conversation_state("z", team_id="t")
    wf.set("plan", [1, 2])
    x.add_message("hi")
    events = Recorder(manager)

    _fail(manager, wf)

    assert events.settle() == [
        ("failed", "workflow:wf", "team:t"),
        ("restarted", "workflow:wf", "team:t"),
        ("restarted", "conversation:x", "workflow:wf"),
        ("restarted", "conversation:y", "workflow:wf"),
    ]
    assert events.restarts(wf, x, y) == [1, 1, 1]
    assert events.restarts(team, z) == [0, 0]
    assert wf.to_dict() == {"plan": [1, 2]}
    assert x.snapshot().messages == ("hi",)


# -- intensity, escalation, giving up -------------------------------------------


def test_exceeding_the_restart_intensity_escalates_to_the_supervisors_supervisor(
    manager: GlobalStateManager,
) -> None:
    team = manager.get_team_state("t")
    c1 = manager.get_conversation_state("c1", team_id="t")
    c2 = manager.get_conversation_state("c2", team_id="t")
    team.set("goal", "g")
    c1.set("k", 1)
    manager.set_supervision(team.ref, max_restarts=2, within=10)
    events = Recorder(manager)

    _fail(manager, c1)
    _fail(manager, c1)
    assert (
        events.settle()
        == [
            ("failed", "conversation:c1", "team:t"),
            ("restarted", "conversation:c1", "team:t"),
        ]
        * 2
    )
    events.clear()

    _fail(manager, c1)
    assert events.settle() == [
        ("failed", "conversation:c1", "team:t"),
        ("escalated", "conversation:c1", "team:t"),
        ("restarted", "team:t", GLOBAL),
        ("restarted", "conversation:c1", "team:t"),
        ("restarted", "conversation:c2", "team:t"),
    ]
    escalated = events.events[1]
    assert "team:t exceeded 2 restarts in 10" in escalated.reason
    assert events.restarts(team, c1, c2) == [1, 3, 1]
    assert events.restarts(manager.get_global_state()) == [0]
    assert (team.get("goal"), c1.get("k"), team.version, c1.version) == ("g", 1, 1, 1)
    stats = manager.stats()
    assert (stats["failures"], stats["restarts"], stats["escalations"]) == (3, 5, 1)
    assert c1.set("k", 2).version == 2


def test_restarts_outside_the_window_do_not_count(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c", team_id="t")
    manager.set_supervision("team:t", max_restarts=1, within=0.05)
    events = Recorder(manager)
    for _ in range(3):
        _fail(manager, conv)
        time.sleep(0.1)  # the 0.05 s window passing is the behaviour under test: not an ordering wait
    assert [k for k, _r, _s in events.settle()] == ["failed", "restarted"] * 3
    assert manager.stats()["escalations"] == 0


@pytest.mark.parametrize("failing", ["team", "global"])
def test_past_the_root_the_scope_gives_up_until_restarted_by_hand(
    manager: GlobalStateManager, failing: str
) -> None:
    glob = manager.get_global_state()
    team = manager.get_team_state("t")
    conv = manager.get_conversation_state("c", team_id="t")
    glob.set("g", 1)
    manager.set_supervision(None, max_restarts=1, within=10)
    manager.set_supervision(GLOBAL, max_restarts=1, within=10)
    events = Recorder(manager)
    target = team if failing == "team" else glob

    # Within the limits: restarts (escalating to the root once for a failing team).
    for _ in range(2 if failing == "team" else 1):
        _fail(manager, target)
    kinds = [k for k, _r, _s in events.settle()]
    assert "gave_up" not in kinds and kinds.count("failed") == (2 if failing == "team" else 1)
    if failing == "team":
        assert ("restarted", GLOBAL, None) in events.triples()  # the root restarted global
        events.clear()
        # As in OTP, a restarted supervisor counts its restarts afresh: the next failure is a plain restart.
        _fail(manager, target)
        assert events.settle() == [
            ("failed", str(team.ref), GLOBAL),
            ("restarted", str(team.ref), GLOBAL),
            ("restarted", str(conv.ref), str(team.ref)),  # a restart takes the subtree with it
        ]
    events.clear()

    _fail(manager, target)
    trail = events.settle()
    assert trail[0] == ("failed", str(target.ref), None if failing == "global" else GLOBAL)
    assert trail[-1] == ("gave_up", GLOBAL, None)
    assert ("escalated", GLOBAL, None) in trail
    assert not any(kind == "restarted" for kind, _r, _s in trail)
    gave_up = events.events[-1]
    assert "RuntimeError" in gave_up.reason

    # The scope supervision gave up on refuses every request, saying so, and applies nothing.
    with pytest.raises(ScopeFailedError, match="failed for good") as info:
        glob.set("g", 2)
    assert "exceeded 1 restarts" in str(info.value)
    with pytest.raises(ScopeFailedError, match="failed for good"):
        conv.apply(TransitionBatch().add_message("m").update_state("g", 3, scope="global"))
    assert (glob.get("g"), glob.version, conv.version) == (1, 1, 0)

    manager.restart_scope(glob.ref)
    assert glob.get("g") == 1
    assert glob.set("g", 4).version == 2
    assert conv.apply(TransitionBatch().add_message("m").update_state("g", 5, scope="global")).version == 1
    assert glob.get("g") == 5
    stats = manager.stats()
    assert (stats["failures"], stats["escalations"]) == ((4, 3) if failing == "team" else (2, 1))


def test_events_arrive_in_order_and_stats_count_them(manager: GlobalStateManager) -> None:
    team = manager.get_team_state("t")
    a = manager.get_conversation_state("a", team_id="t")
    b = manager.get_conversation_state("b")
    manager.set_supervision(team.ref, max_restarts=1, within=10)
    events = Recorder(manager)
    late: list[SupervisionEvent] = []
    late_sub = manager.subscribe_supervision(late.append)
    base = manager.stats()

    _fail(manager, a)  # restart
    _fail(manager, b)  # restart, supervised by global
    _fail(manager, a)  # escalate: global restarts the team and its child
    assert events.settle() == [
        ("failed", "conversation:a", "team:t"),
        ("restarted", "conversation:a", "team:t"),
        ("failed", "conversation:b", GLOBAL),
        ("restarted", "conversation:b", GLOBAL),
        ("failed", "conversation:a", "team:t"),
        ("escalated", "conversation:a", "team:t"),
        ("restarted", "team:t", GLOBAL),
        ("restarted", "conversation:a", "team:t"),
    ]
    stamps = [e.timestamp for e in events.events]
    assert stamps == sorted(stamps)
    stats = manager.stats()
    assert stats["failures"] - base["failures"] == 3
    assert stats["restarts"] - base["restarts"] == 4
    assert stats["escalations"] - base["escalations"] == 1
    assert stats["scopes"] == 4
    # restarts neither leak nor lose actors (a scope starts its actor on its first request)
    assert stats["live_actors"] == stats["activations"] - stats["passivations"] >= 2

    late_sub.close()
    assert len(late) == 8
    _fail(manager, b)
    events.settle()
    assert len(late) == 8 and len(events.events) == 10


# -- rejected batches are not failures --------------------------------------------


def test_rejected_batches_are_not_failures(manager: GlobalStateManager) -> None:
    team = manager.get_team_state("t")
    conv = manager.get_conversation_state("c", team_id="t")
    other = manager.get_conversation_state("o", team_id="t")
    conv.apply(TransitionBatch().execute_tool("grep", {}, request_id="r1"))
    conv.set("k", 1)
    events = Recorder(manager)

    def fn_raises(_snap: object) -> TransitionBatch:
        raise ValueError("fn says no")

    rejected: list[tuple[type[Exception], Callable[[], object]]] = [
        (
            TransitionValidationError,
            lambda: conv.apply(TransitionBatch().execute_tool("g", {}, request_id="r1")),
        ),
        (
            TransitionValidationError,
            lambda: conv.apply(TransitionBatch().tool_result("g", 1, request_id="no")),
        ),
        (TransitionValidationError, lambda: conv.apply("not a batch")),  # type: ignore[arg-type]
        (VersionConflictError, lambda: conv.apply(TransitionBatch().add_message("m"), expected_version=0)),
        (
            VersionConflictError,
            lambda: conv.apply(
                TransitionBatch().update_state("k", 1, scope="team"), expected_version={"team": 7}
            ),
        ),
        (ScopeAccessError, lambda: conv.apply(TransitionBatch().update_state("k", 1, scope="workflow"))),
        (ScopeAccessError, lambda: conv.apply(TransitionBatch().close_session("o"))),
        (ValueError, lambda: conv.transact(fn_raises)),
    ]
    for kind, attempt in rejected:
        with pytest.raises(kind):
            attempt()

    async def rejected_async() -> None:
        with pytest.raises(TransitionValidationError):
            await conv.aapply(TransitionBatch().tool_result("grep", 1, request_id="nope"))

    asyncio.run(rejected_async())
    other.apply(TransitionBatch().close_session())
    with pytest.raises(ScopeClosedError):
        other.add_message("after close")

    assert conv.version == 2 and team.version == 0
    assert events.settle() == []
    assert events.restarts(team, conv, other) == [0, 0, 0]
    stats = manager.stats()
    assert (stats["failures"], stats["restarts"], stats["escalations"]) == (0, 0, 0)


def test_set_supervision_validates_the_policy(manager: GlobalStateManager) -> None:
    manager.get_team_state("t")
    with pytest.raises(ValueError, match="strategy"):
        manager.set_supervision("team:t", "one_for_some")
    with pytest.raises(ValueError, match="max_restarts"):
        manager.set_supervision("team:t", max_restarts=0)
    with pytest.raises(ScopeAccessError):
        manager.set_supervision(ScopeRef("team", "nobody"))
