"""Issue 30's benchmark rows and the before/after script: the plumbing, never the numbers.

One quick ``victor-actors bench`` run of ``core``, ``sequential`` and ``simulate`` in a
subprocess, shared by the tests that read its JSON: each new row runs and reports a ratio, each
new target a verdict, and the latency rows say where they were pinned. Then pinning itself on
real threads, and ``alternate`` run once for real on two exports of this checkout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import victor_actors.bench as bench
from victor_actors.bench import _pin, alternate
from victor_actors.bench._machine import source_checkout

NEW_ROWS = ("apply_lock", "seq_fsync", "seq_lmdb", "seq_memory", "simulate", "simulate_clean")
NEW_TARGETS = {"apply_lock": 2.0, "seq_fsync": 1.5, "seq_lmdb": 1.0}


def affinity(tid: int) -> set[int]:
    return set(os.sched_getaffinity(tid))


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    where = tmp_path_factory.mktemp("bench30")
    path = where / "bench.json"
    cmd = [sys.executable, "-m", "victor_actors", "bench", "--quick", "--only", "core,sequential,simulate"]
    proc = subprocess.run([*cmd, "--json", str(path)], capture_output=True, text=True, timeout=300, cwd=where)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc: dict[str, Any] = json.loads(path.read_text())
    doc["stdout"] = proc.stdout
    return doc


def test_each_new_row_runs_and_reports_a_ratio(run: dict[str, Any]) -> None:
    rows = {r["id"]: r for r in run["rows"]}
    for rid in NEW_ROWS:
        row = rows[rid]
        assert row["ours"] > 0 and row["baseline"] > 0, row
        assert row["ratio"] == pytest.approx(row["ours"] / row["baseline"]), row
        assert row["what"] in run["stdout"], rid
    assert rows["seq_lmdb"]["unit"] == "ops/s" and rows["seq_lmdb"]["better"] == "higher"
    assert rows["seq_fsync"]["unit"] == "us" and rows["seq_fsync"]["better"] == "lower"
    seq = run["benchmarks"]["sequential"]["result"]
    assert seq["record_bytes"] > 0  # the fdatasync and the LMDB txn write what one commit hands the store
    assert set(seq["latency"]) == {"ours", "fdatasync", "lmdb", "memory"}
    sim = run["benchmarks"]["simulate"]["result"]
    assert sim["config"]["agents"] == 16 and all(r["commits"] > 0 for r in sim["rates"].values())


def test_the_issues_targets_are_registered_with_its_thresholds(run: dict[str, Any]) -> None:
    targets = {t["id"]: t for t in run["targets"]}
    for tid, threshold in NEW_TARGETS.items():
        t = targets[tid]
        assert t["threshold"] == threshold and t["verdict"] in ("MET", "MISSED") and t["measured"] > 0, t
        if t["verdict"] == "MISSED":
            assert t["why"] and "no explanation" not in t["why"], t
    assert targets["apply_p50"]["threshold"] == 1.0 and targets["seq_lmdb"]["op"] == ">="
    spec = {t.id: t for t in bench.TARGETS}
    assert spec["durable_floor"].threshold == 1.0 and spec["durable_floor"].op == ">="
    assert spec["groupcommit_sqlite"].threshold == 5.0 and spec["virtual_touch"].threshold == 0.5
    assert spec["virtual_create"].bound == 5000.0


def test_latency_rows_say_where_they_were_pinned(run: dict[str, Any]) -> None:
    rows = {r["id"]: r for r in run["rows"]}
    allowed = affinity(0)
    for name in ("core", "sequential"):
        pin = run["benchmarks"][name]["result"]["pinned"]
        assert pin["cpu"] in allowed and "pinned:" in pin["how"], pin
    for rid in ("apply_p50", "apply_lock", "seq_fsync", "seq_lmdb"):
        assert "pinned: own process, every thread, to CPU" in rows[rid]["note"], rows[rid]
    assert "not pinned" in rows["simulate"]["note"]


def test_pinned_pins_every_thread_and_restores_each_ones_mask() -> None:
    release, started = threading.Event(), threading.Event()
    before_ids: list[int] = []

    def park() -> None:
        before_ids.append(threading.get_native_id())
        started.set()
        release.wait(timeout=30)

    old, young = threading.Thread(target=park), threading.Thread(target=park)
    old.start()
    assert started.wait(timeout=10)
    main_mask = affinity(0)
    try:
        with _pin.pinned() as pin:
            assert pin.cpu is not None and pin.cpu in main_mask
            assert affinity(0) == {pin.cpu} and affinity(before_ids[0]) == {pin.cpu}  # started before
            started.clear()
            young.start()
            assert started.wait(timeout=10)
            assert affinity(before_ids[1]) == {pin.cpu}  # started inside: inherited
        assert affinity(0) == main_mask and affinity(before_ids[0]) == main_mask
        assert affinity(before_ids[1]) == main_mask  # widened again on the way out
    finally:
        release.set()
        old.join(timeout=10)
        if young.ident is not None:
            young.join(timeout=10)


def test_the_cpu_can_be_chosen_and_a_wrong_choice_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    allowed = affinity(0)
    monkeypatch.setenv(_pin.CPU_ENV, str(min(allowed)))
    assert _pin.choose_cpu() == min(allowed)
    monkeypatch.setenv(_pin.CPU_ENV, "9999")  # not a CPU this process may use
    assert _pin.choose_cpu() == max(allowed)


def test_alternate_picks_rows_by_id_or_benchmark_and_refuses_unknown_names() -> None:
    assert alternate.pick_rows(["seq_lmdb", "apply_p50"]) == ["apply_p50", "seq_lmdb"]  # the table's order
    assert alternate.pick_rows(["simulate"]) == ["simulate", "simulate_clean"]
    with pytest.raises(ValueError, match="'nope' is neither a row id nor a benchmark name"):
        alternate.pick_rows(["apply_p50", "nope"])
    assert set(alternate.DEFAULT_ROWS) <= {spec.id for spec in bench.ROWS}


@pytest.mark.skipif(source_checkout() is None, reason="needs the package's git checkout")
def test_alternate_runs_old_and_new_in_turn_and_prints_the_medians(tmp_path: Path) -> None:
    """Old and new are both HEAD here (two exports): the plumbing, not a speed-up."""
    out = tmp_path / "alt.json"
    cmd = [sys.executable, "-m", "victor_actors.bench.alternate", "--old", "HEAD", "--new", "HEAD"]
    cmd += ["--rows", "seq_memory", "--rounds", "2", "--quick", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    order = [line.split(": ", 1)[1] for line in proc.stdout.splitlines() if line.startswith("  round ")]
    first, second = (
        ["sequential on old ...", "sequential on new ..."],
        ["sequential on new ...", "sequential on old ..."],
    )
    assert order == first + second  # the second round runs new first
    doc = json.loads(out.read_text())
    (row,) = doc["rows"]
    assert row["id"] == "seq_memory" and len(row["old_runs"]) == 2 and len(row["new_runs"]) == 2
    assert row["new_over_old"] == pytest.approx(row["new"] / row["old"]) and len(row["per_round"]) == 2
    assert doc["failures"] == {"old": [], "new": []}
    assert "seq_memory" in proc.stdout and "new/old" in proc.stdout


def test_alternate_refuses_an_unknown_row_before_running_anything(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "victor_actors.bench.alternate", "--old", "HEAD", "--rows", "nope"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2 and "'nope' is neither a row id nor a benchmark name" in proc.stderr
    assert "round" not in proc.stdout


def test_the_new_targets_follow_their_thresholds_and_explain_a_miss_from_the_numbers() -> None:
    """Synthetic results shaped like core's, sequential's and simulate's JSON."""

    def lat(p50: float) -> dict[str, float]:
        return {"n": 10, "median_us": p50, "p99_us": p50 * 2}

    pin = {"cpu": 1, "how": "pinned: own process, every thread, to CPU 1"}
    core = {"latency": {"echo": lat(50.0), "apply1": lat(60.0), "apply1_call": lat(55.0), "lock": lat(0.5)},
            "pinned": pin}  # fmt: skip
    side = {"per_s": 0.0, "n": 10, "p99_us": 1.0}
    seq = {
        "record_bytes": 290, "pinned": pin,
        "latency": {"ours": side | {"median_us": 300.0, "per_s": 3000.0},
                    "fdatasync": side | {"median_us": 150.0, "per_s": 6000.0},
                    "lmdb": side | {"median_us": 280.0, "per_s": 3300.0},
                    "memory": side | {"median_us": 40.0, "per_s": 20000.0}},
    }  # fmt: skip
    rate = {"commits": 600, "load_seconds": 3.0, "failed_runs": 0}
    rates = {"sync": 200.0, "async": 250.0, "sync_clean": 300.0, "async_clean": 300.0}
    sim = {
        "config": {"agents": 16, "steps": 40, "rounds": 3, "seed": 7},
        "pinned": {"cpu": None, "how": "not pinned"},
        "rates": {k: rate | {"commits_per_s": v} for k, v in rates.items()},
    }
    sim["rates"]["sync"]["failed_runs"] = 1
    rows, targets = bench.evaluate({"core": core, "sequential": seq, "simulate": sim}, {})
    by_id = {t["id"]: t for t in targets}
    assert by_id["apply_p50"]["verdict"] == "MISSED"  # 1.2x > 1.0x
    lock_why = by_id["apply_lock"]["why"]
    assert by_id["apply_lock"]["verdict"] == "MISSED" and "vs 0.50 us for a lock" in lock_why
    assert "a bare pykka ask, the cost of crossing to an actor's thread and back, is 50.0 us" in lock_why
    assert by_id["seq_fsync"]["verdict"] == "MISSED"  # 2.0x > 1.5x
    assert (
        "p50 300 us per durable apply vs 150 us for one fdatasync of its 290 B" in (by_id["seq_fsync"]["why"])
    )
    assert by_id["seq_lmdb"]["verdict"] == "MISSED"  # 3,000/s / 3,300/s = 0.91x < 1.0x
    assert by_id["seq_lmdb"]["why"].startswith("3,000 durable commits/s vs 3,300/s bare synced LMDB txns")
    notes = {r["id"]: r["note"] for r in rows}
    assert "runs that FAILED their invariants: sync 1, async 0" in notes["simulate"]
    assert "FAILED" not in notes["simulate_clean"]
    ratios = {r["id"]: r["ratio"] for r in rows}
    assert ratios["simulate"] == pytest.approx(0.8) and ratios["seq_lmdb"] == pytest.approx(3000 / 3300)
