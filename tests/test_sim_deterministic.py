"""The deterministic simulation, finished (issue 31, item 4; ADR 0034).

A virtual clock decides every deadline while it is installed; the seeded
schedule picks the agents' steps and the tool calls; a failing schedule
shrinks to a shorter one that fails the same way and replays from a token;
the command and the pytest plugin expose both. No test here orders threads by
sleeping or asserts a duration: the few real sleeps are work that takes real
time, which the virtual clock must not count.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from victor_actors import (
    DeadlineExceededError,
    GlobalStateManager,
    RunTimeoutError,
    TransitionBatch,
    VictorActorsError,
    _clock,
)
from victor_actors.lowlevel import VirtualClock, current_clock, use_clock
from victor_actors.sim import ReplayTokenError, SimRun, Simulation, layout
from victor_actors.sim._schedule import decode_token

# -- the planted races ------------------------------------------------------------------------------


def lost_update(agent: Any) -> Any:
    """Read the team counter, write it back + 1 without a version check: a lost update."""
    team = agent.manager.get_team_state("t0")
    snap = yield agent.snapshot(on=team)
    write = TransitionBatch().update_state("counter", snap.get_state("counter", 0) + 1, scope="team")
    agent.ack((yield agent.apply(write)))


def acked_inside_a_run(agent: Any) -> Any:
    """A timeout race: the counter write is acknowledged inside a short run that may time out later.

    The write itself is safe (``modify``); the bug is the acknowledgement before the run ends: when
    the rest of the run's work (a virtual sleep) takes it past its timeout, the rollback undoes an
    acknowledged write. Whether it does depends on how the others' steps and sleeps fall in virtual time.
    """
    team = agent.manager.get_team_state("t0")

    def bump(snap: Any) -> TransitionBatch:
        return TransitionBatch().update_state("counter", snap.get_state("counter", 0) + 1, scope="team")

    def body(run: Any) -> Any:
        yield agent.sleep(agent.rng.uniform(0.0, 0.006))  # thinking
        agent.ack((yield agent.modify(bump, on=team)))
        yield agent.sleep(agent.rng.uniform(0.0, 0.006))  # the rest of the run's work

    yield from agent.in_run(body, timeout=0.01)


def counter_matches(run: SimRun) -> list[str]:
    counter = run.reopened["team:t0"].values.get("counter", 0)
    acked = len(run.ledger.acks)
    return [] if counter == acked else [f"counter {counter}, {acked} acknowledged"]


def _timeout_race(seed: int) -> dict[str, Any]:
    sim = Simulation(
        acked_inside_a_run,
        layout(1, 1, 3),
        steps=3,
        seed=seed,
        deterministic=True,
        invariants=[counter_matches],
    )
    report = sim.run()
    assert sim.schedule is not None
    return {
        "failed": report.failed,
        "details": report.results[0].details,
        "errors": report.counts["errors"],
        "schedule": report.extra["schedule"],
        "history": sim.schedule.history,
    }


# -- the clock ----------------------------------------------------------------------------------------


def test_the_clock_is_real_unless_a_virtual_one_is_installed() -> None:
    """Nothing changes when no virtual clock is installed: the port is ``time.monotonic`` itself."""
    assert _clock.monotonic is time.monotonic and _clock.time is time.time and current_clock() is None
    clock = VirtualClock()
    with use_clock(clock):
        assert current_clock() is clock and _clock.monotonic() == clock.start
        with pytest.raises(VictorActorsError, match="already installed"), use_clock(VirtualClock()):
            pass
        assert current_clock() is clock  # the refused one changed nothing
        clock.advance(2.5)
        assert _clock.monotonic() == clock.start + 2.5 and _clock.time() == clock.epoch + 2.5
        with pytest.raises(ValueError):
            clock.advance(-1.0)
    assert _clock.monotonic is time.monotonic and current_clock() is None


def test_a_deadline_is_decided_in_virtual_time_not_by_the_real_time_a_step_takes() -> None:
    """A run's timeout and its requests' deadlines count virtual time only.

    50 ms of real work inside a run with a 10 ms timeout (a sleep standing for work, not ordering
    anything) times the run out on the real clock, and leaves it well within its time under the
    virtual one; once virtual time passes its deadline, its next request gives up at once and the
    run is rolled back. Before the clock port every one of these deadlines read ``time.monotonic``
    (the virtual half failed: the request was refused).
    """
    with GlobalStateManager.open() as manager:
        conv = manager.get_conversation_state("c")
        with pytest.raises(RunTimeoutError), manager.run("r", timeout=0.01):
            time.sleep(0.05)
            with pytest.raises(DeadlineExceededError):
                conv.apply(TransitionBatch().update_state("n", 1))
    clock = VirtualClock()
    with use_clock(clock), GlobalStateManager.open() as manager:
        conv = manager.get_conversation_state("c")
        # a 1 ns timeout: no virtual time passes while the actor works, so it is answered
        assert conv.apply(TransitionBatch().update_state("n", 0), timeout=1e-9).committed
        with manager.run("r", timeout=0.01):
            time.sleep(0.05)  # real work inside the run: virtual time stands still
            assert conv.apply(TransitionBatch().update_state("n", 1), timeout=0.01).committed
        with pytest.raises(RunTimeoutError), manager.run("r", timeout=0.01):
            conv.apply(TransitionBatch().update_state("n", 2))
            clock.advance(0.02)  # the run's time is up: its next request gives up at once
            with pytest.raises(DeadlineExceededError):
                conv.apply(TransitionBatch().update_state("n", 3))
        assert conv.get("n") == 1  # the timed-out run's write was rolled back


def test_a_sleeping_agent_lets_the_others_go_and_the_clock_jumps_when_all_sleep() -> None:
    """``agent.sleep`` is virtual in a deterministic run: no real wait, and the schedule's time moves."""

    def napper(agent: Any) -> Any:
        yield agent.sleep(5.0)
        yield agent.apply(TransitionBatch().update_state("woke", True))

    started = time.monotonic()
    sim = Simulation(napper, layout(1, 1, 2), steps=1, deterministic=True, step_seconds=0.0, invariants=[])
    report = sim.run()
    assert report.ok and sim.schedule is not None
    assert sim.schedule.virtual_seconds == 5.0  # both slept in parallel: one jump of 5 s
    assert time.monotonic() - started < 5.0  # not a timed assertion: a real 5 s sleep would exceed it
    assert [call for _, call, _ in sim.schedule.history].count("sleep") == 2


# -- replay of a timeout race ------------------------------------------------------------------------


def test_a_timeout_race_replays_identically_in_two_processes() -> None:
    """Issue 31's test: a race decided by a run's timeout replays from its seed, twice, identically.

    Two separate processes run seed 3 of :func:`acked_inside_a_run`; each reports the failed
    invariant, its details, the errors (the runs that timed out), the schedule's digest and the
    whole history. They are equal, and the timeout outcome is part of them. On the real clock
    (before the virtual one) the timeouts fell where the machine's speed put them.
    """
    runs = []
    for _ in range(2):
        out = subprocess.run(
            [sys.executable, str(Path(__file__)), "3"],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        runs.append(json.loads(out.stdout))
    first, second = runs
    assert first == second
    assert first["failed"] == ["counter matches"] and first["errors"].get("RunTimeoutError", 0) > 0
    assert any(outcome == "raised RunTimeoutError" for _, _, outcome in first["history"])
    here = json.loads(json.dumps(_timeout_race(3)))  # and this process agrees with both
    assert here == first


# -- tools and events in the schedule ------------------------------------------------------------------


def _tool_turn(agent: Any) -> Any:
    batch = TransitionBatch().execute_tool("echo", {"who": agent.name, "turn": agent.turns})
    yield agent.apply(batch)
    while (yield agent.snapshot()).pending_tool_requests:
        yield agent.sleep(0.001)


def _tool_run(seed: int) -> tuple[list[str], list[tuple[str, str, str]]]:
    order: list[str] = []

    def setup(manager: GlobalStateManager) -> None:
        manager.register_tool(
            "echo", lambda call: order.append(f"{call.arguments['who']}/{call.arguments['turn']}")
        )

    sim = Simulation(_tool_turn, layout(1, 1, 3), steps=2, seed=seed, deterministic=True, setup=setup)
    report = sim.run()
    assert report.ok, report.to_dict()
    assert sim.schedule is not None
    return order, sim.schedule.history


def test_tool_calls_complete_in_an_order_the_schedule_picks() -> None:
    """Tool calls are held and run one at a time when the seeded schedule picks them.

    Each pick of a tool is a step of the history (``tool@<scope>``); one seed gives the same order
    of executions twice; other seeds give other orders, so the order is the schedule's choice, not
    the worker threads'.
    """
    order, history = _tool_run(4)
    assert _tool_run(4) == (order, history)
    assert len(order) == 6 and sum(who.startswith("tool@") for who, _, _ in history) == 6
    assert len({tuple(_tool_run(seed)[0]) for seed in range(5, 9)} | {tuple(order)}) > 1


def test_a_turn_that_waits_for_its_tool_result_is_served_by_the_schedule() -> None:
    """``agent.wait_tool_result`` in a deterministic run: the agent waits out of the picks until the
    schedule has run its scope's call, then gets the result; without that the driver would block on
    a call that only a later pick runs (until the wait's timeout)."""

    def turn(agent: Any) -> Any:
        rid = f"{agent.name}-{agent.turns}"
        yield agent.apply(TransitionBatch().execute_tool("double", {"n": agent.turns}, request_id=rid))
        message = yield agent.wait_tool_result(rid, timeout=30.0)
        agent.ack((yield agent.apply(TransitionBatch().update_state("last", message["content"]))))

    def run(seed: int) -> tuple[Any, ...]:
        def setup(manager: GlobalStateManager) -> None:
            manager.register_tool("double", lambda call: 2 * call.arguments["n"])

        sim = Simulation(turn, layout(1, 1, 2), steps=2, seed=seed, deterministic=True, setup=setup)
        report = sim.run()
        assert report.ok, report.to_dict()
        assert sim.schedule is not None
        assert [
            r.values["last"] for ref, r in sorted(report.run.reopened.items()) if ref.startswith("conv")
        ] == [4, 4]
        return tuple(sim.schedule.history)

    history = run(5)
    assert history == run(5)
    assert any(call == "wait_tool_result" for _, call, _ in history)  # it waited for the schedule


def test_subscribers_see_the_same_events_in_the_same_order_for_one_seed() -> None:
    """Events are determined by commit order once each step is quiesced: proven, not scheduled.

    A subscriber on every conversation and on the team records what it is told; two runs of one
    seed record the same sequence (each step commits to one scope, and the quiesce after it
    delivers its events before the next step).
    """

    def run(seed: int) -> list[tuple[str, int]]:
        seen: list[tuple[str, int]] = []

        def setup(manager: GlobalStateManager) -> None:
            for ref in ("team:t0", *(f"conversation:{s.name}" for s in layout(1, 1, 3))):
                manager.scope(ref).subscribe(lambda e: seen.append((str(e.ref), e.new_version)))

        def turn(agent: Any) -> Any:
            yield from lost_update(agent)
            yield agent.apply(TransitionBatch().add_message({"from": agent.name}))

        Simulation(
            turn, layout(1, 1, 3), steps=3, seed=seed, deterministic=True, setup=setup, invariants=[]
        ).run()
        return seen

    first = run(21)
    assert first == run(21) and len(first) == 18


# -- shrinking ----------------------------------------------------------------------------------------


def test_shrinking_a_lost_update_keeps_the_invariant_and_its_token_replays_it() -> None:
    """A failing schedule shrinks to a strictly shorter one that fails the same invariant, and replays.

    The planted lost update (two agents read the counter, both write it + 1) needs two reads and
    two writes; the whole run has dozens of steps. The shrunk schedule is shorter in picks and in
    steps, fails ``counter matches`` alone, and its token fails again with the same history.
    """
    sim = Simulation(
        lost_update, layout(1, 1, 3), steps=4, seed=11, deterministic=True, invariants=[counter_matches]
    )
    report = sim.run()
    assert report.failed == ["counter matches"]
    shrunk = sim.shrink(report)
    assert len(shrunk.picks) < shrunk.original_picks and shrunk.steps < shrunk.original_steps
    assert shrunk.failed == ("counter matches",)
    assert len(shrunk.picks) == 2 and shrunk.steps == 4  # the two reads, then the two writes
    again = Simulation(
        lost_update,
        layout(1, 1, 3),
        steps=4,
        deterministic=True,
        invariants=[counter_matches],
        replay=shrunk.token,
    )
    replayed = again.run()
    assert replayed.failed == ["counter matches"] and again.schedule is not None
    assert tuple(again.schedule.history) == shrunk.history
    assert "replay it with Simulation(..., replay=" in shrunk.describe()


def test_shrinking_a_timeout_race_keeps_the_timeout() -> None:
    """The timeout race shrinks too, to a schedule where a run still times out after its ack."""
    sim = Simulation(
        acked_inside_a_run, layout(1, 1, 3), steps=3, seed=3, deterministic=True, invariants=[counter_matches]
    )
    report = sim.run()
    shrunk = sim.shrink(report, max_runs=80)
    assert len(shrunk.picks) < shrunk.original_picks and shrunk.failed == ("counter matches",)
    assert any(outcome == "raised RunTimeoutError" for _, _, outcome in shrunk.history)


def test_shrink_and_replay_refuse_what_they_cannot_use() -> None:
    """A passing or non-deterministic simulation has nothing to shrink; a bad token runs nothing."""
    sim = Simulation(lost_update, layout(1, 1, 1), steps=2, deterministic=True, invariants=[counter_matches])
    with pytest.raises(ValueError, match="nothing was shrunk"):
        sim.shrink()
    with pytest.raises(ValueError, match="only a deterministic"):
        Simulation(lost_update, layout(1, 1, 1), steps=1).shrink()
    for token in ("v2.abc", "v1.!!!", "hello"):
        with pytest.raises(ReplayTokenError, match="nothing was run"):
            decode_token(token)
        with pytest.raises(ReplayTokenError):
            Simulation(lost_update, layout(1, 1, 1), steps=1, replay=token)


# -- the command and the plugin -------------------------------------------------------------------------


def test_simulate_replay_with_timeouts_replays_and_shrink_prints_a_token(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``simulate --replay`` now replays runs that time out (virtual time); ``--shrink`` shrinks a failure.

    The built-in load passes, so a failure is planted in its checker: ``no lost update`` fails once
    any team counter reaches 3. ``--shrink`` prints a shorter schedule that still fails it, and
    ``--schedule TOKEN`` replays that one and fails the same way.
    """
    from victor_actors.__main__ import main
    from victor_actors.sim import _load
    from victor_actors.sim._ledger import InvariantResult

    argv = [
        "simulate",
        "--quick",
        "--replay",
        "--steps",
        "4",
        "--seed",
        "3",
        "--json",
        "--timeout-rate",
        "0.3",
    ]
    reports = []
    for _ in range(2):
        assert main(argv) == 0
        reports.append(json.loads(capsys.readouterr().out))
    assert reports[0]["schedule"] == reports[1]["schedule"]
    assert reports[0]["counts"]["runs_rolled_back"]["timeout"] > 0

    real_check = _load.check_invariants

    def planted(expected: Any, observed: Any) -> list[InvariantResult]:
        results = real_check(expected, observed)
        if max(observed.counters.values()) >= 3:
            results[0] = InvariantResult(results[0].name, False, 1, ["planted: a counter reached 3"])
        return results

    monkeypatch.setattr(_load, "check_invariants", planted)
    argv = ["simulate", "--quick", "--replay", "--steps", "3", "--seed", "3", "--quiet", "--shrink"]
    argv += ["--shrink-runs", "25", "--timeout-rate", "0", "--crash-rate", "0"]
    assert main(argv) == 1
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("shrunk: "))
    kept, total = (int(n) for n in line.split()[1:4:2])
    assert kept < total and "still fail no lost update" in line
    token = line.rsplit("--schedule ", 1)[1]
    assert (
        main(
            [
                "simulate",
                "--quick",
                "--steps",
                "3",
                "--json",
                "--schedule",
                token,
                "--timeout-rate",
                "0",
                "--crash-rate",
                "0",
            ]
        )
        == 1
    )
    assert json.loads(capsys.readouterr().out)["failed"] == ["no lost update"]
    assert main(["simulate", "--quick", "--shrink"]) == 2


def test_the_pytest_plugin_names_a_failing_simulation_and_shrinks_it(
    tmp_path: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A test's failed deterministic Simulation is reported with its token; ``--victor-shrink`` shrinks it.

    Only the simulations the test ran are reported: the attempts of a shrink inside the test are not
    (the first version listed each of them, and shrank each one again).
    """
    test_file = tmp_path / "test_sim_fails.py"
    test_file.write_text(
        "from victor_actors import TransitionBatch\n"
        "from victor_actors.sim import Simulation, layout\n\n"
        "def lost_update(agent):\n"
        "    team = agent.manager.get_team_state('t0')\n"
        "    snap = yield agent.snapshot(on=team)\n"
        "    c = snap.get_state('counter', 0)\n"
        "    write = TransitionBatch().update_state('counter', c + 1, scope='team')\n"
        "    agent.ack((yield agent.apply(write)))\n\n"
        "def counter_matches(run):\n"
        "    counter = run.reopened['team:t0'].values.get('counter', 0)\n"
        "    return [] if counter == len(run.ledger.acks) else [f'counter {counter}']\n\n"
        "def test_lost(victor_seed):\n"
        "    sim = Simulation(lost_update, layout(1, 1, 3), steps=4, seed=victor_seed, deterministic=True,\n"
        "                     invariants=[counter_matches])\n"
        "    assert sim.run().ok\n\n"
        "def test_shrinks_itself():\n"
        "    sim = Simulation(lost_update, layout(1, 1, 3), steps=4, seed=11, deterministic=True,\n"
        "                     invariants=[counter_matches])\n"
        "    sim.shrink()\n"
        "    assert False, 'shrunk'\n"
    )
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    argv = [str(test_file), "-q", "-p", "no:cacheprovider", "-p", "victor_actors.testing._plugin"]
    argv += ["--rootdir", str(tmp_path), "--victor-seed", "11", "--victor-shrink"]
    assert pytest.main(argv) == pytest.ExitCode.TESTS_FAILED
    out = capsys.readouterr().out
    assert "victor_seed was 11: replay with --victor-seed 11" in out
    assert "a deterministic Simulation failed counter matches (seed 11" in out
    assert "shrunk from " in out and "to 2 (4 steps)" in out and out.count("replay=") >= 2
    # a shrink inside a test reports the simulation it shrank, not each of its failing attempts
    assert out.count("a deterministic Simulation failed") == 2


if __name__ == "__main__":  # one run of the timeout race, for the two-process test
    print(json.dumps(_timeout_race(int(sys.argv[1]))))
