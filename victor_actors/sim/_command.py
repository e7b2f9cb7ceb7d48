"""``victor-actors simulate`` on the command line: the flags, the progress bar, the tables, the verdict."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from victor_actors import VictorActorsError
from victor_actors.sim._config import KINDS, QUICK, SimConfig, Tick
from victor_actors.sim._kill import ack_sink, simulate_kill
from victor_actors.sim._load import simulate
from victor_actors.sim._schedule import decode_token
from victor_actors.sim._shrink import Attempt, shrink_schedule

__all__ = ["add_parser", "run_command"]


def _verdict(report: dict[str, Any]) -> str:
    """The one line every mode ends with (and all that --quiet prints)."""
    total, failed, c = len(report["invariants"]), report["failed"], report["counts"]
    if failed:
        head = f"FAIL: {len(failed)} of {total} invariants failed ({', '.join(failed)})"
    else:
        head = f"PASS: all {total} invariants hold"
    if "ray" in report:
        t = report["throughput"]
        runs = sum(c["runs_rolled_back"].values())
        rejected = sum(v["refused"] for v in c["rejected_batches"].values())
        return (
            f"{head}; {c['agents']} agents on {c['shards']} Ray shards"
            + (f" from {c['drivers']} driver processes" if c.get("drivers", 1) > 1 else "")
            + f", {c['commits_acknowledged']} commits "
            f"in {t['load_seconds']} s ({t['commits_per_second']}/s), {c['cross_shard_commits']} "
            f"cross-shard, {c['shard_kills']} shard kills, {runs} runs rolled back, "
            f"{rejected} batches rejected"
        )
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
        elif key.endswith("_seconds"):
            value = f"{value} s"
        elif key.endswith("_per_second"):
            value = f"{value} {key[: -len('_per_second')]}/s"
        notes = _RAY_ROW_NOTES if "ray" in report else _ROW_NOTES
        name = key.replace("_", " ") + notes.get(key, "")
        load.add_row(name, str(value))
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
        info = f"{commits} commits ({rate:.0f} commits/s), {failures} faults injected so far"
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
    p.add_argument(
        "--keep",
        action="store_true",
        help="keep the temporary store afterwards and print its path (to try the read-only commands on)",
    )
    p.add_argument(
        "--ray",
        action="store_true",
        help="run through RayStateManager on a local Ray cluster, killing every shard once (needs ray)",
    )
    p.add_argument(
        "--replay",
        action="store_true",
        help="deterministic: one seeded schedule of every agent's steps on a virtual clock, so a --seed "
        "replays step for step (threads only; --steps, default 20)",
    )
    p.add_argument(
        "--shrink",
        action="store_true",
        help="with --replay, when an invariant fails: shorten the failing schedule (delta debugging) and "
        "print the shortest that still fails the same invariants, with a token for --schedule",
    )
    p.add_argument(
        "--shrink-runs",
        type=_positive(int),
        default=60,
        help="the most simulations --shrink runs (default 60)",
    )
    p.add_argument(
        "--schedule",
        metavar="TOKEN",
        help="replay this schedule (a token --replay or --shrink printed; its seed replaces --seed)",
    )
    p.add_argument("--shards", type=_positive(int), default=2, help="shards with --ray (default 2)")
    p.add_argument(
        "--drivers",
        type=_positive(int),
        default=1,
        help="with --ray: split the agents over N driver processes attached to the same shards (default 1)",
    )
    p.add_argument("--report", metavar="FILE", help="write the full JSON report to FILE")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--quiet", action="store_true", help="print only the final verdict line")
    out.add_argument("--json", action="store_true", help="print the JSON report on stdout")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--ack-file", help=argparse.SUPPRESS)


def run_command(args: argparse.Namespace) -> int:
    """``victor-actors simulate``: exit 0 if every invariant holds, 1 if one fails, 2 on an error."""
    if args.ray:
        problem = _ray_problem(args)
        if problem:
            print(f"victor-actors: error: {problem}", file=sys.stderr)
            return 2
        from victor_actors.sim._ray_load import RAY_DEFAULTS, RAY_QUICK

        values = dict(RAY_QUICK if args.quick else RAY_DEFAULTS)
    else:
        values = dict(QUICK) if args.quick else {}
    for f in dataclasses.fields(SimConfig):
        if getattr(args, f.name, None) is not None:
            values[f.name] = getattr(args, f.name)
    if args.drivers != 1 and not args.ray:
        print("victor-actors: error: --drivers splits the agents of a --ray run; add --ray", file=sys.stderr)
        return 2
    if args.schedule is not None:
        try:
            values["seed"] = decode_token(args.schedule)[0]
        except VictorActorsError as exc:
            print(f"victor-actors: error: --schedule: {exc}", file=sys.stderr)
            return 2
        args.replay = True
    if args.shrink and not args.replay:
        print(
            "victor-actors: error: --shrink shrinks a deterministic schedule; add --replay", file=sys.stderr
        )
        return 2
    if args.replay:
        if args.ray or args.kill:
            print(
                "victor-actors: error: --replay runs in this process, without --ray or --kill",
                file=sys.stderr,
            )
            return 2
        values.setdefault("steps", 20)
    config = SimConfig(**values)
    if args.drivers > config.teams * config.workflows * config.conversations:
        print(
            f"victor-actors: error: --drivers {args.drivers} is more than the run's "
            f"{config.teams * config.workflows * config.conversations} agents: each driver needs one",
            file=sys.stderr,
        )
        return 2
    if config.durability not in ("sync", "async"):
        print("victor-actors: error: --durability is sync or async", file=sys.stderr)
        return 2
    if sum(config.rate(kind) for kind in KINDS) > 1.0:
        print("victor-actors: error: the --*-rate options add up to more than 1", file=sys.stderr)
        return 2
    if args.store and os.path.isdir(args.store) and os.listdir(args.store) and not args.child:
        print(f"victor-actors: error: --store {args.store} is not empty", file=sys.stderr)
        return 2
    mode = "json" if args.json else "quiet" if args.quiet else "rich"
    temporary = args.store is None
    path = args.store or tempfile.mkdtemp(prefix="victor-actors-simulate-")
    if mode == "rich":
        _print_plan(config, args, path, temporary)
    tick, stop = _progress(mode)
    try:
        if args.ray:
            from victor_actors.sim._ray_load import simulate_ray

            report = simulate_ray(config, shards=args.shards, store=path, tick=tick, drivers=args.drivers)
        elif args.kill:
            report = simulate_kill(config, store=path, tick=tick)
        else:
            sink = ack_sink(args.ack_file) if args.ack_file else None
            report = simulate(
                config, store=path, sink=sink, tick=tick, deterministic=args.replay, replay=args.schedule
            )
    except (VictorActorsError, OSError) as exc:
        stop()
        print(f"victor-actors: error: {exc}", file=sys.stderr)
        return 2
    finally:
        if temporary and not args.keep:
            shutil.rmtree(path, ignore_errors=True)
    stop()
    report["store"] = None if temporary and not args.keep else path
    if args.shrink and report["verdict"] == "FAIL":
        if mode == "rich":
            print(f"shrinking the failing schedule (at most {args.shrink_runs} runs)...", file=sys.stderr)
        report["shrunk"] = _shrink(config, report, args.shrink_runs)
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
        if "shrunk" in report:
            shrunk = report["shrunk"]
            print(
                f"shrunk: {shrunk['picks']} of {shrunk['original_picks']} picks ({shrunk['steps']} steps) "
                f"still fail {', '.join(shrunk['failed'])}; replay it with --schedule {shrunk['token']}"
            )
        elif args.shrink and report["verdict"] == "PASS":
            print("nothing to shrink: every invariant holds")
        if report["store"] is not None and mode == "rich":
            print(f"the store is kept at {path}: try `victor-actors inspect {path}`")
    return 0 if report["verdict"] == "PASS" else 1


def _shrink(config: SimConfig, report: dict[str, Any], runs: int) -> dict[str, Any]:
    """Shrink the failing deterministic run behind ``report`` (``_shrink.py``); a JSON summary."""
    schedule = report["schedule"]
    seed, picks = decode_token(schedule["token"])

    def replay(token: str) -> Attempt:
        got = simulate(config, deterministic=True, replay=token)
        return Attempt(tuple(got["failed"]), got["schedule"]["steps"])

    original = Attempt(tuple(report["failed"]), schedule["steps"])
    shrunk = shrink_schedule(replay, seed, picks, original, max_runs=runs)
    return {
        "picks": len(shrunk.picks),
        "original_picks": shrunk.original_picks,
        "steps": shrunk.steps,
        "original_steps": shrunk.original_steps,
        "failed": list(shrunk.failed),
        "runs": shrunk.runs,
        "token": shrunk.token,
    }


def _ray_problem(args: argparse.Namespace) -> str | None:
    """Why ``--ray`` cannot run with these flags (or in this environment), or None."""
    if args.kill:
        return "--ray kills shards itself; --kill (SIGKILL of a local child) is the local mode's"
    if args.shards < 2:
        return "--ray needs at least 2 shards (--shards), so that batches cross shards"
    try:
        import ray  # noqa: F401
    except ImportError:
        return "--ray needs the ray package: pip install 'victor-actors[ray]'"
    return None


def _print_plan(config: SimConfig, args: argparse.Namespace, path: str, temporary: bool) -> None:
    """Say before the run what it will do, for how long, and where the store is."""
    agents = config.teams * config.workflows * config.conversations
    if args.ray:
        length = f"{config.steps} turns per agent" if config.steps else f"about {config.seconds:g} s of load"
        print(
            f"victor-actors simulate --ray: {agents} agents ({config.teams} teams x {config.workflows} "
            f"workflows x {config.conversations} conversations; half threads, half asyncio tasks) on "
            f"{args.shards} Ray shards with stores under {path}, {length}"
            + (f", split over {args.drivers} driver processes" if args.drivers > 1 else "")
            + "; every shard is killed once "
            "mid-run and restarted by Ray. Then the shards are settled, the stores reopened, and 11 "
            "invariants checked (exit 1 if one fails). Ray's start-up takes a few seconds.",
            file=sys.stderr,
        )
        return
    length = f"{config.steps} turns per agent" if config.steps else f"about {config.seconds:g} s of load"
    where = f"a temporary LMDB store at {path}" if temporary else f"the LMDB store at {path}"
    kept = " (deleted afterwards; --keep keeps it)" if temporary and not args.keep else ""
    faults = ", ".join(
        f"{name} {config.rate(kind) * 100:g}% of turns"
        for kind, name in _FAULT_NAMES.items()
        if config.rate(kind)
    )
    lines = [
        f"victor-actors simulate: {agents} agents ({config.teams} teams x {config.workflows} workflows x "
        f"{config.conversations} conversations; half on threads, half asyncio tasks), {length}, "
        f"durability {config.durability}, on {where}{kept}.",
        f"Turns that request a tool: {config.tool_rate * 100:g}%. Injected faults, as shares of turns: "
        f"{faults or 'none'}. Those errors are expected: each rejected batch must be refused and each "
        "crash answered by a restart, and the checks count them.",
        "Then: "
        + ("the child is killed with SIGKILL mid-run, " if args.kill else "")
        + "the store is closed and reopened, and 8 invariants are checked (exit 1 if one fails).",
    ]
    print("\n".join(lines), file=sys.stderr)


# What a row of the load table means, where its name alone does not say.
_ROW_NOTES = {
    "rejected_batches": " (refused / sent; every one must be refused)",
    "crashes_injected": " (on purpose; each answered by a restart)",
    "restarts_expected": " (the supervisor's answers to the injected crashes)",
    "runs_rolled_back": " (on purpose: runs made to time out or raise)",
    "unexpected_errors": " (errors nobody planned: must be 0)",
    "errors": " (what callers were answered; each injected crash answers one request ScopeFailedError)",
}

# The same for ``--ray``, whose faults are shard kills.
_RAY_ROW_NOTES = {
    **{k: v for k, v in _ROW_NOTES.items() if k in ("rejected_batches", "runs_rolled_back")},
    "errors": " (what callers were answered while shards were away; each outcome was looked up)",
    "ambiguous_outcomes": " (writes that may have applied when they failed, resolved by reading)",
}

# What each fault kind (SimConfig.rate) is called on the first screen.
_FAULT_NAMES = {
    "reject": "batches that must be refused",
    "crash": "actor crashes",
    "timeout": "runs that time out",
    "raise": "runs that raise",
}
