"""A driver's side of a batch that writes the global scope from a scope on another shard.

Three steps, each a request to one shard (the shards' side, and why it is
safe, is in :mod:`._twophase`):

1. ``prepare`` on the scope's shard P: its part is held, checked, dry-run
   and recorded durably; the vote carries a lower bound of global's version;
2. ``decide`` on home: the global part commits there, carrying the
   transaction id; this commit is the decision, and home holds nothing
   across a round trip;
3. ``commit`` on P, with global's new state for P's mirror.

A part refused at P or a global part refused at home (a version conflict, a
validation error) aborts the part: nothing is applied anywhere. When home
cannot be reached, its answer is asked for (``status``): committed, the
part commits; aborted (home decided so for a participant in doubt, or
never saw the decision), the part is aborted and the caller learns that
nothing was applied; unknown, the caller learns that it may have been
applied, and P resolves the part with home once home is back.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol

import attrs

from victor_actors._errors import DeadlineExceededError, VictorActorsError
from victor_actors._model import GLOBAL_REF, StateTransition
from victor_actors._state import StateChanged
from victor_actors.ray import _wire as w
from victor_actors.ray._placement import GLOBAL_ADDRESS, HOME, Address
from victor_actors.ray._wire import ShardUnavailableError
from victor_actors.remote._client import RETRY_PAUSE

__all__ = ["commit_across", "targets_global"]

_GLOBAL_NAMES = frozenset({"global", str(GLOBAL_REF)})


class Driver(Protocol):
    counters: dict[str, int]

    async def _ask(
        self, owner: int, op: dict[str, Any], timeout: float | None, outcome: Any = None
    ) -> Any: ...

    def _saw(self, version: int | None) -> None: ...


def targets_global(t: StateTransition) -> bool:
    return t.data.get("scope") in _GLOBAL_NAMES


async def commit_across(
    m: Driver,
    address: Address,
    shard: int,
    steps: tuple[StateTransition, ...],
    pairs: Any,
    wait: float,
    txid: str,
) -> StateChanged:
    """Commit ``steps`` (some writing global, applied from the scope at ``address`` on ``shard``)
    on both shards or on neither. ``pairs``: ``expected_version`` in its wire form."""
    glob = tuple(t for t in steps if targets_global(t))
    rest = tuple(t for t in steps if not targets_global(t))
    gx: Any = None
    px: Any = pairs
    if isinstance(pairs, tuple):
        gx = tuple(p for p in pairs if p[0] == str(GLOBAL_REF))
        px = tuple(p for p in pairs if p[0] != str(GLOBAL_REF))
    m.counters["cross_shard"] += 1
    prepare = {"k": "prepare", "id": txid, "role": "part", "a": address, "t": w.transitions_to(rest), "x": px}
    try:
        vote = await m._ask(shard, prepare, wait)
    except BaseException:
        m.counters["cross_shard_aborted"] += 1
        await _quiet(m, shard, {"k": "abort", "id": txid}, wait)
        raise
    low = int(vote["g"])
    refs = tuple(r for r, _ in vote["v"])
    decide = {"k": "decide", "id": txid, "a": GLOBAL_ADDRESS, "t": w.transitions_to(glob), "x": gx, "g": low}
    done: Any = None
    try:
        done = await m._ask(HOME, decide, wait)
    except (ShardUnavailableError, DeadlineExceededError):
        outcome = await _outcome(m, txid, low, wait)
        if outcome != "committed":
            if outcome == "aborted":
                m.counters["cross_shard_aborted"] += 1
                await _quiet(m, shard, {"k": "abort", "id": txid}, wait)
            raise ShardUnavailableError(
                f"shard {HOME} (the global scope's home) did not answer a cross-shard commit; "
                + (
                    "it was aborted, nothing was applied"
                    if outcome == "aborted"
                    else "its outcome is unknown: it may have been applied"
                ),
                shard=HOME,
                may_have_applied=outcome != "aborted",
            ) from None
    except VictorActorsError:  # home refused the global part: nothing is applied anywhere
        m.counters["cross_shard_aborted"] += 1
        await _quiet(m, shard, {"k": "abort", "id": txid}, wait)
        raise
    commit: dict[str, Any] = {"k": "commit", "id": txid, "refs": refs}
    if done is not None:
        commit["m"] = done["m"]
    out = await m._ask(shard, commit, wait)
    record = w.record_from(out["r"])
    if done is not None:
        grec = w.record_from(done["r"])
        m._saw(grec.new_version)
        involved = tuple(dict.fromkeys((grec.ref, *(record.involved or (record.ref,)))))
        record = attrs.evolve(record, related=(*record.related, grec), involved=involved)
    return record


async def _outcome(m: Driver, txid: str, low: int, wait: float) -> str:
    end = time.monotonic() + wait
    while time.monotonic() < end:
        try:
            answer = await m._ask(
                HOME, {"k": "status", "id": txid, "g": low}, max(end - time.monotonic(), 0.1)
            )
            return str(answer)
        except (ShardUnavailableError, DeadlineExceededError):
            await asyncio.sleep(RETRY_PAUSE)
    return "unknown"


async def _quiet(m: Driver, shard: int, op: dict[str, Any], wait: float) -> None:
    try:
        await m._ask(shard, op, wait)
    except VictorActorsError:
        pass  # a part left prepared resolves itself through home (presumed abort)
