"""The durable store: LMDB records, the group-commit writer, load and replay, the codec.

Public here: the :class:`Store` a manager opens on a path, the record types
and codec it writes, and the reports recovery and checkpoint listing return.
"""

from __future__ import annotations

from victor_actors.store._codec import SCHEMA_VERSION, CheckpointRecord, Codec, CommitRecord, ScopeRecord
from victor_actors.store._compact import plan_compaction
from victor_actors.store._crypto import Keyring
from victor_actors.store._incremental import CheckpointBase
from victor_actors.store._keys import checkpoint_id, ref_from_key, ref_key, version_of, versioned_key
from victor_actors.store._load import CheckpointInfo, RecoveryReport, apply_record
from victor_actors.store._rekey import encrypt_in_place, is_encrypted, rekey
from victor_actors.store._store import Rows, Store
from victor_actors.store._writer import TxnOp, WriteTxn

__all__ = [
    "SCHEMA_VERSION",
    "CheckpointBase",
    "CheckpointInfo",
    "CheckpointRecord",
    "Codec",
    "CommitRecord",
    "Keyring",
    "RecoveryReport",
    "Rows",
    "ScopeRecord",
    "Store",
    "TxnOp",
    "WriteTxn",
    "apply_record",
    "encrypt_in_place",
    "is_encrypted",
    "plan_compaction",
    "rekey",
    "checkpoint_id",
    "ref_from_key",
    "ref_key",
    "version_of",
    "versioned_key",
]
