"""What one simulation runs: its size, its fault rates, its seed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from victor_actors.lowlevel import Durability

__all__ = ["KINDS", "QUICK", "REJECTS", "SimConfig", "Sink", "Tick"]

KINDS = ("tool", "reject", "crash", "timeout", "raise")  # the turns that are not a plain step
REJECTS = ("access", "conflict", "validation")  # the ways a batch that must fail fails
Sink = Callable[[dict[str, Any]], None]  # where acknowledgments go as they happen (``--kill``)
Tick = Callable[[float, int, int], None]  # (fraction done, commits, failures): the progress bar


@dataclass
class SimConfig:
    teams: int = 2
    workflows: int = 2  # per team
    conversations: int = 4  # per workflow: one agent each
    seconds: float = 25.0
    steps: int | None = None  # turns per agent (instead of --seconds)
    tool_rate: float = 0.08
    reject_rate: float = 0.04
    crash_rate: float = 0.02
    timeout_rate: float = 0.02
    raise_rate: float = 0.02
    team_crash_share: float = 0.2  # of crashes, the share injected into the team rather than the agent
    transact_share: float = 0.5  # of plain steps, the share done with transact rather than the runner
    run_timeout: float = 0.25
    run_steps: int = 1  # counter steps per failing run (more than 1 meets a rollback bug, see the docs)
    seed: int = 7
    durability: Durability = "sync"  # "async": acknowledged before durable, which --kill must catch

    def rate(self, kind: str) -> float:
        return float(getattr(self, f"{kind}_rate"))


# ``--quick``: small, a few seconds, every kind of fault at a higher rate (what the tests run).
QUICK: dict[str, Any] = {
    "teams": 1, "workflows": 2, "conversations": 2, "seconds": 3.0, "tool_rate": 0.12,
    "reject_rate": 0.08, "crash_rate": 0.05, "timeout_rate": 0.04, "raise_rate": 0.04, "run_timeout": 0.1,
}  # fmt: skip
