"""``victor-actors simulate``'s commits per second, on a fixed small workload.

    python -m victor_actors.bench.simulate [--quick] [--json FILE]

The simulation runs in this process through its public API (``victor_actors.sim.simulate``
with a :class:`~victor_actors.sim.SimConfig`), with ``victor-actors simulate``'s default layout
(2 teams x 2 workflows x 4 conversations: 16 agents, half on threads and half asyncio tasks)
and default fault rates, but a fixed number of turns per agent (``steps``: 40; ``--quick`` 10)
instead of a duration, and a fixed seed, so every run does the same work. Its commits per second
are the report's own (``throughput.commits_per_second``: acknowledged commits over the load's
wall time). A run whose invariants did not all hold still counts, and says so: its verdict and
the failed invariants are in the JSON, the report and the row's note (a benchmark reports, the
simulator's own tests judge).

Subjects, in interleaved rounds (odd rounds reversed), each a fresh store in a temporary
directory: ``sync`` durability (the command's default), and the same with ``async`` durability
(acknowledged before durable) as the baseline; and both again with every fault rate at zero, where
the rate is the request path's alone. The agents run on many threads, so the process is not pinned.
Before and after a change, ``python -m victor_actors.bench.alternate --rows simulate`` runs this in
old and new code alternately.
"""

from __future__ import annotations

from typing import Any, Literal

from victor_actors.bench._common import run_module
from victor_actors.sim import SimConfig, simulate

SUBJECTS: dict[str, tuple[Literal["sync", "async"], bool]] = {
    "sync": ("sync", True),
    "async": ("async", True),
    "sync_clean": ("sync", False),
    "async_clean": ("async", False),
}


def one(steps: int, durability: Literal["sync", "async"], faults: bool) -> dict[str, Any]:
    config = SimConfig(steps=steps, durability=durability)
    if not faults:
        config = SimConfig(
            steps=steps, durability=durability, tool_rate=0.0, reject_rate=0.0, crash_rate=0.0,
            timeout_rate=0.0, raise_rate=0.0,
        )  # fmt: skip
    report = simulate(config)
    t, c = report["throughput"], report["counts"]
    failed = {r["name"]: r["details"] for r in report["invariants"] if not r["ok"]}
    return {
        "commits_per_s": float(t["commits_per_second"]),
        "load_seconds": float(t["load_seconds"]),
        "commits": int(c["commits_acknowledged"]),
        "agents": int(c["agents"]),
        "verdict": report["verdict"],
        "failed": failed,
    }


def run(quick: bool) -> dict[str, Any]:
    rounds, steps = (1, 10) if quick else (3, 40)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in SUBJECTS}
    names = list(SUBJECTS)
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            durability, faults = SUBJECTS[name]
            runs[name].append(one(steps, durability, faults))
    rates = {}
    for name, done in runs.items():
        commits = sum(x["commits"] for x in done)
        seconds = sum(x["load_seconds"] for x in done)
        rates[name] = {
            "commits_per_s": commits / seconds if seconds else 0.0,
            "commits": commits,
            "load_seconds": seconds,
            "failed_runs": sum(x["verdict"] != "PASS" for x in done),
        }
    agents = runs["sync"][0]["agents"]
    return {
        "config": {"rounds": rounds, "steps": steps, "agents": agents, "seed": SimConfig().seed},
        "pinned": {"cpu": None, "how": "not pinned (16 agents on threads and asyncio tasks)"},
        "rates": rates,
        "runs": runs,
    }


def print_report(res: dict[str, Any]) -> None:
    cfg = res["config"]
    print(
        f"\n{cfg['agents']} agents x {cfg['steps']} turns, seed {cfg['seed']}, {cfg['rounds']} interleaved "
        f"round(s); {res['pinned']['how']}"
    )
    print(f"{'subject':<46}{'commits':>10}{'load s':>10}{'commits/s':>12}")
    labels = {
        "sync": "simulate, sync (the command's default)",
        "async": "simulate, async durability",
        "sync_clean": "simulate, sync, no faults",
        "async_clean": "simulate, async, no faults",
    }
    for name, label in labels.items():
        r = res["rates"][name]
        print(f"{label:<46}{r['commits']:>10,}{r['load_seconds']:>10.2f}{r['commits_per_s']:>12,.1f}")
    for name, done in res["runs"].items():
        for i, x in enumerate(done):
            for invariant, details in x["failed"].items():
                print(f"FAIL in {name} run {i + 1}: {invariant}: {'; '.join(details)[:500]}")


def main() -> int:
    return run_module(__doc__, "victor_actors simulate benchmark (commits per second)", run, print_report)


if __name__ == "__main__":
    raise SystemExit(main())
