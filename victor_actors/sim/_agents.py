"""The agents of a :class:`Simulation`: who they are (:class:`AgentSpec`) and what a turn gets.

A turn function receives a :class:`SimAgent` and yields the steps it offers
(``yield agent.apply(batch)``): each is a ``Step`` with a blocking call and
its asyncio twin, so the simulation drives the same turn in a thread or on
an event loop.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from victor_actors import GlobalStateManager, Run, ScopeHandle, StateChanged
from victor_actors.lowlevel import Step, StepGen
from victor_actors.sim._record import Ledger
from victor_actors.sim._schedule import clock_sleep


class Host(Protocol):
    """What an agent needs of its simulation (the :class:`Simulation`, in ``_simulation.py``)."""

    seed: int
    ledger: Ledger
    specs: list[AgentSpec]


__all__ = ["AgentSpec", "Host", "SimAgent", "layout"]


@dataclass(frozen=True)
class AgentSpec:
    """One agent: its name (its conversation's id), and the team and workflow it sits under."""

    name: str
    team: str | None = None
    workflow: str | None = None


def layout(teams: int = 1, workflows: int = 1, conversations: int = 2) -> list[AgentSpec]:
    """Teams x workflows x conversations, one agent each, named ``t0w0a0`` as the built-in load does."""
    return [
        AgentSpec(f"t{t}w{w}a{c}", f"t{t}", f"t{t}w{w}")
        for t in range(teams)
        for w in range(workflows)
        for c in range(conversations)
    ]


class SimAgent:
    """What a turn function gets: the agent's conversation, its seeded random, and its steps.

    Each method returning a :class:`Step` is to be yielded (``yield
    agent.apply(batch)``); what the step returns comes back from the yield.
    ``on=`` names another handle to use instead of the agent's conversation.
    ``state`` is whatever the simulation's ``agent_state`` made for this agent.
    """

    def __init__(self, sim: Host, spec: AgentSpec, manager: GlobalStateManager, is_async: bool) -> None:
        self.sim = sim
        self.spec = spec
        self.name = spec.name
        self.manager = manager
        self.is_async = is_async
        self.conv: ScopeHandle = manager.get_conversation_state(
            spec.name, workflow_id=spec.workflow, team_id=spec.team
        )
        self.rng = random.Random(f"{sim.seed}:{spec.name}")
        self.turns = 0
        self.state: Any = None

    def __repr__(self) -> str:
        return f"<SimAgent {self.name} {'asyncio' if self.is_async else 'thread'}>"

    def apply(self, batch: Any, *, on: ScopeHandle | None = None, **kwargs: Any) -> Step:
        h = on or self.conv
        return Step(h.apply, h.aapply, batch, **kwargs)

    def transact(self, fn: Callable[..., Any], *, on: ScopeHandle | None = None, **kwargs: Any) -> Step:
        h = on or self.conv
        return Step(h.transact, h.atransact, fn, **kwargs)

    def modify(self, fn: Callable[..., Any], *, on: ScopeHandle | None = None, **kwargs: Any) -> Step:
        h = on or self.conv
        return Step(h.modify, h.amodify, fn, **kwargs)

    def snapshot(self, *, on: ScopeHandle | None = None) -> Step:
        h = on or self.conv
        return Step(h.snapshot, h.asnapshot)

    def wait_tool_result(self, request: Any, *, on: ScopeHandle | None = None, timeout: float = 60.0) -> Step:
        """Wait until the tool ``request`` (its id, or the request) is answered; its result.

        In a deterministic simulation the agent waits until the schedule has run the call.
        """
        h = on or self.conv
        return Step(h.wait_tool_result, h.await_tool_result, request, timeout=timeout)

    def sleep(self, seconds: float) -> Step:
        return Step(clock_sleep, asyncio.sleep, seconds)  # in a deterministic run: virtual time

    def call(
        self, sync: Callable[..., Any], async_: Callable[..., Any] | None, *args: Any, **kw: Any
    ) -> Step:
        """Any other blocking call and its asyncio twin (or one callable whose result may be awaited)."""
        return Step(sync, async_, *args, **kw)

    def in_run(self, body: Callable[[Run], StepGen[Any]], *, timeout: float = 30.0) -> StepGen[Any]:
        """``with manager.run(name) as run: body(run)``, as steps: ``yield from agent.in_run(body)``.

        Raises what the run raises (:class:`RunFailedError`, :class:`RunTimeoutError`).
        """
        cm = (self.manager.arun if self.is_async else self.manager.run)(self.name, timeout=timeout)
        run = yield Step(cm.__enter__, cm.__aenter__)
        try:
            result = yield from body(run)
        except BaseException as exc:
            if not (yield Step(cm.__exit__, cm.__aexit__, type(exc), exc, exc.__traceback__)):
                raise
            return None
        yield Step(cm.__exit__, cm.__aexit__, None, None, None)
        return result

    def ack(self, record: StateChanged, note: str | None = None) -> StateChanged:
        """Record that the runtime acknowledged ``record`` (call it after the write returned).

        The kill-and-reopen check and ``acknowledged_writes_durable`` look for
        every acknowledged commit in the reopened store. Returns ``record``.
        """
        self.sim.ledger.ack(self.name, record, note)
        return record
