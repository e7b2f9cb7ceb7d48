"""Scopes sharded over a Ray cluster: the same API and guarantees as one process, with failover.

Needs the ``ray`` extra (``pip install 'victor-actors[ray]'``). See ``docs/ray.md``::

    from victor_actors.ray import RayStateManager

    with RayStateManager.open(path, shards=2) as manager:
        conv = manager.get_conversation_state("s1", workflow_id="wf", team_id="t1")
        conv.apply(TransitionBatch().add_message({"role": "user", "content": "hi"}))
"""

from __future__ import annotations

from victor_actors.ray._driver import RayRun, RayScopeHandle, RayStateManager, RaySubscription
from victor_actors.ray._placement import HOME, placement_key, shard_for
from victor_actors.ray._wire import ShardUnavailableError
from victor_actors.remote._host import BATCH_KEY, DEDUPE_WINDOW

__all__ = [
    "BATCH_KEY",
    "DEDUPE_WINDOW",
    "HOME",
    "RayRun",
    "RayScopeHandle",
    "RayStateManager",
    "RaySubscription",
    "ShardUnavailableError",
    "placement_key",
    "shard_for",
]
