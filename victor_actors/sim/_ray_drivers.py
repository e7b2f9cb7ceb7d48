"""``simulate --ray --drivers N``: the agents split over N driver processes attached to the same shards.

The main process (driver 0) starts the Ray session and the shards, then one
process per other driver (``python -m victor_actors.sim._ray_drivers``) that
joins the same Ray (its GCS address), attaches to the same shards through
``RayStateManager.open`` on the same path, and runs its share of the agents.
They talk over the child's stdin and stdout, one line each way at a time:

- the child prints ``READY`` once its agents hold their handles;
- the main process writes ``GO`` when every driver is ready (the load starts
  in all of them together), and ``STOP`` when its own agents are done (its
  load lasts until every shard killed has taken a commit after its recovery);
  the end of stdin (the main process died) stops the child too;
- the child writes what its agents were acknowledged (ledgers, runs, tallies)
  as JSON to the result file it was given, detaches (``close``) and exits 0.

The main process then checks the invariants over every driver's
acknowledgments, reading the state through its own handles (events included:
its subscriptions see the other drivers' commits).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO, Any

from victor_actors.sim._config import SimConfig
from victor_actors.sim._ledger import AgentLedger, RunLedger
from victor_actors.sim._ray_agent import RayAgent, RayHub

__all__ = [
    "DriverProcess", "RemoteAgent", "agents_for", "merge_result", "run_agents", "share", "start_agents",
]  # fmt: skip

READY_WAIT = 180.0  # seconds for a driver process to import Ray, join and attach (a loaded 2-core box)
END_WAIT = 180.0  # seconds for it to finish its turns, write its result and detach after STOP
GRACE = 120.0  # a child's load never outlasts the main one's by more (STOP normally ends it first)

Name = tuple[str, str, str, "str | None"]


def share(names: list[Name], driver: int, drivers: int) -> list[Name]:
    """Driver ``driver``'s agents: every ``drivers``-th one, so each driver's are spread over the teams."""
    return [n for i, n in enumerate(names) if i % drivers == driver]


def agents_for(hub: RayHub, names: list[Name]) -> list[RayAgent]:
    """One driver's agents, alternately threads and asyncio tasks."""
    return [
        RayAgent(hub, team, wf, name, sibling, is_async=bool(j % 2))
        for j, (team, wf, name, sibling) in enumerate(names)
    ]


def _run_async(agents: list[RayAgent]) -> None:
    async def main() -> None:
        # settle and failing runs go through to_thread: room for every agent
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(2 * len(agents) + 4))
        await asyncio.gather(*(agent.arun() for agent in agents))

    if agents:
        asyncio.run(main())


def start_agents(agents: list[RayAgent]) -> list[threading.Thread]:
    """Start the agents: a thread each for the sync ones, one thread with an asyncio loop for the rest."""
    threads = [threading.Thread(target=a.run, name=a.name, daemon=True) for a in agents if not a.is_async]
    threads.append(
        threading.Thread(
            target=_run_async, args=([a for a in agents if a.is_async],), name="sim-asyncio", daemon=True
        )
    )
    for thread in threads:
        thread.start()
    return threads


def run_agents(agents: list[RayAgent]) -> None:
    """Run the agents to the end of the load (a child driver's whole load)."""
    for thread in start_agents(agents):
        thread.join()


@dataclass
class RemoteAgent:
    """An agent another driver ran, as the main process sees it: its conversation and, at the end,
    what it was acknowledged."""

    name: str
    conv: Any
    ledger: AgentLedger
    global_increment: int = 0
    is_async: bool = False
    driver: int = 1


@dataclass
class DriverProcess:
    """One child driver process and its pipes."""

    driver: int
    proc: subprocess.Popen[str]
    result: str
    stderr: IO[str]
    names: list[Name] = field(default_factory=list)

    @classmethod
    def start(
        cls,
        config: SimConfig,
        path: str,
        shards: int,
        address: str,
        driver: int,
        names: list[Name],
        timeouts: dict[str, float],
    ) -> DriverProcess:
        fd, result = tempfile.mkstemp(prefix=f"victor-actors-driver-{driver}-", suffix=".json")
        os.close(fd)
        spec = {
            "config": dataclasses.asdict(config), "path": path, "shards": shards, "address": address,
            "driver": driver, "names": names, "result": result, "timeouts": timeouts,
        }  # fmt: skip
        stderr = tempfile.TemporaryFile("w+", encoding="utf-8")
        proc = subprocess.Popen(
            [sys.executable, "-m", "victor_actors.sim._ray_drivers", json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
        return cls(driver, proc, result, stderr, names)

    def wait_ready(self) -> str | None:
        """None once the child printed READY, else why it did not (it exited, or took too long)."""
        out = self.proc.stdout
        assert out is not None
        got: list[str] = []
        reader = threading.Thread(target=lambda: got.append(out.readline()), daemon=True)
        reader.start()
        reader.join(READY_WAIT)
        if got and got[0].strip() == "READY":
            return None
        return f"driver {self.driver} was not ready: {self._why()}"

    def say(self, line: str) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):  # it exited already: wait_result says why
            pass

    def wait_result(self) -> dict[str, Any] | str:
        """The child's result, or why there is none."""
        try:
            self.proc.wait(END_WAIT)
        except subprocess.TimeoutExpired:
            self.stop()
            return f"driver {self.driver} did not finish in {END_WAIT:g} s after STOP"
        try:
            if self.proc.returncode == 0:
                with open(self.result, encoding="utf-8") as fh:
                    return dict(json.load(fh))
        except (OSError, ValueError):
            pass
        return f"driver {self.driver} left no result: {self._why()}"

    def _why(self) -> str:
        code = self.proc.poll()
        self.stderr.seek(0)
        tail = self.stderr.read()[-1500:].strip()
        return f"exit code {code}; its stderr ends: {tail or '(empty)'}"

    def stop(self) -> None:
        """End the child (if it still runs) and clean up its files."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()
        self.stderr.close()
        try:
            os.unlink(self.result)
        except OSError:
            pass


def _result(hub: RayHub, agents: list[RayAgent], stats: dict[str, Any]) -> dict[str, Any]:
    return {
        "agents": [
            {"ledger": dataclasses.asdict(a.ledger), "global_increment": a.global_increment,
             "is_async": a.is_async}
            for a in agents
        ],
        "runs": [dataclasses.asdict(r) for r in hub.runs],
        "rejected": hub.rejected, "errors": dict(hub.errors), "examples": hub.examples,
        "unexpected": hub.unexpected, "turns": hub.turns, "commits": hub.commits,
        "shard_commits": {str(n): c for n, c in hub.shard_commits.items()}, "ambiguous": hub.ambiguous,
        "repaired": hub.repaired_rollbacks, "interrupted": hub.interrupted_rollbacks, "stats": stats,
    }  # fmt: skip


def merge_result(hub: RayHub, remote: dict[str, RemoteAgent], result: dict[str, Any]) -> dict[str, int]:
    """Add a child driver's tallies to the main hub and its ledgers to ``remote``; its driver stats."""
    for a in result["agents"]:
        ledger = AgentLedger(**a["ledger"])
        agent = remote[ledger.name]
        agent.ledger, agent.global_increment, agent.is_async = ledger, a["global_increment"], a["is_async"]
    with hub.lock:
        hub.runs.extend(RunLedger(**r) for r in result["runs"])
        for kind, (sent, refused) in result["rejected"].items():
            hub.rejected[kind][0] += sent
            hub.rejected[kind][1] += refused
        hub.errors.update(Counter(result["errors"]))
        for name, text in result["examples"].items():
            hub.examples.setdefault(name, text)
        hub.unexpected.extend(f"driver {result['driver']}: {u}" for u in result["unexpected"])
        hub.turns += result["turns"]
        hub.commits += result["commits"]
        hub.shard_commits.update({int(n): c for n, c in result["shard_commits"].items()})
        hub.ambiguous += result["ambiguous"]
        hub.repaired_rollbacks += result["repaired"]
        hub.interrupted_rollbacks += result["interrupted"]
    return {k: int(v) for k, v in result["stats"].items() if isinstance(v, int)}


def _child(spec: dict[str, Any]) -> int:
    """A driver process: join, attach, READY, wait for GO, run until STOP, write the result, detach."""
    import ray

    from victor_actors.ray import RayStateManager

    # Ctrl-C reaches the whole process group: the main process stops the load and then says STOP
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    config = SimConfig(**spec["config"])
    ray.init(address=spec["address"], log_to_driver=False)  # the main driver's Ray: its shards are there
    try:
        manager = RayStateManager.open(
            spec["path"], shards=spec["shards"], durability=config.durability, **spec["timeouts"]
        )
        try:
            hub = RayHub(manager, config)
            hub.driver = spec["driver"]
            agents = agents_for(hub, [tuple(n) for n in spec["names"]])
            print("READY", flush=True)
            if sys.stdin.readline().strip() != "GO":
                return 3  # the main process gave up on this run
            hub.started = time.monotonic()
            hub.stop_at = hub.started + config.seconds + GRACE

            def on_stop() -> None:
                sys.stdin.readline()  # STOP, or the end of stdin when the main process died
                hub.stopping = True

            threading.Thread(target=on_stop, name="sim-stop", daemon=True).start()
            run_agents(agents)
            result = _result(hub, agents, dict(manager.stats())) | {"driver": hub.driver}
        finally:
            manager.close()  # detach: the shards carry on for the main driver
        with open(spec["result"], "w", encoding="utf-8") as fh:
            json.dump(result, fh)
        return 0
    finally:
        ray.shutdown()


if __name__ == "__main__":
    sys.exit(_child(json.loads(sys.argv[1])))
