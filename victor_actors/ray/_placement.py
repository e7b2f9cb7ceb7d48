"""Which shard a scope lives on: a consistent hash of its placement key.

A team and everything under it share the team's shard; a workflow directly
under global, and its conversations, share the workflow's; a conversation
directly under global is placed by its own id; the global scope lives on
shard 0 (its *home*). So the common batch (a conversation with its
workflow and team) never leaves its shard, and only writes to the global
scope cross shards.

The hash is rendezvous (highest random weight) hashing over blake2b: adding
a shard moves only the keys the new shard wins, about 1/(n+1) of them.
"""

from __future__ import annotations

import hashlib

from victor_actors._model import GLOBAL_REF, ScopeRef, StateScope

__all__ = [
    "GLOBAL_ADDRESS",
    "HOME",
    "Address",
    "directory_shard",
    "lineage_of",
    "placement_key",
    "ref_of",
    "shard_for",
]

HOME = 0  # the global scope's shard

# (level, id, workflow_id, team_id): everything a shard needs to open the scope with its parents
Address = tuple[str, str, "str | None", "str | None"]
GLOBAL_ADDRESS: Address = ("global", "global", None, None)


def placement_key(address: Address) -> str:
    """The key a scope is placed by (see the module docstring)."""
    level, ident, workflow_id, team_id = address
    if level == StateScope.GLOBAL.value:
        return "global"
    if team_id is not None:
        return f"team:{team_id}"
    if level == StateScope.TEAM.value:
        return f"team:{ident}"
    if workflow_id is not None:
        return f"workflow:{workflow_id}"
    return f"{level}:{ident}"


def shard_for(address: Address, shards: int) -> int:
    """The shard (0 .. shards-1) that hosts the scope at ``address``."""
    key = placement_key(address)
    if key == "global" or shards == 1:
        return HOME
    data = key.encode("utf-8")
    best, best_weight = 0, -1
    for n in range(shards):
        weight = int.from_bytes(
            hashlib.blake2b(data, digest_size=8, key=n.to_bytes(8, "big")).digest(), "big"
        )
        if weight > best_weight:
            best, best_weight = n, weight
    return best


def ref_of(address: Address) -> ScopeRef:
    return ScopeRef(StateScope.coerce(address[0]), address[1])


def lineage_of(address: Address) -> tuple[ScopeRef, ...]:
    """The scope's ancestors, nearest first (as ``ScopeState.lineage``)."""
    level, _ident, wf, team = address
    if level == StateScope.GLOBAL.value:
        return ()
    out = []
    if wf is not None and level == StateScope.CONVERSATION.value:
        out.append(ScopeRef(StateScope.WORKFLOW, wf))
    if team is not None:
        out.append(ScopeRef(StateScope.TEAM, team))
    out.append(GLOBAL_REF)
    return tuple(out)


def directory_shard(ref: ScopeRef, shards: int) -> int:
    """The shard keeping ``ref``'s directory entry: the one hosting it were it directly under global."""
    return shard_for((ref.scope.value, ref.id, None, None), shards)
