"""The Ray benchmark (issue 17) runs: one quick run in a subprocess, its rows, targets, JSON and model.

No timed assertions: the numbers of a run this small on a shared machine say nothing; this checks
the plumbing (one Ray session, every row with its same-run baseline, the targets explained from the
run's own numbers, the paper model) and the facts a run must show whatever the machine's speed
(every commit reached a shard, requests in flight were coalesced into fewer Ray calls).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import victor_actors.bench as bench
from victor_actors.bench import ray as ray_bench

RAY_ROWS = {
    "ray_apply_p50", "ray_apply_p99", "ray_pipeline", "ray_pipeline_1", "ray_shards", "ray_vs_local",
    "ray_cross_p50", "ray_cross_rate", "ray_directory_miss", "ray_shard_memory", "ray_scope_memory",
}  # fmt: skip
RAY_TARGETS = {"ray_apply_p50", "ray_pipeline_rate", "ray_cross_rate"}


def test_ray_is_registered_off_by_default_and_needs_ray() -> None:
    b = bench.BENCHMARKS["ray"]
    assert b.module == "victor_actors.bench.ray" and not b.default and b.needs == ("ray",)
    assert {r.id for r in bench.ROWS if r.bench == "ray"} == RAY_ROWS
    assert {t.id for t in bench.TARGETS if t.row.startswith("ray_")} == RAY_TARGETS


@pytest.mark.timeout(180)
def test_quick_run_writes_every_row_with_a_same_run_baseline(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    out = tmp_path / "ray.json"
    cmd = [sys.executable, "-m", "victor_actors.bench.ray", "--quick", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=170, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for spec in bench.ROWS:
        if spec.bench == "ray":
            assert spec.what in proc.stdout, spec.what
    for t in bench.TARGETS:
        if t.id in RAY_TARGETS:
            assert t.text in proc.stdout, t.text
    assert "PAPER MODEL" in proc.stdout

    doc = json.loads(out.read_text())
    rows, targets = bench.evaluate({"ray": doc}, {})
    ray_rows = {r["id"]: r for r in rows if r["bench"] == "ray"}
    assert set(ray_rows) == RAY_ROWS
    for rid, row in ray_rows.items():  # ours and its baseline, both measured in this run
        assert row["ours"] is not None and row["baseline"] is not None, (rid, row["note"])
        assert row["baseline"] > 0 and row["ratio"] is not None, rid
    for t in targets:
        if t["id"] in RAY_TARGETS:
            assert t["verdict"] in ("MET", "MISSED") and t["measured"] is not None
            assert t["verdict"] == "MET" or (t["why"] and "no explanation" not in t["why"])

    tp, cfg = doc["throughput"], doc["config"]
    for name in ("two", "one"):
        run = tp[name]
        assert run["shard_commits"] == cfg["commits"]  # every commit of the round reached a shard
        assert 1 < run["ops_per_call"] <= 1000  # requests in flight left together, not one call each
        assert run["calls"] < cfg["commits"]
        assert run["cpu_us_per_commit"]["driver"] > 0
    assert set(tp["two"]["cpu_us_per_commit"]) == {"driver", "shard_0", "shard_1"}
    lt = doc["latency"]
    assert lt["apply"]["n"] == lt["bare"]["n"] == cfg["latency_calls"] * cfg["latency_rounds"]
    assert 0 < lt["request_bytes"] < lt["reply_bytes"]  # the bare call carries our sizes, both ways
    scopes = doc["memory"]["scopes"]
    assert scopes["shard_stats"]["scopes"] >= cfg["scope_conversations"]
    x = doc["cross_shard"]  # every batch of the concurrent part was a two-phase commit, none aborted
    assert x["cross_shard"] == x["commits"] and x["aborted"] == 0
    assert set(x["cpu_us_per_batch"]) == {"driver", "shard_0", "shard_1"}
    d = doc["directory"]  # each open of a scope the driver had not seen asked the directory once
    assert d["misses"] == d["scopes"] == cfg["directory_scopes"]
    assert d["hit"]["median_us"] < d["known"]["median_us"]  # a cached open makes no call
    model = doc["model"]
    assert set(model["nodes"]) == {"10", "100"}
    assert model["nodes"]["100"]["local_per_s"] == pytest.approx(10 * model["nodes"]["10"]["local_per_s"])


def _result(**over: Any) -> dict[str, Any]:
    """A hand-made bench JSON: 2 shards at 10,000/s with 50 ops per call, a bare call of 250 us."""
    doc: dict[str, Any] = {
        "config": {"inflight": 2000, "commits": 10_000, "conversations": 100},
        "call_rate": {"us_each": 250.0},
        "latency": {
            "apply": {"n": 10, "median_us": 1200.0, "p99_us": 2000.0},
            "bare": {"n": 10, "median_us": 1000.0, "p99_us": 1500.0},
            "bare_via_loop": {"n": 10, "median_us": 1100.0, "p99_us": 1800.0},
            "request_bytes": 200,
            "reply_bytes": 370,
        },
        "throughput": {
            "two": {"per_s": 10_000.0, "ops_per_call": 50.0, "rounds": [10_000.0],
                    "cpu_us_per_commit": {"driver": 100.0, "shard_0": 50.0, "shard_1": 50.0}},
            "one": {"per_s": 8_000.0, "ops_per_call": 100.0, "rounds": [8_000.0]},
            "bare_batched": {"per_s": 500_000.0, "ops_per_call": 1000, "rounds": [500_000.0]},
            "local": {"per_s": 20_000.0, "rounds": [20_000.0]},
        },
        "memory": {
            "process": {"shard_pss": 60 * 2**20, "shard_rss": 100 * 2**20, "bare_pss": 50 * 2**20,
                        "bare_rss": 90 * 2**20, "node_pss": 300 * 2**20, "driver_pss": 64 * 2**20},
            "scopes": {"conversations": 1000, "shard": {"bytes_per_conversation": 20_000.0},
                       "local": {"bytes_per_conversation": 10_000.0}},
        },
        "cross_shard": {"lone": {"n": 10, "median_us": 3000.0}, "per_s": 300.0, "tasks": 50, "commits": 1000,
                        "aborted": 0, "cpu_us_per_batch": {"driver": 400.0, "shard_0": 300.0, "shard_1": 300.0}},
        "directory": {"scopes": 100, "misses": 100, "new": {"n": 100, "median_us": 1500.0},
                      "known": {"n": 100, "median_us": 900.0}, "hit": {"n": 100, "median_us": 3.0},
                      "apply": {"n": 100, "median_us": 1200.0}},
        "meta": {"cpus": 2},
    }  # fmt: skip
    doc.update(over)
    return doc


def test_the_paper_model_is_the_measured_costs_scaled_as_stated() -> None:
    doc = _result()
    model = ray_bench.paper_model(doc)
    # 1 / 10,000/s = 100 us a commit, of which a 250 us call over 50 ops is 5 us: t_op = 95 us
    assert model["t_op_us"] == pytest.approx(95.0) and model["t_call_us"] == 250.0
    ten, hundred = model["nodes"]["10"], model["nodes"]["100"]
    assert ten["local_per_s"] == 100_000.0 and hundred["local_per_s"] == 1_000_000.0
    # spread: 2,000 in flight over 2 calls per lane x 20 shards = 50 ops per call; over 200 shards, 5
    assert ten["spread_ops_per_call"] == 50.0 and hundred["spread_ops_per_call"] == 5.0
    assert ten["spread_per_s"] == pytest.approx(10 / 100e-6)
    assert hundred["spread_per_s"] == pytest.approx(100 / (95e-6 + 250e-6 / 5))
    node = (300 + 64 + 2 * 60) * 2**20 + ray_bench.CONVERSATIONS_PER_NODE * 20_000
    assert ten["memory_bytes"] == pytest.approx(10 * node)
    assert model["global_home_per_s"] == 8_000.0 and model["cross_shard_per_s"] == 300.0


def test_the_rows_divide_by_their_same_run_baselines_and_a_miss_explains_itself() -> None:
    rows, targets = bench.evaluate({"ray": _result()}, {})
    ratios = {r["id"]: r["ratio"] for r in rows if r["bench"] == "ray"}
    assert ratios == {
        "ray_apply_p50": 1.2, "ray_apply_p99": pytest.approx(2000 / 1500), "ray_pipeline": 0.02,
        "ray_pipeline_1": 0.016, "ray_shards": 1.25, "ray_vs_local": 0.5, "ray_shard_memory": 1.2,
        "ray_scope_memory": 2.0, "ray_cross_p50": 2.5, "ray_cross_rate": pytest.approx(300 / (1e6 / 3000)),
        "ray_directory_miss": 0.75,
    }  # fmt: skip
    verdicts = {t["id"]: t for t in targets if t["id"] in RAY_TARGETS}
    assert verdicts["ray_apply_p50"]["verdict"] == "MET"  # 1.2x <= 1.5x
    rate = verdicts["ray_pipeline_rate"]
    assert rate["verdict"] == "MISSED" and rate["measured"] == 0.5  # 10,000/s against the 20,000/s bound
    assert "10,000 commits/s on 2 shards" in rate["why"] and "driver 100 us" in rate["why"]
    cross = verdicts["ray_cross_rate"]  # 300/s against the 1,000/s bound, explained by its CPU per batch
    assert cross["verdict"] == "MISSED" and cross["measured"] == pytest.approx(0.3)
    assert "300 batches/s" in cross["why"] and "driver 400 us" in cross["why"]
