"""The LMDB store: scope records, commit logs, checkpoints, one group-committing writer.

Layout (named databases in one environment):

``scopes``      ref key -> ScopeRecord (the scope's place in the tree)
``log``         ref key + big-endian version -> CommitRecord (one per commit)
``ckpt``        ref key + big-endian version -> CheckpointRecord (full state)
``quarantine``  db name + original key -> the bytes of a record recovery skipped

Keys (``_keys.py``) sort as bytes, so one scope's history is one ordered
range scan. Writes go through the group-commit writer (``_writer.py``);
recovery is ``_load.py``. Reads use their own read transactions and never
block the writer.
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Iterator
from typing import Any

import lmdb

from victor_actors._errors import (
    CheckpointCorruptError,
    CheckpointNotFoundError,
    ScopeFailedError,
    StoreLockedError,
    VictorActorsError,
)
from victor_actors._model import ScopeRef
from victor_actors._state import ScopeState
from victor_actors.store._codec import CheckpointRecord, Codec, CommitRecord, ScopeRecord
from victor_actors.store._keys import checkpoint_id, ref_from_key, ref_key, version_of, versioned_key
from victor_actors.store._load import CheckpointInfo, RecoveryReport, load_state
from victor_actors.store._writer import GroupCommitWriter, TxnOp, WriteTxn

__all__ = ["Store"]

logger = logging.getLogger("victor_actors")


class Store:
    """One LMDB environment, owned by one manager for writing.

    Raises:
        StoreLockedError: another live manager owns ``path`` for writing.
    """

    DBS = ("scopes", "log", "ckpt", "quarantine")

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        read_only: bool = False,
        codec: Codec | None = None,
        map_size: int = 256 * 1024 * 1024,
        flush_interval: float = 0.05,
        max_batch: int = 2048,
    ) -> None:
        self.path = os.fspath(path)
        self.read_only = read_only
        self.codec = codec or Codec()
        self.flush_interval = flush_interval
        self.max_batch = max_batch
        self._lock_file: Any = None
        data = os.path.join(self.path, "data")
        if read_only:
            if not os.path.isdir(data):
                raise VictorActorsError(f"no victor_actors store at {self.path!r}")
        else:
            os.makedirs(data, exist_ok=True)
            lock_file = open(os.path.join(self.path, "owner.lock"), "a+")
            try:
                fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock_file.close()
                raise StoreLockedError(
                    f"{self.path!r} is owned by another live manager; nothing was opened "
                    "(open it with read_only=True to inspect it)"
                ) from None
            lock_file.seek(0)
            lock_file.truncate()
            lock_file.write(f"{os.getpid()}\n")
            lock_file.flush()
            self._lock_file = lock_file
        try:
            self.env = lmdb.open(
                data,
                map_size=map_size,
                max_dbs=len(self.DBS) + 2,
                readonly=read_only,
                sync=True,
                metasync=True,
                readahead=False,
                max_readers=1024,
            )
            if read_only:
                self.dbs = {name: self.env.open_db(name.encode(), create=False) for name in self.DBS}
            else:
                self.dbs = {name: self.env.open_db(name.encode()) for name in self.DBS}
        except lmdb.Error as exc:
            self._release_lock()
            raise VictorActorsError(f"cannot open a victor_actors store at {self.path!r}: {exc}") from exc
        except Exception:
            self._release_lock()
            raise
        self._closed = False
        self._writer: GroupCommitWriter | None = None
        if not read_only:
            self._writer = GroupCommitWriter(
                self.env, self.dbs, path=self.path, flush_interval=flush_interval, max_batch=max_batch
            )

    # -- writing -------------------------------------------------------------

    @property
    def commits(self) -> int:
        """Jobs written so far (a commit of one scope, or of one cross-scope batch, is one job)."""
        return 0 if self._writer is None else self._writer.commits

    @property
    def transactions(self) -> int:
        """LMDB write transactions so far."""
        return 0 if self._writer is None else self._writer.transactions

    def submit(self, ops: list[TxnOp], *, wait: bool) -> None:
        """Run ``ops`` in a write transaction; with ``wait``, return once it is durable.

        Raises:
            ScopeFailedError: the store is closed or read-only, or the
                transaction failed; nothing of it was written.
        """
        if self._closed or self._writer is None:
            raise ScopeFailedError("the store is closed or read-only; nothing was written")
        self._writer.submit(ops, wait=wait)

    def flush(self) -> None:
        """Return once everything submitted before the call is durable."""
        if not self._closed and self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        """Flush pending writes, stop the flusher and close the environment. Idempotent."""
        if self._closed:
            return
        if self._writer is not None:
            self._writer.close()
        self._closed = True
        self.env.close()
        self._release_lock()

    def _release_lock(self) -> None:
        if self._lock_file is not None:
            try:
                fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_UN)
            finally:
                self._lock_file.close()
                self._lock_file = None

    # -- operations (run on the writer thread, inside its transaction) ---------

    def op_put_scope(self, record: ScopeRecord) -> TxnOp:
        key, raw = ref_key(record.ref), self.codec.encode_scope(record)
        return lambda t: t.put("scopes", key, raw)

    def op_put_commit(self, ref: ScopeRef, record: CommitRecord) -> TxnOp:
        key, raw = versioned_key(ref, record.version), self.codec.encode_commit(record)
        return lambda t: t.put("log", key, raw)

    def op_put_checkpoint(self, ref: ScopeRef, record: CheckpointRecord, keep: int | None) -> TxnOp:
        key, raw = versioned_key(ref, record.state.version), self.codec.encode_checkpoint(record)

        def op(t: WriteTxn) -> None:
            t.put("ckpt", key, raw)
            if keep is not None:
                self._retain(t, ref, keep)

        return op

    @staticmethod
    def _retain(t: WriteTxn, ref: ScopeRef, keep: int) -> None:
        """Keep the newest ``keep`` checkpoints and the log from the oldest kept one on."""
        prefix = ref_key(ref)
        ckpts = t.keys_in("ckpt", prefix)
        if len(ckpts) <= keep:
            return
        for key in ckpts[:-keep]:
            t.delete("ckpt", key)
        oldest_kept = version_of(ckpts[-keep])
        for key in t.keys_in("log", prefix):
            if version_of(key) > oldest_kept:
                break
            t.delete("log", key)

    # -- reading --------------------------------------------------------------

    def _scan(self, db: str, prefix: bytes, *, reverse: bool = False) -> Iterator[tuple[bytes, bytes]]:
        with self.env.begin(db=self.dbs[db]) as txn, txn.cursor() as cur:
            items: list[tuple[bytes, bytes]] = []
            if cur.set_range(prefix):
                for key, value in cur:
                    if not key.startswith(prefix):
                        break
                    items.append((bytes(key), bytes(value)))
        return iter(reversed(items) if reverse else items)

    def scope_record(self, ref: ScopeRef) -> ScopeRecord | None:
        with self.env.begin(db=self.dbs["scopes"]) as txn:
            raw = txn.get(ref_key(ref))
        return None if raw is None else self.codec.decode_scope(bytes(raw), ref=ref)

    def scope_records(self) -> list[ScopeRecord]:
        """Every stored scope's record; unreadable ones are logged and left out."""
        out = []
        for key, raw in self._scan("scopes", b""):
            try:
                ref: object = ref_from_key(key)
            except Exception:
                ref = key
            try:
                out.append(self.codec.decode_scope(raw, ref=ref))
            except CheckpointCorruptError as exc:
                if exc.fatal:
                    raise
                logger.warning("skipping an unreadable scope record: %s", exc)
        return out

    def checkpoints(self, ref: ScopeRef) -> list[CheckpointInfo]:
        """Stored checkpoints of ``ref``, newest first; unreadable ones are listed with label None."""
        out = []
        for key, raw in self._scan("ckpt", ref_key(ref), reverse=True):
            version = version_of(key)
            try:
                rec = self.codec.decode_checkpoint(raw, ref=ref, version=version)
                label, ts, readable = rec.label, rec.timestamp, True
            except CheckpointCorruptError:
                label, ts, readable = None, 0.0, False
            out.append(
                CheckpointInfo(checkpoint_id(ref, version), ref, version, label, ts, len(raw), readable)
            )
        return out

    def log_versions(self, ref: ScopeRef) -> list[int]:
        return [version_of(k) for k, _ in self._scan("log", ref_key(ref))]

    def commit_record(self, ref: ScopeRef, version: int) -> CommitRecord:
        with self.env.begin(db=self.dbs["log"]) as txn:
            raw = txn.get(versioned_key(ref, version))
        if raw is None:
            raise CheckpointNotFoundError(f"{ref} has no stored commit at version {version}")
        return self.codec.decode_commit(bytes(raw), ref=ref, version=version)

    def checkpoint(self, ref: ScopeRef, version: int) -> CheckpointRecord:
        with self.env.begin(db=self.dbs["ckpt"]) as txn:
            raw = txn.get(versioned_key(ref, version))
        if raw is None:
            raise CheckpointNotFoundError(f"{ref} has no checkpoint at version {version}")
        return self.codec.decode_checkpoint(bytes(raw), ref=ref, version=version)

    def size_of(self, ref: ScopeRef) -> int:
        """Bytes of stored records (log and checkpoints) for ``ref``."""
        prefix = ref_key(ref)
        return sum(len(v) for _k, v in self._scan("log", prefix)) + sum(
            len(v) for _k, v in self._scan("ckpt", prefix)
        )

    def load(
        self, ref: ScopeRef, lineage: tuple[ScopeRef, ...], *, upto: int | None = None
    ) -> tuple[ScopeState, RecoveryReport]:
        """Rebuild ``ref``'s state from the newest good checkpoint and the log (see ``_load.py``)."""
        return load_state(self._scan, self.codec, ref, lineage, upto=upto)

    def op_quarantine_after(self, ref: ScopeRef, version: int) -> TxnOp:
        """Move every record of ``ref`` above ``version`` out of the way (recovery could not reach it)."""
        prefix = ref_key(ref)

        def op(t: WriteTxn) -> None:
            for db in ("log", "ckpt"):
                for key in t.keys_in(db, prefix):
                    if version_of(key) > version:
                        raw = t.get(db, key)
                        if raw is not None:
                            t.put("quarantine", db.encode() + b"/" + key, raw)
                        t.delete(db, key)

        return op
