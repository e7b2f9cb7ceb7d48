"""The coordinators and tools the simulated agents use, and the batch every step commits.

A step's batch is the agent's message (naming the agent and its sequence
number) and +1 on its team's counter: one cross-scope batch, so a message
without its increment, or the reverse, is a partial batch the checker sees.
The asyncio agents get an ``async def`` coordinator and an async tool, the
thread agents plain ones, so both kinds of caller meet both kinds of callee.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from victor_actors import (
    ContextSnapshot,
    Coordinator,
    CoordinatorResult,
    CoordinatorRunner,
    ToolCall,
    TransitionBatch,
)

__all__ = ["alookup", "lookup", "message", "runner", "step_batch"]


def message(agent: str, seq: int, inc: int, kind: str) -> dict[str, Any]:
    return {"role": "assistant", "agent": agent, "seq": seq, "inc": inc, "kind": kind}


def step_batch(
    agent: str, seq: int, snap: ContextSnapshot, kind: str = "step", inc: int = 1
) -> TransitionBatch:
    """The agent's message and the team counter's change: one atomic cross-scope batch."""
    counter = int(snap.get_state("counter", 0))
    return (
        TransitionBatch()
        .add_message(message(agent, seq, inc, kind))
        .update_state("counter", counter + inc, scope="team")
    )


def _parse(user_message: str) -> tuple[str, int, str]:
    """``"<agent> <seq> <then>"``: who, which seq, and ``tool`` when a tool request follows."""
    agent, seq, then = user_message.split(" ")
    return agent, int(seq), then


class Work:
    """Message + team counter; hands off to ``tool`` when the turn asks for one."""

    def __init__(self, kind: str = "step") -> None:
        self.kind = kind

    def process(self, snapshot: ContextSnapshot, user_message: str) -> CoordinatorResult:
        agent, seq, then = _parse(user_message)
        batch = step_batch(agent, seq, snapshot, self.kind)
        if then == "tool":
            return CoordinatorResult(batch, reasoning=f"step {seq}, then a tool", handoff_to="tool")
        return CoordinatorResult(batch, reasoning=f"step {seq}", should_continue=False)


class AsyncWork:
    """:class:`Work` as an ``async def`` coordinator."""

    def __init__(self, kind: str = "step") -> None:
        self.work = Work(kind)

    async def process(self, snapshot: ContextSnapshot, user_message: str) -> CoordinatorResult:
        return self.work.process(snapshot, user_message)


class ToolRequest:
    """A single-scope commit (see the orchestrators guide): a message and an EXECUTE_TOOL."""

    def __init__(self, tool: str) -> None:
        self.tool = tool

    def process(self, snapshot: ContextSnapshot, user_message: str) -> CoordinatorResult:
        agent, seq, _ = _parse(user_message)
        batch = TransitionBatch().add_message(message(agent, seq + 1, 0, "tool_request"))
        batch.execute_tool(self.tool, {"agent": agent, "seq": seq + 1})
        return CoordinatorResult(batch, reasoning="needs a lookup", should_continue=False)


def lookup(call: ToolCall) -> dict[str, Any]:
    time.sleep(0.002)
    return {"agent": call.arguments["agent"], "seq": call.arguments["seq"], "found": True}


async def alookup(call: ToolCall) -> dict[str, Any]:
    await asyncio.sleep(0.002)
    return {"agent": call.arguments["agent"], "seq": call.arguments["seq"], "found": True}


def runner(is_async: bool) -> CoordinatorRunner:
    """``work`` (a step), ``tool`` (the tool request it hands off to) and ``run`` (a step in a run)."""
    work = AsyncWork if is_async else Work
    coordinators: dict[str, Coordinator] = {
        "work": work(),
        "tool": ToolRequest("alookup" if is_async else "lookup"),
        "run": work("run_step"),
    }
    return CoordinatorRunner(coordinators, max_retries=200)
