"""The LMDB store: scope records, commit logs, checkpoints, one group-committing writer.

Layout (named databases in one environment):

``scopes``      ref key -> ScopeRecord (the scope's place in the tree)
``log``         ref key + big-endian version -> CommitRecord (one per commit)
``ckpt``        ref key + big-endian version -> CheckpointRecord (full state)
``quarantine``  db name + original key -> the bytes of a record recovery skipped

Keys sort as bytes, so one scope's history is one ordered range scan. All
writes go through one writer thread that packs many jobs into each LMDB
write transaction (group commit); a job's waiter is released only once the
transaction holding it is durable. Reads use their own read transactions
and never block the writer.
"""

from __future__ import annotations

import fcntl
import logging
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import lmdb

from victor_actors._codec import CheckpointRecord, Codec, CommitRecord, ScopeRecord
from victor_actors._errors import (
    CheckpointCorruptError,
    CheckpointNotFoundError,
    ScopeFailedError,
    StoreLockedError,
    VictorActorsError,
)
from victor_actors._model import ScopeRef, StateScope
from victor_actors._reducer import reduce
from victor_actors._state import ScopeState

__all__ = ["CheckpointInfo", "RecoveryReport", "Store", "TxnOp"]

logger = logging.getLogger("victor_actors")

_KIND = {StateScope.GLOBAL: 0, StateScope.TEAM: 1, StateScope.WORKFLOW: 2, StateScope.CONVERSATION: 3}
_KIND_BACK = {v: k for k, v in _KIND.items()}
_VERSION = struct.Struct(">Q")
_PREFIX = struct.Struct(">BH")

TxnOp = Callable[["_Txn"], None]


def ref_key(ref: ScopeRef) -> bytes:
    ident = ref.id.encode("utf-8")
    return _PREFIX.pack(_KIND[ref.scope], len(ident)) + ident


def ref_from_key(key: bytes) -> ScopeRef:
    kind, n = _PREFIX.unpack_from(key)
    return ScopeRef(_KIND_BACK[kind], bytes(key[_PREFIX.size : _PREFIX.size + n]).decode("utf-8"))


def versioned_key(ref: ScopeRef, version: int) -> bytes:
    return ref_key(ref) + _VERSION.pack(version)


def version_of(key: bytes) -> int:
    return int(_VERSION.unpack(bytes(key[-8:]))[0])


@attrs.frozen(slots=True)
class CheckpointInfo:
    """One stored checkpoint, as ``list_checkpoints`` shows it."""

    checkpoint_id: str
    ref: ScopeRef
    version: int
    label: str | None
    timestamp: float
    size: int
    readable: bool = True


@attrs.frozen(slots=True)
class RecoveryReport:
    """What recovery of one scope used and what it had to skip."""

    ref: ScopeRef
    version: int
    checkpoint_version: int | None
    replayed: int
    skipped: tuple[str, ...] = ()
    latest_stored_version: int = 0

    @property
    def clean(self) -> bool:
        return not self.skipped


class _Txn:
    """The write transaction a job's operations run in (on the writer thread)."""

    __slots__ = ("dbs", "txn")

    def __init__(self, txn: Any, dbs: dict[str, Any]) -> None:
        self.txn = txn
        self.dbs = dbs

    def put(self, db: str, key: bytes, value: bytes) -> None:
        self.txn.put(key, value, db=self.dbs[db])

    def delete(self, db: str, key: bytes) -> None:
        self.txn.delete(key, db=self.dbs[db])

    def get(self, db: str, key: bytes) -> bytes | None:
        value = self.txn.get(key, db=self.dbs[db])
        return None if value is None else bytes(value)

    def keys_in(self, db: str, prefix: bytes) -> list[bytes]:
        out = []
        with self.txn.cursor(db=self.dbs[db]) as cur:
            if cur.set_range(prefix):
                for key in cur.iternext(keys=True, values=False):
                    if not key.startswith(prefix):
                        break
                    out.append(bytes(key))
        return out


class _Job:
    __slots__ = ("done", "error", "ops", "queued")

    def __init__(self, ops: list[TxnOp]) -> None:
        self.ops = ops
        self.done = False
        self.error: BaseException | None = None
        self.queued = time.monotonic()


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
        # Group commit with a leader instead of a dedicated writer: whoever needs a durable commit
        # and finds no commit in progress becomes the leader and writes every queued job in one
        # LMDB transaction on its own thread; the others wait for it, then one of them leads the
        # next round. A lone writer pays no thread hand-off; concurrent writers share transactions.
        self._cond = threading.Condition()
        self._pending: list[_Job] = []
        self._leading = False
        self._closed = False
        self._flusher: threading.Thread | None = None
        self.commits = 0
        self.transactions = 0
        if not read_only:
            # async-mode jobs have nobody waiting: this thread leads for them within flush_interval
            self._flusher = threading.Thread(
                target=self._flush_loop, name="victor-actors-flusher", daemon=True
            )
            self._flusher.start()

    # -- writing -------------------------------------------------------------

    def submit(self, ops: list[TxnOp], *, wait: bool) -> None:
        """Run ``ops`` in a write transaction; with ``wait``, return once it is durable.

        Raises:
            ScopeFailedError: the transaction failed; nothing of it was written.
        """
        if self._closed or self.read_only:
            raise ScopeFailedError("the store is closed or read-only; nothing was written")
        job = _Job(ops)
        with self._cond:
            self._pending.append(job)
            if not wait:
                self._cond.notify_all()  # wakes the flusher
                return
        self._lead_until_done(job)
        if job.error is not None:
            raise ScopeFailedError(
                f"the store could not commit: {job.error}; nothing was written"
            ) from job.error

    def _lead_until_done(self, job: _Job | None) -> None:
        """Lead commit rounds (or wait for the leader) until ``job`` is durable; None: drain all."""
        cond = self._cond
        while True:
            with cond:
                while self._leading and not (job is not None and job.done):
                    cond.wait()
                if job is not None and job.done:
                    return
                if not self._pending:
                    return
                self._leading = True
                batch = self._pending[: self.max_batch]
                del self._pending[: self.max_batch]
            try:
                self._commit(batch)
            finally:
                with cond:
                    self._leading = False
                    cond.notify_all()

    def flush(self) -> None:
        """Return once everything submitted before the call is durable."""
        if not self._closed and not self.read_only:
            self.submit([], wait=True)

    def _flush_loop(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while not self._pending and not self._closed:
                    cond.wait()
                if self._closed and not self._pending:
                    return
                oldest = self._pending[0].queued if self._pending else time.monotonic()
            delay = oldest + self.flush_interval - time.monotonic()
            if delay > 0 and not self._closed:
                time.sleep(delay)  # let more async commits join this transaction
            self._lead_until_done(None)

    def _commit(self, jobs: list[_Job]) -> None:
        error: BaseException | None = None
        for _attempt in range(8):
            try:
                with self.env.begin(write=True) as txn:
                    t = _Txn(txn, self.dbs)
                    for job in jobs:
                        for op in job.ops:
                            op(t)
                error = None
                break
            except lmdb.MapFullError:
                size = self.env.info()["map_size"] * 2
                logger.info("growing the LMDB map of %s to %d bytes", self.path, size)
                self.env.set_mapsize(size)
            except BaseException as exc:  # reported to every waiter; the writer goes on
                logger.exception("a store transaction failed")
                error = exc
                break
        else:
            error = VictorActorsError("the LMDB map could not grow enough")
        self.transactions += 1
        self.commits += len(jobs)
        for job in jobs:
            job.error = error
            job.done = True  # waiters are woken by the leader's notify_all

    def close(self) -> None:
        """Flush pending writes, stop the flusher and close the environment. Idempotent."""
        if self._closed:
            return
        if not self.read_only:
            self._lead_until_done(None)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._flusher is not None:
            self._flusher.join()
        if not self.read_only:
            self._lead_until_done(None)  # anything that slipped in meanwhile
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

        def op(t: _Txn) -> None:
            t.put("ckpt", key, raw)
            if keep is not None:
                self._retain(t, ref, keep)

        return op

    @staticmethod
    def _retain(t: _Txn, ref: ScopeRef, keep: int) -> None:
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
        """Rebuild ``ref``'s state: the newest good checkpoint plus a replay of later commits.

        With ``upto``, rebuild the state at that version instead of the latest.
        A corrupt checkpoint is skipped for an older one; a corrupt or missing
        commit ends the replay there. What was skipped is in the report.
        """
        prefix = ref_key(ref)
        ckpt_items = list(self._scan("ckpt", prefix, reverse=True))
        log_items = [(version_of(k), v) for k, v in self._scan("log", prefix)]
        latest = max([v for v, _ in log_items] + [version_of(k) for k, _ in ckpt_items] + [0])
        target = latest if upto is None else upto
        skipped: list[str] = []
        starts: list[tuple[ScopeState, int | None]] = []
        for key, raw in ckpt_items:
            version = version_of(key)
            if version > target:
                continue
            try:
                starts.append((self.codec.decode_checkpoint(raw, ref=ref, version=version).state, version))
                break
            except CheckpointCorruptError as exc:
                if exc.fatal:
                    raise
                skipped.append(f"checkpoint v{version}: {exc}")
        first_log = log_items[0][0] if log_items else None
        if not starts and (first_log is None or first_log == 1):
            starts.append((ScopeState(ref=ref, lineage=lineage), None))
        if not starts and upto is not None and not skipped:
            raise CheckpointNotFoundError(
                f"{ref}: version {upto} is no longer stored (retention keeps the newest checkpoints "
                "and the log from the oldest of them on)"
            )
        if not starts:
            raise CheckpointCorruptError(
                f"{ref}: no readable checkpoint and the log starts at version {first_log}; "
                f"cannot rebuild its state ({'; '.join(skipped)})",
                ref=ref,
            )
        state, ck_version = starts[0]
        state = attrs.evolve(state, ref=ref, lineage=lineage)
        replayed = 0
        for version, raw in log_items:
            if version <= state.version or version > target:
                continue
            if version != state.version + 1:
                skipped.append(f"commit v{state.version + 1} is missing")
                break
            try:
                rec = self.codec.decode_commit(raw, ref=ref, version=version)
            except CheckpointCorruptError as exc:
                if exc.fatal:
                    raise
                skipped.append(f"commit v{version}: {exc}")
                break
            state = apply_record(state, rec)
            replayed += 1
        if upto is not None and upto > latest:
            raise CheckpointNotFoundError(f"{ref} has no version {upto}; its newest is {latest}")
        if upto is not None and state.version != upto:
            raise CheckpointNotFoundError(
                f"{ref}: version {upto} cannot be rebuilt from the store (reached {state.version})"
            )
        return state, RecoveryReport(ref, state.version, ck_version, replayed, tuple(skipped), latest)

    def op_quarantine_after(self, ref: ScopeRef, version: int) -> TxnOp:
        """Move every record of ``ref`` above ``version`` out of the way (recovery could not reach it)."""
        prefix = ref_key(ref)

        def op(t: _Txn) -> None:
            for db in ("log", "ckpt"):
                for key in t.keys_in(db, prefix):
                    if version_of(key) > version:
                        raw = t.get(db, key)
                        if raw is not None:
                            t.put("quarantine", db.encode() + b"/" + key, raw)
                        t.delete(db, key)

        return op


def checkpoint_id(ref: ScopeRef, version: int) -> str:
    return f"{ref}@{version}"


def apply_record(state: ScopeState, rec: CommitRecord) -> ScopeState:
    """Replay one stored commit on ``state`` (deterministic: same reducer, same inputs)."""
    if rec.kind == "reset":
        if rec.state is None:
            raise CheckpointCorruptError(f"{state.ref}: reset commit v{rec.version} holds no state")
        return attrs.evolve(rec.state, ref=state.ref, lineage=state.lineage, version=rec.version)
    new_state, _record = reduce(
        state, rec.transitions, commit_id=rec.commit_id, run_id=rec.run_id, timestamp=rec.timestamp
    )
    if new_state.version != rec.version:
        raise CheckpointCorruptError(
            f"{state.ref}: replaying commit v{rec.version} gave version {new_state.version}",
            ref=state.ref,
            version=rec.version,
        )
    return new_state
