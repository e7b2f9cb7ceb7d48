"""Many scopes: passivation and reactivation, the live-actor cap, bounded mailboxes."""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path

import pytest
from helpers import wait_for as _wait_for

from victor_actors import (
    BackpressureError,
    GlobalStateManager,
    StateChanged,
    TransitionBatch,
)
from victor_actors.testing import inject_fault


def _live(handle: object) -> bool:
    return handle._cell.actor is not None  # type: ignore[attr-defined]


@pytest.mark.parametrize("durable", [False, True])
def test_passivation_keeps_state_version_subscriptions_and_parents(tmp_path: Path, durable: bool) -> None:
    path = tmp_path if durable else None
    with GlobalStateManager.open(path, idle_timeout=0.05, durability="async") as m:
        conv = m.get_conversation_state("c", workflow_id="wf", team_id="t")
        seen: list[StateChanged] = []
        conv.subscribe(seen.append)
        conv.apply(TransitionBatch().add_message("hi").update_state("k", 1))
        m.get_team_state("t").set("goal", "g")
        assert _wait_for(lambda: not _live(conv)), "the idle scope was not passivated"
        before = m.stats()
        assert before["passivated_scopes"] >= 1 and before["passivations"] >= 1
        snap = conv.snapshot()  # reads need no actor
        assert (snap.version, snap.get_state("k"), snap.get_state("goal")) == (1, 1, "g")
        assert conv.parent == m.get_workflow_state("wf").ref
        assert conv.set("k", 2).version == 2  # a write reactivates it
        assert _live(conv) or m.stats()["activations"] > before["activations"]
        assert m.stats()["activations"] > before["activations"]
        assert _wait_for(lambda: [e.new_version for e in seen] == [1, 2]), "the subscription did not survive"
        # a cross-scope batch reactivates a passivated ancestor too
        team = m.get_team_state("t")
        assert _wait_for(lambda: not _live(team))
        record = conv.apply(TransitionBatch().add_message("x").update_state("n", 1, scope="team"))
        assert team.ref in record.involved and team.get("n") == 1
    if durable:
        with GlobalStateManager.open(path) as m:
            assert m.get_conversation_state("c").snapshot().get_state("k") == 2


def test_the_live_actor_cap_evicts_least_recently_used(tmp_path: Path) -> None:
    with GlobalStateManager.open(tmp_path, max_live_actors=10) as m:
        convs = [m.get_conversation_state(f"c{i}") for i in range(60)]
        for i, c in enumerate(convs):
            c.set("i", i)
        stats = m.stats()
        assert stats["live_actors"] <= 10
        assert stats["peak_live_actors"] <= 11
        assert stats["evictions"] >= 50
        # the most recently used survive; early ones were evicted and come back on demand
        assert _live(convs[-1]) and not _live(convs[0])
        for i, c in enumerate(convs):
            assert c.get("i") == i and c.version == 1
        assert convs[0].set("i", 100).version == 2
        assert m.stats()["live_actors"] <= 10


def test_a_scope_in_a_run_or_with_pending_tools_is_not_passivated() -> None:
    with GlobalStateManager.open(idle_timeout=60.0) as m:  # sweeps are triggered by hand here
        conv = m.get_conversation_state("c")
        other = m.get_conversation_state("o")
        tools = m.get_conversation_state("t")
        tools.apply(TransitionBatch().execute_tool("nobody_runs_this", {}))
        m.passivator.idle_timeout = 0.0
        with m.run("c", timeout=10) as _run:
            conv.set("k", 1)
            time.sleep(0.01)
            m.passivate_idle()
            assert _live(conv)  # the run is still going
            assert not _live(other)  # an idle scope outside the run was passivated
        assert _live(tools)  # a pending tool request keeps its scope live
        m.passivate_idle()
        assert not _live(conv)


def test_reject_backpressure_refuses_at_once_and_applies_nothing() -> None:
    with GlobalStateManager.open(mailbox_size=2, backpressure="reject", request_timeout=5.0) as m:
        conv = m.get_conversation_state("c")
        release = threading.Event()
        inject_fault(m, conv.ref, lambda: release.wait(5.0))  # the actor is stuck on the first request
        first = threading.Thread(target=conv.set, args=("a", 1))
        first.start()
        assert _wait_for(lambda: conv._cell.busy)
        queued = [threading.Thread(target=conv.set, args=(f"q{i}", i)) for i in range(2)]
        for t in queued:
            t.start()
        assert _wait_for(lambda: m.stats()["mailbox_depth_max"] == 2)
        started = time.monotonic()
        with pytest.raises(BackpressureError, match="mailbox"):
            conv.set("refused", 1)
        assert time.monotonic() - started < 1.0  # refused at once, not after the deadline
        release.set()
        first.join()
        for t in queued:
            t.join()
        assert conv.get("refused") is None and conv.version == 3


def test_wait_backpressure_waits_for_room_then_its_deadline() -> None:
    with GlobalStateManager.open(mailbox_size=1, backpressure="wait") as m:
        conv = m.get_conversation_state("c")
        release = threading.Event()
        inject_fault(m, conv.ref, lambda: release.wait(5.0))
        first = threading.Thread(target=conv.set, args=("a", 1))
        first.start()
        assert _wait_for(lambda: conv._cell.busy)
        queued = threading.Thread(target=conv.set, args=("b", 1))
        queued.start()
        assert _wait_for(lambda: m.stats()["mailbox_depth_max"] == 1)
        with pytest.raises(BackpressureError, match="deadline"):
            conv.set("late", 1, timeout=0.2)
        # with room made before its deadline, a waiting request goes through
        waiter = threading.Thread(target=conv.set, args=("waited", 1))
        waiter.start()
        time.sleep(0.05)
        release.set()
        for t in (first, queued, waiter):
            t.join()
        assert conv.get("waited") == 1 and conv.get("late") is None


def test_a_flooded_scope_does_not_hold_up_a_quiet_one() -> None:
    with GlobalStateManager.open() as m:
        noisy = m.get_conversation_state("noisy")
        quiet = m.get_conversation_state("quiet")

        def latencies(n: int) -> list[float]:
            out = []
            for i in range(n):
                start = time.perf_counter()
                quiet.set("k", i)
                out.append(time.perf_counter() - start)
            return out

        calm = statistics.median(latencies(200))
        stop = threading.Event()

        def flood(n: int) -> None:
            i = 0
            while not stop.is_set():
                noisy.add_message({"from": n, "i": i})
                i += 1

        flooders = [threading.Thread(target=flood, args=(n,)) for n in range(8)]
        for t in flooders:
            t.start()
        try:
            time.sleep(0.05)
            stormy = statistics.median(latencies(200))
        finally:
            stop.set()
            for t in flooders:
                t.join()
        # The quiet scope's requests never queue behind the flood: only CPU is shared (2 cores, one
        # GIL), so its median latency may grow by a bounded factor, never with the flood's backlog.
        assert stormy < calm * 25, (calm, stormy)


def test_closing_with_many_passivated_scopes_is_prompt() -> None:
    m = GlobalStateManager.open(max_live_actors=50)
    for i in range(500):
        m.get_conversation_state(f"c{i}").set("k", i)
    assert m.stats()["live_actors"] <= 50
    m.close()  # does not hang on the passivated scopes
    assert m.stats()["live_actors"] <= 50
    assert threading.active_count() < 100
