"""A LangGraph checkpointer on the victor_actors runtime (``pip install 'victor-actors[langgraph]'``).

``VictorActorsSaver`` implements LangGraph's ``BaseCheckpointSaver``, sync and
asyncio, with the extended operations (``delete_for_runs``, ``copy_thread``,
``prune``, DeltaChannel history), tombstones and checkpoint TTL;
``VictorActorsStore`` LangGraph's long-term ``BaseStore``, versioned. Each
LangGraph thread is a team scope and each of its checkpoint namespaces a
chain of conversation scopes (segments), so checkpoints get the runtime's
guarantees: one writer per scope, group commit in LMDB, crash
safety, and ``victor-actors inspect``. See ``docs/langgraph.md``.

The core package never imports this module: LangGraph is an optional extra.
"""

from __future__ import annotations

import importlib.util

if importlib.util.find_spec("langgraph") is None:  # pragma: no cover - only without the extra
    raise ImportError("victor_actors.langgraph needs LangGraph: pip install 'victor-actors[langgraph]'")

from victor_actors.langgraph._errors import ThreadDeletedError
from victor_actors.langgraph._saver import VictorActorsSaver
from victor_actors.langgraph._serde import DisallowedTypeError, StrictSerializer
from victor_actors.langgraph._store import (
    ItemVersionConflictError,
    StoreItem,
    StoreSearchItem,
    VersionedPutOp,
    VictorActorsStore,
)

__all__ = [
    "DisallowedTypeError",
    "ItemVersionConflictError",
    "StoreItem",
    "StoreSearchItem",
    "StrictSerializer",
    "ThreadDeletedError",
    "VersionedPutOp",
    "VictorActorsSaver",
    "VictorActorsStore",
]
