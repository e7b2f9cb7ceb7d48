"""``victor-actors simulate``: many agents, real faults, then the invariants.

Teams x workflows x conversations, one agent per conversation, half of them
threads and half asyncio tasks, run coordinator loops against an LMDB store
while batches are rejected, actors crash and runs time out or raise. At the
end the store is closed and reopened, and :func:`check_invariants` compares
what the agents were acknowledged with what the store holds. ``--kill`` runs
the load in a child process, SIGKILLs it at a random moment and checks every
acknowledged commit after reopening. ``--ray`` runs agents through
``victor_actors.ray.RayStateManager`` on a local Ray cluster and kills every
shard once mid-run. See ``docs/simulate.md``.

:class:`Simulation` runs a user's own agents the same way: one turn function
written once and driven from threads and asyncio, a :class:`FaultPlan`, a
:class:`Ledger` of acknowledged writes (which :func:`kill_and_reopen` checks
after a SIGKILL), and invariants as plain functions (:data:`BUILT_IN`);
``victor-actors simulate`` is one use of it.

Tooling on top of the runtime: it uses only the public surface
(:mod:`victor_actors`, :mod:`victor_actors.lowlevel`, :mod:`victor_actors.testing`,
and with ``--ray`` :mod:`victor_actors.ray`, imported only then), and nothing in the
runtime imports it.

- ``_config``: :class:`SimConfig`, the fault kinds, ``--quick``;
- ``_coordinators``: the coordinators, the tools and the batch of a step;
- ``_agent``: one agent, written once for a thread and an asyncio task;
- ``_hub``: what the agents share, and the tallies;
- ``_ledger``, ``_invariants``: the plain data the checker compares, and the checks;
- ``_load``: one simulation in this process; ``_kill``: the SIGKILL harness;
- ``_ray_agent``, ``_ray_load``, ``_ray_invariants``: ``--ray`` (the agent over Ray,
  the run with its shard kills, the checks that apply there);
- ``_simulation``, ``_agents``, ``_faults``, ``_record``, ``_sim_report``, ``_checks``,
  ``_schedule``, ``_shrink``, ``_crash``: the :class:`Simulation` API (the driver, the agents and
  their steps, the fault plan, the ledger and facts, the report and how invariants are called, the
  built-in invariants, the deterministic schedule on its virtual clock, shrinking a failing
  schedule, the kill-and-reopen check);
- ``_command``: the ``simulate`` subcommand.
"""

from __future__ import annotations

from victor_actors.sim._agents import AgentSpec, SimAgent, layout
from victor_actors.sim._checks import (
    BUILT_IN,
    acknowledged_writes_durable,
    no_unexpected_errors,
    reopened_equals_live,
    restarts_accounted_for,
)
from victor_actors.sim._command import add_parser, run_command
from victor_actors.sim._config import QUICK, SimConfig
from victor_actors.sim._crash import kill_and_reopen
from victor_actors.sim._faults import Fault, FaultPlan, SimulatedCrash
from victor_actors.sim._invariants import check_invariants
from victor_actors.sim._kill import simulate_kill
from victor_actors.sim._ledger import AgentLedger, Expected, InvariantResult, Observed, RunLedger
from victor_actors.sim._load import simulate
from victor_actors.sim._ray_invariants import RayFacts, check_ray_invariants
from victor_actors.sim._ray_load import simulate_ray
from victor_actors.sim._record import Ack, Ledger, ScopeFacts, SimRun, read_scopes
from victor_actors.sim._schedule import ReplayTokenError
from victor_actors.sim._shrink import Shrunk
from victor_actors.sim._sim_report import SimReport
from victor_actors.sim._simulation import Simulation

__all__ = [
    "BUILT_IN",
    "QUICK",
    "Ack",
    "AgentLedger",
    "AgentSpec",
    "Fault",
    "FaultPlan",
    "Ledger",
    "ReplayTokenError",
    "ScopeFacts",
    "SimAgent",
    "SimReport",
    "SimRun",
    "SimulatedCrash",
    "Simulation",
    "Shrunk",
    "acknowledged_writes_durable",
    "kill_and_reopen",
    "layout",
    "no_unexpected_errors",
    "read_scopes",
    "reopened_equals_live",
    "restarts_accounted_for",
    "Expected",
    "InvariantResult",
    "Observed",
    "RayFacts",
    "RunLedger",
    "SimConfig",
    "add_parser",
    "check_invariants",
    "check_ray_invariants",
    "run_command",
    "simulate",
    "simulate_kill",
    "simulate_ray",
]
