"""The invariants ``victor-actors simulate`` checks, over the plain data of :mod:`._ledger`.

:func:`check_invariants` compares what the agents were told (``Expected``)
with what the store holds (``Observed``) and returns every invariant, pass or
fail, with the details of each violation. See ``docs/simulate.md``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from victor_actors.sim._ledger import AgentLedger, Expected, InvariantResult, Message, Observed

__all__ = ["check_invariants"]


def _own(messages: Iterable[Message]) -> list[Message]:
    return [m for m in messages if isinstance(m, dict) and "agent" in m and "seq" in m]


def _result(name: str, checked: int, details: list[str], limit: int = 20) -> InvariantResult:
    more = [f"... and {len(details) - limit} more"] if len(details) > limit else []
    return InvariantResult(name, not details, checked, details[:limit] + more)


def _teams(expected: Expected) -> dict[str, list[AgentLedger]]:
    teams: dict[str, list[AgentLedger]] = {}
    for agent in expected.agents:
        teams.setdefault(agent.team, []).append(agent)
    return teams


def _lost_update(expected: Expected, observed: Observed) -> InvariantResult:
    details = []
    for team, agents in sorted(_teams(expected).items()):
        acked = sum(a.increment for a in agents)
        counter = observed.counters.get(team, 0)
        low, high = expected.slack.get(team, (0, 0))
        if not low <= counter - acked <= high:
            allowed = "" if (low, high) == (0, 0) else f" (allowed {low:+d}..{high:+d})"
            details.append(f"team {team}: counter {counter}, acknowledged increments {acked}{allowed}")
    return _result("no lost update", len(_teams(expected)), details)


def _partial_batch(expected: Expected, observed: Observed) -> InvariantResult:
    details = []
    checked = 0
    for team, agents in sorted(_teams(expected).items()):
        carried = sum(a.leftover for a in agents)
        for agent in agents:
            for m in _own(observed.messages.get(agent.conversation, [])):
                carried += int(m.get("inc", 0))
                checked += 1
        counter = observed.counters.get(team, 0)
        slack = expected.partial_slack.get(team, 0)
        if abs(counter - carried) > slack:
            allowed = f" (allowed +-{slack})" if slack else ""
            details.append(
                f"team {team}: counter {counter}, but its conversations' messages carry {carried} "
                f"(with what rollbacks reported leaving){allowed}"
            )
    return _result("no partial batch", checked, details)


def _tool_results(agent: AgentLedger, messages: list[Message], killed: bool, details: list[str]) -> None:
    answered: dict[int, int] = {}
    for m in messages:
        if not (isinstance(m, dict) and m.get("role") == "tool"):
            continue
        content = m.get("content")
        owner = content.get("agent") if isinstance(content, dict) else None
        if owner != agent.name:
            details.append(f"{agent.conversation}: a tool result for {owner!r} (isolation leak)")
        elif isinstance(content, dict):
            seq = int(content.get("seq", -1))
            answered[seq] = answered.get(seq, 0) + 1
    for seq, count in sorted(answered.items()):
        if count > 1:
            details.append(f"{agent.conversation}: tool request {seq} answered {count} times")
    if not killed:
        missing = [s for s in agent.tool_requests if s not in answered]
        if missing:
            details.append(f"{agent.conversation}: tool requests {missing} never answered")


def _isolation(expected: Expected, observed: Observed) -> InvariantResult:
    details: list[str] = []
    checked = 0
    for agent in expected.agents:
        messages = observed.messages.get(agent.conversation, [])
        checked += len(messages)
        where = f"{agent.conversation}"
        for m in messages:
            if not isinstance(m, dict) or ("agent" not in m and m.get("role") != "tool"):
                details.append(f"{where}: a message nobody in the simulation wrote: {m!r}")
        own = _own(messages)
        for m in own:
            if m["agent"] != agent.name:
                details.append(f"{where}: message {m['seq']} of agent {m['agent']} (isolation leak)")
        seqs = [int(m["seq"]) for m in own if m["agent"] == agent.name and m.get("kind") != "rejected"]
        if any(b <= a for a, b in itertools.pairwise(seqs)):
            details.append(f"{where}: messages out of order or repeated: {seqs}")
        present, rolled = set(seqs), set(agent.rolled_back)
        for seq in sorted(present & rolled):
            details.append(f"{where}: message {seq} of a rolled-back run is still there")
        if expected.killed:
            top = max(agent.acked, default=-1)
            missing = sorted(set(agent.acked) - present)
            extra = sorted(s for s in present - set(agent.acked) - rolled if s <= top)
        else:
            wanted = {s for s in range(agent.next_seq) if s not in rolled}
            missing = sorted(wanted - present)
            extra = sorted(present - wanted - rolled)
        if missing:
            details.append(f"{where}: gap, messages {missing} are missing")
        if extra:
            details.append(f"{where}: messages {extra} were never acknowledged")
        _tool_results(agent, messages, expected.killed, details)
    return _result("message isolation", checked, details)


def _rejected(expected: Expected, observed: Observed) -> InvariantResult:
    details = []
    attempted = 0
    for kind, (tried, refused) in sorted(expected.rejected.items()):
        attempted += tried
        if refused != tried:
            details.append(f"{kind}: {tried} batches sent, only {refused} refused with the expected error")
    for conv, messages in sorted(observed.messages.items()):
        leaked = [m for m in _own(messages) if m.get("kind") == "rejected"]
        if leaked:
            details.append(f"{conv}: {len(leaked)} batch(es) that had to fail were committed")
    return _result("rejected batches refused", attempted, details)


def _durable(expected: Expected, observed: Observed) -> InvariantResult:
    details = []
    acked = sum(len(a.acked) for a in expected.agents)
    if expected.killed:
        for agent in expected.agents:
            present = {int(m["seq"]) for m in _own(observed.messages.get(agent.conversation, []))}
            missing = sorted(set(agent.acked) - present)
            if missing:
                details.append(f"{agent.conversation}: acknowledged commits {missing} lost in the crash")
        return _result("acknowledged commits survive SIGKILL", acked, details)
    if observed.reopened_messages is None or observed.reopened_counters is None:
        return _result("durable after reopen", 0, ["the store was not reopened"])
    for team, counter in sorted(observed.counters.items()):
        again = observed.reopened_counters.get(team)
        if again != counter:
            details.append(f"team {team}: counter {counter} live, {again} after reopening")
    for agent in expected.agents:
        live = observed.messages.get(agent.conversation, [])
        again_msgs = observed.reopened_messages.get(agent.conversation, [])
        present = {int(m["seq"]) for m in _own(again_msgs)}
        missing = sorted(set(agent.acked) - set(agent.rolled_back) - present)
        if missing:
            details.append(f"{agent.conversation}: acknowledged commits {missing} missing after reopening")
        elif again_msgs != live:
            details.append(f"{agent.conversation}: messages differ after reopening")
    for ref, version in sorted(observed.versions.items()):
        again_v = (observed.reopened_versions or {}).get(ref)
        if again_v != version:
            details.append(f"{ref}: version {version} live, {again_v} after reopening")
    return _result("durable after reopen", acked, details)


def _restarts(expected: Expected, observed: Observed) -> InvariantResult:
    stats = observed.stats or {}
    details = []
    if stats.get("failures") != expected.crashes:
        details.append(f"{expected.crashes} crashes injected, {stats.get('failures')} failures seen")
    if stats.get("restarts") != expected.restarts:
        details.append(f"{expected.restarts} restarts expected, {stats.get('restarts')} made")
    if stats.get("escalations", 0):
        details.append(f"{stats.get('escalations')} escalations (none expected)")
    return _result("restarts accounted for", expected.crashes, details)


def _rollbacks(expected: Expected, observed: Observed) -> InvariantResult:
    details = []
    raised_by = {"timeout": "DeadlineExceededError", "raise": "SimulatedFailure"}
    for run in expected.runs:
        name = f"run {run.run_id} ({run.kind})"
        if not run.raised:
            details.append(f"{name} did not fail")
            continue
        if not run.has_report:
            details.append(f"{name} raised {run.raised} without a rollback report")
        if run.step_error is None and run.raised != raised_by.get(run.kind):
            details.append(f"{name} raised {run.raised}, not {raised_by.get(run.kind)}")
        if run.cancelled_step == "survived":
            details.append(f"{name}: a step its timeout cancelled committed after the rollback")
        if run.messages_removed != run.committed:
            removed = run.messages_removed
            details.append(f"{name} committed {run.committed} message(s), its rollback removed {removed}")
        if run.committed and run.counter not in ("restored", "conflict", "failed"):
            details.append(f"{name}: the rollback report says nothing about the team counter")
        if not run.committed and run.counter != "none":
            details.append(f"{name} committed nothing, yet its rollback touched the team counter")
        if run.counter in ("conflict", "failed") and not run.compensated:
            details.append(f"{name}: the counter the rollback left was not compensated")
    return _result("rollbacks accounted for", len(expected.runs), details)


def check_invariants(expected: Expected, observed: Observed) -> list[InvariantResult]:
    """Every invariant, pass or fail, with details of each violation."""
    results = [
        _lost_update(expected, observed),
        _partial_batch(expected, observed),
        _isolation(expected, observed),
        _rejected(expected, observed),
        _durable(expected, observed),
    ]
    if not expected.killed:
        results.append(_restarts(expected, observed))
    results.append(_rollbacks(expected, observed))
    results.append(_result("no unexpected errors", len(expected.agents), list(expected.unexpected)))
    return results
