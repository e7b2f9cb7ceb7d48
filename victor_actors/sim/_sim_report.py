"""What a :class:`Simulation` reports, and how its invariants are called.

An invariant is a plain function of the :class:`SimRun`; :func:`check` turns
whatever it returns (None, a list of problems, an ``InvariantResult`` or
several) into ``InvariantResult`` values named for the function.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from victor_actors.sim._ledger import InvariantResult
from victor_actors.sim._record import SimRun

__all__ = ["Invariant", "SimReport", "check"]

# an invariant: a plain function of the run; None or [] when it holds, else the problems (strings),
# or an InvariantResult, or several
Invariant = Callable[[SimRun], "list[str] | InvariantResult | list[InvariantResult] | None"]


@dataclass
class SimReport:
    """The outcome: every invariant, the counts, the ledger, and the facts read."""

    results: list[InvariantResult]
    counts: dict[str, Any]
    run: SimRun
    wall_seconds: float
    seed: int
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    @property
    def verdict(self) -> str:
        return "PASS" if self.ok else "FAIL"

    @property
    def failed(self) -> list[str]:
        return [r.name for r in self.results if not r.ok]

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "failed": self.failed,
            "seed": self.seed,
            "counts": self.counts,
            "invariants": [r.to_dict() for r in self.results],
            "wall_seconds": self.wall_seconds,
            **self.extra,
        }

    def summary(self) -> str:
        total = len(self.results)
        head = (
            f"FAIL: {len(self.failed)} of {total} invariants failed ({', '.join(self.failed)})"
            if self.failed
            else f"PASS: all {total} invariants hold"
        )
        c = self.counts
        if self.run.killed:
            return f"{head}; {c['agents']} agents killed mid-load, {c['acknowledged']} acknowledged commits"
        return f"{head}; {c['agents']} agents, {c['turns']} turns, {c['acknowledged']} commits acknowledged"


def check(invariants: Sequence[Invariant], run: SimRun) -> list[InvariantResult]:
    """Call every invariant; a plain result becomes an :class:`InvariantResult` named for the function."""
    results: list[InvariantResult] = []
    for inv in invariants:
        name = getattr(inv, "__name__", repr(inv)).replace("_", " ")
        try:
            out = inv(run)
        except Exception as exc:  # an invariant that crashes fails, with the reason
            results.append(
                InvariantResult(name, False, 0, [f"the invariant raised {type(exc).__name__}: {exc}"])
            )
            continue
        if out is None:
            results.append(InvariantResult(name, True, 1))
        elif isinstance(out, InvariantResult):
            results.append(out)
        elif isinstance(out, list) and out and all(isinstance(o, InvariantResult) for o in out):
            results.extend(out)  # type: ignore[arg-type]
        elif isinstance(out, list):
            details = [str(o) for o in out]
            results.append(InvariantResult(name, not details, 1, details[:20]))
        else:
            raise TypeError(
                f"invariant {name} returned {type(out).__name__}; return None, problems or results"
            )
    return results
