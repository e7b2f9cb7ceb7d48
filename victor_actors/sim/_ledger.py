"""The plain data the simulator's checker compares: what the agents were told, what the store holds.

``Expected`` holds what the runtime acknowledged to the agents (the commits,
the runs it rolled back, the faults injected); ``Observed`` what the store
holds (team counters and conversation messages, live and after a reopen).
Both are dataclasses of ints, strings, lists and dicts, so a test can build
them by hand and plant a violation.

Messages the simulator writes are dicts: an agent's own message carries
``agent``, ``seq`` (its per-agent sequence number), ``inc`` (what the same
batch added to the team counter) and ``kind`` (``step``, ``run_step``,
``tool_request``, ``compensation``, or ``rejected`` for the marker of a batch
that must never commit); a tool result is ``{"role": "tool", "content":
{"agent": ..., "seq": ...}, ...}``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

__all__ = ["AgentLedger", "Expected", "InvariantResult", "Message", "Observed", "RunLedger"]

Message = dict[str, Any]


@dataclass
class AgentLedger:
    """What one agent was told: its conversation's expected content and its counter contributions."""

    name: str
    team: str
    conversation: str
    next_seq: int = 0  # every seq below was committed, or committed and rolled back
    acked: list[int] = field(default_factory=list)  # seqs whose commit the runtime acknowledged
    increment: int = 0  # net acknowledged change this agent made to its team's counter
    rolled_back: list[int] = field(default_factory=list)  # seqs a failed run committed, then undid
    tool_requests: list[int] = field(default_factory=list)  # acknowledged tool requests (by seq)
    leftover: int = 0  # increments whose message a rollback removed, reported left on the counter


@dataclass
class RunLedger:
    """One run that was meant to fail (``kind``: ``timeout`` or ``raise``) and what it reported."""

    run_id: str
    agent: str
    kind: str
    committed: int = 0  # steps the run committed before it failed
    raised: str = ""  # the class of the exception the run raised ("" if it did not fail)
    step_error: str | None = None  # a step inside the run failed first (then any error is right)
    has_report: bool = False
    messages_removed: int = 0  # the conversation's rollback report
    counter: str = "none"  # the team counter: restored | conflict | failed | none
    compensated: bool = False  # a counter left by the rollback was compensated
    # the timeout cancelled a step in flight (asyncio), which then had: "not committed",
    # "undone" (it committed and the rollback removed it) or "survived" (it committed after the rollback)
    cancelled_step: str | None = None


@dataclass
class Expected:
    agents: list[AgentLedger]
    runs: list[RunLedger] = field(default_factory=list)
    crashes: int = 0  # faults injected (each one failure)
    restarts: int = 0  # supervised restarts they imply (a team's restart restarts its subtree)
    rejected: dict[str, list[int]] = field(default_factory=dict)  # kind -> [attempted, refused]
    killed: bool = False  # the writer was SIGKILLed: only acknowledged commits are known
    # team -> (low, high): how far counter - acknowledged, and counter - sum of the messages'
    # increments, may be off (a SIGKILL leaves one unacknowledged commit per agent, and runs open)
    slack: dict[str, tuple[int, int]] = field(default_factory=dict)
    partial_slack: dict[str, int] = field(default_factory=dict)
    unexpected: list[str] = field(default_factory=list)  # exceptions no agent step expected


@dataclass
class Observed:
    counters: dict[str, int]  # team -> counter
    messages: dict[str, list[Message]]  # conversation -> messages
    versions: dict[str, int] = field(default_factory=dict)  # scope ref -> version
    reopened_counters: dict[str, int] | None = None
    reopened_messages: dict[str, list[Message]] | None = None
    reopened_versions: dict[str, int] | None = None
    stats: dict[str, int] | None = None


@dataclass
class InvariantResult:
    name: str
    ok: bool
    checked: int  # how many items were checked
    details: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
