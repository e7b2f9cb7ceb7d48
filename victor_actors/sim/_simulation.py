"""``Simulation``: run the user's own agents under load and faults, then check invariants.

The user writes one turn function, ``turn(agent)``: a generator that yields
the blocking calls it needs as steps (``yield agent.apply(batch)``, ``snap =
yield agent.snapshot()``, ``yield from agent.in_run(body)``). The simulation
drives it with blocking calls in a thread for some agents and with awaits on
one event loop for the others (``victor_actors/_twins.py``), so the same
lines run both ways. Around the turns it injects the faults of a
:class:`FaultPlan`, keeps a :class:`Ledger` of what the runtime acknowledged
(``agent.ack(record)``), and at the end quiesces the manager, reads every
scope, closes and reopens the store read-only, reads it again, and runs the
invariants: plain functions of the :class:`SimRun`, the built-in ones in
``_checks.py`` included. ``victor-actors simulate`` is one use of it
(``_load.py``). See ``docs/simulate.md``.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from victor_actors import (
    DeadlineExceededError,
    GlobalStateManager,
    TransitionBatch,
    VictorActorsError,
)
from victor_actors.lowlevel import Durability, StepGen, adrive, drive
from victor_actors.sim._agents import AgentSpec, SimAgent
from victor_actors.sim._faults import FaultPlan
from victor_actors.sim._record import Ledger, SimRun, read_scopes
from victor_actors.sim._schedule import Schedule
from victor_actors.sim._sim_report import Invariant, SimReport, check

__all__ = ["Simulation", "Turn"]

Turn = Callable[["SimAgent"], StepGen[Any]]


class Simulation:
    """Run the user's agents: ``Simulation(turn, agents, ...).run()`` returns a :class:`SimReport`.

    - ``turn(agent)``: the turn function, a generator of steps (see :class:`SimAgent`);
    - ``agents``: :class:`AgentSpec` values (or names), e.g. :func:`layout`;
    - ``steps`` turns per agent, or ``seconds`` of load (one of them);
    - ``asyncio_share``: the share of agents run as asyncio tasks (the rest are threads);
    - ``faults``: a :class:`FaultPlan`, injected before each turn;
    - ``invariants``: plain functions of the :class:`SimRun` (default: the built-in ones);
    - ``setup(manager)``: called once the agents' conversations exist, before any agent starts;
    - ``agent_state(agent)``: what each agent keeps between turns (``agent.state``);
    - ``observe(manager)``: the facts to read live and after the reopen (default: every scope's
      version, messages and values, plain);
    - ``store``: a directory to keep (new or empty), else a temporary one; ``durability``;
    - ``deterministic``: one driver thread runs every agent's steps in an order drawn from the seed,
      quiescing after each, so a seed replays step for step (``_schedule.py``; needs ``steps``).

    A turn that raises a :class:`VictorActorsError` is counted as an error (an outcome, not a
    violation); anything else is an unexpected error, which the built-in ``no_unexpected_errors``
    fails on.
    """

    def __init__(
        self,
        turn: Turn,
        agents: Iterable[AgentSpec | str],
        *,
        steps: int | None = None,
        seconds: float | None = None,
        seed: int = 7,
        asyncio_share: float = 0.5,
        faults: FaultPlan | None = None,
        invariants: Sequence[Invariant] | None = None,
        setup: Callable[[GlobalStateManager], object] | None = None,
        agent_state: Callable[[SimAgent], Any] | None = None,
        observe: Callable[[GlobalStateManager], Any] | None = None,
        store: str | None = None,
        durability: Durability = "sync",
        deterministic: bool = False,
    ) -> None:
        if not callable(turn):
            raise TypeError("a Simulation takes turn(agent), a generator function of steps")
        if (steps is None) == (seconds is None):
            raise ValueError("give a Simulation either steps (turns per agent) or seconds, not both or none")
        if (steps is not None and steps < 0) or (seconds is not None and seconds <= 0):
            raise ValueError("steps must be at least 0 and seconds positive")
        if deterministic and steps is None:
            raise ValueError(
                "a deterministic Simulation takes steps, not seconds (time is not in its schedule)"
            )
        if not 0.0 <= asyncio_share <= 1.0:
            raise ValueError(f"asyncio_share is a share between 0 and 1, not {asyncio_share!r}")
        from victor_actors.sim._checks import BUILT_IN

        self.turn = turn
        self.specs = [AgentSpec(a) if isinstance(a, str) else a for a in agents]
        if not self.specs or len({s.name for s in self.specs}) != len(self.specs):
            raise ValueError("a Simulation needs at least one agent, each with its own name")
        self.steps, self.seconds, self.seed = steps, seconds, seed
        self.asyncio_share = asyncio_share
        self.faults = faults or FaultPlan()
        self.invariants = list(BUILT_IN if invariants is None else invariants)
        self.setup, self.agent_state, self.observe = setup, agent_state, observe
        self.store, self.durability = store, durability
        self.deterministic = deterministic
        self.schedule: Schedule | None = None  # the deterministic mode's schedule, once run
        self.ledger = Ledger()
        self.agents: list[SimAgent] = []
        self._stopping = threading.Event()
        self._stop_at = 0.0
        self.elapsed = 0.0  # the load's seconds, once run

    def stop(self) -> None:
        """Let every agent finish its current turn and stop; the checks still run."""
        self._stopping.set()

    # -- the load -------------------------------------------------------------------------------

    def _more(self, agent: SimAgent) -> bool:
        if self._stopping.is_set():
            return False
        if self.steps is not None:
            return agent.turns < self.steps
        return time.monotonic() < self._stop_at

    def _turns(self, agent: SimAgent) -> StepGen[None]:
        while self._more(agent):
            agent.turns += 1
            self.ledger.turn()
            self.faults.before_turn(agent, self.ledger)
            try:
                gen = self.turn(agent)
                if not hasattr(gen, "send"):
                    raise TypeError(
                        f"turn({agent.name}) returned {type(gen).__name__}, not a generator of steps"
                    )
                yield from gen
            except VictorActorsError as exc:
                self.ledger.error(exc)
            except Exception as exc:  # a bug in the turn or the runtime: tallied, never fatal
                self.ledger.unexpected(agent.name, exc)

    def _run_async(self, agents: list[SimAgent]) -> None:
        async def main() -> None:
            # cross-scope aapply, atransact and run rollbacks use to_thread: room for every agent
            asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(4 * len(agents) + 4))
            await asyncio.gather(*(adrive(self._turns(a)) for a in agents))

        if agents:
            asyncio.run(main())

    def drive(self, manager: GlobalStateManager, tick: Callable[[float], None] | None = None) -> float:
        """Start the agents on ``manager``, wait for them, return the load's seconds."""
        share = 0.0 if self.deterministic else self.asyncio_share
        # interleaved (with a share of 0.5: even agents threads, odd ones asyncio), so every team has both
        self.agents = [
            SimAgent(self, s, manager, int((i + 1) * share) > int(i * share))
            for i, s in enumerate(self.specs)
        ]
        if self.setup is not None:
            self.setup(manager)
        for agent in self.agents:
            if self.agent_state is not None:
                agent.state = self.agent_state(agent)
        self.faults.prepare(manager, self.specs)
        started = time.monotonic()
        self._stop_at = started + (self.seconds or 0.0)
        if self.deterministic:  # one driver thread, a seeded order of steps (see _schedule.py)
            self.schedule = Schedule(self.seed)
            self.schedule.run(manager, [(a.name, self._turns(a)) for a in self.agents])
            return time.monotonic() - started
        threads = [
            threading.Thread(target=drive, args=(self._turns(a),), name=f"sim-{a.name}", daemon=True)
            for a in self.agents
            if not a.is_async
        ]
        threads.append(
            threading.Thread(
                target=self._run_async, args=([a for a in self.agents if a.is_async],), name="sim-asyncio"
            )
        )
        for thread in threads:
            thread.start()
        total = (self.steps or 0) * len(self.agents)
        while any(t.is_alive() for t in threads):
            try:
                if tick is not None:
                    done = (
                        self.ledger.turns / total
                        if total
                        else (time.monotonic() - started) / (self.seconds or 1)
                    )
                    tick(min(done, 1.0))
                next(t for t in threads if t.is_alive()).join(0.2)
            except KeyboardInterrupt:  # Ctrl-C: the agents finish their turn, then the checks run
                self.stop()
        return time.monotonic() - started

    def settle(self, manager: GlobalStateManager) -> None:
        """After the load: an empty request through every conversation and team (consuming any fault
        no agent request met), then ``quiesce`` (tools and subscribers done)."""
        refs = [a.conv.ref for a in self.agents] + [
            f"team:{t}" for t in dict.fromkeys(s.team for s in self.specs if s.team)
        ]
        for ref in refs:
            for _ in range(10):
                try:
                    manager.scope(ref).apply(TransitionBatch())
                    break
                except VictorActorsError:
                    continue
        try:
            manager.quiesce(10.0)
        except DeadlineExceededError:
            pass  # what never came is the invariants' to report

    def run(
        self,
        *,
        tick: Callable[[float], None] | None = None,
        sink: Callable[[dict[str, Any]], None] | None = None,
    ) -> SimReport:
        """Run the load, read it live, close, reopen read-only, read it again, check. See the class."""
        started = time.monotonic()
        self.ledger.sink = sink
        path = self.store or tempfile.mkdtemp(prefix="victor-actors-sim-")
        read = self.observe or read_scopes
        try:
            manager = GlobalStateManager.open(path, durability=self.durability)
            try:
                elapsed = self.elapsed = self.drive(manager, tick)
                self.settle(manager)
                live, stats = read(manager), manager.stats()
            finally:
                manager.close()
            with GlobalStateManager.open(path, read_only=True) as again:
                reopened = read(again)
        finally:
            if self.store is None:
                shutil.rmtree(path, ignore_errors=True)
        run = SimRun(self.ledger, live, reopened, stats, self.agents, self.faults, killed=False)
        return self.report(run, elapsed, time.monotonic() - started)

    def report(self, run: SimRun, elapsed: float, wall: float) -> SimReport:
        results = check(self.invariants, run)
        counts = {
            "agents": len(self.specs),
            "thread_agents": sum(not a.is_async for a in self.agents),
            "asyncio_agents": sum(a.is_async for a in self.agents),
            "turns": self.ledger.turns,
            "acknowledged": len(self.ledger.acks),
            "faults": dict(self.ledger.faults),
            "errors": dict(self.ledger.errors),
            "load_seconds": round(elapsed, 2),
        }
        report = SimReport(results, counts, run, round(wall, 2), self.seed)
        if self.schedule is not None:
            report.extra["schedule"] = {"steps": len(self.schedule.history), "digest": self.schedule.digest}
        return report
