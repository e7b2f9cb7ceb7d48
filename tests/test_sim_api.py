"""``victor_actors.sim.Simulation``: the user's own agents, one turn function, threads and asyncio.

Issue 31, item 3. Real managers on LMDB stores in temporary directories; the
kill-and-reopen check runs in examples/simulate_my_agents.py (tests/test_examples.py).
"""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from victor_actors import TransitionBatch
from victor_actors.cli import main
from victor_actors.sim import (
    BUILT_IN,
    Ack,
    AgentSpec,
    Fault,
    FaultPlan,
    Ledger,
    ScopeFacts,
    SimAgent,
    SimRun,
    Simulation,
    acknowledged_writes_durable,
    layout,
    reopened_equals_live,
)


def _bump(snap: Any) -> TransitionBatch:
    return TransitionBatch().update_state("counter", snap.get_state("counter", 0) + 1, scope="team")


def test_one_turn_function_runs_on_threads_and_on_asyncio_under_faults() -> None:
    seen: dict[str, set[str]] = {}
    custom: list[str] = []

    def turn(agent: SimAgent) -> Any:
        on_loop = threading.current_thread().name == "sim-asyncio"
        seen.setdefault(agent.name, set()).add("asyncio" if on_loop else "thread")
        snap = yield agent.snapshot()
        record = yield agent.apply(TransitionBatch().add_message({"n": len(snap.messages)}))
        agent.ack(record)
        agent.ack((yield agent.transact(_bump, lock=["team"])), note="counter")

    def counter_is_acknowledged(run: SimRun) -> list[str]:
        acked = sum(a.note == "counter" for a in run.ledger.acks)
        counter = run.reopened["team:t0"].values["counter"]
        return [] if counter == acked else [f"counter {counter}, acknowledged {acked}"]

    plan = FaultPlan(crash=0.1, slow=0.1, slow_seconds=0.001, custom=[Fault("mine", 0.5, custom.append)])
    sim = Simulation(
        turn, layout(1, 2, 2), steps=12, faults=plan, invariants=[*BUILT_IN, counter_is_acknowledged]
    )
    report = sim.run()
    assert report.ok, report.to_dict()
    assert seen == {a.name: {"asyncio" if a.is_async else "thread"} for a in sim.agents}
    assert report.counts["thread_agents"] == 2 and report.counts["asyncio_agents"] == 2
    assert [a.is_async for a in sim.agents] == [False, True, False, True]
    assert report.counts["turns"] == 48 and len(custom) == report.counts["faults"]["mine"] > 0
    assert report.counts["faults"].get("crash", 0) + report.counts["faults"].get("team crash", 0) > 0
    assert report.summary().startswith("PASS: all 5 invariants hold; 4 agents, 48 turns")


def test_the_seed_fixes_each_agents_plan() -> None:
    def plans(seed: int) -> dict[str, list[float]]:
        drawn: dict[str, list[float]] = {}

        def turn(agent: SimAgent) -> Any:
            drawn.setdefault(agent.name, []).append(agent.rng.random())
            yield agent.snapshot()

        Simulation(turn, ["a", "b"], steps=3, seed=seed, invariants=[]).run()
        return drawn

    assert plans(1) == plans(1) != plans(2)


def test_a_failing_invariant_and_an_unexpected_error_fail_the_verdict() -> None:
    def turn(agent: SimAgent) -> Any:
        yield agent.apply(TransitionBatch().update_state("k", agent.turns))
        if agent.name == "bad" and agent.turns == 2:
            raise KeyError("a bug in the turn")

    def never(run: SimRun) -> list[str]:
        return ["planted: this invariant never holds"]

    report = Simulation(turn, ["good", "bad"], steps=3, invariants=[*BUILT_IN, never]).run()
    assert report.verdict == "FAIL"
    failed = {r.name: r.details for r in report.results if not r.ok}
    assert failed == {
        "no unexpected errors": ["bad: KeyError: 'a bug in the turn'"],
        "never": ["planted: this invariant never holds"],
    }
    assert report.to_dict()["failed"] == ["no unexpected errors", "never"]


def test_built_in_invariants_catch_planted_violations() -> None:
    """Built by hand: a commit acknowledged at v3 that the reopened store holds only up to v2."""
    ledger = Ledger()
    ledger.acks.append(Ack("a", "c1", {"conversation:a": 3}))
    live = {"conversation:a": ScopeFacts(3, ["m"], {})}
    reopened = {"conversation:a": ScopeFacts(2, [], {})}
    run = SimRun(ledger, live, reopened, None)
    assert acknowledged_writes_durable(run) == [
        "a's acknowledged commit c1 made conversation:a v3; reopened at v2"
    ]
    assert reopened_equals_live(run) == ["conversation:a differs after reopening: v2 (live v3)"]
    assert reopened_equals_live(SimRun(ledger, live, reopened, None, killed=True)) == []


def test_bad_simulations_are_refused() -> None:
    def turn(agent: SimAgent) -> Any:
        yield agent.snapshot()

    with pytest.raises(ValueError, match="either steps"):
        Simulation(turn, ["a"])
    with pytest.raises(ValueError, match="each with its own name"):
        Simulation(turn, ["a", AgentSpec("a")], steps=1)
    with pytest.raises(ValueError, match="share between 0 and 1"):
        FaultPlan(crash=2.0)
    report = Simulation(lambda agent: None, ["a"], steps=1).run()  # type: ignore[arg-type,return-value]
    assert report.failed == ["no unexpected errors"]
    assert "not a generator of steps" in report.results[-1].details[0]


# -- deterministic mode ----------------------------------------------------------------------------


def _racy_turn(agent: SimAgent) -> Any:
    """A planted race: read the team counter, then write it back + 1 with no version check."""
    team = agent.manager.get_team_state("t0")
    snap = yield agent.snapshot(on=team)
    record = yield agent.apply(
        TransitionBatch().update_state("counter", snap.get_state("counter", 0) + 1, scope="team")
    )
    agent.ack(record, note="counter")


def _no_lost_update(run: SimRun) -> list[str]:
    acked = sum(a.note == "counter" for a in run.ledger.acks)
    counter = run.reopened["team:t0"].values.get("counter", 0)
    return [] if counter == acked else [f"counter {counter}, {acked} increments acknowledged"]


def _racy(seed: int) -> Any:
    sim = Simulation(
        _racy_turn, layout(1, 1, 3), steps=4, seed=seed, deterministic=True, invariants=[_no_lost_update]
    )
    return sim, sim.run()


def test_a_deterministic_simulation_replays_a_planted_race_from_its_seed() -> None:
    """The same seed twice: the same schedule, step for step, and the same lost update."""
    first_sim, first = _racy(11)
    second_sim, second = _racy(11)
    assert first_sim.schedule is not None and second_sim.schedule is not None
    assert first_sim.schedule.history == second_sim.schedule.history
    assert first.extra["schedule"] == second.extra["schedule"] and first.extra["schedule"]["steps"] == 24
    assert not first.ok and first.results[0].details == second.results[0].details
    assert "increments acknowledged" in first.results[0].details[0]
    _other_sim, other = _racy(12)  # another seed: another schedule
    assert other.extra["schedule"]["digest"] != first.extra["schedule"]["digest"]
    assert all(not a.is_async for a in first_sim.agents)  # one driver thread, the sync twins
    with pytest.raises(ValueError, match="takes steps, not seconds"):
        Simulation(_racy_turn, ["a"], seconds=1.0, deterministic=True)


def test_the_simulate_command_replays_a_seed(capsys: pytest.CaptureFixture[str]) -> None:
    """``victor-actors simulate --replay --seed N``: the built-in load, one schedule, twice the same.

    Time is outside the schedule: runs that must time out, and runs whose 0.1 s timeout a loaded
    machine can outlast, are left out (``--timeout-rate 0 --run-timeout 30``).
    """
    digests = []
    argv = ["simulate", "--quick", "--replay", "--steps", "6", "--seed", "3", "--json"]
    argv += ["--timeout-rate", "0", "--run-timeout", "30"]
    for _ in range(2):
        code = main(argv)
        report = json.loads(capsys.readouterr().out)
        assert code == 0 and report["verdict"] == "PASS", report["failed"]
        digests.append(report["schedule"]["digest"])
    assert digests[0] == digests[1]
    assert main(["simulate", "--replay", "--kill"]) == 2


def test_the_pytest_plugin_gives_a_seed_and_names_it_when_a_test_fails(
    tmp_path: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``victor_seed``: ``--victor-seed N`` replays a seed; a failing test's report names its seed."""
    test_file = tmp_path / "test_seeded.py"
    test_file.write_text(
        "def test_given(victor_seed):\n"
        "    assert victor_seed == 5\n\n"
        "def test_fails(victor_seed):\n"
        "    assert False, 'a planted failure'\n"
    )
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # only the plugin under test
    argv = [str(test_file), "-q", "-p", "no:cacheprovider", "-p", "victor_actors.testing._plugin"]
    argv += ["--rootdir", str(tmp_path), "--victor-seed", "5"]
    code = pytest.main(argv)  # a nested run, in this process
    out = capsys.readouterr().out
    assert code == pytest.ExitCode.TESTS_FAILED and "1 failed, 1 passed" in out, out
    assert "victor_seed was 5: replay with --victor-seed 5" in out
