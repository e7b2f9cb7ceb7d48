"""The deterministic mode of a :class:`Simulation`: one seeded schedule of every agent's steps.

With ``deterministic=True`` the agents do not run in threads and tasks of
their own. One driver thread advances them: at each point a random drawn
from the seed picks the agent whose next step runs, the step runs with its
blocking twin, and then ``manager.quiesce()`` lets the actors, the event
thread (subscribers) and the tool outbox finish everything that step caused
before the next one starts. Every scope's mailbox therefore receives the same
requests in the same order for one seed, and so does every subscriber and
tool: a failing seed replays, step for step. :attr:`Schedule.history` lists
each step (agent, call, outcome: versions reached or error type) and
:attr:`Schedule.digest` fingerprints it, so two runs can be compared.

What this does not make deterministic (ADR 0031): time. Deadlines, run
timeouts, ``slow`` faults and ``seconds`` read the real clock, so a schedule
that depends on a timeout firing may differ; a deterministic simulation
takes ``steps``, not ``seconds``. Real I/O (the disk's latency is invisible
to the schedule, its failures are not), Ray, and the interleaving inside one
step (a cross-scope commit's participants, a tool running beside the actor
until quiesce) are outside it. Agents run the sync twin of every step, so
the asyncio twins are not exercised in this mode.
"""

from __future__ import annotations

import contextvars
import hashlib
import random
from collections.abc import Callable
from typing import Any

from victor_actors import GlobalStateManager, StateChanged
from victor_actors._snapshot import ContextSnapshot
from victor_actors.lowlevel import StepGen

__all__ = ["Schedule"]


def _outcome(value: Any, error: BaseException | None) -> str:
    if error is not None:
        return f"raised {type(error).__name__}"
    if isinstance(value, StateChanged):
        parts = [f"{r.ref}@v{r.new_version}" for r in (value, *value.related) if r.committed]
        return "committed " + (" ".join(parts) or "nothing")
    if isinstance(value, ContextSnapshot):
        return "read " + " ".join(f"{ref}@v{v}" for ref, v in value.versions().items())
    return type(value).__name__


class Schedule:
    """Runs ``(name, generator)`` pairs one step at a time in an order drawn from ``seed``."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(f"{seed}:schedule")
        self.history: list[tuple[str, str, str]] = []  # (agent, call, outcome)

    @property
    def digest(self) -> str:
        """A fingerprint of the history: equal for two runs with the same steps and the same outcomes."""
        text = "\n".join(" | ".join(item) for item in self.history)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def run(self, manager: GlobalStateManager, agents: list[tuple[str, StepGen[Any]]]) -> None:
        # each agent keeps its own context, as it would in a thread of its own: a run it enters
        # (CURRENT_RUN, the run id) tags its own steps, never another agent's
        live: list[tuple[str, StepGen[Any], list[Any], contextvars.Context]] = [
            (n, g, [None, None], contextvars.copy_context()) for n, g in agents
        ]
        while live:
            index = self.rng.randrange(len(live))
            name, gen, pending, ctx = live[index]
            value, error = pending
            try:
                step = ctx.run(gen.send, value) if error is None else ctx.run(gen.throw, error)
            except StopIteration:
                del live[index]
                continue
            call: Callable[..., Any] = step.sync
            value, error = None, None
            try:
                value = ctx.run(call, *step.args, **step.kwargs)
            except Exception as exc:  # handed back to the agent's generator, as drive() does
                error = exc
            pending[:] = [value, error]
            self.history.append((name, getattr(call, "__qualname__", repr(call)), _outcome(value, error)))
            manager.quiesce(30.0)
