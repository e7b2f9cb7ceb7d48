"""The built-in invariants of a :class:`Simulation`: plain functions of the :class:`SimRun`.

Reuse them beside your own: ``invariants=[*BUILT_IN, my_check]``. Each
returns the problems it found (an empty list when it holds). The first two
read the default facts (``read_scopes``: a dict of scope ref to
:class:`ScopeFacts`); with a custom ``observe`` they say so and fail.
"""

from __future__ import annotations

from typing import Any

from victor_actors.sim._record import ScopeFacts, SimRun

__all__ = [
    "BUILT_IN",
    "acknowledged_writes_durable",
    "no_unexpected_errors",
    "reopened_equals_live",
    "restarts_accounted_for",
]


def _facts(facts: Any, what: str) -> dict[str, ScopeFacts]:
    if not isinstance(facts, dict) or not all(isinstance(f, ScopeFacts) for f in facts.values()):
        raise TypeError(f"{what} needs the default observe (a dict of ScopeFacts)")
    return facts


def acknowledged_writes_durable(run: SimRun) -> list[str]:
    """Every acknowledged commit is in the reopened store: each of its scopes at least at its version."""
    reopened = _facts(run.reopened, "acknowledged_writes_durable")
    problems = []
    for ack in run.ledger.acks:
        for ref, version in ack.versions.items():
            found = reopened.get(ref)
            if found is None or found.version < version:
                at = "absent" if found is None else f"at v{found.version}"
                problems.append(
                    f"{ack.agent}'s acknowledged commit {ack.commit_id} made {ref} v{version}; reopened {at}"
                )
    return problems


def reopened_equals_live(run: SimRun) -> list[str]:
    """After closing and reopening, every scope reads as it did live (version, messages, values)."""
    if run.killed or run.live is None:
        return []
    live, reopened = _facts(run.live, "reopened_equals_live"), _facts(run.reopened, "reopened_equals_live")
    problems = []
    for ref, facts in sorted(live.items()):
        again = reopened.get(ref)
        if again != facts:
            what = "absent" if again is None else f"v{again.version} (live v{facts.version})"
            problems.append(f"{ref} differs after reopening: {what}")
    return problems


def restarts_accounted_for(run: SimRun) -> list[str]:
    """Every injected crash is one failure, its restarts are the scopes it implies, nothing escalated."""
    if run.killed or run.stats is None or not run.ledger.crashes:
        return []
    stats, ledger = run.stats, run.ledger
    problems = []
    if stats.get("failures") != ledger.crashes:
        problems.append(f"{ledger.crashes} crashes injected, {stats.get('failures')} failures seen")
    if stats.get("restarts") != ledger.restarts:
        problems.append(f"{ledger.restarts} restarts expected, {stats.get('restarts')} made")
    if stats.get("escalations", 0):
        problems.append(f"{stats.get('escalations')} escalations (none expected)")
    return problems


def no_unexpected_errors(run: SimRun) -> list[str]:
    """No turn raised anything but the runtime's documented errors."""
    return list(run.ledger.unexpected_errors)


BUILT_IN = (acknowledged_writes_durable, reopened_equals_live, restarts_accounted_for, no_unexpected_errors)
