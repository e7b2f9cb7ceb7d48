"""One simulation in this process: start the agents on a store, observe it, reopen it, check.

The built-in load is one use of :class:`Simulation`: its agent (``_agent``) is
each :class:`SimAgent`'s ``state``, its turn function drives one of the
agent's turns, ``observe`` reads the team counters, the conversations and the
versions, and :func:`check_invariants` runs on what it read.

Teams x workflows x conversations, one agent per conversation, half of them
threads and half asyncio tasks, run coordinator loops against an LMDB store
while batches are rejected, actors crash and runs time out or raise. At the
end the store is closed and reopened, and :func:`check_invariants` compares
what the agents were acknowledged with what the store holds.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from collections import Counter
from typing import Any

from victor_actors import GlobalStateManager
from victor_actors.lowlevel import StepGen, thaw
from victor_actors.sim._agent import Agent
from victor_actors.sim._agents import AgentSpec, SimAgent
from victor_actors.sim._config import SimConfig, Sink, Tick
from victor_actors.sim._coordinators import alookup, lookup
from victor_actors.sim._hub import Hub
from victor_actors.sim._invariants import check_invariants
from victor_actors.sim._ledger import AgentLedger, Expected, InvariantResult, Observed
from victor_actors.sim._simulation import Simulation

__all__ = ["observe", "report", "simulate"]


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


def observe(
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


def _load(
    config: SimConfig,
    path: str,
    sink: Sink | None,
    tick: Tick | None,
    deterministic: bool = False,
    replay: str | None = None,
) -> tuple[Hub, list[AgentLedger], Observed, float, dict[str, Any] | None]:
    """Run the agents on the store at ``path`` as a :class:`Simulation`: observed live, closed, reopened."""
    hubs: list[Hub] = []

    def setup(manager: GlobalStateManager) -> None:
        manager.register_tool("lookup", lookup, timeout=5.0)
        manager.register_tool("alookup", alookup, timeout=5.0)
        teams, workflows = _scopes(config)
        for ref in (None, "global:global", *teams, *workflows):  # no escalation: a crash, a restart
            manager.set_supervision(ref, max_restarts=1_000_000, within=1.0)
        hubs.append(Hub(manager, config, sink))

    siblings = {name: sibling for _, _, name, sibling in _names(config)}

    def agent_state(agent: SimAgent) -> Agent:
        spec = agent.spec
        return Agent(
            hubs[0],
            spec.team or "",
            spec.workflow or "",
            agent.name,
            siblings[agent.name],
            is_async=agent.is_async,
        )

    def turn(agent: SimAgent) -> StepGen[None]:
        yield from agent.state.turn_once()

    sim = Simulation(
        turn,
        [AgentSpec(name, team, wf) for team, wf, name, _ in _names(config)],
        steps=config.steps,
        seconds=None if config.steps is not None else config.seconds,
        seed=config.seed,
        setup=setup,
        agent_state=agent_state,
        observe=lambda manager: observe(manager, config),
        invariants=(),
        store=path,
        durability=config.durability,
        deterministic=deterministic,
        replay=replay,
    )
    progress = None
    if tick is not None:
        user_tick = tick

        def progress(done: float) -> None:
            hub = hubs[0]
            user_tick(done, hub.commits, hub.failures())

    sim_report = sim.run(tick=progress)
    result = sim_report.run
    hub = hubs[0]
    counters, messages, versions = result.live
    observed = Observed(counters, messages, versions, stats=result.stats)
    observed.reopened_counters, observed.reopened_messages, observed.reopened_versions = result.reopened
    return hub, [a.state.ledger for a in sim.agents], observed, sim.elapsed, sim_report.extra.get("schedule")


def report(
    config: SimConfig, results: list[InvariantResult], counts: dict[str, Any], **extra: Any
) -> dict[str, Any]:
    """The JSON report: the verdict, the config, the counts, every invariant, and ``extra``."""
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
    config: SimConfig,
    *,
    store: str | None = None,
    sink: Sink | None = None,
    tick: Tick | None = None,
    deterministic: bool = False,
    replay: str | None = None,
) -> dict[str, Any]:
    """Run one simulation in this process; return the report (``report["verdict"]``: PASS or FAIL).

    ``deterministic``: the agents' steps in one seeded schedule (``--replay``; needs ``steps``);
    the report's ``schedule`` then holds its length, digest and replay token; ``replay``: a token
    to run instead of the seed's schedule (a shrunk one; deterministic).
    """
    started = time.monotonic()
    path = store or tempfile.mkdtemp(prefix="victor-actors-simulate-")
    try:
        hub, ledgers, observed, elapsed, schedule = _load(config, path, sink, tick, deterministic, replay)
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
    if schedule is not None:
        extra["schedule"] = schedule
    return report(config, results, counts, wall_seconds=round(time.monotonic() - started, 2), **extra)
