"""``simulate --ray``: the agents on a Ray cluster through ``RayStateManager``, with every shard killed once.

The teams are named so that each shard hosts some (placement is a hash of the
team id), half the agents are threads and half asyncio tasks, and a killer
thread kills each shard in turn with ``ray.kill(manager.shard_actor(n),
no_restart=False)`` at seeded moments of the load (a shard hosting
conversations first, the global scope's home last). Ray restarts it; it
reopens its store and recovers its in-doubt two-phase commits. When the load
ends the shards are settled, the state is read through the driver, the
manager is closed, each shard's store is reopened read-only and read again,
and :func:`check_ray_invariants` compares it all with what the agents were
acknowledged.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import threading
import time
from typing import Any

from victor_actors import GlobalStateManager, VictorActorsError
from victor_actors.lowlevel import thaw
from victor_actors.sim._config import SimConfig, Tick
from victor_actors.sim._ledger import AgentLedger, Expected, Observed
from victor_actors.sim._load import report
from victor_actors.sim._ray_agent import RayHub
from victor_actors.sim._ray_drivers import (
    DriverProcess,
    RemoteAgent,
    agents_for,
    merge_result,
    share,
    start_agents,
)
from victor_actors.sim._ray_invariants import RayFacts, check_ray_invariants

__all__ = ["RAY_DEFAULTS", "RAY_QUICK", "simulate_ray"]

# ``--ray`` without sizes: 8 agents for 15 s, about 25 s in all with Ray's start-up (2 cores).
RAY_DEFAULTS: dict[str, Any] = {"teams": 2, "workflows": 2, "conversations": 2, "seconds": 15.0}
# ``--ray --quick``: 4 agents, two teams (one per shard), 6 s; every fault kind early on.
RAY_QUICK: dict[str, Any] = {
    "teams": 2, "workflows": 1, "conversations": 2, "seconds": 6.0, "reject_rate": 0.08,
    "timeout_rate": 0.04, "raise_rate": 0.04, "run_timeout": 0.1,
}  # fmt: skip
REQUEST_TIMEOUT = 1.5  # shorter than a restart: requests caught by a kill fail and are resolved
AFTER_RECOVERY = 1.5  # seconds of load at least after each shard's recovery
KILL_WAIT = 60.0  # seconds the killer waits for a shard to answer, or for a commit on it after its recovery
HOLD_TIMEOUT = 5.0  # a prepared part's hold, when its coordinator went away
TIMEOUTS = {"request_timeout": REQUEST_TIMEOUT, "hold_timeout": HOLD_TIMEOUT}  # every driver's


def _teams(config: SimConfig, shards: int) -> list[str]:
    """Team ids spread over the shards: team i on shard i % shards (placement hashes the id)."""
    from victor_actors.ray import shard_for

    out: list[str] = []
    while len(out) < config.teams:
        k = 0
        while f"t{k}" in out or shard_for(("team", f"t{k}", None, None), shards) != len(out) % shards:
            k += 1
        out.append(f"t{k}")
    return out


def _names(config: SimConfig, shards: int) -> list[tuple[str, str, str, str | None]]:
    """(team, workflow, agent, a sibling agent) for every conversation."""
    out = []
    for t in _teams(config, shards):
        for w in range(config.workflows):
            for c in range(config.conversations):
                sibling = f"{t}w{w}a{(c + 1) % config.conversations}" if config.conversations > 1 else None
                out.append((t, f"{t}w{w}", f"{t}w{w}a{c}", sibling))
    return out


class _Events:
    """Every conversation's delivered event versions, from driver-side subscriptions."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.seen: dict[str, list[int]] = {}
        self.start: dict[str, int] = {}
        self.subs: list[Any] = []

    def watch(self, agent: Any) -> None:
        seen = self.seen.setdefault(agent.name, [])

        def on_event(event: Any) -> None:
            with self.cond:
                seen.append(int(event.new_version))
                self.cond.notify_all()

        sub = agent.conv.subscribe(on_event)
        self.start[agent.name] = sub.delivered
        self.subs.append(sub)

    def wait(self, finals: dict[str, int], timeout: float) -> None:
        def caught_up() -> bool:
            return all((self.seen[c] or [self.start[c]])[-1] >= v for c, v in finals.items())

        with self.cond:
            self.cond.wait_for(caught_up, timeout)
        for sub in self.subs:
            sub.close()


def _killer(
    manager: Any, hub: RayHub, shards: int, stop: threading.Event, kills: list[dict[str, Any]]
) -> None:
    """Kill every shard once, a conversations' shard first and the global scope's home last.

    The load goes on until every kill has been checked: the agents' planned end is held open
    while the killer works (each of its waits is bounded by ``KILL_WAIT``) and set again when it
    is done, at least ``AFTER_RECOVERY`` seconds after the last recovery. Before, an agent whose
    turn outlasted the planned end (a rollback waiting for the shards to settle after a kill) left
    its loop before the killer extended the end, so a shard recovered with no agent left to
    commit on it and the run failed "no commit was acknowledged on it after it recovered" on a
    loaded machine (seen in CI).
    """
    with hub.lock:
        keep_until = hub.stop_at
        hub.stop_at = float("inf")
    try:
        keep_until = _kill_each(manager, hub, shards, stop, kills, keep_until)
    finally:
        with hub.lock:
            hub.stop_at = keep_until


def _kill_each(
    manager: Any,
    hub: RayHub,
    shards: int,
    stop: threading.Event,
    kills: list[dict[str, Any]],
    keep_until: float,
) -> float:
    """The killer's work; returns the time the load must go on until."""
    import ray

    rng = random.Random(hub.config.seed)
    at = hub.started + hub.config.seconds * rng.uniform(0.15, 0.3)
    for n in reversed(range(shards)):
        if stop.wait(max(at - time.monotonic(), 0.0)):
            return keep_until
        rec: dict[str, Any] = {"shard": n, "killed": False, "recovered": False, "calls_before": 0}
        rec.update(calls_after=0, commits_after_recovery=0, recovered_after_seconds=None)
        kills.append(rec)
        before = _calls_on(manager, n, stop, KILL_WAIT)
        if before is None:  # the shard never answered (or the run is over): not killed, and reported
            continue
        rec["calls_before"] = before
        actor = manager.shard_actor(n)
        killed_at = time.monotonic()
        ray.kill(actor, no_restart=False)
        rec["killed"] = True
        while time.monotonic() - killed_at < 60.0:  # until a new process answers (its counters start at 0)
            try:
                calls = int(manager.shard_stats()[n].get("shard_calls", 0))
            except VictorActorsError:  # away past the request deadline: ask again
                continue
            if calls < rec["calls_before"]:
                rec.update(recovered=True, calls_after=calls)
                rec["recovered_after_seconds"] = round(time.monotonic() - killed_at, 2)
                break
            stop.wait(0.05)  # the old process still answers: the kill has not landed yet
        with hub.lock:
            rec["_commits_at_recovery"] = at_recovery = hub.shard_commits[n]
        # the load goes on after every recovery until a commit lands on the new process (at least
        # AFTER_RECOVERY seconds, at most KILL_WAIT): on a loaded machine the first ones may take a while
        waited_from = time.monotonic()
        while not stop.is_set() and time.monotonic() - waited_from < KILL_WAIT:
            keep_until = max(keep_until, time.monotonic() + AFTER_RECOVERY)
            with hub.lock:
                landed = hub.shard_commits[n] > at_recovery
            if landed:
                break
            stop.wait(0.05)  # polling the agents' tally; it orders nothing
        at = time.monotonic() + rng.uniform(0.3, 1.0)  # the next kill
    return keep_until


def _calls_on(manager: Any, n: int, stop: threading.Event, wait: float) -> int | None:
    """Shard ``n``'s call counter, asked until it answers (``wait`` seconds at most; a request may
    miss its short deadline on a loaded machine), or None."""
    end = time.monotonic() + wait
    while not stop.is_set() and time.monotonic() < end:
        try:
            return int(manager.shard_stats()[n].get("shard_calls", 0))
        except VictorActorsError:
            stop.wait(0.05)  # away past the request deadline: ask again
    return None


def _observe_live(
    manager: Any, agents: list[Any]
) -> tuple[dict[str, int], dict[str, Any], dict[str, int], int]:
    counters: dict[str, int] = {}
    messages: dict[str, Any] = {}
    versions: dict[str, int] = {}
    for a in agents:
        snap = a.conv.snapshot()
        messages[a.name] = [thaw(m) for m in snap.messages]
        versions[str(a.conv.ref)] = snap.version
    for team in sorted({a.ledger.team for a in agents}):
        snap = manager.get_team_state(team).snapshot()
        counters[team] = int(snap.get_state("counter", 0))
        versions[f"team:{team}"] = snap.version
    for team, wf in sorted({(a.ledger.team, a.conv.address[2]) for a in agents}):
        versions[f"workflow:{wf}"] = manager.get_workflow_state(wf, team_id=team).version
    glob = manager.get_global_state().snapshot()
    versions["global:global"] = glob.version
    return counters, messages, versions, int(glob.get_state("gcounter", 0))


def _observe_stores(
    root: str, manager_shard: dict[str, int], shards: int
) -> tuple[dict[str, int], dict[str, Any], dict[str, int], int]:
    """The same reads from each shard's store, reopened read-only in this process."""
    counters: dict[str, int] = {}
    messages: dict[str, Any] = {}
    versions: dict[str, int] = {}
    gcounter = 0
    for n in range(shards):
        with GlobalStateManager.open(os.path.join(root, f"shard-{n}"), read_only=True) as store:
            for ref, shard in manager_shard.items():
                if shard != n:
                    continue
                scope = store.scope(ref)
                versions[ref] = scope.version
                kind, _, ident = ref.partition(":")
                if kind == "team":
                    counters[ident] = int(scope.get("counter", 0))
                elif kind == "conversation":
                    messages[ident] = [thaw(m) for m in scope.snapshot().messages]
                elif kind == "global":
                    gcounter = int(scope.get("gcounter", 0))
    return counters, messages, versions, gcounter


def simulate_ray(
    config: SimConfig,
    *,
    shards: int = 2,
    store: str | None = None,
    tick: Tick | None = None,
    drivers: int = 1,
) -> dict[str, Any]:
    """Run one simulation through ``RayStateManager`` on ``shards`` shards; return the report.

    Starts a local Ray instance of its own when Ray is not initialised
    (``address="local"``: never joins a cluster another process started on
    this machine), and shuts it down at the end. ``drivers`` > 1 splits the
    agents over that many driver processes attached to the same shards (this
    one and ``drivers - 1`` children, see :mod:`._ray_drivers`).
    """
    import ray

    owns_ray = not ray.is_initialized()
    started = time.monotonic()
    if owns_ray:
        ray.init(address="local", num_cpus=max(2, shards), include_dashboard=False, log_to_driver=False)
    try:
        return _simulate_ray(config, shards, store, tick, started, drivers)
    finally:
        if owns_ray:
            ray.shutdown()


def _simulate_ray(
    config: SimConfig, shards: int, store: str | None, tick: Tick | None, started: float, drivers: int
) -> dict[str, Any]:
    import ray

    from victor_actors.ray import RayStateManager

    path = store or tempfile.mkdtemp(prefix="victor-actors-simulate-ray-")
    children: list[DriverProcess] = []
    try:
        manager = RayStateManager.open(
            path,
            shards=shards,
            durability=config.durability,
            request_timeout=REQUEST_TIMEOUT,
            hold_timeout=HOLD_TIMEOUT,
        )
        kills: list[dict[str, Any]] = []
        events = _Events()
        remote: dict[str, RemoteAgent] = {}
        child_stats: list[dict[str, int]] = []
        try:
            names = _names(config, shards)
            address = ray.get_runtime_context().gcs_address
            for d in range(1, drivers):  # started first: they import Ray and attach while we get ready
                children.append(
                    DriverProcess.start(config, path, shards, address, d, share(names, d, drivers), TIMEOUTS)
                )
            ray_up = time.monotonic() - started
            hub = RayHub(manager, config)
            agents = agents_for(hub, share(names, 0, drivers))
            for child in children:
                for team, wf, name, _ in child.names:
                    conv = manager.get_conversation_state(name, workflow_id=wf, team_id=team)
                    remote[name] = RemoteAgent(name, conv, AgentLedger(name, team, name), driver=child.driver)
            everyone: list[Any] = [*agents, *remote.values()]
            for agent in everyone:  # the other drivers' commits reach this driver's subscribers too
                events.watch(agent)
            for child in children:
                problem = child.wait_ready()
                if problem:
                    raise VictorActorsError(f"simulate --ray --drivers {drivers}: {problem}; nothing was run")
            hub.started = time.monotonic()
            hub.stop_at = hub.started + config.seconds
            for child in children:
                child.say("GO")
            stop = threading.Event()
            killer = threading.Thread(
                target=_killer, args=(manager, hub, shards, stop, kills), name="sim-killer", daemon=True
            )
            killer.start()
            threads = start_agents(agents)
            total = config.steps * len(agents) if config.steps is not None else None
            while any(thread.is_alive() for thread in threads):
                try:
                    if tick is not None:
                        done = (
                            hub.turns / total if total else (time.monotonic() - hub.started) / config.seconds
                        )
                        tick(min(done, 1.0), hub.commits, hub.failures())
                    alive = [thread for thread in threads if thread.is_alive()]
                    if alive:
                        alive[0].join(0.2)  # the progress bar's pace
                except KeyboardInterrupt:  # Ctrl-C: the agents finish their turn, then the checks run
                    hub.stopping = True
            elapsed = time.monotonic() - hub.started
            for child in children:
                child.say("STOP")
            for child in children:
                result = child.wait_result()
                if isinstance(result, str):
                    hub.unexpected.append(result)
                else:
                    child_stats.append(merge_result(hub, remote, result))
            stop.set()
            killer.join()
            manager.settle(60.0)
            counters, messages, versions, gcounter = _observe_live(manager, everyone)
            events.wait({a.name: versions[str(a.conv.ref)] for a in everyone}, 15.0)
            stats = manager.stats()
            placed = {ref: manager.shard_of(ref) for ref in versions}
        finally:
            for child in children:
                child.stop()
            manager.shutdown()  # the run is over: every shard flushes and closes its store
        observed = Observed(counters, messages, versions, stats=stats)
        observed.reopened_counters, observed.reopened_messages, observed.reopened_versions, again = (
            _observe_stores(path, placed, shards)
        )
    finally:
        if store is None:
            shutil.rmtree(path, ignore_errors=True)
    for k in kills:
        k["commits_after_recovery"] = hub.shard_commits[k["shard"]] - k.pop("_commits_at_recovery", 0)
    agents = everyone
    ledgers = [a.ledger for a in agents]
    facts = RayFacts(
        global_acknowledged=sum(a.global_increment for a in agents),
        global_counter=gcounter,
        global_reopened=again,
        shards=shards,
        kills=kills,
        events={
            a.name: (events.start[a.name], events.seen[a.name], versions[str(a.conv.ref)]) for a in agents
        },
    )
    expected = Expected(ledgers, hub.runs, rejected=hub.rejected, unexpected=hub.unexpected)
    results = check_ray_invariants(expected, observed, facts)
    runs = {kind: sum(1 for r in hub.runs if r.kind == kind) for kind in ("timeout", "raise")}
    counts = {
        "agents": len(ledgers),
        "thread_agents": sum(1 for a in agents if not a.is_async),
        "asyncio_agents": sum(1 for a in agents if a.is_async),
        "shards": shards,
        "drivers": drivers,
        "commits_by_driver": _by_driver(agents, drivers),
        "store_messages_by_driver": _in_store_by_driver(observed, drivers),
        "teams_per_shard": {
            str(n): sorted({a.ledger.team for a in agents if a.conv.shard == n}) for n in range(shards)
        },
        "turns": hub.turns,
        "commits_acknowledged": hub.commits,
        "commits_by_shard": {str(n): hub.shard_commits[n] for n in range(shards)},
        "global_increments": facts.global_acknowledged,
        "cross_shard_commits": _summed(stats, child_stats, "driver_cross_shard"),
        "cross_shard_aborted": _summed(stats, child_stats, "driver_cross_shard_aborted"),
        "driver_retries": _summed(stats, child_stats, "driver_retries"),
        "rejected_batches": {k: {"sent": v[0], "refused": v[1]} for k, v in hub.rejected.items()},
        "shard_kills": sum(1 for k in kills if k["killed"]),
        "runs_rolled_back": runs,
        "rollbacks_interrupted_by_a_kill": hub.interrupted_rollbacks,
        "rollbacks_finished_by_the_agent": hub.repaired_rollbacks,
        "ambiguous_outcomes": hub.ambiguous,
        "errors": dict(hub.errors),
        "error_examples": hub.examples,
    }
    throughput = {
        "ray_start_seconds": round(ray_up, 2),
        "load_seconds": round(elapsed, 2),
        "commits_per_second": round(hub.commits / elapsed, 1) if elapsed else 0.0,
        "turns_per_second": round(hub.turns / elapsed, 1) if elapsed else 0.0,
    }
    extra = {
        "ray": {"shards": shards, "drivers": drivers, "kills": kills},
        "throughput": throughput,
        "stats": stats,
        "store": store,
    }
    return report(config, results, counts, wall_seconds=round(time.monotonic() - started, 2), **extra)


def _summed(stats: dict[str, Any], others: list[dict[str, int]], key: str) -> int:
    """A driver-side counter over every driver process (each driver counts its own requests)."""
    return int(stats.get(key, 0)) + sum(o.get(key, 0) for o in others)


def _by_driver(agents: list[Any], drivers: int) -> dict[str, int]:
    """Acknowledged commits by the driver process that was told."""
    out = {str(d): 0 for d in range(drivers)}
    for a in agents:
        out[str(getattr(a, "driver", 0))] += len(a.ledger.acked)
    return out


def _in_store_by_driver(observed: Observed, drivers: int) -> dict[str, int]:
    """The step messages in the reopened stores, by the driver process that wrote them."""
    out = {str(d): 0 for d in range(drivers)}
    for messages in (observed.reopened_messages or {}).values():
        for m in messages:
            if isinstance(m, dict) and m.get("kind") == "step" and str(m.get("driver")) in out:
                out[str(m["driver"])] += 1
    return out
