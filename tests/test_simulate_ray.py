"""``victor-actors simulate --ray``: the agents through RayStateManager, every shard killed once.

One end-to-end run on a real local Ray session (``ray.init(num_cpus=2, include_dashboard=False)``,
shard actors with real LMDB stores in a temporary directory), the flag's errors, and the Ray-only
invariants on plain data with planted violations. Before issue 17 item 8 there was no ``--ray``
flag: every test here fails on that code (argparse refuses the flag, the checker module is absent).
"""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from victor_actors.cli import main
from victor_actors.sim import (
    AgentLedger,
    Expected,
    InvariantResult,
    Observed,
    RayFacts,
    RunLedger,
    check_ray_invariants,
)

RAY_INVARIANTS = {
    "no lost update",
    "no partial batch",
    "message isolation",
    "rejected batches refused",
    "durable after reopen",
    "global counter: no lost update, no partial cross-shard batch",
    "acknowledged commits survive shard kills, none applied twice",
    "every shard killed and recovered",
    "events delivered in order across the kills",
    "rollbacks accounted for",
    "no unexpected errors",
}


@pytest.fixture(scope="module")
def ray_session() -> Iterator[None]:
    ray = pytest.importorskip("ray")  # the "ray" extra is in the test extra: CI always runs this
    # address="local": a session of our own, even while another test's ``Cluster`` runs on this machine
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.mark.timeout(90)
def test_a_quick_ray_simulation_passes_with_every_shard_killed_and_recovered(
    ray_session: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report_path = tmp_path / "report.json"
    code = main(["simulate", "--ray", "--quick", "--quiet", "--report", str(report_path)])
    out, _ = capsys.readouterr()
    report = json.loads(report_path.read_text())
    assert code == 0, [r for r in report["invariants"] if not r["ok"]]
    assert out.startswith("PASS: all 11 invariants hold; 4 agents on 2 Ray shards, "), out
    assert report["verdict"] == "PASS" and report["failed"] == []
    assert {r["name"] for r in report["invariants"]} == RAY_INVARIANTS
    assert all(r["ok"] and r["details"] == [] for r in report["invariants"])

    counts = report["counts"]
    # each shard hosts a team, so batches cross shards (global lives on shard 0)
    assert all(counts["teams_per_shard"][str(n)] for n in range(2))
    assert counts["commits_by_shard"]["0"] > 0 and counts["commits_by_shard"]["1"] > 0
    assert counts["cross_shard_commits"] > 0 and counts["global_increments"] > 0
    # every shard was killed, a new process answered for it, and commits were acknowledged on it after
    kills = report["ray"]["kills"]
    assert sorted(k["shard"] for k in kills) == [0, 1]
    for k in kills:
        assert k["killed"] and k["recovered"], k
        assert k["calls_after"] < k["calls_before"], k  # the counters of a new process
        assert k["commits_after_recovery"] > 0, k
    # the other faults happened too, and each one was answered as it must be
    assert all(v["sent"] > 0 and v["sent"] == v["refused"] for v in counts["rejected_batches"].values())
    assert counts["runs_rolled_back"]["timeout"] > 0 and counts["runs_rolled_back"]["raise"] > 0
    checked = {r["name"]: r["checked"] for r in report["invariants"]}
    assert checked["events delivered in order across the kills"] > counts["commits_acknowledged"]
    assert (
        checked["acknowledged commits survive shard kills, none applied twice"]
        == (counts["commits_acknowledged"])
    )


@pytest.mark.timeout(120)
def test_two_driver_processes_share_the_shards_and_both_drivers_commits_are_checked(
    ray_session: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 24's ``simulate --ray --shards 2`` with two driver processes: this process runs half the
    agents, a child process that joins the same Ray and attaches to the same shards runs the other
    half, every shard is killed once under both, and the invariants are checked over what both drivers
    were acknowledged. Before ``--drivers`` argparse refused the flag (exit 2): this failed on main."""
    report_path = tmp_path / "report.json"
    argv = ["simulate", "--ray", "--shards", "2", "--drivers", "2", "--quick", "--seconds", "4"]
    code = main([*argv, "--quiet", "--report", str(report_path)])
    out, _ = capsys.readouterr()
    report = json.loads(report_path.read_text())
    assert code == 0, [r for r in report["invariants"] if not r["ok"]]
    assert out.startswith("PASS: all 11 invariants hold; 4 agents on 2 Ray shards from 2 driver processes"), (
        out
    )
    assert {r["name"] for r in report["invariants"]} == RAY_INVARIANTS
    assert all(r["ok"] and r["details"] == [] for r in report["invariants"])

    counts = report["counts"]
    assert counts["drivers"] == report["ray"]["drivers"] == 2
    by_driver = counts["commits_by_driver"]
    assert by_driver["0"] > 0 and by_driver["1"] > 0, by_driver
    assert by_driver["0"] + by_driver["1"] == counts["commits_acknowledged"]
    # each driver's acknowledged steps are in the stores reopened after the shards stopped, each once
    assert counts["store_messages_by_driver"] == by_driver
    # both drivers wrote through both shards while each shard was killed and recovered
    assert all(counts["teams_per_shard"][str(n)] for n in range(2))
    assert counts["cross_shard_commits"] > 0
    kills = report["ray"]["kills"]
    assert sorted(k["shard"] for k in kills) == [0, 1]
    assert all(k["killed"] and k["recovered"] for k in kills), kills
    # this driver's subscriptions saw the other driver's commits, in order (every conversation's)
    checked = {r["name"]: r["checked"] for r in report["invariants"]}
    assert checked["events delivered in order across the kills"] > counts["commits_acknowledged"]


def test_drivers_needs_ray_and_an_agent_for_each_driver(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--drivers", "2", "--quick"]) == 2
    assert "--drivers splits the agents of a --ray run" in capsys.readouterr().err
    assert main(["simulate", "--ray", "--drivers", "5", "--quick"]) == 2  # --quick has 4 agents
    assert "--drivers 5 is more than the run's 4 agents" in capsys.readouterr().err


def test_ray_mode_without_the_ray_package_is_a_clear_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # ``import ray`` raises ImportError
    assert main(["simulate", "--ray", "--quick"]) == 2
    err = capsys.readouterr().err
    assert "--ray needs the ray package: pip install 'victor-actors[ray]'" in err


def test_ray_mode_refuses_kill_and_a_single_shard(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--ray", "--kill", "--quick"]) == 2
    assert "--kill" in capsys.readouterr().err
    assert main(["simulate", "--ray", "--shards", "1", "--quick"]) == 2
    assert "at least 2 shards" in capsys.readouterr().err


# -- the Ray checker on plain data ----------------------------------------------------------------


def msg(agent: str, seq: int, ginc: int = 0) -> dict[str, Any]:
    return {"role": "assistant", "agent": agent, "seq": seq, "inc": 1, "kind": "step", "ginc": ginc}


def healthy() -> tuple[Expected, Observed, RayFacts]:
    """Agents a (team t, shard 0) and b (team u, shard 1); b's second step also added 1 to global."""
    a = AgentLedger("a", "t", "a", next_seq=2, acked=[0, 1], increment=2)
    b = AgentLedger("b", "u", "b", next_seq=2, acked=[0, 1], increment=2)
    run = RunLedger("r", "a", "raise", 0, "SimulatedFailure", None, True, 0)
    expected = Expected([a, b], [run], rejected={"access": [1, 1]})
    messages = {"a": [msg("a", 0), msg("a", 1)], "b": [msg("b", 0), msg("b", 1, ginc=1)]}
    versions = {"team:t": 2, "team:u": 2, "conversation:a": 2, "conversation:b": 2, "global:global": 1}
    observed = Observed({"t": 2, "u": 2}, messages, versions)
    observed.reopened_counters = dict(observed.counters)
    observed.reopened_messages = copy.deepcopy(messages)
    observed.reopened_versions = dict(versions)
    kills = [
        {"shard": n, "killed": True, "recovered": True, "calls_before": 9, "calls_after": 0}
        | {"commits_after_recovery": 1, "recovered_after_seconds": 1.5}
        for n in (1, 0)
    ]
    facts = RayFacts(1, 1, 1, 2, kills, {"a": (0, [1, 2], 2), "b": (0, [1, 2], 2)})
    return expected, observed, facts


def failed(results: list[InvariantResult]) -> dict[str, list[str]]:
    return {r.name: r.details for r in results if not r.ok}


def test_the_ray_checker_passes_consistent_data() -> None:
    results = check_ray_invariants(*healthy())
    assert {r.name for r in results} == RAY_INVARIANTS
    assert failed(results) == {}


def test_a_commit_applied_twice_by_a_retry_is_caught() -> None:
    expected, observed, facts = healthy()
    for messages in (observed.messages, observed.reopened_messages or {}):
        messages["b"].append(msg("b", 1, ginc=1))  # the retry of an applied batch, applied again
    facts.global_counter = facts.global_reopened = 2
    bad = failed(check_ray_invariants(expected, observed, facts))
    assert bad["acknowledged commits survive shard kills, none applied twice"] == [
        "b: commits [1] applied more than once"
    ]
    assert bad["global counter: no lost update, no partial cross-shard batch"] == [
        "global counter 2, acknowledged increments 1"
    ]


def test_half_a_cross_shard_batch_is_caught() -> None:
    expected, observed, facts = healthy()
    facts.global_counter = facts.global_reopened = 0  # b's message landed, its global half did not
    bad = failed(check_ray_invariants(expected, observed, facts))
    assert bad["global counter: no lost update, no partial cross-shard batch"] == [
        "global counter 0, acknowledged increments 1",
        "global counter 0, but the messages carry 1",
    ]


def test_a_lost_commit_an_unrecovered_shard_and_lost_events_are_caught() -> None:
    expected, observed, facts = healthy()
    observed.messages["a"].pop()  # an acknowledged commit gone after the kill
    facts.kills[1]["recovered"] = False
    facts.kills[0]["commits_after_recovery"] = 0
    facts.events["b"] = (0, [2], 2)  # the event of version 1 never came
    bad = failed(check_ray_invariants(expected, observed, facts))
    assert bad["acknowledged commits survive shard kills, none applied twice"] == [
        "a: acknowledged commits [1] lost"
    ]
    assert bad["every shard killed and recovered"] == [
        "shard 1: no commit was acknowledged on it after it recovered",
        "shard 0: no new process answered for it after it was killed",
    ]
    assert bad["events delivered in order across the kills"] == [
        "b: events for versions 1..2 expected in order; lost [1], doubled [], 1 delivered"
    ]


def test_a_run_left_in_place_is_caught() -> None:
    expected, observed, facts = healthy()
    expected.runs.append(RunLedger("s", "b", "timeout", 1, "ShardUnavailableError", None, False, 0))
    bad = failed(check_ray_invariants(expected, observed, facts))
    assert bad["rollbacks accounted for"] == [
        "run s of b (timeout) raised ShardUnavailableError and was not rolled back",
        "run s of b (timeout) raised ShardUnavailableError, not DeadlineExceededError",
        "run s of b (timeout) committed 1 message(s), 0 removed",
    ]
