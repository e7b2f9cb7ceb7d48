"""``victor-actors bench`` and ``victor_actors.bench.report``: the plumbing, not the numbers.

One quick run of the cheapest benchmarks (start-up, the agent step and the LangGraph savers) in a
subprocess outside the checkout, shared by the tests that read its JSON; one
quick run of the LangGraph-comparing benchmarks with LangGraph hidden; the
rest exercise the runner's edges (a failing or missing module, an unknown
name) without running a real benchmark.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import victor_actors.bench as bench
from victor_actors import GlobalStateManager, TransitionBatch
from victor_actors.bench import _probes, _runner
from victor_actors.cli import main

PACKAGE = Path(bench.__file__).resolve().parent
HINT = "langgraph not installed (pip install 'victor-actors[bench]')"
NO_PLOT = "The plot needs matplotlib"
TARGET_IDS = {
    "apply_p50",
    "apply_p99",
    "pipeline_10",
    "pipeline_100k",
    "pipeline_flat",
    "snapshot",
    "durable_floor",
    "bytes_written",
    "disk_10k",
    "lg_put",
    "lg_put_raw",
    "lg_get",
    "lg_graph",
    "lg_disk",
    "lg_concurrent",
    "lg_long_disk",
    "storage",
    "security_commits",
    "security_reopen",
    "security_bytes",
    "otel_disabled",
    "virtual_bytes",
    "virtual_bytes_sync",
    "virtual_create",
    "virtual_create_sync",
    "virtual_touch",
    "virtual_react_p50",
    "virtual_react_p99",
    "virtual_slowest",
    "groupcommit_one_rate",
    "groupcommit_one",
    "groupcommit_many",
    "groupcommit_sqlite",
    "ray_apply_p50",
    "ray_pipeline_rate",
    "remote_four_sync",
    "remote_p50_sync",
    "remote_four_mem",
    "remote_p50_mem",
}
LANGGRAPH_ROWS = {"durable_1", "durable_100", "storage_sqlite", "agent", "agent_memory"}


def has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:
        return False


HAS_LANGGRAPH = has("langgraph") and has("langgraph.checkpoint.sqlite")
HAS_MATPLOTLIB = has("matplotlib")


def hide_langgraph(root: Path) -> Path:
    """A directory that, first on PYTHONPATH, makes ``import langgraph`` fail as if it were not installed."""
    for name in ("langgraph", "langgraph_checkpoint_lmdb"):
        (root / name).mkdir(parents=True)
        message = f"No module named '{name}'"
        (root / name / "__init__.py").write_text(f"raise ModuleNotFoundError({message!r}, name={name!r})\n")
    return root


def hidden_path(root: Path) -> str:
    """PYTHONPATH with the hiding directory first, then whatever the tests run with (a checkout's own)."""
    return os.pathsep.join(p for p in (str(hide_langgraph(root)), os.environ.get("PYTHONPATH")) if p)


def bench_cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "victor_actors", "bench", "--quick", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=cwd, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], str]:
    where = tmp_path_factory.mktemp("bench")  # outside the checkout: no benchmarks/ directory needed
    path = where / "bench.json"
    proc = bench_cli("--only", "startup,agent,langgraph", "--json", str(path), cwd=where)
    return path, json.loads(path.read_text()), proc.stdout


def report(json_path: Path, out: Path, *, block_matplotlib: bool = False) -> subprocess.CompletedProcess[str]:
    if block_matplotlib:  # as if matplotlib were not installed, whether it is or not
        code = (
            "import runpy, sys; sys.modules['matplotlib'] = None; "
            f"sys.argv = ['report', {str(json_path)!r}, '--out', {str(out)!r}]; "
            "runpy.run_module('victor_actors.bench.report', run_name='__main__', alter_sys=True)"
        )
        cmd = [sys.executable, "-c", code]
    else:
        cmd = [sys.executable, "-m", "victor_actors.bench.report", str(json_path), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


# -- a real quick run ------------------------------------------------------------------------------------


def test_quick_run_prints_the_table_and_writes_the_json(quick_run: tuple[Path, dict[str, Any], str]) -> None:
    _path, doc, stdout = quick_run
    assert doc["schema"] == 1 and doc["mode"] == "quick" and doc["wall_seconds"] > 0
    meta = doc["meta"]
    for key in ("cpu_model", "cpus", "memory_bytes", "python", "date", "packages"):
        assert meta[key], key
    assert meta["packages"]["victor-actors"] and meta["packages"]["pykka"]
    assert list(doc["benchmarks"]) == ["startup", "agent", "langgraph"]

    startup = doc["benchmarks"]["startup"]
    assert startup["status"] == "ok" and startup["seconds"] > 0
    assert startup["module"] == "victor_actors.bench.startup"
    sizes = startup["result"]["sizes"]
    assert len(sizes) == 2
    for size in sizes.values():
        assert size["ours"]["start_s"] > 0 and size["bare"]["start_s"] > 0 and size["ratio_start"] > 0

    rows = {r["id"]: r for r in doc["rows"]}
    assert set(rows) == {spec.id for spec in bench.ROWS}
    for row in rows.values():
        assert set(row) >= {"bench", "what", "unit", "better", "ours", "baseline", "ratio", "note"}
    for rid in ("startup_small", "startup_large", "agent_durable"):
        assert rows[rid]["ratio"] == pytest.approx(rows[rid]["ours"] / rows[rid]["baseline"])
    assert rows["apply_p50"]["ratio"] is None and rows["apply_p50"]["note"] == "not selected (--only)"

    targets = {t["id"]: t for t in doc["targets"]}
    assert set(targets) == TARGET_IDS
    for t in targets.values():
        assert t["verdict"] in ("MET", "MISSED", "NOT RUN") and t["op"] in ("<=", ">=") and t["threshold"] > 0
        if t["verdict"] == "MISSED":
            assert t["why"] and "no explanation" not in t["why"]
    assert targets["apply_p50"]["verdict"] == "NOT RUN"
    assert doc["benchmarks"]["agent"]["status"] == "ok"  # ours runs with or without LangGraph
    lg_targets = [t for tid, t in targets.items() if tid.startswith("lg_")]
    assert len(lg_targets) == 7
    if HAS_LANGGRAPH and has("langgraph_checkpoint_lmdb"):
        assert doc["benchmarks"]["langgraph"]["status"] == "ok"
        for t in lg_targets:
            assert t["verdict"] in ("MET", "MISSED") and t["measured"] > 0, t
    else:
        assert all(t["verdict"] == "NOT RUN" for t in lg_targets)

    assert "MEASURED (same run; ratio = ours / baseline)" in stdout
    assert "TARGET" in stdout and "\ntargets: " in stdout
    assert "start N scope actors / N bare pykka actors (larger N)" in stdout


def test_report_writes_the_markdown_and_the_plot(
    quick_run: tuple[Path, dict[str, Any], str], tmp_path: Path
) -> None:
    path, doc, _ = quick_run
    proc = report(path, tmp_path)
    md = (tmp_path / "benchmarks.md").read_text()
    assert md.startswith("# Benchmarks\n")
    assert "## Targets" in md and "python -m victor_actors.bench.report" in md
    assert "| target | measured | verdict | why (misses, from this run's numbers) |" in md
    for t in doc["targets"]:
        assert f"| {t['target']} |" in md
    assert "## Machine" in md and f"| CPU | {doc['meta']['cpu_model']} |" in md
    assert "## Measured values" in md and "start N scope actors / N bare pykka actors (smaller N)" in md
    assert "### startup" in md and "ratio_start" in md  # every value the benchmark wrote
    assert "| startup | `victor_actors.bench.startup` | ok |" in md
    png = tmp_path / "benchmarks.png"
    if HAS_MATPLOTLIB:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert "![ratios against targets](benchmarks.png)" in md and NO_PLOT not in md
        assert "benchmarks.png" in proc.stdout
    else:
        assert not png.exists() and NO_PLOT in md


def test_report_keeps_the_hand_written_notes_below_the_marker(
    quick_run: tuple[Path, dict[str, Any], str], tmp_path: Path
) -> None:
    """Regression: a regeneration dropped the hand-written sections (issue 15's notes)."""
    from victor_actors.bench.report import KEPT_MARKER

    path, _, _ = quick_run
    (tmp_path / "benchmarks.md").write_text(f"# old\n\nstale table\n\n{KEPT_MARKER}\n\n## A note\n\nkept\n")
    report(path, tmp_path)
    md = (tmp_path / "benchmarks.md").read_text()
    assert md.startswith("# Benchmarks\n") and "stale table" not in md
    assert md.endswith(f"{KEPT_MARKER}\n\n## A note\n\nkept\n") and md.count(KEPT_MARKER) == 1


def test_report_without_matplotlib_still_writes_the_markdown_and_says_so(
    quick_run: tuple[Path, dict[str, Any], str], tmp_path: Path
) -> None:
    path, _doc, _ = quick_run
    (tmp_path / "benchmarks.png").write_bytes(b"a plot from an earlier run")
    proc = report(path, tmp_path, block_matplotlib=True)
    md = (tmp_path / "benchmarks.md").read_text()
    assert NO_PLOT in md and "pip install 'victor-actors[bench]'" in md and "](benchmarks.png)" not in md
    assert "## Targets" in md
    assert not (tmp_path / "benchmarks.png").exists()  # a stale plot would not match the report
    assert NO_PLOT in proc.stdout


def test_without_langgraph_ours_run_and_only_the_langgraph_rows_say_so(tmp_path: Path) -> None:
    """store and agent measure ours and skip their LangGraph peer; the langgraph benchmark is skipped."""
    env = {**os.environ, "PYTHONPATH": hidden_path(tmp_path / "hide")}
    out = tmp_path / "bench.json"
    proc = bench_cli(
        "--only", "store,agent", "--only", "langgraph", "--json", str(out), cwd=tmp_path, env=env
    )
    doc = json.loads(out.read_text())
    statuses = {n: doc["benchmarks"][n]["status"] for n in ("store", "agent", "langgraph")}
    assert statuses == {"store": "ok", "agent": "ok", "langgraph": "skipped"}
    assert doc["benchmarks"]["langgraph"]["reason"] == HINT
    for name in ("store", "agent"):
        assert doc["benchmarks"][name]["result"]["skipped"] == {"langgraph": HINT}
    rows = {r["id"]: r for r in doc["rows"] if r["bench"] in ("store", "agent")}
    for rid, row in rows.items():
        if rid in LANGGRAPH_ROWS:
            assert row["ratio"] is None and row["note"] == HINT, rid
        else:  # ours against our own or a raw baseline
            assert row["ratio"] is not None and row["ratio"] > 0, rid
    targets = {t["id"]: t for t in doc["targets"]}
    for tid in ("lg_put", "lg_graph", "lg_concurrent"):  # the whole benchmark was skipped
        assert targets[tid]["verdict"] == "NOT RUN" and targets[tid]["why"] == f"skipped: {HINT}"
    assert targets["durable_floor"]["verdict"] in ("MET", "MISSED")  # against raw LMDB: no LangGraph
    assert targets["storage"]["verdict"] in ("MET", "MISSED")
    assert proc.stdout.count(HINT) >= 3


# -- the runner's edges, without running a real benchmark -------------------------------------------------


def test_every_benchmark_is_a_module_of_the_installed_package(tmp_path: Path) -> None:
    """The runner finds every benchmark in the package itself, and each imports without LangGraph."""
    assert set(bench.BENCHMARKS) == {
        "core", "pipeline", "startup", "store", "agent", "scale", "langgraph", "security", "otel",
        "listing", "virtual", "groupcommit", "checkpoints", "ray", "remote",
    }  # fmt: skip
    for b in bench.BENCHMARKS.values():
        spec = importlib.util.find_spec(b.module)
        assert spec is not None and spec.origin is not None, b.module
        assert Path(spec.origin).resolve().parent == PACKAGE and b.module == f"victor_actors.bench.{b.name}"
    modules = [b.module for b in bench.BENCHMARKS.values()] + ["victor_actors.bench.report"]
    code = "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name).main\n"
    env = {**os.environ, "PYTHONPATH": hidden_path(tmp_path / "hide")}
    proc = subprocess.run(
        [sys.executable, "-c", code, *modules],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr


def test_the_private_probes_still_work() -> None:
    """The two reads past the public surface (``_probes.py``) against the runtime as it is."""
    with GlobalStateManager.open(max_live_actors=None) as manager:
        handle = manager.get_conversation_state("probe")
        assert not _probes.is_live(handle)  # a new scope starts its actor on its first request
        futures = [_probes.send_nowait(handle, TransitionBatch().update_state("k", i)) for i in range(5)]
        assert [f.get(timeout=10.0).version for f in futures] == [1, 2, 3, 4, 5]
        assert _probes.is_live(handle)
        assert handle.get("k") == 4


def test_a_langgraph_import_error_in_the_child_counts_as_not_installed() -> None:
    stderr = "Traceback ...\nModuleNotFoundError: No module named 'langgraph.checkpoint.sqlite'\n"
    assert _runner._missing_module(stderr) == "langgraph.checkpoint.sqlite"
    assert _runner._missing_module("ValueError: boom") is None


def fake_bench(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, source: str) -> None:
    """``startup`` replaced by a module of ``source``, importable here and in the child."""
    (tmp_path / "fake_startup.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    fake = dataclasses.replace(bench.BENCHMARKS["startup"], module="fake_startup")
    monkeypatch.setitem(bench.BENCHMARKS, "startup", fake)


def test_a_failing_benchmark_is_reported_and_exits_1(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_bench(monkeypatch, tmp_path, "import sys\nprint('boom', file=sys.stderr)\nraise SystemExit(3)\n")
    assert main(["bench", "--quick", "--only", "startup"]) == 1
    out = capsys.readouterr().out
    assert "failed" in out and "exit status 3: boom" in out


def test_one_size_only_leaves_that_row_missing_not_made_up(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake_bench(
        monkeypatch,
        tmp_path,
        "import json, sys\n"
        "path = sys.argv[sys.argv.index('--json') + 1]\n"
        "side = lambda s: {'start_s': s, 'rss_per_actor_bytes': 0}\n"
        "size = {'actors': 10, 'rounds': 1, 'ours': side(2.0), 'bare': side(1.0)}\n"
        "json.dump({'sizes': {'10': size}}, open(path, 'w'))\n",
    )
    out = tmp_path / "bench.json"
    assert main(["bench", "--quick", "--only", "startup", "--json", str(out)]) == 0
    rows = {r["id"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["startup_small"]["ratio"] == 2.0
    assert rows["startup_large"]["ratio"] is None and "IndexError" in rows["startup_large"]["note"]


def test_a_benchmark_module_that_is_not_there_fails_with_its_name(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    gone = dataclasses.replace(bench.BENCHMARKS["startup"], module="victor_actors.bench.no_such_bench")
    monkeypatch.setitem(bench.BENCHMARKS, "startup", gone)
    assert main(["bench", "--quick", "--only", "startup"]) == 1
    assert "no module victor_actors.bench.no_such_bench here" in capsys.readouterr().out


def test_an_unknown_benchmark_name_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--only", "core,nope"]) == 2
    err = capsys.readouterr().err
    assert "no benchmark named 'nope'" in err and "core, pipeline, startup, store, agent" in err


def test_every_missed_target_explains_itself_from_the_numbers() -> None:
    """Synthetic results shaped like each script's JSON: the verdicts follow the thresholds."""
    lat = {k: {"n": 10, "median_us": 10.0, "p99_us": 20.0} for k in ("echo", "snap10", "copy_dict")}
    lat |= {"apply1": {"n": 10, "median_us": 30.0, "p99_us": 25.0}, "snap100k": lat["snap10"]}
    lat |= {"apply1_call": {"n": 10, "median_us": 25.0, "p99_us": 22.0}, "aapply1": lat["apply1"]}
    tp = {k: {"per_s": 1000.0} for k in ("aapply_10", "aapply_100k", "prebuilt_10", "prebuilt_100k")}
    tp |= {"tell": {"per_s": 10_000.0}, "futures_10": {"per_s": 1500.0}, "futures_100k": {"per_s": 1400.0}}
    acc = {"store_commits": 0, "store_txns": 0}
    store = {k: {"rate": 1000.0, **acc} for k in ("sync1", "raw_lmdb", "mem1", "async100")}
    store |= {
        "sqlite_put": {"rate": 400.0, **acc},
        "sync100": {"rate": 5000.0, "store_commits": 50, "store_txns": 5},
    }
    storage = {
        "steps": 1000,
        "plain_msgpack_bytes": 300,
        "sqlite": {"final_state_bytes": 300, "file": {"size": 9000}},
    }
    storage["ours"] = {
        "final_state_bytes": 100,
        "scope_bytes": 250,
        "kept": "3 ckpts",
        "data_mdb": {"size": 400},
    }
    agent_rates = {"ours_sync": 500.0, "ours_memory": 5000.0, "langgraph_sqlite": 100.0}
    results = {
        "core": {"latency": lat},
        "pipeline": {"throughput": tp, "in_flight": 100, "rounds": 1},
        "store": {"throughput": store, "storage": storage, "meta": {"cpus": 2}},
        "agent": {"rates": agent_rates, "rounds": 1, "steps": 1},
    }
    rows, targets = bench.evaluate(results, {"startup": "not selected (--only)"})
    verdicts = {t["id"]: t["verdict"] for t in targets}
    assert verdicts == {
        "apply_p50": "MISSED",  # 3.0x > 1.15x
        "apply_p99": "MET",  # 1.25x
        "pipeline_10": "MISSED",  # 0.1x < 0.5x
        "pipeline_100k": "MISSED",
        "pipeline_flat": "MET",  # 1.0x
        "snapshot": "MET",  # 1.0x
        "durable_floor": "MET",  # 1.0x
        **{tid: "NOT RUN" for tid in TARGET_IDS if tid.startswith("lg_")},  # langgraph not in these results
        "storage": "MISSED",  # 4x > 3x
        "security_commits": "NOT RUN",  # not in these results
        "security_reopen": "NOT RUN",
        "security_bytes": "NOT RUN",
        "otel_disabled": "NOT RUN",
        **{
            tid: "NOT RUN"
            for tid in TARGET_IDS
            if tid.startswith(("virtual", "groupcommit", "ray_", "remote_"))
        },
        "bytes_written": "NOT RUN",
        "disk_10k": "NOT RUN",
    }
    whys = {t["id"]: t["why"] for t in targets}
    assert all(whys[tid] == "" for tid, v in verdicts.items() if v == "MET")
    assert "30.0 us vs echo 10.0 us" in whys["apply_p50"]
    assert "1,000 us per pipelined aapply vs 100 us per raw tell" in whys["pipeline_10"]
    assert "data.mdb 400 B vs a 100 B" in whys["storage"]
    assert {r["id"]: r["note"] for r in rows}["startup_small"] == "not selected (--only)"


def test_a_skipped_langgraph_peer_leaves_only_its_rows_without_a_ratio() -> None:
    storage: dict[str, Any] = {"steps": 1000, "plain_msgpack_bytes": 300}
    storage["ours"] = {
        "final_state_bytes": 100,
        "scope_bytes": 250,
        "kept": "3 ckpts",
        "data_mdb": {"size": 200},
    }
    store = {
        k: {"rate": 1000.0, "store_commits": 0, "store_txns": 0} for k in ("sync1", "sync100", "raw_lmdb")
    }
    results = {
        "store": {"throughput": store, "storage": storage, "skipped": {"langgraph": HINT}},
        "agent": {"rates": {"ours_sync": 500.0, "ours_memory": 5000.0}, "rounds": 1, "steps": 1,
                  "skipped": {"langgraph": HINT}},
    }  # fmt: skip
    rows, targets = bench.evaluate(results, {})
    by_id = {r["id"]: r for r in rows}
    assert {rid for rid in LANGGRAPH_ROWS if by_id[rid]["note"] == HINT} == LANGGRAPH_ROWS
    assert by_id["durable_raw"]["ratio"] == 1.0 and by_id["agent_durable"]["ratio"] == 0.1
    verdicts = {t["id"]: (t["verdict"], t["why"]) for t in targets}
    assert verdicts["lg_put"][0] == "NOT RUN"  # the langgraph benchmark is not in these results
    assert verdicts["durable_floor"] == ("MET", "")  # 1.0x a bare synced txn: no LangGraph needed
    assert verdicts["storage"] == ("MET", "")  # 2x <= 3x: ours alone decides it


def test_the_checkpoints_rows_divide_by_the_final_state_and_explain_a_miss() -> None:
    run = {"steps": 10_000, "bytes_put": 4_000, "log_bytes_put": 3_000, "checkpoint_bytes_put": 1_000,
           "data_mdb": 2_000, "final_state_bytes": 1_000, "final_plain_bytes": 3_500, "kept": "3 ckpts",
           "reload_seconds": 0.02, "decode_full_seconds": 0.01, "open_seconds": 0.001}  # fmt: skip
    small = {**run, "steps": 1_000, "data_mdb": 5_000}
    results = {"checkpoints": {"long": 10_000, "runs": {"1000": small, "10000": run}}}
    rows, targets = bench.evaluate(results, {})
    ratios = {r["id"]: r["ratio"] for r in rows if r["bench"] == "checkpoints"}
    assert ratios == {"ckpt_bytes": 4.0, "ckpt_disk_1k": 5.0, "ckpt_disk_10k": 2.0, "ckpt_reload": 2.0}
    verdicts = {t["id"]: (t["verdict"], t["why"]) for t in targets}
    assert verdicts["disk_10k"] == ("MET", "")
    verdict, why = verdicts["bytes_written"]
    assert verdict == "MISSED" and "the commit log alone is 3,000 B (3.00x" in why and "3.50x" in why
