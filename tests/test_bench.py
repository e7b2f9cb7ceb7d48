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
NO_PLOT = "The figures need matplotlib"
TARGET_IDS = {
    "apply_p50",
    "apply_lock",
    "apply_p99",
    "pipeline_10",
    "pipeline_100k",
    "pipeline_flat",
    "snapshot",
    "durable_floor",
    "seq_fsync",
    "seq_lmdb",
    "bytes_written",
    "disk_10k",
    "lg_put",
    "lg_put_raw",
    "lg_get",
    "lg_graph",
    "lg_disk",
    "lg_concurrent",
    "lg_long_disk",
    "lg_put_pg",
    "lg_get_pg",
    "lg_graph_pg",
    "lg_concurrent_pg",
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
    "ray_cross_rate",
    *(f"sdk_{sdk}_{what}" for sdk in ("adk", "openai", "claude") for what in ("one", "p50", "many")),
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
    selected = {"startup", "agent", "langgraph"}
    assert set(rows) == {spec.id for spec in bench.ROWS if spec.bench in selected}  # only what was asked
    for row in rows.values():
        assert set(row) >= {"bench", "what", "unit", "better", "ours", "baseline", "ratio", "note"}
    for rid in ("startup_small", "startup_large", "agent_durable"):
        assert rows[rid]["ratio"] == pytest.approx(rows[rid]["ours"] / rows[rid]["baseline"])
    targets = {t["id"]: t for t in doc["targets"]}
    assert set(targets) == {tid for tid in TARGET_IDS if tid.startswith("lg_")}  # startup, agent: none
    for t in targets.values():
        assert t["verdict"] in ("MET", "MISSED", "NOT RUN") and t["op"] in ("<=", ">=") and t["threshold"] > 0
        if t["verdict"] == "MISSED":
            assert t["why"] and "no explanation" not in t["why"]
    assert doc["benchmarks"]["agent"]["status"] == "ok"  # ours runs with or without LangGraph
    lg_targets = [t for tid, t in targets.items() if tid.startswith("lg_")]
    assert len(lg_targets) == 11
    if HAS_LANGGRAPH and has("langgraph_checkpoint_lmdb"):
        assert doc["benchmarks"]["langgraph"]["status"] == "ok"
        skipped = doc["benchmarks"]["langgraph"]["result"]["meta"]["skipped"]
        for tid, t in targets.items():  # PostgresSaver's rows need a local PostgreSQL the run could start
            if tid.endswith("_pg") and "postgres" in skipped:
                assert t["verdict"] == "NOT RUN", t
            else:
                assert t["verdict"] in ("MET", "MISSED") and t["measured"] > 0, t
    else:
        assert all(t["verdict"] == "NOT RUN" for t in lg_targets)

    assert "MEASURED (same run; ratio = ours / baseline)" in stdout
    assert "start N scope actors / N bare pykka actors (larger N)" in stdout
    assert "not selected" not in stdout and "[core]" not in stdout and "apply p50" not in stdout
    if doc["benchmarks"]["langgraph"]["status"] == "ok":
        assert "TARGET" in stdout and "\ntargets: " in stdout
    # the closing hint writes the report outside the checkout, never over docs/
    assert "python -m victor_actors.bench.report" in stdout and "--out docs" not in stdout


def test_report_writes_the_markdown_and_the_figures(
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
    assert "apply p50" not in md and "not selected" not in md  # only the benchmarks that were selected
    assert "## Machine" in md and f"| CPU | {doc['meta']['cpu_model']} |" in md
    assert "## Measured values" in md and "start N scope actors / N bare pykka actors (smaller N)" in md
    assert "### startup" in md and "ratio_start" in md  # every value the benchmark wrote
    assert "| startup | `victor_actors.bench.startup` | ok |" in md
    figures = {"bench-startup.png", "bench-agent.png"}  # the questions this run has data for
    if HAS_MATPLOTLIB:
        for name in figures:
            assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
            assert f"]({name})" in md and name in proc.stdout
        assert "## Figures" in md and "### How long do N scope actors take to start?" in md
        assert NO_PLOT not in md and not (tmp_path / "bench-latency.png").exists()  # core did not run
    else:
        assert not any((tmp_path / name).exists() for name in figures) and NO_PLOT in md


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
    (tmp_path / "bench-agent.png").write_bytes(b"a figure from an earlier run")
    proc = report(path, tmp_path, block_matplotlib=True)
    md = (tmp_path / "benchmarks.md").read_text()
    assert NO_PLOT in md and "pip install 'victor-actors[bench]'" in md and ".png)" not in md
    assert "## Targets" in md
    assert not (tmp_path / "benchmarks.png").exists()  # a stale plot would not match the report
    assert not (tmp_path / "bench-agent.png").exists()
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
        "listing", "virtual", "groupcommit", "checkpoints", "ray", "remote", "sdk", "sequential", "simulate",
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
        "apply_p50": "MISSED",  # 3.0x > 1.0x
        "apply_lock": "NOT RUN",  # no lock baseline in these results
        "apply_p99": "MET",  # 1.25x
        "pipeline_10": "MISSED",  # 0.1x < 0.5x
        "pipeline_100k": "MISSED",
        "pipeline_flat": "MET",  # 1.0x
        "snapshot": "MET",  # 1.0x
        "durable_floor": "MET",  # 1.0x
        "seq_fsync": "NOT RUN",  # the sequential benchmark is not in these results
        "seq_lmdb": "NOT RUN",
        **{tid: "NOT RUN" for tid in TARGET_IDS if tid.startswith("lg_")},  # langgraph not in these results
        "storage": "MISSED",  # 4x > 3x
        "security_commits": "NOT RUN",  # not in these results
        "security_reopen": "NOT RUN",
        "security_bytes": "NOT RUN",
        "otel_disabled": "NOT RUN",
        **{
            tid: "NOT RUN"
            for tid in TARGET_IDS
            if tid.startswith(("virtual", "groupcommit", "ray_", "remote_", "sdk_"))
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


def test_the_sdk_rows_divide_ours_by_each_sdks_own_store_and_a_missing_sdk_says_so() -> None:
    side = {"one_per_s": 200.0, "one_p50_us": 2_000.0, "many_per_s": 800.0}
    theirs = {"one_per_s": 100.0, "one_p50_us": 4_000.0, "many_per_s": 1_600.0, "many_errors": 3}
    results = {
        "sdk": {
            "rounds": 2,
            "subjects": {"adk": {"peer": "SqliteSessionService", "version": "2.13.0", "ours": side,
                                 "theirs": theirs}},
            "skipped": {"openai": "openai-agents is not installed", "claude": "claude-agent-sdk is not installed"},
        }
    }  # fmt: skip
    rows, targets = bench.evaluate(results, {})
    by_id = {r["id"]: r for r in rows if r["bench"] == "sdk"}
    assert {k: v["ratio"] for k, v in by_id.items() if k.startswith("sdk_adk")} == {
        "sdk_adk_one": 2.0, "sdk_adk_p50": 0.5, "sdk_adk_many": 0.5,
    }  # fmt: skip
    assert by_id["sdk_openai_one"]["note"] == "openai-agents is not installed"
    # calls a store refused under contention (SQLite's "database is locked") are shown, not hidden
    assert by_id["sdk_adk_many"]["note"].endswith("calls refused (ours, theirs): 0, 3")
    assert "refused" not in by_id["sdk_adk_one"]["note"]
    verdicts = {t["id"]: (t["verdict"], t["why"]) for t in targets if t["id"].startswith("sdk_")}
    assert verdicts["sdk_adk_one"] == ("MET", "") and verdicts["sdk_adk_p50"] == ("MET", "")
    assert verdicts["sdk_adk_many"][0] == "MISSED" and "800/s vs 1,600/s" in verdicts["sdk_adk_many"][1]
    assert verdicts["sdk_claude_one"][0] == "NOT RUN"


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


# -- only what ran, reports outside the checkout, figures --------------------------------------------------


def test_only_prints_and_keeps_what_was_selected(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (issue 29, item 7): ``--only startup`` printed every other benchmark's section and
    about 30 NOT RUN targets, and the JSON carried them as "not selected". Now the table, the targets
    and the JSON hold the selected benchmark only. This failed before the fix."""
    fake_bench(
        monkeypatch,
        tmp_path,
        "import json, sys\n"
        "path = sys.argv[sys.argv.index('--json') + 1]\n"
        "side = lambda s: {'start_s': s, 'rss_per_actor_bytes': 0}\n"
        "size = lambda n: {'actors': n, 'rounds': 1, 'ours': side(2.0), 'bare': side(1.0)}\n"
        "sizes = {str(n): size(n) for n in (10, 20)}\n"
        "json.dump({'sizes': sizes}, open(path, 'w'))\n",
    )
    out = tmp_path / "bench.json"
    assert main(["bench", "--quick", "--only", "startup", "--json", str(out)]) == 0
    stdout = capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert {r["bench"] for r in doc["rows"]} == {"startup"} and doc["targets"] == []
    assert "[startup]" in stdout and "start N scope actors / N bare pykka actors (larger N)" in stdout
    for other in ("[core]", "[store]", "[langgraph]", "NOT RUN", "not selected", "TARGET"):
        assert other not in stdout, other
    assert f"python -m victor_actors.bench.report {out}" in stdout and "--out docs" not in stdout
    assert str(tmp_path / "bench-report") in stdout  # where the report will go


def test_a_report_goes_beside_its_json_and_never_into_the_checkout(
    quick_run: tuple[Path, dict[str, Any], str], tmp_path: Path
) -> None:
    """Regression (issue 29, item 7): the report defaulted to the checkout's docs/, so the hint the
    run printed overwrote the committed docs/benchmarks.md with a quick run. This failed before the
    fix."""
    from victor_actors.bench._machine import source_checkout
    from victor_actors.bench.report import default_out

    path, _, _ = quick_run
    local = tmp_path / "mine.json"
    local.write_text(path.read_text())
    proc = subprocess.run(
        [sys.executable, "-m", "victor_actors.bench.report", str(local)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "mine-report" / "benchmarks.md").read_text().startswith("# Benchmarks\n")
    assert default_out(local) == tmp_path / "mine-report"
    checkout = source_checkout()
    if checkout is not None:  # a JSON kept in the checkout: its report goes to the temporary directory
        inside = default_out(checkout / "bench.json")
        assert not inside.resolve().is_relative_to(checkout.resolve())
        assert inside.name == "bench-report"


def test_a_quick_run_does_not_replace_a_full_runs_report_without_force(
    quick_run: tuple[Path, dict[str, Any], str], tmp_path: Path
) -> None:
    path, _, _ = quick_run
    full = "# Benchmarks\n\nGenerated by ... (default mode, wall time 282 s). ...\n"
    (tmp_path / "benchmarks.md").write_text(full)
    cmd = [sys.executable, "-m", "victor_actors.bench.report", str(path), "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "holds the report of a full run" in proc.stderr
    assert "nothing was written" in proc.stderr and (tmp_path / "benchmarks.md").read_text() == full
    proc = subprocess.run([*cmd, "--force"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "(quick mode," in (tmp_path / "benchmarks.md").read_text()


def _synthetic_run() -> dict[str, Any]:
    """A run's JSON with every benchmark a figure reads, in the shape each benchmark writes it."""

    def ok(result: dict[str, Any]) -> dict[str, Any]:
        return {"status": "ok", "module": "m", "about": "a", "seconds": 1.0, "result": result}

    def lat(p50: float, p99: float) -> dict[str, float]:
        return {"n": 100, "median_us": p50, "p99_us": p99}

    saver = {
        "put_per_s": 2000.0,
        "get_tuple_per_s": 50_000.0,
        "graph_s": [0.25, 0.27],
        "concurrent_s": [3.4, 3.5],
        "disk": {"size": 557_190},
        "long_disk": {"size": 1_147_014},
    }
    benchmarks = {
        "core": ok(
            {
                "latency": {
                    "echo": lat(58.4, 97.4),
                    "apply1": lat(73.0, 126.0),
                    "aapply1": lat(83.5, 131.5),
                    "snap10": lat(0.83, 1.35),
                    "snap100k": lat(0.82, 1.36),
                }
            }
        ),
        "pipeline": ok({"throughput": {"aapply_10": {"per_s": 22_369.0}}}),
        "store": ok(
            {
                "throughput": {
                    "sync1": {"rate": 1602.0},
                    "sqlite_put": {"rate": 3315.0},
                    "sync100": {"rate": 3590.0},
                    "raw_lmdb": {"rate": 3741.0},
                    "mem1": {"rate": 14_177.0},
                },
                "storage": {
                    "ours": {"scope_bytes_at": {"250": 88_594, "1000": 132_001}},
                    "sqlite": {"file_bytes_at": {"250": 9_698_976, "1000": 116_470_176}},
                },
            }
        ),
        "groupcommit": ok(
            {
                "results": {
                    "one_sync": 17_735.0,
                    "one_mem": 25_165.0,
                    "many_sync": 15_696.0,
                    "many_mem": 11_085.0,
                }
            }
        ),
        "checkpoints": ok(
            {
                "runs": {
                    "1000": {"data_mdb": 299_008, "final_state_bytes": 66_169},
                    "10000": {"data_mdb": 1_044_480, "final_state_bytes": 632_865},
                }
            }
        ),
        "langgraph": ok(
            {
                "results": {
                    "victor_actors": saver,
                    "sqlite": {**saver, "put_per_s": 2862.0},
                    "lmdb": {**saver, "put_per_s": 2552.0},
                    "memory": {"concurrent_s": [1.5, 1.4]},
                }
            }
        ),
        "agent": ok({"rates": {"ours_sync": 1814.0, "ours_memory": 8256.0, "langgraph_sqlite": 259.5}}),
        "startup": ok({"sizes": {"1000": {"ours": {"start_s": 0.17}, "bare": {"start_s": 0.17}}}}),
    }
    results = {n: b["result"] for n, b in benchmarks.items()}
    rows, targets = bench.evaluate(results, {})
    rows = [r for r in rows if r["bench"] in benchmarks]
    targets = [t for t in targets if t["bench"] in benchmarks]
    meta = {"cpu_model": "test CPU", "date": "2026-12-02", "cpus": 2, "cpus_usable": 2}
    return {
        "schema": 1,
        "mode": "default",
        "wall_seconds": 1.0,
        "meta": meta,
        "benchmarks": benchmarks,
        "rows": rows,
        "targets": targets,
    }


def test_each_figure_answers_one_question_with_the_measured_values(tmp_path: Path) -> None:
    """One figure per question, drawn only from benchmarks that ran (matplotlib is in the test extra)."""
    from victor_actors.bench._plots import FIGURES, _concurrency_data, _langgraph_data
    from victor_actors.bench.report import write

    doc = _synthetic_run()
    md_path, figures = write(doc, tmp_path, "run.json")
    assert not isinstance(figures, str)
    assert [f.name for f in figures] == [f.name for f in FIGURES]  # every question, in order
    md = md_path.read_text()
    for figure in figures:
        assert (tmp_path / figure.file).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", figure.file
        assert f"### {figure.question}\n\n![{figure.question}]({figure.file})\n\n{figure.caption}" in md
    # the values themselves, ours beside the peers, placed at the requests in flight they had
    series = {label: points for label, _c, _m, _l, points in _concurrency_data(doc) or []}
    assert series["ours, durable (sync), 1 scope"] == [(1, 1602.0), (1000, 17_735.0)]
    assert series["ours, durable (sync), 100 scopes"] == [(100, 3590.0), (10_000, 15_696.0)]
    assert series["ours, in memory, 1 scope"] == [(1, 14_177.0), (1000, 25_165.0), (10_000, 22_369.0)]
    assert series["LangGraph SqliteSaver put (durable)"] == [(1, 3315.0)]
    panels = {title: bars for title, _better, bars in _langgraph_data(doc) or []}
    assert [(label, v) for label, _c, v in panels["puts per second"]] == [
        ("ours", 2000.0),
        ("SqliteSaver", 2862.0),
        ("LMDBSaver", 2552.0),
    ]

    # a run of two benchmarks draws their figures only, and a regeneration removes the others
    only = {**doc, "benchmarks": {n: doc["benchmarks"][n] for n in ("agent", "startup")}}
    _, figures = write(only, tmp_path, "run.json")
    assert not isinstance(figures, str) and [f.name for f in figures] == ["agent", "startup"]
    assert sorted(p.name for p in tmp_path.glob("*.png")) == ["bench-agent.png", "bench-startup.png"]
    md = md_path.read_text()
    assert "bench-latency.png" not in md and "### What does one request cost?" not in md
