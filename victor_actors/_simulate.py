"""``victor-actors simulate``: many agents, real faults, then the invariants.

Teams x workflows x conversations, one agent per conversation, half of them
threads and half asyncio tasks, run coordinator loops against an LMDB store
while batches are rejected, actors crash and runs time out or raise. At the
end the store is closed and reopened, and :func:`check_invariants` compares
what the agents were acknowledged with what the store holds. ``--kill`` runs
the load in a child process, SIGKILLs it at a random moment and checks every
acknowledged commit after reopening. See ``docs/simulate.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from victor_actors._errors import VictorActorsError
from victor_actors._invariants import (
    AgentLedger,
    Expected,
    InvariantResult,
    Observed,
    check_invariants,
)
from victor_actors._manager import GlobalStateManager
from victor_actors._model import TransitionBatch
from victor_actors._simagents import KINDS, Agent, AsyncAgent, Hub, SimConfig, Sink, alookup, lookup
from victor_actors._values import thaw

__all__ = ["QUICK", "SimConfig", "add_parser", "run_command", "simulate"]

QUICK: dict[str, Any] = {
    "teams": 1, "workflows": 2, "conversations": 2, "seconds": 3.0, "tool_rate": 0.12,
    "reject_rate": 0.08, "crash_rate": 0.05, "timeout_rate": 0.04, "raise_rate": 0.04, "run_timeout": 0.1,
}  # fmt: skip
Tick = Callable[[float, int, int], None]  # (fraction done, commits, failures)


def _names(config: SimConfig) -> list[tuple[str, str, str, str | None]]:
    """(team, workflow, agent, a sibling agent) for every conversation."""
    out = []
    for t in range(config.teams):
        for w in range(config.workflows):
            for c in range(config.conversations):
                sibling = f"t{t}w{w}a{(c + 1) % config.conversations}" if config.conversations > 1 else None
                out.append((f"t{t}", f"t{t}w{w}", f"t{t}w{w}a{c}", sibling))
    return out


def _scopes(config: SimConfig) -> tuple[list[str], list[str]]:
    """The refs of the teams and of the workflows."""
    names = _names(config)
    return sorted({f"team:{t}" for t, _, _, _ in names}), sorted({f"workflow:{w}" for _, w, _, _ in names})


def _observe(
    manager: GlobalStateManager, config: SimConfig
) -> tuple[dict[str, int], dict[str, Any], dict[str, int]]:
    """Team counters, conversation messages (plain) and every scope's version."""
    teams, workflows = _scopes(config)
    convs = [f"conversation:{a}" for _, _, a, _ in _names(config)]
    counters = {ref.partition(":")[2]: int(manager.scope(ref).get("counter", 0)) for ref in teams}
    messages = {
        ref.partition(":")[2]: [thaw(m) for m in manager.scope(ref).snapshot().messages] for ref in convs
    }
    versions = {ref: manager.scope(ref).version for ref in ["global:global", *teams, *workflows, *convs]}
    return counters, messages, versions


def _barrier(manager: GlobalStateManager, ref: str) -> None:
    """An empty request through the scope's mailbox: consumes a fault no agent request met."""
    for _ in range(10):
        try:
            manager.scope(ref).apply(TransitionBatch())
            return
        except VictorActorsError:
            continue


def _run_async(agents: list[AsyncAgent]) -> None:
    async def main() -> None:
        # cross-scope aapply, atransact and run rollbacks use to_thread: room for every agent
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(4 * len(agents) + 4))
        await asyncio.gather(*(agent.run() for agent in agents))

    if agents:
        asyncio.run(main())


def _load(
    config: SimConfig, path: str, sink: Sink | None, tick: Tick | None
) -> tuple[Hub, list[AgentLedger], Observed, float]:
    """Run the agents on the store at ``path``; observe it live, close it, and reopen it read-only."""
    manager = GlobalStateManager.open(path, durability=config.durability)
    try:
        manager.register_tool("lookup", lookup, timeout=5.0)
        manager.register_tool("alookup", alookup, timeout=5.0)
        hub = Hub(manager, config, sink)
        agents = [
            (AsyncAgent if i % 2 else Agent)(hub, team, wf, name, sibling)
            for i, (team, wf, name, sibling) in enumerate(_names(config))
        ]
        teams, workflows = _scopes(config)
        for ref in (None, "global:global", *teams, *workflows):  # no escalation: a crash, a restart
            manager.set_supervision(ref, max_restarts=1_000_000, within=1.0)
        hub.started = time.monotonic()
        hub.stop_at = hub.started + config.seconds
        threads = [
            threading.Thread(target=a.run, name=a.name, daemon=True) for a in agents if isinstance(a, Agent)
        ]
        async_agents = [a for a in agents if isinstance(a, AsyncAgent)]
        threads.append(
            threading.Thread(target=_run_async, args=(async_agents,), name="sim-asyncio", daemon=True)
        )
        for thread in threads:
            thread.start()
        total = config.steps * len(agents) if config.steps is not None else None
        while any(thread.is_alive() for thread in threads):
            try:
                if tick is not None:
                    done = hub.turns / total if total else (time.monotonic() - hub.started) / config.seconds
                    tick(min(done, 1.0), hub.commits, hub.failures())
                time.sleep(0.2)
            except KeyboardInterrupt:  # Ctrl-C: the agents finish their turn, then the checks run
                hub.stopping = True
        elapsed = time.monotonic() - hub.started
        for ref in [*(f"conversation:{a.name}" for a in agents), *teams]:
            _barrier(manager, ref)
        manager.tools.wait_idle(10.0)
        counters, messages, versions = _observe(manager, config)
        observed = Observed(counters, messages, versions, stats=manager.stats())
    finally:
        manager.close()
    with GlobalStateManager.open(path, read_only=True) as again:
        observed.reopened_counters, observed.reopened_messages, observed.reopened_versions = _observe(
            again, config
        )
    return hub, [a.ledger for a in agents], observed, elapsed


def _report(
    config: SimConfig, results: list[InvariantResult], counts: dict[str, Any], **extra: Any
) -> dict[str, Any]:
    failed = [r.name for r in results if not r.ok]
    return {
        "verdict": "FAIL" if failed else "PASS",
        "failed": failed,
        "config": dataclasses.asdict(config),
        "counts": counts,
        "invariants": [r.to_dict() for r in results],
        **extra,
    }


def simulate(
    config: SimConfig, *, store: str | None = None, sink: Sink | None = None, tick: Tick | None = None
) -> dict[str, Any]:
    """Run one simulation in this process; return the report (``report["verdict"]``: PASS or FAIL)."""
    started = time.monotonic()
    path = store or tempfile.mkdtemp(prefix="victor-actors-simulate-")
    try:
        hub, ledgers, observed, elapsed = _load(config, path, sink, tick)
    finally:
        if store is None:
            shutil.rmtree(path, ignore_errors=True)
    expected = Expected(ledgers, hub.runs, hub.crashes, hub.restarts, hub.rejected, unexpected=hub.unexpected)
    results = check_invariants(expected, observed)
    runs = {kind: sum(1 for r in hub.runs if r.kind == kind) for kind in ("timeout", "raise")}
    restored = sum(r.counter == "restored" for r in hub.runs)
    counts = {
        "agents": len(ledgers),
        "thread_agents": (len(ledgers) + 1) // 2,
        "asyncio_agents": len(ledgers) // 2,
        "turns": hub.turns,
        "commits_acknowledged": hub.commits,
        "tool_requests": sum(len(a.tool_requests) for a in ledgers),
        "rejected_batches": {k: {"sent": v[0], "refused": v[1]} for k, v in hub.rejected.items()},
        "crashes_injected": hub.crashes,
        "team_crashes": hub.team_crashes,
        "restarts_expected": hub.restarts,
        "runs_rolled_back": runs,
        "rollbacks_restored_counter": restored,
        "compensations": hub.compensations,
        "ambiguous_outcomes": hub.ambiguous,
        "runs_cancelled_in_a_step": dict(Counter(r.cancelled_step for r in hub.runs if r.cancelled_step)),
        "errors": dict(hub.errors),
        "error_examples": hub.examples,
    }
    throughput = {
        "load_seconds": round(elapsed, 2),
        "commits_per_second": round(hub.commits / elapsed, 1) if elapsed else 0.0,
        "turns_per_second": round(hub.turns / elapsed, 1) if elapsed else 0.0,
    }
    extra = {"throughput": throughput, "stats": observed.stats, "store": store}
    return _report(config, results, counts, wall_seconds=round(time.monotonic() - started, 2), **extra)


# -- the command line -------------------------------------------------------------------------------


def _verdict(report: dict[str, Any]) -> str:
    """The one line every mode ends with (and all that --quiet prints)."""
    total, failed, c = len(report["invariants"]), report["failed"], report["counts"]
    if failed:
        head = f"FAIL: {len(failed)} of {total} invariants failed ({', '.join(failed)})"
    else:
        head = f"PASS: all {total} invariants hold"
    if "kill" in report:
        after = report["kill"]["killed_after_seconds"]
        return (
            f"{head}; {c['agents']} agents, child killed with SIGKILL after {after} s, "
            f"{c['commits_acknowledged']} acknowledged commits checked after reopening"
        )
    t = report["throughput"]
    runs = sum(c["runs_rolled_back"].values())
    rejected = sum(v["refused"] for v in c["rejected_batches"].values())
    return (
        f"{head}; {c['agents']} agents, {c['commits_acknowledged']} commits in {t['load_seconds']} s "
        f"({t['commits_per_second']}/s), {c['crashes_injected']} crashes, {runs} runs rolled back, "
        f"{rejected} batches rejected"
    )


def _print_tables(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title="victor-actors simulate: invariants")
    for col in ("invariant", "result", "checked", "details"):
        table.add_column(col, overflow="fold")
    for r in report["invariants"]:
        result = "[green]pass[/]" if r["ok"] else "[bold red]FAIL[/]"
        table.add_row(r["name"], result, str(r["checked"]), "\n".join(r["details"]) or "-")
    load = Table(title="load")
    load.add_column("measure")
    load.add_column("value", overflow="fold")
    rows = {**report["counts"], **report.get("throughput", {}), **report.get("kill", {})}
    rows["wall_seconds"] = report["wall_seconds"]
    rows.pop("error_examples", None)  # in the JSON report
    for key, value in rows.items():
        if isinstance(value, dict):
            parts = [
                f"{k} {v['refused']}/{v['sent']}" if isinstance(v, dict) else f"{k} {v}"
                for k, v in value.items()
            ]
            value = ", ".join(parts) or "none"
        load.add_row(key.replace("_", " "), str(value))
    console.print(load)
    console.print(table)


def _progress(mode: str) -> tuple[Tick | None, Callable[[], None]]:
    if mode != "rich":
        return None, lambda: None
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), TextColumn("{task.fields[info]}"),
        console=Console(stderr=True), transient=True,
    )  # fmt: skip
    task = progress.add_task("simulating", total=1.0, info="")
    began = time.monotonic()
    progress.start()

    def tick(done: float, commits: int, failures: int) -> None:
        rate = commits / max(time.monotonic() - began, 1e-6)
        info = f"{commits} commits ({rate:.0f}/s), {failures} failures so far"
        progress.update(task, completed=done, info=info)

    return tick, progress.stop


def _positive(kind: type[int] | type[float]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, not {text}")
        return value

    return parse


def _rate(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"a rate is between 0 and 1, not {text}")
    return value


def add_parser(sub: Any) -> None:
    """Add ``simulate`` to the command line's subcommands."""
    text = "run agents with injected faults against a store, then check the invariants"
    p = sub.add_parser("simulate", help=text, description=text)
    d = SimConfig()
    for name, kind, helptext in (
        ("teams", _positive(int), f"teams (default {d.teams})"),
        ("workflows", _positive(int), f"workflows per team (default {d.workflows})"),
        ("conversations", _positive(int), f"conversations (agents) per workflow (default {d.conversations})"),
        ("seconds", _positive(float), f"load duration (default {d.seconds})"),
        ("steps", _positive(int), "turns per agent, instead of --seconds"),
        ("tool-rate", _rate, f"share of turns that request a tool (default {d.tool_rate})"),
        ("reject-rate", _rate, f"share of turns sending a batch that must fail (default {d.reject_rate})"),
        ("crash-rate", _rate, f"share of turns that crash an actor first (default {d.crash_rate})"),
        ("timeout-rate", _rate, f"share of turns in a run that times out (default {d.timeout_rate})"),
        ("raise-rate", _rate, f"share of turns in a run that raises (default {d.raise_rate})"),
        (
            "team-crash-share",
            _rate,
            f"of the crashes, the share aimed at the team (default {d.team_crash_share})",
        ),
        ("transact-share", _rate, f"of the steps, the share using transact (default {d.transact_share})"),
        ("run-timeout", _positive(float), f"timeout of the runs meant to time out (default {d.run_timeout})"),
        ("run-steps", _positive(int), f"counter steps in each failing run (default {d.run_steps})"),
        ("seed", int, f"random seed (default {d.seed})"),
        ("durability", str, "sync (default) or async: acknowledged before durable, which --kill must catch"),
    ):
        p.add_argument(f"--{name}", type=kind, default=None, help=helptext)
    p.add_argument("--quick", action="store_true", help="a few seconds, small, every fault kind: for tests")
    p.add_argument(
        "--store", metavar="PATH", help="keep the store at PATH (new or empty; default a temp dir)"
    )
    p.add_argument(
        "--kill", action="store_true", help="SIGKILL a child running the load, then check the store"
    )
    p.add_argument("--report", metavar="FILE", help="write the full JSON report to FILE")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--quiet", action="store_true", help="print only the final verdict line")
    out.add_argument("--json", action="store_true", help="print the JSON report on stdout")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--ack-file", help=argparse.SUPPRESS)


def run_command(args: argparse.Namespace) -> int:
    """``victor-actors simulate``: exit 0 if every invariant holds, 1 if one fails, 2 on an error."""
    values = dict(QUICK) if args.quick else {}
    for f in dataclasses.fields(SimConfig):
        if getattr(args, f.name, None) is not None:
            values[f.name] = getattr(args, f.name)
    config = SimConfig(**values)
    if config.durability not in ("sync", "async"):
        print("victor-actors: error: --durability is sync or async", file=sys.stderr)
        return 2
    if sum(config.rate(kind) for kind in KINDS) > 1.0:
        print("victor-actors: error: the --*-rate options add up to more than 1", file=sys.stderr)
        return 2
    if args.store and os.path.isdir(args.store) and os.listdir(args.store) and not args.child:
        print(f"victor-actors: error: --store {args.store} is not empty", file=sys.stderr)
        return 2
    from victor_actors._simkill import ack_sink, simulate_kill  # it imports this module

    mode = "json" if args.json else "quiet" if args.quiet else "rich"
    tick, stop = _progress(mode)
    try:
        if args.kill:
            report = simulate_kill(config, store=args.store, tick=tick)
        else:
            sink = ack_sink(args.ack_file) if args.ack_file else None
            report = simulate(config, store=args.store, sink=sink, tick=tick)
    except (VictorActorsError, OSError) as exc:
        stop()
        print(f"victor-actors: error: {exc}", file=sys.stderr)
        return 2
    stop()
    if args.report:
        with open(args.report, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2)
            fh.write("\n")
    if mode == "json":
        print(json.dumps(report, indent=2))
    else:
        if mode == "rich":
            _print_tables(report)
        print(_verdict(report))
    return 0 if report["verdict"] == "PASS" else 1
