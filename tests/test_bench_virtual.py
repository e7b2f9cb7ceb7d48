"""The virtual-scopes benchmark (issue 14) runs: a small quick run in a subprocess, its rows and JSON.

No timed assertions: the numbers of a run this small say nothing; this checks the plumbing
(each part in its own process, the rows, the targets, the JSON the runner reads).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import victor_actors.bench as bench


def test_quick_run_with_a_small_n_prints_its_rows_and_writes_the_json(tmp_path: Path) -> None:
    out = tmp_path / "virtual.json"
    cmd = [
        sys.executable, "-m", "victor_actors.bench.virtual", "--quick",
        "--n", "1000", "--touches", "500", "--tasks", "16", "--warm", "300", "--json", str(out),
    ]  # fmt: skip (a small warm-up: this checks the plumbing, the default 3,000 took most of a minute)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    stdout = proc.stdout
    assert "MEASURED (same run; ratio = ours / baseline)" in stdout and "TARGET" in stdout
    rows = [spec for spec in bench.ROWS if spec.bench == "virtual"]
    targets = [t for t in bench.TARGETS if t.row.startswith("virtual")]
    assert len(rows) >= 10 and len(targets) >= 8
    for spec in rows:
        assert spec.what in stdout, spec.what
    for t in targets:
        assert t.text in stdout, t.text
    assert "quoted, not measured" in stdout

    doc = json.loads(out.read_text())
    assert doc["conversations"] == 1000
    for mode in ("async", "sync"):
        part = doc["store"][mode]
        assert part["conversations"] == 1000 and part["create_per_s"] > 0 and part["anon_before"] > 0
        assert part["stats_after"]["live_actors"] == 0  # everything evicted before "after"
        assert part["stats_after"]["evicted_scopes"] >= 1000
    touch = doc["touch"]
    assert touch["touches"] == 500 and touch["baseline"]["touches"] == 500
    assert 0 < touch["reactivations"] <= 500
    assert doc["memory"]["live"]["stats_after"]["live_actors"] >= doc["memory"]["live"]["conversations"]
    assert doc["quoted"]["bytes"] == 8500

    evaluated, verdicts = bench.evaluate({"virtual": doc}, {})
    virtual = {r["id"]: r for r in evaluated if r["bench"] == "virtual"}
    # every row has its ratio (memory deltas of a run this small may be noise, even below zero)
    assert all(r["ratio"] is not None for r in virtual.values()), virtual
    assert virtual["virtual_touch"]["ratio"] > 0 and virtual["virtual_create"]["ratio"] > 0
    assert "pinned: own process (the touch rounds)" in virtual["virtual_touch"]["note"]  # one caller
    assert touch["pinned"]["cpu"] in os.sched_getaffinity(0)
    for t in verdicts:
        if t["bench"] == "virtual":
            assert t["verdict"] in ("MET", "MISSED") and t["measured"] is not None
            assert t["verdict"] == "MET" or (t["why"] and "no explanation" not in t["why"])


def test_virtual_is_registered_off_by_default() -> None:
    b = bench.BENCHMARKS["virtual"]
    assert b.module == "victor_actors.bench.virtual" and not b.default
