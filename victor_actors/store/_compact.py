"""Compaction: a scope's current state written as its only stored base, everything older dropped.

The operation a scope's owner runs (``Durability.compact``, on the scope's
actor thread, so no commit of the scope can come between the state it reads
and the records it writes): one full checkpoint (a new message root, a full
values record) and, in the same transaction, the removal of every older
checkpoint, the log up to the checkpoint's version, every values record
below it and every message root but the new one. So what the scope held
before (deleted values included) leaves the store, and nothing that is left
refers to a record that is gone: the only manifest below the new one's
version is the new one itself.

Kept apart from the store's retention (``Store._retain``, which keeps the
newest ``keep`` checkpoints and acts only when a scope holds more than that)
because compaction must also drop the log when the scope holds a single
checkpoint, and must never run beside the scope's owner. Why: docs/adr/0022.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from victor_actors._model import ScopeRef
from victor_actors.store._codec import CheckpointRecord
from victor_actors.store._incremental import CheckpointBase
from victor_actors.store._keys import is_head, version_of
from victor_actors.store._writer import TxnOp, WriteTxn

if TYPE_CHECKING:  # the store's own package: not an upward import
    from victor_actors.store._store import Store

__all__ = ["plan_compaction"]

logger = logging.getLogger("victor_actors")

_ROOT = 8  # bytes of a message root in a chunk key (after the scope's prefix)


def plan_compaction(store: Store, ref: ScopeRef, record: CheckpointRecord) -> tuple[TxnOp, CheckpointBase]:
    """The operation writing ``record`` as ``ref``'s only checkpoint, and the base it leaves.

    ``record`` must hold the scope's newest committed state (its owner's
    state): commits at or below its version leave the log, and every later
    checkpoint the owner writes builds on the base returned. A checkpoint
    newer than ``record`` in the store (which the owner never leaves) keeps
    everything in place: the new checkpoint is written and nothing dropped.

    Raises:
        TransitionValidationError: the state cannot be encoded; nothing is written.
    """
    full, planned = store.plan_checkpoint(ref, record, None)
    version = record.state.version
    prefix = store.layout.ref_key(ref)

    def op(t: WriteTxn) -> None:
        full(t)
        manifests = t.keys_in("ckpt", prefix)
        if any(version_of(key) > version for key in manifests):
            logger.warning("%s: a checkpoint newer than v%d is stored; nothing was dropped", ref, version)
            return
        for key in manifests:
            if version_of(key) < version:
                t.delete("ckpt", key)
        for key in t.keys_in("log", prefix):
            if is_head(key):
                continue  # the head (version 0) stays
            if version_of(key) > version:
                break
            t.delete("log", key)
        for key in t.keys_in("kv", prefix):
            if version_of(key) >= version:
                break
            t.delete("kv", key)
        start = prefix
        while (found := t.first_key_from("chunks", start)) is not None and found.startswith(prefix):
            root = found[len(prefix) : len(prefix) + _ROOT]
            if root != planned.root:
                for old in t.keys_in("chunks", prefix + root):
                    t.delete("chunks", old)
            start = prefix + root + b"\xff" * (_ROOT + 1)  # past every chunk of this root

    return op, planned
