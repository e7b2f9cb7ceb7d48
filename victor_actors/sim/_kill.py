"""``victor-actors simulate --kill``: SIGKILL a child running the load, reopen the store, check.

The child (``simulate --child --ack-file F``) runs the ordinary load and
appends every acknowledgment to ``F`` as a JSON line with one ``os.write``
after the commit returned and before the agent's next request, so a SIGKILL
cannot lose a record of a commit that was acknowledged (the kernel keeps what
was written; only a power cut would need an fsync). The parent kills the child
at a random moment, reopens the store read-only and checks that every
acknowledged commit is there, with the invariants weakened only where a kill
leaves an outcome unknown (one unacknowledged commit per agent, runs caught
between their commit and the end of their rollback).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from victor_actors import GlobalStateManager
from victor_actors.sim._config import SimConfig, Sink, Tick
from victor_actors.sim._invariants import check_invariants
from victor_actors.sim._ledger import AgentLedger, Expected, InvariantResult, Observed, RunLedger
from victor_actors.sim._load import observe, report

__all__ = ["ack_sink", "simulate_kill"]


def ack_sink(path: str) -> Sink:
    """Append-only JSON lines; os.write per record, so a SIGKILL never loses an acknowledged one."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    lock = threading.Lock()

    def write(record: dict[str, Any]) -> None:
        with lock:
            os.write(fd, (json.dumps(record) + "\n").encode())

    return write


def _config_argv(config: SimConfig) -> list[str]:
    argv = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if value is not None and f.name != "steps":  # the child runs for --seconds and is killed in it
            argv += [f"--{f.name.replace('_', '-')}", str(value)]
    return argv


def _read_acks(path: str, config: SimConfig) -> Expected:
    agents: dict[str, AgentLedger] = {}
    open_runs: dict[str, int] = {}
    runs: list[RunLedger] = []
    rejected: dict[str, list[int]] = {}
    unexpected: list[str] = []
    with open(path, encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:  # a last line cut short: never acknowledged
            continue
        if rec["t"] == "agent":
            agents[rec["agent"]] = AgentLedger(rec["agent"], rec["team"], rec["conversation"])
            open_runs.setdefault(rec["team"], 0)
        elif rec["t"] == "ack":
            agents[rec["agent"]].acked.append(rec["seq"])
            agents[rec["agent"]].increment += rec["inc"]
        elif rec["t"] == "rolled_back":
            agents[rec["agent"]].rolled_back.extend(rec["seqs"])
            agents[rec["agent"]].increment += rec["leftover"]
            agents[rec["agent"]].leftover += rec["leftover"]
        elif rec["t"] == "run":
            open_runs[rec["team"]] += 1 if rec["ledger"] is None else -1
            if rec["ledger"] is not None:
                runs.append(RunLedger(**rec["ledger"]))
        elif rec["t"] == "unexpected":
            unexpected.append(rec["error"])
        elif rec["t"] == "rejected":
            counts = rejected.setdefault(rec["kind"], [0, 0])
            counts[0] += 1
            counts[1] += rec["refused"]
    size = {t: sum(1 for a in agents.values() if a.team == t) for t in open_runs}
    k = config.run_steps
    slack = {t: (-k * n, size[t] + k * n) for t, n in open_runs.items()}
    partial = {t: k * n for t, n in open_runs.items()}
    return Expected(
        list(agents.values()),
        runs,
        rejected=rejected,
        killed=True,
        slack=slack,
        partial_slack=partial,
        unexpected=unexpected,
    )


def simulate_kill(config: SimConfig, *, store: str | None = None, tick: Tick | None = None) -> dict[str, Any]:
    """Run the load in a child process, SIGKILL it at a random moment, reopen the store and check."""
    started = time.monotonic()
    path = store or tempfile.mkdtemp(prefix="victor-actors-simulate-kill-")
    acks = os.path.join(path, "simulate-acks.jsonl")
    os.makedirs(path, exist_ok=True)
    cmd = [sys.executable, "-m", "victor_actors", "simulate", *_config_argv(config)]
    cmd += ["--child", "--store", path, "--ack-file", acks, "--quiet"]
    try:
        with open(os.path.join(path, "simulate-child.log"), "wb") as log:
            child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
            while not (os.path.exists(acks) and os.path.getsize(acks) > 4096) and child.poll() is None:
                time.sleep(0.05)  # started and acknowledging
            load_began = time.monotonic()
            kill_after = random.Random(config.seed).uniform(0.3, 0.7) * config.seconds
            while time.monotonic() - load_began < kill_after and child.poll() is None:
                if tick is not None:
                    with open(acks, "rb") as fh:
                        tick((time.monotonic() - load_began) / kill_after, fh.read().count(b'"ack"'), 0)
                time.sleep(0.1)
            killed = child.poll() is None
            if killed:
                child.send_signal(signal.SIGKILL)
            code = child.wait()
        expected = _read_acks(acks, config)
        with GlobalStateManager.open(path, read_only=True) as reopened:
            counters, messages, _ = observe(reopened, config)
        results = check_invariants(expected, Observed(counters, messages))
    finally:
        if store is None:
            shutil.rmtree(path, ignore_errors=True)
    if not killed:
        results.append(InvariantResult("the child was killed mid-load", False, 1, [f"it exited with {code}"]))
    unacknowledged = 0
    for a in expected.agents:
        seqs = {m.get("seq") for m in messages[a.conversation] if isinstance(m, dict) and "agent" in m}
        unacknowledged += len(seqs - set(a.acked) - set(a.rolled_back))
    counts = {
        "agents": len(expected.agents),
        "commits_acknowledged": sum(len(a.acked) for a in expected.agents),
        "commits_found_unacknowledged": unacknowledged,  # committed, the SIGKILL came before the ack
        "runs_open_at_kill": sum(expected.partial_slack.values()) // max(config.run_steps, 1),
    }
    kill = {"killed_after_seconds": round(kill_after, 2), "signal": "SIGKILL", "child_exit": code}
    return report(
        config, results, counts, kill=kill, wall_seconds=round(time.monotonic() - started, 2), store=store
    )
