"""Shrinking a failing deterministic schedule: the fewest picks that still fail the same way.

A deterministic run is a list of picks (``_schedule.py``). A failing one
usually holds a great deal that has nothing to do with the failure: other
agents' turns, turns after the bug, virtual time that changes nothing. The
shrinker replays shortened lists and keeps a shorter one whenever it still
fails with the same invariants, in the manner of delta debugging (Zeller's
ddmin, as hypothesis shrinks its examples):

1. spans of picks removed, halves first, then quarters, down to single
   picks, starting again from the larger spans after each success (a
   schedule that ends early finishes the turns it is in and stops, so
   removing the tail cuts agents' turns);
2. the virtual time of the picks set to zero, all at once, then span by span
   (a timeout that still fires with less time is the simpler story).

Each attempt is a whole run of the simulation in a new store, so shrinking
costs up to ``max_runs`` runs; every replay is deterministic, so the result
is too, and it comes with a token that replays it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from victor_actors.sim._schedule import Pick, encode_token

__all__ = ["Attempt", "Shrunk", "shrink_picks", "shrink_schedule"]


@dataclass(frozen=True)
class Attempt:
    """One replay's outcome, as the shrinker compares them."""

    failed: tuple[str, ...]  # the invariants that failed
    steps: int  # the steps the run took
    history: tuple[tuple[str, str, str], ...] = ()  # (agent, call, outcome), when known


@dataclass(frozen=True)
class Shrunk:
    """What shrinking found: the picks, their replay token, and what it cost."""

    picks: tuple[Pick, ...]
    token: str
    failed: tuple[str, ...]  # the invariants the shrunk schedule fails (those of the original)
    original_picks: int
    steps: int  # steps the shrunk schedule ran (its finishing steps included)
    original_steps: int
    runs: int  # simulations run while shrinking
    history: tuple[tuple[str, str, str], ...]  # the shrunk run's steps: (agent, call, outcome)

    def describe(self) -> str:
        """The shrunk schedule, one step a line, and how to replay it."""
        lines = [
            f"shrunk from {self.original_picks} picks ({self.original_steps} steps) to {len(self.picks)} "
            f"({self.steps} steps) in {self.runs} runs; still fails: {', '.join(self.failed)}",
            *(
                f"  {i:3d}  {who:<16} {call:<32} {outcome}"
                for i, (who, call, outcome) in enumerate(self.history)
            ),
            f"replay it with Simulation(..., replay={self.token!r})",
        ]
        return "\n".join(lines)


def shrink_picks(
    fails: Callable[[list[Pick]], bool], picks: Sequence[Pick], *, max_runs: int
) -> tuple[list[Pick], int]:
    """The shortest list found for which ``fails`` holds, and how many times ``fails`` was called."""
    best = list(picks)
    runs = 0

    def attempt(candidate: list[Pick]) -> bool:
        nonlocal runs, best
        if runs >= max_runs:
            return False
        runs += 1
        if fails(candidate):
            best = candidate
            return True
        return False

    # 1. spans of picks removed (ddmin's complements)
    parts = 2
    while best and runs < max_runs:
        size = max(1, -(-len(best) // parts))
        removed = False
        for start in range(0, len(best), size):
            if attempt(best[:start] + best[start + size :]):
                removed = True
                parts = max(parts - 1, 2)
                break
        if not removed:
            if size == 1:
                break
            parts = min(parts * 2, len(best))
    # 2. virtual time taken away: all of it, else span by span
    if any(delay for _, delay in best) and not attempt([(who, 0.0) for who, _ in best]):
        size = max(1, len(best) // 2)
        while size >= 1 and runs < max_runs:
            for start in range(0, len(best), size):
                span = best[start : start + size]
                if any(delay for _, delay in span):
                    attempt(best[:start] + [(who, 0.0) for who, _ in span] + best[start + size :])
            size //= 2
    return best, runs


def shrink_schedule(
    run: Callable[[str], Attempt],
    seed: int,
    picks: Sequence[Pick],
    original: Attempt,
    *,
    invariant: str | None = None,
    max_runs: int = 200,
) -> Shrunk:
    """Shrink a failing schedule: ``run(token)`` replays a token; ``original`` is how the whole one failed.

    A shorter schedule is kept when the same invariants fail: exactly the set
    ``original`` failed, or, with ``invariant``, at least that one.

    Raises:
        ValueError: ``original`` does not fail (that invariant); nothing was run.
    """
    if not original.failed or (invariant is not None and invariant not in original.failed):
        raise ValueError(
            f"shrinking needs a failing run{f' of {invariant!r}' if invariant else ''}; this one "
            f"failed {list(original.failed) or 'nothing'}, so nothing was shrunk"
        )
    target = {invariant} if invariant is not None else set(original.failed)
    kept = [original]

    def fails(candidate: list[Pick]) -> bool:
        got = run(encode_token(seed, candidate))
        failed = set(got.failed)
        if target <= failed if invariant is not None else failed == target:
            kept.append(got)  # the last one kept is the shortest: each success replaces the best
            return True
        return False

    best, runs = shrink_picks(fails, picks, max_runs=max_runs)
    last = kept[-1]
    return Shrunk(
        tuple(best),
        encode_token(seed, best),
        last.failed,
        len(picks),
        last.steps,
        original.steps,
        runs,
        last.history,
    )
