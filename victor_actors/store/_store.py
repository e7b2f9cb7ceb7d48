"""The LMDB store: scope records, commit logs, checkpoints, one group-committing writer.

Layout (named databases in one environment):

``scopes``      ref key -> ScopeRecord (the scope's place in the tree)
``log``         ref key + big-endian version -> CommitRecord (one per commit)
``ckpt``        ref key + big-endian version -> a checkpoint's manifest (format 2; a store
                written before it may hold full CheckpointRecords here, still read)
``chunks``      ref key + root + end index -> messages of the log, written once (``_incremental.py``)
``kv``          ref key + big-endian version -> a checkpoint's values map, in full or as a delta
``quarantine``  db name + original key -> the bytes of a record recovery skipped
``children``    parent ref key (or ff for no parent) + child ref key -> the child's ScopeRecord
(in ``log``)    ref key + 00*8 -> the scope's head: its newest committed version and a CRC bound to the key

Keys (``_keys.py``) sort as bytes, so one scope's history is one ordered
range scan. Every record's checksum covers its database and key, so a record
copied or swapped elsewhere reads as corrupt. A scope's head version is kept
apart from its commit records (at the start of its range in ``log``), so
recovery knows how far the log must reach and reports a lost tail instead of
loading without it. Writes go through the
group-commit writer (``_writer.py``); recovery is ``_load.py``; the owner
lock and the data file's size check are ``_files.py``. Reads use their own
read transactions, never block the writer, and wait only while the map grows;
an LMDB error on a read is raised as :class:`CheckpointCorruptError`.

The ``children`` index is written in the same transaction as each scope
record, with the record itself as its value (sealed for its own place), so a
page of one parent's children is one range read. ``children_page``,
``level_page`` and ``prefix_page`` read a page in key order from a cursor; a
store from before the index (opened read-only) is listed by a full scan
instead, and a writable open builds the index first.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import partial
from typing import Any, TypeVar

import attrs
import lmdb

from victor_actors._errors import (
    CheckpointCorruptError,
    CheckpointNotFoundError,
    EncryptionKeyError,
    ScopeFailedError,
    VictorActorsError,
)
from victor_actors._model import MAX_ID_BYTES, ScopeRef, StateScope
from victor_actors._state import ScopeState
from victor_actors._values import FrozenDict
from victor_actors.store._codec import CheckpointRecord, Codec, CommitRecord, RecordTooLargeError, ScopeRecord
from victor_actors.store._crypto import Keyring, Sealer, looks_sealed
from victor_actors.store._files import OwnerLock, check_data_file, leave_slack, readable_data
from victor_actors.store._heads import HEADED_FORMAT, decode_head, encode_head, newest_head
from victor_actors.store._incremental import (
    CheckpointBase,
    assemble,
    changed_keys,
    chunk_key,
    chunk_payload,
    chunk_ranges,
    is_manifest,
    kv_full_of,
    kv_part_key,
    kv_payloads,
    kv_version,
    manifest_payload,
    manifest_root,
    new_root,
)
from victor_actors.store._keys import (
    HEAD_SUFFIX,
    PLAIN,
    ROOT_PARENT,
    Layout,
    checkpoint_id,
    is_head,
    level_byte,
    place,
    plain_prefix_start,
    ref_from_key,
    version_of,
)
from victor_actors.store._load import CheckpointInfo, RecoveryReport, load_state
from victor_actors.store._meta import (
    LIMIT,
    META_KEY,
    is_encrypted,
    keys_for,
    new_encrypted,
    upgraded,
    with_record_limit,
)
from victor_actors.store._meta import pack as pack_meta
from victor_actors.store._meta import parse as parse_meta
from victor_actors.store._seek import prefix_items
from victor_actors.store._wal import WriteAheadLog, growing
from victor_actors.store._walfile import LOG_NAME, LogRead, boot_id, read_log
from victor_actors.store._walrecover import (
    Replay,
    needs_restore,
    plan_replay,
    restore_after_restart,
    start_log,
    tail_beyond,
)
from victor_actors.store._writer import GroupCommitWriter, ResizeGate, TxnOp, WriteTxn

__all__ = ["Store"]

logger = logging.getLogger("victor_actors")

T = TypeVar("T")


# Everything of one scope that ``load`` reads, by database: (key, value) pairs in key order.
Rows = dict[str, list[tuple[bytes, bytes]]]
_LOAD_RANGES = ("log", "ckpt", "chunks", "kv")


def _ranges(txn: Any, handles: Mapping[str, Any], prefix: bytes) -> Rows:
    """In ``txn``: every record under ``prefix`` of each database of ``handles`` (none if it is absent)."""
    out: Rows = {}
    for db, handle in handles.items():
        items: list[tuple[bytes, bytes]] = []
        if handle is not None:
            with txn.cursor(db=handle) as cur:
                items = prefix_items(cur, prefix)
        out[db] = items
    return out


class Store:
    """One LMDB environment, owned by one manager for writing.

    With ``encryption`` (a :class:`Keyring`) every record is sealed and no
    key holds a scope id (see ``_crypto.py``); an encrypted store refuses to
    open without the keys it was written with.

    Raises:
        StoreLockedError: another live manager owns ``path`` for writing.
        EncryptionKeyError: the store is encrypted and no keyring (or one
            without its keys) was given, or it is plaintext and a keyring was
            given without ``encryption_migrate=True``; nothing was opened.
        CheckpointCorruptError: the data file is truncated or unreadable; nothing was opened.
        VictorActorsError: ``path`` holds no store (read-only), or LMDB refused it.
    """

    DBS = ("scopes", "log", "ckpt", "quarantine", "meta", "children", "chunks", "kv")

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        read_only: bool = False,
        codec: Codec | None = None,
        map_size: int = 256 * 1024 * 1024,
        flush_interval: float = 0.05,
        max_batch: int = 2048,
        encryption: Keyring | None = None,
        lock_timeout: float = 0.0,
        wal: bool = True,
        drop_damaged_log: bool = False,
    ) -> None:
        self.path = os.fspath(path)
        # the write-ahead log (docs/adr/0033): a writer's, where the system reports its boot
        self._wal_enabled = bool(wal) and not read_only and boot_id() is not None
        self._drop_damaged_log = drop_damaged_log
        self._log: WriteAheadLog | None = None
        self.log_tail = 0  # read-only: records of the log the data file does not hold yet
        self.log_replayed = 0  # writable: records of the log replayed into the data file by this open
        self._log_read: LogRead | None = None
        self._replay = Replay(None, 0, ())
        self._writes_begun = read_only
        self._data_dir = ""
        self._restored = False
        self._lock_timeout = lock_timeout
        self.read_only = read_only
        self.codec = codec or Codec()
        self.flush_interval = flush_interval
        self.max_batch = max_batch
        self.gate = ResizeGate()
        self._owner: OwnerLock | None = None
        if encryption is not None and not isinstance(encryption, Keyring):
            raise EncryptionKeyError(f"encryption takes a Keyring, not {type(encryption).__name__}")
        self._open(map_size)
        try:
            if not read_only:  # checked now; replayed before the open's first write (_begin_writes)
                self._replay = plan_replay(
                    self.env, self.dbs, self._log_read, path=self.path, drop_damaged=drop_damaged_log
                )
            else:
                self.log_tail = tail_beyond(self.env, self.dbs, self._log_read, self.path)
                if self.log_tail:
                    logger.warning(
                        "%s: opened read-only with %d record(s) of its write-ahead log not in the data file "
                        "(its owner is writing them, or stopped before they reached it: a writable open "
                        "replays them); serving the data file's state",
                        self.path,
                        self.log_tail,
                    )
            meta = self._read_meta()
            if not is_encrypted(meta):
                self._refuse_sealed_records()
                if encryption is not None and not (self._is_empty() and not self._replay.todo):
                    raise EncryptionKeyError(
                        f"the store at {self.path!r} is not encrypted and holds {self.scope_count()} scopes; "
                        "open it without a keyring, or with encryption_migrate=True to encrypt it first "
                        "(GlobalStateManager.open); nothing was opened"
                    )
            self.layout, self.sealer = self._keys_for(meta, encryption)
            if not read_only:
                stored = self._read_meta()
                new = upgraded(stored, self.sealer)
                if new is not None:
                    self.give_heads(1 if stored is None else int(stored["format"]))
                    self._put_meta(new)
            meta = self._read_meta()
            self.format = 1 if meta is None else int(meta["format"])
            self._adopt_record_limit(meta)
            if not read_only and "children" not in self.dbs:
                self._build_index()
            if not read_only:
                self._begin_writes()
            if self._log is not None:
                self._log.checkpoint()  # what the open wrote (pinned, unsynced) is synced
        except BaseException:
            self._close_env()
            raise
        if not read_only:  # zeros past the last page, for a reader of a damaged copy (_files.py)
            leave_slack(self._data_file)
        self._closed = False
        # what the newest loads built on: ref -> (checkpoint version, root, n, message n - 1,
        # the checkpoint's kv version and full kv version)
        self._hints: OrderedDict[ScopeRef, tuple[int, bytes, int, Any, int, int]] = OrderedDict()
        self._hints_lock = threading.Lock()
        self._writer: GroupCommitWriter | None = None
        if not read_only:
            self._writer = GroupCommitWriter(
                self.env,
                self.dbs,
                gate=self.gate,
                path=self.path,
                flush_interval=flush_interval,
                max_batch=max_batch,
                wal=self._log,
            )

    def _open(self, map_size: int) -> None:
        """Open the environment: a writer takes the owner lock first (see ``OwnerLock``); a reader
        reads the directory an interrupted rewrite left as the store's, and changes nothing."""
        if self.read_only:
            data = readable_data(self.path)
            data_file = os.path.join(data, "data.mdb")
            if not os.path.isfile(data_file):
                raise VictorActorsError(f"no victor_actors store at {self.path!r}")
        else:
            self._owner = OwnerLock(self.path, timeout=self._lock_timeout)
            data = self._owner.data
            data_file = os.path.join(data, "data.mdb")
        self._data_dir = data
        self._restored = False
        try:
            self._log_read = read_log(os.path.join(data, LOG_NAME))
            if self.read_only and needs_restore(self._log_read):
                raise VictorActorsError(
                    f"the store at {self.path!r} was open for writing when the machine restarted, and its "
                    "data file may hold writes that never reached the disk whole; open it for writing once "
                    "(which recovers it from its write-ahead log) before reading it; nothing was opened"
                )
            if not self.read_only:
                self._restored = restore_after_restart(data, self._log_read)
            check_data_file(data_file)
            self._data_file = data_file
            wal = self._wal_enabled  # with the log, LMDB is synced at its checkpoints
            self._open_env(data, map_size, sync=not wal)
            if self._missing:  # created in a synced environment: no unsynced write before the log's pin
                self._shut_env()
                self._open_env(data, map_size, sync=True)
                self._shut_env()
                self._open_env(data, map_size, sync=False)
        except lmdb.Error as exc:
            self._release_lock()
            raise VictorActorsError(f"cannot open a victor_actors store at {self.path!r}: {exc}") from exc
        except BaseException:
            self._release_lock()
            raise

    def _open_env(self, data: str, map_size: int, *, sync: bool) -> None:
        """Open LMDB and its databases; an unsynced writer creates none (``_missing`` names them)."""
        self.env = lmdb.open(
            data,
            map_size=map_size,
            max_dbs=len(self.DBS) + 2,
            readonly=self.read_only,
            sync=sync,
            metasync=True,
            readahead=False,
            max_readers=1024,
        )
        self._env_open = True
        self.dbs: dict[str, Any] = {}
        self._missing: list[str] = []
        for name in self.DBS:
            # a store from before the children index has none: built on a writable open
            # (_build_index), a full scan instead when read-only
            create = not self.read_only and name != "children"
            try:
                self.dbs[name] = self.env.open_db(name.encode(), create=create and sync)
            except lmdb.NotFoundError:
                if create:
                    self._missing.append(name)
                # stores from before meta records, the children index or format 2 lack them
                elif name not in ("meta", "children", "chunks", "kv"):
                    raise

    def _begin_writes(self) -> None:
        """Before a writable open's first write: replay the log's tail and start the live log.

        Everything that can refuse the open runs before this, so a refused
        open writes nothing (after a machine restart the meta pages were put
        back already, which loses nothing: the log still holds what follows).
        """
        if self._writes_begun:
            return
        self._writes_begun = True
        self._log = start_log(
            self.env,
            self.dbs,
            self._data_dir,
            self._log_read,
            self._replay,
            restored=self._restored,
            enabled=self._wal_enabled,
            path=self.path,
        )
        self.log_replayed = len(self._replay.todo)
        self._log_read = None

    def _build_index(self) -> None:
        """Create the ``children`` index from the scope records, in one write transaction."""
        self._begin_writes()
        entries = []
        for record in self.scope_records():
            entries.append(self._child_entry(record, self.layout.ref_key(record.ref)))

        def build() -> Any:
            with self.env.begin(write=True) as txn:
                handle = self.env.open_db(b"children", txn=txn, create=True)
                for key, raw in entries:
                    txn.put(key, raw, db=handle)
            return handle

        self.dbs["children"] = growing(self.env, self._log, build)
        if entries:
            logger.info("built the children index of %s (%d scopes)", self.path, len(entries))

    @property
    def indexed(self) -> bool:
        """Whether the store has its ``children`` index (one from before it, opened read-only, has not)."""
        return "children" in self.dbs

    def _close_env(self) -> None:
        self._shut_env()
        self._release_lock()

    def _shut_env(self) -> None:
        log, self._log = getattr(self, "_log", None), None
        if log is not None:
            log.drop()  # unpinned before the environment closes
        if getattr(self, "_env_open", False):
            self._env_open = False
            self.env.close()

    def _read_meta(self) -> dict[str, Any] | None:
        """The meta record's fields (see ``_meta.py``); CheckpointCorruptError if it is malformed."""
        return parse_meta(self._get("meta", META_KEY), self.path)

    def _refuse_sealed_records(self) -> None:
        """Refuse to open as plaintext a store whose records are sealed (its meta record was lost or altered).

        The first record of each database is looked at: all of them sealed
        (one damaged record cannot look so) means the store is encrypted.

        Raises:
            CheckpointCorruptError: they are; nothing was opened or written.
        """

        def firsts() -> list[bytes]:
            out = []
            with self.env.begin() as txn:
                for name in ("scopes", "log", "ckpt", "chunks", "kv"):
                    handle = self.dbs.get(name)
                    if handle is not None:
                        with txn.cursor(db=handle) as cur:
                            if cur.first():
                                out.append(bytes(cur.value()))
            return out

        seen = self._read(firsts)
        if seen and all(looks_sealed(raw) for raw in seen):
            raise CheckpointCorruptError(
                f"the store at {self.path!r} has no meta record saying it is encrypted, but its records are "
                "sealed: the meta record was lost or altered; nothing was opened or changed (restore the "
                "meta record, or the store, from a copy)"
            )

    def _adopt_record_limit(self, meta: dict[str, Any] | None) -> None:
        """Read and write with the larger of the codec's record limit and the store's own.

        The store keeps the largest ``max_record_bytes`` it was opened with for
        writing in its meta record (``_meta.LIMIT``), so a store written with a
        raised limit and opened with the default codec still reads (and never
        quarantines) the records it legitimately holds. A store never lowers
        its limit.
        """
        stored = int(meta.get(LIMIT, 0)) if meta is not None else 0
        limit = max(self.codec.max_record_bytes, stored)
        if limit != self.codec.max_record_bytes:
            self.codec = self.codec.with_max_record_bytes(limit)
        if not self.read_only and stored < limit:
            self._put_meta(with_record_limit(meta, limit, self.sealer))

    def _is_empty(self) -> bool:
        return all(
            next(self._scan(db, b"", heads_too=True), None) is None for db in ("scopes", "log", "ckpt")
        )

    def scope_count(self) -> int:
        """How many scope records the store holds (readable without keys)."""

        def count() -> int:
            with self.env.begin() as txn:
                return int(txn.stat(self.dbs["scopes"])["entries"])

        return self._read(count)

    def _keys_for(self, meta: dict[str, Any] | None, keyring: Keyring | None) -> tuple[Layout, Sealer]:
        """The key layout and sealer for this store, checking the keyring against its meta record."""
        if not is_encrypted(meta):
            if keyring is None:
                return PLAIN, Sealer(None)
            if self.read_only:  # an empty plaintext store: nothing to seal, and nothing may be written
                raise EncryptionKeyError(f"the store at {self.path!r} is not encrypted; nothing was opened")
            record = new_encrypted(keyring)
            self._put_meta(record)
            return keys_for(record, keyring, self.path)
        assert meta is not None
        if keyring is None:
            raise EncryptionKeyError(
                f"the store at {self.path!r} is encrypted (it holds {self.scope_count()} scopes); "
                "open it with encryption=Keyring(...) (on the command line: --key-file, or "
                "VICTOR_ACTORS_KEYS); nothing was opened"
            )
        return keys_for(meta, keyring, self.path)

    def _put_meta(self, record: dict[str, Any]) -> None:
        self._begin_writes()

        def put() -> None:
            with self.env.begin(write=True, db=self.dbs["meta"]) as txn:
                txn.put(META_KEY, pack_meta(record))

        growing(self.env, self._log, put)

    @property
    def encrypted(self) -> bool:
        return self.sealer.encrypted

    # -- writing -------------------------------------------------------------

    @property
    def commits(self) -> int:
        """Jobs written so far (a commit of one scope, or of one cross-scope batch, is one job)."""
        return 0 if self._writer is None else self._writer.commits

    @property
    def transactions(self) -> int:
        """LMDB write transactions so far."""
        return 0 if self._writer is None else self._writer.transactions

    @property
    def bytes_put(self) -> int:
        """Bytes of the values put by the write transactions committed so far (handed to LMDB)."""
        return 0 if self._writer is None else self._writer.bytes_put

    def submit(self, ops: list[TxnOp], *, wait: bool) -> None:
        """Run ``ops`` in a write transaction; with ``wait``, return once it is durable.

        Raises:
            ScopeFailedError: the store is closed or read-only, or the
                transaction failed; nothing of it was written.
        """
        if self._closed or self._writer is None:
            raise ScopeFailedError("the store is closed or read-only; nothing was written")
        self._writer.submit(ops, wait=wait)

    @property
    def wal(self) -> bool:
        """Whether this store's commits go through its write-ahead log (docs/adr/0033)."""
        return self._log is not None

    def checkpoint_log(self) -> None:
        """Sync LMDB and empty the write-ahead log now (done on its own every few hundred groups and
        on close); a no-op without a log."""
        if not self._closed and self._writer is not None:
            self._writer.checkpoint_log()

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
        try:
            if self._log is not None:
                self._log.close()  # a clean checkpoint: LMDB synced, the log empty
        finally:
            self._close_env()

    def forget_after_fork(self) -> None:
        """In a forked child: drop this process's hold on the owner lock, leave everything else alone.

        The LMDB environment and the writer's thread belong to the parent;
        the child must not touch them (nor close them).
        """
        owner, self._owner = self._owner, None
        if owner is not None:
            owner.forget()

    def _release_lock(self) -> None:
        if self._owner is not None:
            self._owner.release()
            self._owner = None

    # -- operations (run on the writer thread, inside its transaction) ---------

    def _sealed(self, raw: bytes, db: str, key: bytes) -> bytes:
        return self.sealer.seal(raw, place(db, key))

    def _unsealed(self, raw: bytes, db: str, key: bytes, what: str) -> bytes:
        return self.sealer.open(raw, place(db, key), what)

    def op_put_scope(self, record: ScopeRecord) -> TxnOp:
        """The scope record, its entry in the ``children`` index and, for a scope that has none,
        its head at version 0 (in the same transaction: every scope record has a head)."""
        key = self.layout.ref_key(record.ref)
        where = place("scopes", key)
        raw = self.sealer.seal(self.codec.encode_scope(record, place=where), where)
        child_key, child_raw = self._child_entry(record, key)
        head_key = self.layout.head_key(record.ref)
        head = self.op_put_head(record.ref, 0)

        def op(t: WriteTxn) -> None:
            t.put("scopes", key, raw)
            t.put("children", child_key, child_raw)
            if t.get("log", head_key) is None:  # a new scope: its head says version 0
                head(t)

        return op

    def _child_entry(self, record: ScopeRecord, key: bytes) -> tuple[bytes, bytes]:
        """The ``children`` index entry of ``record`` (whose scope key is ``key``): key and sealed value."""
        parent = self.layout.ref_key(record.lineage[0]) if record.lineage else ROOT_PARENT
        child_key = parent + key
        where = place("children", child_key)
        return child_key, self.sealer.seal(self.codec.encode_scope(record, place=where), where)

    def op_put_commit(self, ref: ScopeRef, record: CommitRecord) -> TxnOp:
        """The commit's log record, and the scope's head moved to its version.

        A reset (a restore or a rollback: the whole state) too large for one
        record is written as a checkpoint at its version, cut into records
        that fit, and its log record holds no state (``state`` None): replay
        starts from that checkpoint, never from before it.

        Raises:
            TransitionValidationError: a batch too large for a record
                (``RecordTooLargeError``), or one that cannot be encoded; nothing is written.
        """
        key = self.layout.versioned_key(ref, record.version)
        where = place("log", key)
        checkpoint: TxnOp | None = None
        try:
            plain = self.codec.encode_commit(record, place=where)
        except RecordTooLargeError:
            if record.kind != "reset" or record.state is None:
                raise
            checkpoint = self.op_put_checkpoint(
                ref, CheckpointRecord(record.state, None, record.timestamp), None
            )
            plain = self.codec.encode_commit(attrs.evolve(record, state=None), place=where)
        raw = self.sealer.seal(plain, where)
        head = self.op_put_head(ref, record.version)

        def op(t: WriteTxn) -> None:
            if checkpoint is not None:
                checkpoint(t)
            t.put("log", key, raw)
            head(t)

        return op

    def op_put_head(self, ref: ScopeRef, version: int) -> TxnOp:
        """Record ``version`` as ``ref``'s newest committed version."""
        key = self.layout.head_key(ref)
        raw = self._sealed(encode_head(key, version), "log", key)
        return lambda t: t.put("log", key, raw)

    def op_put_checkpoint(self, ref: ScopeRef, record: CheckpointRecord, keep: int | None) -> TxnOp:
        """Write ``record`` as a checkpoint in full (a new message root, a full values record).

        With ``keep``, the transaction also applies retention (see ``_retain``).
        """
        return self.plan_checkpoint(ref, record, keep)[0]

    def plan_checkpoint(
        self,
        ref: ScopeRef,
        record: CheckpointRecord,
        keep: int | None,
        base: CheckpointBase | None = None,
        touched: Iterable[str] | None = None,
        *,
        replaced: Callable[[CheckpointBase, CheckpointBase], None] | None = None,
        verify: bool = False,
    ) -> tuple[TxnOp, CheckpointBase]:
        """The operation writing ``record`` as a checkpoint on top of ``base``, and the base it leaves.

        ``base`` is what the previous checkpoint of this scope (written by the
        caller, so ``record.state`` descends from it with no reset between)
        left; ``touched`` holds every values key changed since ``base`` (a
        superset does no harm); with ``touched`` None the values map is
        written in full. With ``verify`` (for copies between stores, where
        nothing vouches for the descent), the message log and values are
        compared with the base's instead of trusted. Without a base, or one
        it cannot build on, the checkpoint is written in full.

        The operation checks in its transaction that the records it builds
        on are stored; if not, it writes the checkpoint in full instead and
        calls ``replaced(planned_base, actual_base)`` on the writer's thread.
        It moves the scope's head up to the checkpoint's version if the head
        is below it (``manual`` durability and forks write no commits).

        Raises:
            TransitionValidationError: the state cannot be encoded; nothing is written.
        """
        state = record.state
        version = state.version
        prefix = self.layout.ref_key(ref)
        messages = state.messages
        n = len(messages)
        if base is not None and not _descends(base, state, verify):
            base = None
        if base is not None and verify:
            touched = changed_keys(base.values, state.values)
        puts: list[tuple[str, bytes, bytes]] = []
        checks: list[tuple[str, bytes]] = []
        if base is not None and base.n:
            root, start = base.root, base.n
            checks.append(("chunks", chunk_key(prefix, root, base.n)))
        else:
            root, start = new_root(), 0
        limit = self.codec.max_record_bytes
        for s, e in chunk_ranges(start, n, messages, limit):
            key = chunk_key(prefix, root, e)
            puts.append(("chunks", key, self._sealed_payload("chunks", key, chunk_payload(messages, s, e))))
        kv_key = self.layout.versioned_key(ref, version)
        kv: tuple[int, int, int, int] | None = None  # kv version, full version, chain bytes, full bytes
        if base is not None and base.version == version:  # the same state again: its values are stored
            kv = (base.kv_version, base.kv_full, base.chain_bytes, base.full_bytes)
        elif base is not None and touched is not None:
            delta = self._kv_puts(kv_key, kv_payloads(state.values, base.kv_version, touched, limit))
            size = sum(len(raw) for _db, _k, raw in delta)
            if base.chain_bytes + size <= base.full_bytes:
                kv = (version, base.kv_full, base.chain_bytes + size, base.full_bytes)
                puts.extend(delta)
        if kv is None:
            full = self._kv_puts(kv_key, kv_payloads(state.values, None, None, limit))
            kv = (version, version, 0, sum(len(raw) for _db, _k, raw in full))
            puts.extend(full)
        elif base is not None:
            checks.append(("kv", self.layout.versioned_key(ref, base.kv_version)))
            checks.append(("kv", self.layout.versioned_key(ref, base.kv_full)))
        key = self.layout.versioned_key(ref, version)
        manifest = manifest_payload(self.codec, record, root, kv[0], kv[1])
        puts.append(("ckpt", key, self._sealed_payload("ckpt", key, manifest)))
        planned = CheckpointBase(version, root, n, messages, state.values, *kv)
        raise_head = self._op_raise_head(ref, version)
        written = {k for db, k, _v in puts if db == "kv"}  # a values record and its parts, if any

        def op(t: WriteTxn) -> None:
            for db, check in checks:
                if t.get(db, check) is None:
                    logger.info("%s: the checkpoint v%d builds on records no longer stored; written in full",
                                ref, version)  # fmt: skip
                    full, actual = self.plan_checkpoint(ref, record, keep)
                    full(t)
                    if replaced is not None:
                        replaced(planned, actual)
                    return
            for db, k, v in puts:
                t.put(db, k, v)
            for stale in t.keys_in("kv", kv_key) if written else ():
                if stale not in written:  # a part of an earlier record at this version
                    t.delete("kv", stale)
            raise_head(t)
            if keep is not None:
                self._retain(t, ref, keep)

        return op, planned

    def _op_raise_head(self, ref: ScopeRef, version: int) -> TxnOp:
        """Move ``ref``'s head up to ``version`` if it is below (a checkpoint with no commit
        after it, as ``manual`` durability and a fork write, is the newest durable version)."""
        key = self.layout.head_key(ref)
        put = self.op_put_head(ref, version)

        def op(t: WriteTxn) -> None:
            raw = t.get("log", key)
            try:
                head = (
                    None if raw is None else decode_head(self._unsealed(raw, "log", key, "a head"), key, ref)
                )
            except CheckpointCorruptError:
                return  # a damaged head is left for recovery to report
            if head is None or head < version:
                put(t)

        return op

    def _kv_puts(self, key: bytes, payloads: list[dict[str, Any]]) -> list[tuple[str, bytes, bytes]]:
        """The puts of a values record at ``key`` and its parts (``kv_payloads``)."""
        keys = [key] + [kv_part_key(key, i) for i in range(1, len(payloads))]
        return [("kv", k, self._sealed_payload("kv", k, p)) for k, p in zip(keys, payloads, strict=True)]

    def _sealed_payload(self, db: str, key: bytes, payload: Mapping[str, Any]) -> bytes:
        where = place(db, key)
        return self.sealer.seal(self.codec.pack(payload, where), where)

    def _open_record(
        self, db: str, key: bytes, raw: bytes, ref: object, version: int | None, what: str
    ) -> Mapping[str, Any]:
        """The payload of the record stored at ``key`` of ``db`` (CheckpointCorruptError if damaged)."""
        where = place(db, key)
        return self.codec.unpack(self.sealer.open(raw, where, what), ref=ref, version=version, place=where)

    def _retain(self, t: WriteTxn, ref: ScopeRef, keep: int) -> None:
        """Keep the newest ``keep`` checkpoints and the log after the oldest kept one.

        History reaches back ``keep`` checkpoints: once the scope holds that
        many, the log up to and including the oldest kept checkpoint's version
        goes (that checkpoint holds it), whether or not a checkpoint is
        dropped; with fewer, the whole log stays. So with ``keep=1`` the log
        before a scope's newest checkpoint goes in the transaction that writes
        it. Then the records only the dropped checkpoints used go too: values
        records below the oldest full one a kept checkpoint's chain starts
        from, and every message root no kept checkpoint refers to. (If a kept
        checkpoint does not open, nothing of that is dropped.)
        """
        prefix = self.layout.ref_key(ref)
        ckpts = t.keys_in("ckpt", prefix)
        if len(ckpts) < keep:
            return
        dropped = ckpts[:-keep]
        for key in dropped:
            t.delete("ckpt", key)
        oldest_kept = version_of(ckpts[-keep:][0])
        for key in t.keys_in("log", prefix):
            if is_head(key):
                continue  # the head (version 0) stays
            if version_of(key) > oldest_kept:
                break
            t.delete("log", key)
        if not dropped:
            return
        roots: set[bytes] = set()
        fulls: list[int] = []
        for key in ckpts[-keep:]:
            kept = t.get("ckpt", key) or b""
            try:
                payload = self._open_record("ckpt", key, kept, ref, version_of(key), "a kept checkpoint")
            except CheckpointCorruptError:
                return
            root, full = manifest_root(payload), kv_full_of(payload)
            if root is not None:
                roots.add(root)
            if full is not None:
                fulls.append(full)
        floor = min(fulls) if fulls else None
        for key in t.keys_in("kv", prefix):
            if floor is not None and kv_version(len(prefix), key) >= floor:
                break
            t.delete("kv", key)
        start = prefix
        while (found := t.first_key_from("chunks", start)) is not None and found.startswith(prefix):
            root = found[len(prefix) : len(prefix) + 8]
            if root not in roots:
                for old in t.keys_in("chunks", prefix + root):
                    t.delete("chunks", old)
            start = prefix + root + b"\xff" * 9  # past every chunk of this root

    # -- reading --------------------------------------------------------------

    def _read(self, fn: Callable[[], T]) -> T:
        """Run a read transaction: never while the map grows; LMDB's errors as ours."""
        try:
            with self.gate.reading():
                return fn()
        except lmdb.MapResizedError:
            # another process grew the map: adopt its size, then read again
            with self.gate.exclusive():
                self.env.set_mapsize(0)
            with self.gate.reading():
                return fn()
        except lmdb.Error as exc:
            raise CheckpointCorruptError(
                f"the store at {self.path!r} could not be read ({type(exc).__name__}: {exc}); "
                "nothing was loaded"
            ) from exc

    def _scan(
        self, db: str, prefix: bytes, *, reverse: bool = False, heads_too: bool = False
    ) -> Iterator[tuple[bytes, bytes]]:
        """Records of ``db`` under ``prefix`` in key order (the log's head records only with heads_too)."""
        handle = self.dbs.get(db)
        if handle is None:
            return iter(())

        def scan() -> list[tuple[bytes, bytes]]:
            with self.env.begin(db=handle) as txn, txn.cursor() as cur:
                items = prefix_items(cur, prefix)
            if db == "log" and not heads_too:
                items = [(k, v) for k, v in items if not is_head(k)]
            return items

        items = self._read(scan)
        return iter(reversed(items) if reverse else items)

    def _get(self, db: str, key: bytes) -> bytes | None:
        handle = self.dbs.get(db)
        if handle is None:
            return None

        def get() -> bytes | None:
            with self.env.begin(db=handle) as txn:
                raw = txn.get(key)
            return None if raw is None else bytes(raw)

        return self._read(get)

    def scope_record(self, ref: ScopeRef) -> ScopeRecord | None:
        key = self.layout.ref_key(ref)
        raw = self._get("scopes", key)
        if raw is None:  # read past a damaged key beside it (_seek.py)
            raw = next((v for k, v in self._scan("scopes", key) if k == key), None)
        if raw is None:
            return None
        plain = self._unsealed(raw, "scopes", key, f"the scope record of {ref}")
        return self.codec.decode_scope(plain, ref=ref, place=place("scopes", key))

    def scope_records(self) -> list[ScopeRecord]:
        """Every stored scope's record; unreadable ones are logged and left out."""
        out = []
        for key, raw in self._scan("scopes", b""):
            try:
                ref: object = key if self.layout.hashed else ref_from_key(key)
            except Exception:
                ref = key
            try:
                plain = self._unsealed(raw, "scopes", key, "a scope record")
                out.append(self.codec.decode_scope(plain, ref=ref, place=place("scopes", key)))
            except CheckpointCorruptError as exc:
                if exc.fatal:
                    raise
                logger.warning("skipping an unreadable scope record: %s", exc)
        return out

    # -- pages: bounded reads in key order from a cursor ------------------------------------------

    def children_page(self, parent: ScopeRef | None, after: ScopeRef | None, limit: int) -> list[ScopeRecord]:
        """Up to ``limit`` scopes whose parent is ``parent`` (None: no parent), past ``after``.

        In key order of the children (plaintext: level, id length, id;
        encrypted: level, keyed hash of the id). One range read of the
        ``children`` index; without the index (a store from before it), a
        full scan.

        Raises:
            CheckpointCorruptError: an entry of the page is damaged or in the wrong place.
        """
        if not self.indexed:
            return self._cut(
                [r for r in self.scope_records() if (r.lineage[0] if r.lineage else None) == parent],
                after,
                limit,
            )
        prefix = ROOT_PARENT if parent is None else self.layout.ref_key(parent)
        start = prefix if after is None else prefix + self.layout.ref_key(after) + b"\x00"
        rows = self._read(lambda: self._range("children", [(prefix, start)], limit))
        return [self._decode_entry("children", key, raw, len(prefix)) for key, raw in rows]

    def level_page(self, level: StateScope | None, after: ScopeRef | None, limit: int) -> list[ScopeRecord]:
        """Up to ``limit`` scopes of ``level`` (None: every level) past ``after``, in key order.

        A level's keys are one range in either layout, so this is one range read.

        Raises:
            CheckpointCorruptError: a record of the page is damaged or in the wrong place.
        """
        prefix = b"" if level is None else level_byte(level)
        start = self._start(prefix, after)
        if start is None:
            return []
        rows = self._read(lambda: self._range("scopes", [(prefix, start)], limit))
        return [self._decode_entry("scopes", key, raw, 0) for key, raw in rows]

    def prefix_page(
        self, prefix: str, level: StateScope | None, after: ScopeRef | None, limit: int
    ) -> list[ScopeRecord]:
        """Up to ``limit`` scopes of ``level`` (None: any) whose id starts with ``prefix``, past ``after``.

        In key order. Plaintext keys of one level and id length are one
        contiguous range, so this reads one range per id length from
        ``len(prefix)`` up (skipping empty lengths) and stops at ``limit``.
        An encrypted store's keys hold no id: there it is a scan of the
        level(s) in key order that opens each record until ``limit`` match.

        Raises:
            CheckpointCorruptError: a record read is damaged or in the wrong place.
        """
        levels = sorted(StateScope, key=level_byte) if level is None else [level]
        if self.layout.hashed:
            return self._scan_prefix(prefix, levels, after, limit)
        want = prefix.encode("utf-8")
        after_key = None if after is None else self.layout.ref_key(after) + b"\x00"

        def ranges() -> list[tuple[bytes, bytes]]:
            out: list[tuple[bytes, bytes]] = []
            for lvl in levels:
                for n in range(len(want), MAX_ID_BYTES + 1):
                    lo = plain_prefix_start(lvl, n, want)
                    if after_key is None or after_key <= lo:
                        out.append((lo, lo))
                    elif after_key.startswith(lo):
                        out.append((lo, after_key))
            return out

        rows = self._read(lambda: self._range("scopes", ranges(), limit, skip_empty=True))
        return [self._decode_entry("scopes", key, raw, 0) for key, raw in rows]

    def with_children(self, refs: list[ScopeRef]) -> set[ScopeRef]:
        """Which of ``refs`` have at least one child (one seek each with the index)."""
        if not self.indexed:
            parents = {r.lineage[0] for r in self.scope_records() if r.lineage}
            return {ref for ref in refs if ref in parents}
        keys = [(ref, self.layout.ref_key(ref)) for ref in refs]

        def seek() -> set[ScopeRef]:
            found = set()
            with self.env.begin(db=self.dbs["children"]) as txn, txn.cursor() as cur:
                for ref, key in keys:
                    if cur.set_range(key) and bytes(cur.key()).startswith(key):
                        found.add(ref)
            return found

        return self._read(seek)

    def _start(self, prefix: bytes, after: ScopeRef | None) -> bytes | None:
        """Where a page of the range ``prefix`` past ``after`` begins (None: past its end)."""
        if after is None:
            return prefix
        past = self.layout.ref_key(after) + b"\x00"  # the least key greater than after's
        if past.startswith(prefix) or past < prefix:
            return max(past, prefix)
        return None

    def _range(
        self, db: str, ranges: list[tuple[bytes, bytes]], limit: int, *, skip_empty: bool = False
    ) -> list[tuple[bytes, bytes]]:
        """Up to ``limit`` (key, value) pairs: each range (prefix, start) read from start while under prefix.

        Runs inside a read (see ``_read``): one cursor, one ``set_range`` per
        range. With ``skip_empty``, ranges are plaintext (level, id length)
        ranges in key order, and a seek that lands on a longer id at the same
        level skips the lengths in between, which hold no keys.
        """
        out: list[tuple[bytes, bytes]] = []
        if limit <= 0:
            return out
        with self.env.begin(db=self.dbs[db]) as txn, txn.cursor() as cur:
            beyond = b""  # with skip_empty: no key below this is left unread
            for prefix, start in ranges:
                if skip_empty and beyond > start and not beyond.startswith(prefix):
                    continue
                if not cur.set_range(start):
                    break
                key = bytes(cur.key())
                beyond = key
                while key.startswith(prefix):
                    out.append((key, bytes(cur.value())))
                    if len(out) >= limit or not cur.next():
                        return out
                    key = bytes(cur.key())
                    beyond = key
        return out

    def _decode_entry(self, db: str, key: bytes, raw: bytes, parent_len: int) -> ScopeRecord:
        """The scope record stored at ``key`` of ``db`` (``parent_len`` bytes of parent key first).

        Raises:
            CheckpointCorruptError: it does not open, or holds another scope than its key names.
        """
        where = place(db, key)
        own = key[parent_len:]
        ref: object = own
        if not self.layout.hashed:
            try:
                ref = ref_from_key(own)
            except Exception:
                raise CheckpointCorruptError(f"a key of the {db} database is malformed ({own!r})") from None
        plain = self._unsealed(raw, db, key, f"the {db} record of {ref}")
        record = self.codec.decode_scope(plain, ref=ref, place=where)
        parent = record.lineage[0] if record.lineage else None
        expected_parent = ROOT_PARENT if parent is None else self.layout.ref_key(parent)
        if self.layout.ref_key(record.ref) != own or (
            db == "children" and key[:parent_len] != expected_parent
        ):
            raise CheckpointCorruptError(
                f"the {db} record at {ref} holds another scope ({record.ref})", ref=ref
            )
        return record

    def _scan_prefix(
        self, prefix: str, levels: list[StateScope], after: ScopeRef | None, limit: int
    ) -> list[ScopeRecord]:
        """``prefix_page`` for an encrypted store: read the levels in chunks, open each, keep matches."""
        out: list[ScopeRecord] = []
        chunk = max(256, 4 * limit)
        for lvl in levels:
            lo = level_byte(lvl)
            start = self._start(lo, after)
            while start is not None and len(out) < limit:
                span = [(lo, start)]
                rows = self._read(partial(self._range, "scopes", span, chunk))
                for key, raw in rows:
                    record = self._decode_entry("scopes", key, raw, 0)
                    if record.ref.id.startswith(prefix):
                        out.append(record)
                        if len(out) >= limit:
                            return out
                start = rows[-1][0] + b"\x00" if len(rows) == chunk else None
        return out

    def _cut(self, records: list[ScopeRecord], after: ScopeRef | None, limit: int) -> list[ScopeRecord]:
        """The page of ``records`` past ``after`` in key order (the full-scan fallback)."""
        keyed = sorted(((self.layout.ref_key(r.ref), r) for r in records), key=lambda kr: kr[0])
        floor = None if after is None else self.layout.ref_key(after)
        return [r for k, r in keyed if floor is None or k > floor][: max(limit, 0)]

    def head(self, ref: ScopeRef) -> int | None:
        """``ref``'s newest committed version as its head record says (None: no head record found).

        Read as every lookup of a scope's records is (``_seek.py``): a damaged key beside it does
        not hide it.

        Raises:
            CheckpointCorruptError: the head record is damaged.
        """
        key = self.layout.head_key(ref)
        found = [v for k, v in self._scan("log", key, heads_too=True) if k == key]
        version, note = self._newest_head(ref, key, found)
        if version is None and note is not None:
            raise CheckpointCorruptError(note, ref=ref)
        return version

    def _newest_head(self, ref: ScopeRef, key: bytes, found: list[bytes]) -> tuple[int | None, str | None]:
        """The newest good head among the records ``found`` at ``key``, and what was wrong with others."""

        def unseal(raw: bytes) -> bytes:
            return self._unsealed(raw, "log", key, f"the head record of {ref}")

        return newest_head(ref, key, found, unseal)

    @property
    def headed(self) -> bool:
        """Whether every scope record has a head (format 3 on): one that cannot be found is damage."""
        return self.format >= HEADED_FORMAT

    def give_heads(self, old_format: int) -> None:
        """Moving a store to format 3: give a head at version 0 to every scope that has none.

        Only to scopes that hold no commit and no checkpoint (created, never
        committed: format 2 wrote a head with every commit). One that holds
        records but no head is left without one, so loading it reports the
        damage; in a store of format 1, which may predate heads, it gets the
        newest version it holds instead.
        """
        self._begin_writes()
        given = growing(self.env, self._log, partial(self._give_heads, old_format))
        if given:
            logger.info("gave %d scopes of %s a head record (store format 3)", given, self.path)

    def _give_heads(self, old_format: int) -> int:
        scopes, log, ckpt = self.dbs["scopes"], self.dbs["log"], self.dbs["ckpt"]
        given = 0
        with self.env.begin(write=True) as txn:
            with txn.cursor(db=scopes) as cur:
                keys = [k for k, _ in prefix_items(cur, b"", values=False)]
            for key in keys:
                head_key = key + HEAD_SUFFIX
                with txn.cursor(db=log) as cur:
                    logged = prefix_items(cur, key, values=False)
                if any(k == head_key for k, _ in logged):
                    continue
                with txn.cursor(db=ckpt) as cur:
                    versions = [version_of(k) for k, _ in logged + prefix_items(cur, key, values=False)]
                if versions and old_format >= 2:
                    continue
                version = max(versions, default=0)
                txn.put(head_key, self._sealed(encode_head(head_key, version), "log", head_key), db=log)
                given += 1
        return given

    def last_txnid(self) -> int:
        """The id of the newest write transaction committed to the store, by any process.

        Cheap (LMDB reads it off its meta page, no transaction): a reader
        that saw the same id before knows nothing has changed since.
        """
        return int(self.env.info()["last_txnid"])

    def heads(self, refs: list[ScopeRef]) -> tuple[int, dict[ScopeRef, int | None]]:
        """The head versions of ``refs``, all read in one read transaction (one consistent cut),
        and that transaction's id.

        A cross-scope batch writes every scope's head in one write
        transaction, so heads read together name a set of versions no batch
        is half of. The id is the newest write transaction the read saw:
        compare it with :meth:`last_txnid` to tell whether the store moved on
        since (the meta page can name a newer id a moment before a new read
        transaction sees it, so the id of the read itself is the one to keep).
        Raises as :meth:`head` does.
        """
        log = self.dbs.get("log")
        keys = [(ref, self.layout.head_key(ref)) for ref in refs]

        def read() -> tuple[int, list[list[bytes]]]:
            with self.env.begin() as txn:
                if log is None:
                    return int(txn.id()), [[] for _ in keys]
                found = []
                with txn.cursor(db=log) as cur:
                    for _ref, key in keys:  # read past a damaged key beside it (_seek.py)
                        found.append([v for k, v in prefix_items(cur, key) if k == key])
                return int(txn.id()), found

        txnid, raws = self._read(read)
        out: dict[ScopeRef, int | None] = {}
        for (ref, key), found in zip(keys, raws, strict=True):
            version, note = self._newest_head(ref, key, found)
            if version is None and note is not None:
                raise CheckpointCorruptError(note, ref=ref)
            out[ref] = version
        return txnid, out

    def probe(self, ref: ScopeRef) -> tuple[ScopeRecord | None, bool]:
        """``(scope_record(ref), has_records(ref))`` in one read transaction: what a lookup of a
        scope that is not in memory needs to tell "stored", "new" and "damaged" apart."""
        record, stored, _rows = self.probe_rows(ref, rows=False)
        return record, stored

    def probe_rows(self, ref: ScopeRef, *, rows: bool = True) -> tuple[ScopeRecord | None, bool, Rows | None]:
        """:meth:`probe`, and, for a scope whose record is found, every record :meth:`load` reads, all
        in one read transaction: bringing an evicted scope back reads the store once (pass the
        rows to ``load``)."""
        layout = self.layout
        key = layout.ref_key(ref)
        scopes, log, ckpt = self.dbs.get("scopes"), self.dbs.get("log"), self.dbs.get("ckpt")
        handles = {db: self.dbs.get(db) for db in _LOAD_RANGES}
        found_rows: Rows | None = None

        def read() -> tuple[bytes | None, bool]:
            nonlocal found_rows
            with self.env.begin() as txn:
                raw = None if scopes is None else txn.get(key, db=scopes)
                if raw is not None:
                    if rows:
                        found_rows = _ranges(txn, handles, key)
                    return bytes(raw), True
                # not there, or hidden by a damaged key: every scope has a head in the log, read
                # past damage beside it (_seek.py); a checkpoint is a second witness
                stored = False
                if log is not None:
                    with txn.cursor(db=log) as cur:
                        stored = bool(prefix_items(cur, key, values=False))
                if not stored and ckpt is not None:
                    with txn.cursor(db=ckpt) as cur:
                        stored = cur.set_range(key) and bytes(cur.key()).startswith(key)
                if stored and scopes is not None:  # look for its record past damage too
                    with txn.cursor(db=scopes) as cur:
                        raw = next((v for k, v in prefix_items(cur, key) if k == key), None)
                return raw, stored

        raw, stored = self._read(read)
        if raw is None:
            return None, stored, None
        plain = self._unsealed(raw, "scopes", key, f"the scope record of {ref}")
        return self.codec.decode_scope(plain, ref=ref, place=place("scopes", key)), True, found_rows

    def has_records(self, ref: ScopeRef) -> bool:
        """Whether any commit, checkpoint or head of ``ref`` is stored (with or without its scope record)."""
        prefix = self.layout.ref_key(ref)
        return any(next(self._scan(db, prefix, heads_too=True), None) is not None for db in ("log", "ckpt"))

    def checkpoints(self, ref: ScopeRef) -> list[CheckpointInfo]:
        """Stored checkpoints of ``ref``, newest first; unreadable ones are listed with label None."""
        out = []
        for key, raw in self._scan("ckpt", self.layout.ref_key(ref), reverse=True):
            version = version_of(key)
            try:
                payload = self._open_record("ckpt", key, raw, ref, version, f"checkpoint v{version} of {ref}")
                if is_manifest(payload):
                    label, ts = payload["label"], float(payload["timestamp"])
                    if label is not None and not isinstance(label, str):
                        raise CheckpointCorruptError(f"checkpoint v{version} of {ref} has a bad label")
                else:
                    rec = self.codec.structure_payload(payload, CheckpointRecord, ref, version)
                    label, ts = rec.label, rec.timestamp
                readable = True
            except (CheckpointCorruptError, KeyError, TypeError, ValueError):
                label, ts, readable = None, 0.0, False
            out.append(
                CheckpointInfo(checkpoint_id(ref, version), ref, version, label, ts, len(raw), readable)
            )
        return out

    def log_versions(self, ref: ScopeRef) -> list[int]:
        return [version_of(k) for k, _ in self._scan("log", self.layout.ref_key(ref))]

    def commit_record(self, ref: ScopeRef, version: int) -> CommitRecord:
        plain, where = self._versioned("log", ref, version, "stored commit", f"commit v{version} of {ref}")
        return self.codec.decode_commit(plain, ref=ref, version=version, place=where)

    def checkpoint(self, ref: ScopeRef, version: int) -> CheckpointRecord:
        """The checkpoint of ``ref`` at ``version``, as a full record (its chunks and values read too).

        Raises:
            CheckpointNotFoundError: there is none at that version.
            CheckpointCorruptError: it, or a record it needs, is damaged or missing.
        """
        key = self.layout.versioned_key(ref, version)
        rows = self._rows(self.layout.ref_key(ref), ("chunks", "kv"), {"ckpt": key})
        raw = rows["ckpt"][0][1] if rows["ckpt"] else None
        if raw is None:
            raise CheckpointNotFoundError(f"{ref} has no checkpoint at version {version}")
        return self._checkpoint_from(ref, key, raw, rows)

    def _checkpoint_from(
        self, ref: ScopeRef, key: bytes, raw: bytes, rows: dict[str, list[tuple[bytes, bytes]]]
    ) -> CheckpointRecord:
        """Decode the checkpoint stored at ``key`` (a manifest or a full record) with the scope's rows."""
        version = version_of(key)
        payload = self._open_record("ckpt", key, raw, ref, version, f"checkpoint v{version} of {ref}")
        if not is_manifest(payload):
            return self.codec.structure_payload(payload, CheckpointRecord, ref, version)
        plen = len(self.layout.ref_key(ref))
        by_version: dict[int, list[tuple[bytes, bytes]]] = {}
        for k, v in rows.get("kv", ()):  # in key order: each record, then its parts
            by_version.setdefault(kv_version(plen, k), []).append((k, v))

        def open_record(db: str, k: bytes, r: bytes, v: int | None, what: str) -> Mapping[str, Any]:
            return self._open_record(db, k, r, ref, v, what)

        return assemble(
            self.codec, ref, version, payload, self.layout.ref_key(ref), rows.get("chunks", []), by_version,
            open_record,
        )  # fmt: skip

    def _rows(
        self, prefix: bytes, ranges: tuple[str, ...], gets: Mapping[str, bytes] | None = None
    ) -> dict[str, list[tuple[bytes, bytes]]]:
        """In one read transaction: every record under ``prefix`` of each of ``ranges``, and ``gets``."""
        handles = {db: self.dbs.get(db) for db in (*ranges, *(gets or {}))}

        def read() -> dict[str, list[tuple[bytes, bytes]]]:
            with self.env.begin() as txn:
                out = _ranges(txn, {db: handles[db] for db in ranges}, prefix)
                for db, key in (gets or {}).items():
                    handle = handles[db]
                    raw = None if handle is None else txn.get(key, db=handle)
                    out[db] = [] if raw is None else [(key, bytes(raw))]
            return out

        return self._read(read)

    def _versioned(self, db: str, ref: ScopeRef, version: int, kind: str, what: str) -> tuple[bytes, bytes]:
        """The opened record of ``ref`` at ``version`` in ``db``, and its place (for the decoder)."""
        key = self.layout.versioned_key(ref, version)
        raw = self._get(db, key)
        if raw is None:
            raise CheckpointNotFoundError(f"{ref} has no {kind} at version {version}")
        return self._unsealed(raw, db, key, what), place(db, key)

    def size_of(self, ref: ScopeRef) -> int:
        """Bytes of stored records (log, checkpoints, their message chunks and values) for ``ref``."""
        prefix = self.layout.ref_key(ref)
        return sum(len(v) for db in ("log", "ckpt", "chunks", "kv") for _k, v in self._scan(db, prefix))

    def load(
        self,
        ref: ScopeRef,
        lineage: tuple[ScopeRef, ...],
        *,
        upto: int | None = None,
        rows: Rows | None = None,
    ) -> tuple[ScopeState, RecoveryReport]:
        """Rebuild ``ref``'s state from the newest good checkpoint and the log (see ``_load.py``).

        Everything of the scope is read in one read transaction, then decoded outside it.
        A head that cannot be found (none, or none that passes its check) in a
        store where the scope must have one (format 3, or it holds records) is
        reported, with ``report.head_found`` False: the state is what the
        records found give, which may be short of what was committed.
        """
        prefix = self.layout.ref_key(ref)
        head_key = self.layout.head_key(ref)
        if rows is None:  # else read by probe_rows, in the same transaction as the scope record
            rows = self._rows(prefix, _LOAD_RANGES)
        heads = [v for k, v in rows["log"] if k == head_key]
        log = [(k, v) for k, v in rows["log"] if not is_head(k)]
        ckpts = rows["ckpt"]

        def scan(db: str, _prefix: bytes, *, reverse: bool = False) -> Iterator[tuple[bytes, bytes]]:
            items = log if db == "log" else ckpts
            return iter(reversed(items) if reverse else items)

        head, head_note = self._newest_head(ref, head_key, heads)
        found = head is not None or not (self.headed or log or ckpts)
        if not found and head_note is None:
            head_note = (
                f"no head record of {ref} was found, so how far its log reaches is unknown "
                "(a damaged key in the store can hide it)"
            )
        used: list[tuple[bytes, bytes, ScopeState]] = []

        def read_checkpoint(key: bytes, raw: bytes) -> ScopeState:
            state = self._checkpoint_from(ref, key, raw, rows).state
            used.append((key, raw, state))
            return state

        loaded = load_state(
            scan,
            self.codec,
            ref,
            lineage,
            upto=upto,
            head=head,
            head_note=head_note,
            prefix=self.layout.ref_key(ref),
            unseal=self.sealer.open,
            read_checkpoint=read_checkpoint,
        )
        if not found:
            loaded = (loaded[0], attrs.evolve(loaded[1], head_found=False))
        if upto is None and used:
            self._note_load(ref, used[-1], loaded[0])
        return loaded

    # -- where a loaded scope's next checkpoint can build on -------------------------------------

    _MAX_HINTS = 4096

    def _note_load(self, ref: ScopeRef, used: tuple[bytes, bytes, ScopeState], state: ScopeState) -> None:
        """Remember which message root the state ``load`` just built rests on, if it provably does.

        It does when the checkpoint it started from is a manifest and the
        log replayed on top of it only appended: then message n - 1 of the
        loaded state is the very object the checkpoint's chunks decoded to (a
        replayed reset would have brought objects of its own). That object
        (a container, so never one Python shares between decodes) is what
        ``base_after_load`` later finds in the live state to know it descends
        from this load.
        """
        key, raw, ck_state = used
        version = version_of(key)
        n = len(ck_state.messages)
        if not n or len(state.messages) < n:
            return
        last = ck_state.messages[n - 1]
        if state.messages[n - 1] is not last or not (
            isinstance(last, FrozenDict) or (last.__class__ is tuple and last)
        ):
            return
        try:
            payload = self._open_record("ckpt", key, raw, ref, version, f"checkpoint v{version} of {ref}")
        except CheckpointCorruptError:
            return
        root = manifest_root(payload)
        if root is None:
            return
        kv_version, kv_full = (int(x) for x in payload["kv"])
        with self._hints_lock:
            self._hints[ref] = (version, root, n, last, kv_version, kv_full)
            self._hints.move_to_end(ref)
            while len(self._hints) > self._MAX_HINTS:
                self._hints.popitem(last=False)

    def base_after_load(self, ref: ScopeRef, state: ScopeState) -> CheckpointBase | None:
        """A base for ``state``'s next checkpoint from the load it descends from, or None.

        The caller vouches that nothing reset the scope since it was loaded;
        the base shares the loaded checkpoint's message root. Plan on it with
        ``touched=None`` (the values are written in full once: nothing recorded
        what changed since the load). The hint is used once.
        """
        with self._hints_lock:
            hint = self._hints.pop(ref, None)
        if hint is None:
            return None
        version, root, n, last, kv_version, kv_full = hint
        messages = state.messages
        if state.version < version or len(messages) < n or messages[n - 1] is not last:
            return None
        return CheckpointBase(version, root, n, messages, state.values, kv_version, kv_full, 0, 0)

    def op_quarantine_after(self, ref: ScopeRef, version: int) -> TxnOp:
        """Move every record of ``ref`` above ``version`` out of the way (recovery could not reach it).

        The head moves back to ``version``: the scope goes on from what could be recovered,
        and the quarantined records stay for people to look at.
        """
        prefix = self.layout.ref_key(ref)
        head = self.op_put_head(ref, version)

        def op(t: WriteTxn) -> None:
            for db in ("log", "ckpt", "kv"):  # message chunks stay (retention drops unused roots)
                for key in t.keys_in(db, prefix):
                    at = kv_version(len(prefix), key) if db == "kv" else version_of(key)
                    if at > version and not (db == "log" and is_head(key)):
                        raw = t.get(db, key)
                        if raw is not None:
                            t.put("quarantine", db.encode() + b"/" + key, raw)
                        t.delete(db, key)
            head(t)

        return op


def _descends(base: CheckpointBase, state: ScopeState, verify: bool) -> bool:
    """Whether ``state`` can be written on top of ``base`` (its log extends the base's).

    Trusted (the caller vouches that no reset came between) but for a cheap
    check that the base's last message is still in place; with ``verify``,
    the whole prefix is compared.
    """
    n = base.n
    messages = state.messages
    if base.version > state.version or n > len(messages):
        return False
    if not n:
        return True
    if verify:
        return all(a == b for a, b in zip(base.messages, messages[:n], strict=True))
    return bool(messages[n - 1] is base.messages[n - 1])
