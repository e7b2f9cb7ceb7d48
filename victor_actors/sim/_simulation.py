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
from victor_actors.lowlevel import Durability, StepGen, VirtualClock, adrive, current_clock, drive, use_clock
from victor_actors.sim._agents import AgentSpec, SimAgent
from victor_actors.sim._faults import FaultPlan
from victor_actors.sim._record import Ledger, SimRun, read_scopes
from victor_actors.sim._schedule import Pick, Schedule, decode_token, encode_token
from victor_actors.sim._shrink import Attempt, Shrunk, shrink_schedule
from victor_actors.sim._sim_report import Invariant, SimReport, check

__all__ = ["Simulation", "Turn"]

Turn = Callable[["SimAgent"], StepGen[Any]]

# called with (simulation, report) after every deterministic run (the pytest plugin listens here)
_watchers: list[Callable[[Simulation, SimReport], None]] = []


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
    - ``deterministic``: one driver thread runs every agent's steps and every tool call in an order
      drawn from the seed, quiescing after each, on a virtual clock, so a seed replays step for step
      (``_schedule.py``; needs ``steps``); ``step_seconds``: the most virtual time a step takes (each
      one's is drawn from the seed); ``replay``: a token (``report.extra["schedule"]["token"]``, or
      :meth:`shrink`'s) whose seed and picks to run instead (deterministic, whatever ``seed`` says).

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
        step_seconds: float = 0.002,
        replay: str | None = None,
    ) -> None:
        self._kwargs: dict[str, Any] = dict(
            steps=steps, seconds=seconds, asyncio_share=asyncio_share, faults=faults,
            invariants=invariants, setup=setup, agent_state=agent_state, observe=observe,
            durability=durability, deterministic=deterministic, step_seconds=step_seconds,
        )  # fmt: skip
        self._picks: list[Pick] | None = None
        if replay is not None:
            seed, self._picks = decode_token(replay)
            deterministic = True
        if not step_seconds >= 0:
            raise ValueError(
                f"step_seconds is the most virtual time a step takes, >= 0, not {step_seconds!r}"
            )
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
        self.step_seconds = step_seconds
        self._notify = True  # tell the watchers (the pytest plugin) of a deterministic run; not a shrink's
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
            self.schedule = Schedule(
                self.seed, step_seconds=self.step_seconds, picks=self._picks, clock=current_clock()
            )
            manager.tools.hold(True)  # tool calls wait for the schedule to pick them
            try:
                self.schedule.run(manager, [(a.name, self._turns(a)) for a in self.agents], self.stop)
            finally:
                manager.tools.hold(False)
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
        """Run the load, read it live, close, reopen read-only, read it again, check. See the class.

        A deterministic simulation runs all of it on a :class:`VirtualClock`
        (installed for the call: one deterministic simulation at a time per process).
        """
        if self.deterministic:
            with use_clock(VirtualClock()):
                report = self._run(tick, sink)
            for watch in list(_watchers) if self._notify else ():
                watch(self, report)
            return report
        return self._run(tick, sink)

    def _run(
        self, tick: Callable[[float], None] | None, sink: Callable[[dict[str, Any]], None] | None
    ) -> SimReport:
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
            report.extra["schedule"] = {
                "steps": len(self.schedule.history),
                "picks": len(self.schedule.picks),
                "digest": self.schedule.digest,
                "virtual_seconds": round(self.schedule.virtual_seconds, 6),
                "token": self.schedule.token(),
            }
        return report

    # -- shrinking --------------------------------------------------------------------------------

    def again(self, replay: str | None = None) -> Simulation:
        """A new simulation like this one, in a temporary store; ``replay``: a token to run instead."""
        kwargs = dict(self._kwargs, seed=self.seed)
        if replay is not None:
            kwargs["replay"] = replay
        elif self._picks is not None:
            kwargs["replay"] = encode_token(self.seed, self._picks)
        sim = Simulation(self.turn, self.specs, **kwargs)
        sim._notify = False  # a replay of this one (a shrink's attempt): the plugin reports this one only
        return sim

    def attempt(self, report: SimReport) -> Attempt:
        """This run's outcome, as the shrinker compares them (after :meth:`run`)."""
        history = tuple(self.schedule.history) if self.schedule is not None else ()
        return Attempt(tuple(report.failed), len(history), history)

    def shrink(
        self, report: SimReport | None = None, *, invariant: str | None = None, max_runs: int = 200
    ) -> Shrunk:
        """Shorten this deterministic simulation's failing schedule (``_shrink.py``, delta debugging).

        ``report`` is this simulation's failing report (it is run first if None).
        The shrunk schedule must fail the same invariants: the very set that
        failed, or at least the one named ``invariant``. Every attempt is a
        whole run in a temporary store, at most ``max_runs`` of them. The
        result's ``token`` replays it: ``Simulation(..., replay=token)``.

        Raises:
            ValueError: the simulation is not deterministic, or its report does not fail (that
                invariant); nothing was shrunk.
        """
        if not self.deterministic:
            raise ValueError("only a deterministic Simulation has a schedule to shrink; nothing was run")
        report = report if report is not None else self.run()
        if self.schedule is None:
            raise ValueError("this simulation has not run yet: run() it, then shrink its report")

        def replay(token: str) -> Attempt:
            sim = self.again(token)
            return sim.attempt(sim.run())

        return shrink_schedule(
            replay,
            self.seed,
            self.schedule.picks,
            self.attempt(report),
            invariant=invariant,
            max_runs=max_runs,
        )
