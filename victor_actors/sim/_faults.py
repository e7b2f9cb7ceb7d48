"""The fault plan of a :class:`Simulation`: what is done to the agents' scopes before a turn.

Built in: ``crash`` (the scope's actor fails on its next request, through
``victor_actors.testing.inject_fault``; its supervisor restarts it, a team
with its whole subtree) and ``slow`` (the actor is held for ``slow_seconds``
on its next request). Add your own as :class:`Fault` values: ``inject(agent)``
runs on the agent's thread (or event loop) before the turn, and must not
block for long. Each is drawn from the agent's own seeded random, so a seed
fixes which turns meet which fault.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from victor_actors import GlobalStateManager
from victor_actors.sim._schedule import clock_sleep
from victor_actors.testing import inject_fault

__all__ = ["Fault", "FaultPlan", "SimulatedCrash"]


class SimulatedCrash(RuntimeError):
    """Injected into a scope's actor: a failure its supervisor restarts."""


@dataclass(frozen=True)
class Fault:
    """A fault of the user's: ``inject(agent)`` before a turn, with probability ``rate``."""

    name: str
    rate: float
    inject: Callable[[Any], object]


@dataclass(frozen=True)
class FaultPlan:
    """Which faults, how often (the share of turns each one precedes)."""

    crash: float = 0.0
    team_crash_share: float = 0.2  # of the crashes, the share aimed at the agent's team
    slow: float = 0.0
    slow_seconds: float = 0.05
    custom: Sequence[Fault] = ()

    def __post_init__(self) -> None:
        for name, rate in (
            ("crash", self.crash),
            ("slow", self.slow),
            *((f.name, f.rate) for f in self.custom),
        ):
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"the rate of fault {name!r} is a share between 0 and 1, not {rate!r}")

    def prepare(self, manager: GlobalStateManager, specs: Sequence[Any]) -> None:
        """With crashes planned, supervisors never escalate: each crash is one failure and known restarts."""
        if self.crash <= 0:
            return
        teams = sorted({s.team for s in specs if s.team})
        workflows = sorted({s.workflow for s in specs if s.workflow})
        for ref in (
            None,
            "global:global",
            *(f"team:{t}" for t in teams),
            *(f"workflow:{w}" for w in workflows),
        ):
            manager.set_supervision(ref, max_restarts=1_000_000, within=1.0)

    def before_turn(self, agent: Any, ledger: Any) -> None:
        rng = agent.rng
        if self.crash > 0 and rng.random() < self.crash:
            team = agent.spec.team is not None and rng.random() < self.team_crash_share
            ref = f"team:{agent.spec.team}" if team else agent.conv.ref
            inject_fault(agent.manager, ref, SimulatedCrash(f"{agent.name} crashed {ref} on purpose"))
            ledger.fault("team crash" if team else "crash", _subtree(agent) if team else 1)
        if self.slow > 0 and rng.random() < self.slow:
            seconds = self.slow_seconds
            inject_fault(agent.manager, agent.conv.ref, lambda: clock_sleep(seconds))
            ledger.fault("slow")
        for fault in self.custom:
            if rng.random() < fault.rate:
                fault.inject(agent)
                ledger.fault(fault.name)


def _subtree(agent: Any) -> int:
    """How many scopes restarting the agent's team restarts: the team, its workflows, their conversations."""
    specs = [s for s in agent.sim.specs if s.team == agent.spec.team]
    return 1 + len({s.workflow for s in specs if s.workflow}) + len(specs)
