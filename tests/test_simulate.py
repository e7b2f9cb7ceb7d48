"""``victor-actors simulate``: quick runs pass, and the invariant checker catches planted violations."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from victor_actors.cli import main
from victor_actors.sim import (
    AgentLedger,
    Expected,
    InvariantResult,
    Observed,
    RunLedger,
    check_invariants,
)

INVARIANTS = {
    "no lost update",
    "no partial batch",
    "message isolation",
    "rejected batches refused",
    "durable after reopen",
    "restarts accounted for",
    "rollbacks accounted for",
    "no unexpected errors",
}


def failed(results: list[InvariantResult]) -> dict[str, list[str]]:
    return {r.name: r.details for r in results if not r.ok}


# -- whole simulations ----------------------------------------------------------------------------------


def test_quick_run_in_process_passes_prints_one_line_and_writes_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report_path = tmp_path / "report.json"
    code = main(["simulate", "--quick", "--quiet", "--report", str(report_path)])
    out, err = capsys.readouterr()
    assert code == 0, out
    assert out.count("\n") == 1 and out.startswith("PASS: all 8 invariants hold; 4 agents, "), out
    assert err == ""

    report = json.loads(report_path.read_text())
    assert report["verdict"] == "PASS" and report["failed"] == []
    assert {r["name"] for r in report["invariants"]} == INVARIANTS
    assert all(r["ok"] and r["details"] == [] for r in report["invariants"])
    assert report["config"]["teams"] == 1 and report["config"]["seconds"] == 3.0
    counts = report["counts"]
    assert counts["thread_agents"] == 2 and counts["asyncio_agents"] == 2
    # every kind of fault happened, and the tallies agree with the manager's own
    assert counts["crashes_injected"] > 0 and counts["team_crashes"] > 0
    assert counts["runs_rolled_back"]["timeout"] > 0 and counts["runs_rolled_back"]["raise"] > 0
    assert all(v["sent"] > 0 and v["sent"] == v["refused"] for v in counts["rejected_batches"].values())
    assert counts["tool_requests"] > 0
    assert report["stats"]["failures"] == counts["crashes_injected"]
    assert report["stats"]["restarts"] == counts["restarts_expected"]
    assert report["throughput"]["commits_per_second"] > 0


def test_quick_run_as_a_subprocess_prints_the_json_report() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "victor_actors", "simulate", "--quick", "--json", "--seed", "3"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)  # nothing but the JSON on stdout
    assert report["verdict"] == "PASS"
    assert report["config"]["seed"] == 3
    assert [r["ok"] for r in report["invariants"]] == [True] * 8
    assert report["counts"]["commits_acknowledged"] > 0


def test_kill_mode_sigkills_the_child_and_every_acknowledged_commit_survives(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["simulate", "--quick", "--kill", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report
    assert report["kill"]["signal"] == "SIGKILL" and report["kill"]["child_exit"] == -9
    names = {r["name"] for r in report["invariants"]}
    assert "acknowledged commits survive SIGKILL" in names
    assert all(r["ok"] for r in report["invariants"])
    assert report["counts"]["commits_acknowledged"] > 0


def test_a_store_that_is_not_empty_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "something").write_text("x")
    assert main(["simulate", "--quick", "--store", str(tmp_path)]) == 2
    assert "is not empty" in capsys.readouterr().err


# -- the checker on plain data --------------------------------------------------------------------------


def msg(agent: str, seq: int, inc: int = 1, kind: str = "step") -> dict[str, Any]:
    return {"role": "assistant", "agent": agent, "seq": seq, "inc": inc, "kind": kind}


def tool(agent: str, seq: int) -> dict[str, Any]:
    content = {"agent": agent, "seq": seq, "found": True}
    return {"role": "tool", "tool_name": "lookup", "content": content, "request_id": "r", "error": None}


def healthy() -> tuple[Expected, Observed]:
    """Two agents of team t: a made 3 steps, a tool request and a rolled-back run; b made 2 steps."""
    a = AgentLedger("a", "t", "a", next_seq=5, acked=[0, 1, 2, 4], increment=3, rolled_back=[3])
    a.tool_requests = [4]
    b = AgentLedger("b", "t", "b", next_seq=2, acked=[0, 1], increment=2)
    run = RunLedger("a:1", "a", "timeout", 1, "DeadlineExceededError", None, True, 1, "restored")
    expected = Expected([a, b], [run], crashes=1, restarts=1, rejected={"access": [1, 1]})
    messages = {"a": [msg("a", 0), msg("a", 1), msg("a", 2), msg("a", 4, 0, "tool_request"), tool("a", 4)]}
    messages["b"] = [msg("b", 0), msg("b", 1)]
    versions = {"team:t": 5, "conversation:a": 6, "conversation:b": 2}
    observed = Observed({"t": 5}, messages, versions, stats={"failures": 1, "restarts": 1, "escalations": 0})
    observed.reopened_counters = dict(observed.counters)
    observed.reopened_messages = copy.deepcopy(messages)
    observed.reopened_versions = dict(versions)
    return expected, observed


def test_the_checker_passes_consistent_data() -> None:
    expected, observed = healthy()
    results = check_invariants(expected, observed)
    assert {r.name for r in results} == INVARIANTS
    assert failed(results) == {}


def test_a_lost_update_is_caught() -> None:
    expected, observed = healthy()
    observed.counters["t"] -= 1  # one acknowledged increment is not in the counter
    observed.reopened_counters = dict(observed.counters)
    bad = failed(check_invariants(expected, observed))
    assert bad["no lost update"] == ["team t: counter 4, acknowledged increments 5"]


def test_an_isolation_leak_is_caught() -> None:
    expected, observed = healthy()
    observed.messages["b"].append(msg("a", 5, 0))  # a's message in b's conversation
    observed.reopened_messages = copy.deepcopy(observed.messages)
    bad = failed(check_invariants(expected, observed))
    assert set(bad) == {"message isolation"}
    assert bad["message isolation"] == ["b: message 5 of agent a (isolation leak)"]


def test_a_partial_batch_is_caught() -> None:
    expected, observed = healthy()
    observed.messages["b"].pop()  # the counter got b's increment, the message did not land
    observed.reopened_messages = copy.deepcopy(observed.messages)
    bad = failed(check_invariants(expected, observed))
    assert "team t: counter 5, but its conversations' messages carry 4" in bad["no partial batch"][0]
    assert bad["message isolation"] == ["b: gap, messages [1] are missing"]
    assert "no lost update" not in bad


def test_gaps_order_ghosts_and_rolled_back_messages_are_caught() -> None:
    expected, observed = healthy()
    a = observed.messages["a"]
    a[1], a[2] = a[2], a[1]  # out of order
    a.append(msg("a", 3, 0))  # the rolled-back run's message came back
    bad = failed(check_invariants(expected, observed))["message isolation"]
    assert "a: messages out of order or repeated: [0, 2, 1, 4, 3]" in bad
    assert "a: message 3 of a rolled-back run is still there" in bad


def test_durability_restarts_rejections_and_rollbacks_are_checked() -> None:
    expected, observed = healthy()
    assert observed.reopened_messages is not None and observed.stats is not None
    observed.reopened_messages["b"].pop()
    observed.stats["restarts"] = 3
    for messages in (observed.messages, observed.reopened_messages):
        messages["a"].insert(0, msg("a", -1, 0, "rejected"))
    expected.runs[0].messages_removed = 0
    expected.runs.append(RunLedger("b:2", "b", "raise", 1, "SimulatedFailure", None, True, 1, "conflict"))
    expected.unexpected = ["KeyError: 'seq'"]
    bad = failed(check_invariants(expected, observed))
    assert bad["durable after reopen"] == ["b: acknowledged commits [1] missing after reopening"]
    assert bad["restarts accounted for"] == ["1 restarts expected, 3 made"]
    assert bad["rejected batches refused"] == ["a: 1 batch(es) that had to fail were committed"]
    assert bad["rollbacks accounted for"] == [
        "run a:1 (timeout) committed 1 message(s), its rollback removed 0",
        "run b:2 (raise): the counter the rollback left was not compensated",
    ]
    assert bad["no unexpected errors"] == ["KeyError: 'seq'"]


def test_after_a_kill_only_acknowledged_commits_must_be_there() -> None:
    a = AgentLedger("a", "t", "a", acked=[0, 1], increment=2)
    expected = Expected([a], killed=True, slack={"t": (0, 1)})
    # seq 2 committed but was never acknowledged: allowed, and so is its increment
    observed = Observed({"t": 3}, {"a": [msg("a", 0), msg("a", 1), msg("a", 2)]})
    results = check_invariants(expected, observed)
    assert "restarts accounted for" not in {r.name for r in results}
    assert failed(results) == {}
    observed = Observed({"t": 1}, {"a": [msg("a", 0)]})  # an acknowledged commit lost
    bad = failed(check_invariants(expected, observed))
    assert bad["acknowledged commits survive SIGKILL"] == ["a: acknowledged commits [1] lost in the crash"]
    assert bad["no lost update"] == ["team t: counter 1, acknowledged increments 2 (allowed +0..+1)"]
