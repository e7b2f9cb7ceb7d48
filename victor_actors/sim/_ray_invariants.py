"""The invariants ``simulate --ray`` checks: the local ones that apply over Ray, and the Ray-only ones.

Shared with the local mode (:mod:`._invariants`, on the same ``Expected`` and
``Observed``): no lost update and no partial batch on the team counters,
message isolation, rejected batches refused, durable after reopen (each
shard's store reopened read-only). Ray-only, on :class:`RayFacts`: the
global counter (a cross-shard batch's other half), every acknowledged commit
present exactly once after the shard kills, every kill recovered, events
delivered in order across the kills, and the runs' rollbacks. Not checked:
supervised restarts (no ``inject_fault`` over Ray; the faults are shard
kills), tool results (no tool executors on the driver). See ``docs/simulate.md``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from victor_actors.sim._invariants import (
    _durable,
    _isolation,
    _lost_update,
    _own,
    _partial_batch,
    _rejected,
    _result,
)
from victor_actors.sim._ledger import Expected, InvariantResult, Observed

__all__ = ["RayFacts", "check_ray_invariants"]


@dataclass
class RayFacts:
    """What only a Ray run has: the global counter, the shard kills, the delivered events."""

    global_acknowledged: int = 0  # sum of the acknowledged +1s on the global counter
    global_counter: int = 0  # read live
    global_reopened: int | None = None  # read from the global scope's shard's store, reopened
    shards: int = 2
    # one per kill: {"shard", "killed", "recovered", "recovered_after_seconds", "calls_before",
    # "calls_after", "commits_after_recovery"}
    kills: list[dict[str, Any]] = field(default_factory=list)
    # conversation -> (version subscribed at, versions delivered in order, final version)
    events: dict[str, tuple[int, list[int], int]] = field(default_factory=dict)


def _global(expected: Expected, observed: Observed, facts: RayFacts) -> InvariantResult:
    details = []
    carried = sum(int(m.get("ginc", 0)) for msgs in observed.messages.values() for m in _own(msgs))
    if facts.global_counter != facts.global_acknowledged:
        details.append(
            f"global counter {facts.global_counter}, acknowledged increments {facts.global_acknowledged}"
        )
    if facts.global_counter != carried:
        details.append(f"global counter {facts.global_counter}, but the messages carry {carried}")
    if facts.global_reopened != facts.global_counter:
        details.append(f"global counter {facts.global_counter} live, {facts.global_reopened} after reopening")
    return _result("global counter: no lost update, no partial cross-shard batch", carried, details)


def _survive(expected: Expected, observed: Observed) -> InvariantResult:
    details = []
    for agent in expected.agents:
        seqs = Counter(int(m["seq"]) for m in _own(observed.messages.get(agent.conversation, [])))
        missing = sorted(set(agent.acked) - set(agent.rolled_back) - set(seqs))
        twice = sorted(s for s, n in seqs.items() if n > 1)
        if missing:
            details.append(f"{agent.conversation}: acknowledged commits {missing} lost")
        if twice:
            details.append(f"{agent.conversation}: commits {twice} applied more than once")
    acked = sum(len(a.acked) for a in expected.agents)
    return _result("acknowledged commits survive shard kills, none applied twice", acked, details)


def _kills(facts: RayFacts) -> InvariantResult:
    details = []
    killed = sorted(k["shard"] for k in facts.kills if k["killed"])
    if killed != list(range(facts.shards)):
        details.append(f"shards {killed} were killed; every one of the {facts.shards} shards must be")
    for k in facts.kills:
        if not k["killed"]:
            continue
        name = f"shard {k['shard']}"
        if not k["recovered"]:
            details.append(f"{name}: no new process answered for it after it was killed")
        if not k["commits_after_recovery"]:
            details.append(f"{name}: no commit was acknowledged on it after it recovered")
    return _result("every shard killed and recovered", len(facts.kills), details)


def _events(facts: RayFacts) -> InvariantResult:
    details = []
    checked = 0
    for conv, (start, seen, final) in sorted(facts.events.items()):
        checked += len(seen)
        if seen != list(range(start + 1, final + 1)):
            doubled = sorted(v for v, n in Counter(seen).items() if n > 1)
            lost = sorted(set(range(start + 1, final + 1)) - set(seen))
            details.append(
                f"{conv}: events for versions {start + 1}..{final} expected in order; "
                f"lost {lost[:10]}, doubled {doubled[:10]}, {len(seen)} delivered"
            )
    return _result("events delivered in order across the kills", checked, details)


def _rollbacks(expected: Expected) -> InvariantResult:
    details = []
    raised_by = {"timeout": "DeadlineExceededError", "raise": "SimulatedFailure"}
    for run in expected.runs:
        name = f"run {run.run_id or '?'} of {run.agent} ({run.kind})"
        if not run.raised:
            details.append(f"{name} did not fail")
            continue
        if not run.has_report:
            details.append(f"{name} raised {run.raised} and was not rolled back")
        if run.step_error is None and run.raised != raised_by.get(run.kind):
            details.append(f"{name} raised {run.raised}, not {raised_by.get(run.kind)}")
        if run.messages_removed != run.committed:
            details.append(f"{name} committed {run.committed} message(s), {run.messages_removed} removed")
    return _result("rollbacks accounted for", len(expected.runs), details)


def check_ray_invariants(expected: Expected, observed: Observed, facts: RayFacts) -> list[InvariantResult]:
    """Every invariant of a Ray run, pass or fail, with details of each violation."""
    return [
        _lost_update(expected, observed),
        _partial_batch(expected, observed),
        _isolation(expected, observed),
        _rejected(expected, observed),
        _durable(expected, observed),
        _global(expected, observed, facts),
        _survive(expected, observed),
        _kills(facts),
        _events(facts),
        _rollbacks(expected),
        _result("no unexpected errors", len(expected.agents), list(expected.unexpected)),
    ]
