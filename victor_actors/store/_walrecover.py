"""Recovery from the write-ahead log: put LMDB back to its synced state after a restart, replay the tail.

Runs on a writable open, under the owner lock, before anything reads:

1. **Before LMDB is opened** (:func:`restore_after_restart`): when the log's
   header says the store was not closed clean and the machine has restarted
   since it was written (its boot id differs), LMDB's newest meta page may
   point at pages that never reached the disk. The state the header names was
   synced and stayed pinned (``_wal.py``), so it is whole on disk: its two
   meta pages, saved in the header, are written back over LMDB's and synced.
   Before that, the main database's root page of that state is compared with
   the digest the header holds: a log of another data file changes nothing.
   Within one boot (the owner process was killed, the machine kept running)
   LMDB's own newest state is whole (the page cache holds every write it
   made) and nothing is written back.
2. **After LMDB is opened** (:func:`plan_replay`, then :func:`apply_replay`): the log must be this store's
   (its id is the one in ``meta/wal``, and LMDB is not older than the log's
   records' start), and must hold no damage in its middle; then every record
   after the sequence number LMDB has applied is applied in order, each in
   its own transaction that also moves ``meta/wal``. A record at or below it
   (the log behind LMDB) is skipped: nothing is applied twice.

A refusal raises :class:`LogCorruptError` and leaves LMDB and the log as they
were (``drop_damaged`` replays what precedes the damage and drops the rest).
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
from typing import Any

import attrs
import lmdb

from victor_actors._errors import LogCorruptError
from victor_actors.store._files import _meta as parse_meta_page
from victor_actors.store._wal import WAL_KEY, WriteAheadLog, growing, wal_key_of
from victor_actors.store._walfile import (
    DB_CODES,
    LOG_NAME,
    META_BYTES,
    LogRead,
    boot_id,
    decode_ops,
    fsync_dir,
    read_log,
)

__all__ = [
    "Replay",
    "apply_replay",
    "needs_restore",
    "plan_replay",
    "restore_after_restart",
    "settle_log",
    "start_log",
    "tail_beyond",
]

logger = logging.getLogger("victor_actors")


def needs_restore(read: LogRead | None) -> bool:
    """Whether LMDB may hold unsynced state from before a machine restart (see the module's step 1)."""
    if read is None or read.header is None or read.header.clean:
        return False
    now = boot_id()
    return now is None or now != read.header.boot


def restore_after_restart(data_dir: str, read: LogRead | None) -> bool:
    """Step 1: write the header's synced meta pages back over LMDB's when :func:`needs_restore`.

    Returns whether it did. Raises:
        LogCorruptError: the log's saved state does not fit this data file; nothing was changed.
    """
    if not needs_restore(read):
        return False
    assert read is not None and read.header is not None
    header = read.header
    data_file = os.path.join(data_dir, "data.mdb")
    metas = [parse_meta_page(m, 0) for m in header.metas]
    parsed = [m for m in metas if m is not None]
    if not parsed:
        raise LogCorruptError(
            f"the log of {data_dir!r} saved no readable LMDB meta page; nothing was changed"
        )
    newest = max(parsed, key=lambda m: m[2])
    psize = header.psize
    with open(data_file, "r+b") as f:
        f.seek(newest[3][1] * psize)
        root = hashlib.blake2b(f.read(psize), digest_size=16).digest()
        if root != header.root_digest:
            raise LogCorruptError(
                f"the write-ahead log in {data_dir!r} does not belong to its data file (the synced state "
                "it names is not there): it is another store's, or the data file was replaced; nothing "
                "was changed (move wal.log away to open the data file as it is)"
            )
        for i, meta in enumerate(header.metas):
            f.seek(i * psize)
            f.write(meta[:META_BYTES])
        f.flush()
        os.fsync(f.fileno())
    logger.warning(
        "%s: the machine restarted while the store was open; LMDB was put back to its last synced "
        "state (txn %d) and the write-ahead log is replayed on it",
        data_dir,
        newest[2],
    )
    return True


def _refuse(path: str, why: str) -> LogCorruptError:
    return LogCorruptError(
        f"the write-ahead log of the store at {path!r} {why}; nothing was opened or changed (open it "
        "with drop_damaged_log=True to replay what precedes the damage and drop the rest)"
    )


@attrs.frozen
class Replay:
    """What :func:`plan_replay` found: the log id LMDB knows (None: none yet), the sequence number
    LMDB has applied, and the records to apply after it (decoded, in order)."""

    log_id: bytes | None
    applied: int
    todo: tuple[tuple[int, list[tuple[str, bytes, bytes | None]]], ...]


def plan_replay(
    env: Any, dbs: dict[str, Any], read: LogRead | None, *, path: str, drop_damaged: bool
) -> Replay:
    """Step 2's checks: the log against LMDB, and its records past LMDB's applied one. Writes nothing.

    Raises:
        LogCorruptError: damage in the log's middle, another store's log, or a
            data file older than the log's records' start; nothing was changed.
    """
    key = _applied(env, dbs, path)
    header = None if read is None else read.header
    if read is None or header is None:
        if read is not None and read.garbage and not drop_damaged:
            raise _refuse(path, "has no readable header (both copies fail their check)")
        return Replay(None, 0, ()) if key is None else Replay(key[0], key[1], ())
    if key is None:
        if read.records:
            raise _refuse(path, "holds records but the data file has never applied any (another store's log)")
        return Replay(None, 0, ())
    log_id, applied = key
    if log_id != header.log_id:
        raise _refuse(path, "is another store's (its id is not the one the data file records)")
    if applied < header.base:
        raise _refuse(
            path,
            f"starts after record {header.base}, but the data file holds only up to {applied} "
            "(the data file is older than the log)",
        )
    if read.damage is not None:
        if not drop_damaged:
            raise _refuse(path, f"is damaged: {read.damage}")
        logger.warning("%s: dropping the write-ahead log after the damage: %s", path, read.damage)
    todo = [(seq, body) for seq, body in read.records if seq > applied]
    if todo and todo[0][0] != applied + 1:
        raise _refuse(path, f"has no record {applied + 1} (its records continue at {todo[0][0]})")
    decoded = []
    for seq, body in todo:
        try:
            decoded.append((seq, decode_ops(body)))
        except (ValueError, KeyError, struct.error) as exc:
            if not drop_damaged:
                raise _refuse(
                    path, f"holds record {seq}, which passes its check but does not parse ({exc})"
                ) from None
            break
    return Replay(log_id, applied, tuple(decoded))


def apply_replay(env: Any, dbs: dict[str, Any], plan: Replay, path: str, wal: WriteAheadLog | None) -> int:
    """Apply ``plan``'s records, each in its own transaction that moves ``meta/wal``; the applied number.

    The map grows as it fills (``_wal.growing``: ``wal``'s pin let go meanwhile, its records kept).
    """
    applied = plan.applied
    if not plan.todo:
        return applied
    assert plan.log_id is not None
    log_id = plan.log_id
    meta = dbs["meta"]
    for seq, ops in plan.todo:

        def one(seq: int = seq, ops: list[tuple[str, bytes, bytes | None]] = ops) -> None:
            with env.begin(write=True) as txn:
                for db, k, value in ops:
                    handle = dbs.get(db)
                    if handle is None:
                        handle = dbs[db] = env.open_db(db.encode(), txn=txn, create=True)
                    if value is None:
                        txn.delete(k, db=handle)
                    else:
                        txn.put(k, value, db=handle)
                txn.put(WAL_KEY, log_id + seq.to_bytes(8, "big"), db=meta)

        growing(env, wal, one)
        applied = seq
    logger.info("%s: replayed %d record(s) of the write-ahead log", path, len(plan.todo))
    return applied


def _applied(env: Any, dbs: dict[str, Any], path: str) -> tuple[bytes, int] | None:
    meta = dbs.get("meta")
    if meta is None:
        return None
    try:
        with env.begin(db=meta) as txn:
            raw = txn.get(WAL_KEY)
            return wal_key_of(None if raw is None else bytes(raw))
    except ValueError as exc:
        raise LogCorruptError(f"the store at {path!r}: {exc}; nothing was opened or changed") from None
    except lmdb.Error as exc:
        raise LogCorruptError(f"the store at {path!r}: its meta database does not read ({exc})") from None


def tail_beyond(env: Any, dbs: dict[str, Any], read: LogRead | None, path: str) -> int:
    """How many of the log's records LMDB does not hold (a read-only open reports, never applies them)."""
    if read is None or read.header is None:
        return 0
    key = _applied(env, dbs, path)
    if key is None or key[0] != read.header.log_id:
        return len(read.records)
    return sum(1 for seq, _ in read.records if seq > key[1])


def start_log(
    env: Any,
    dbs: dict[str, Any],
    data_dir: str,
    read: LogRead | None,
    plan: Replay,
    *,
    restored: bool,
    enabled: bool,
    path: str,
) -> WriteAheadLog | None:
    """Apply ``plan`` (from :func:`plan_replay`), then start the live log (None: the log is off).

    With the log off, the tail is replayed (LMDB is opened synced then) and the
    log file removed once LMDB is synced. With it on: the records are replayed
    while LMDB's state before them is pinned (after a restart, the restored
    state; within a boot, LMDB's own state, synced and named by a header first),
    then a checkpoint starts the records over.

    """
    if not enabled:
        if plan.todo:
            apply_replay(env, dbs, plan, path, None)
        if read is not None:
            env.sync(True)
            os.unlink(os.path.join(data_dir, LOG_NAME))
            fsync_dir(data_dir)
        return None
    header = None if read is None else read.header
    log_id = plan.log_id or os.urandom(16)
    same = header is not None and header.log_id == log_id
    wal = WriteAheadLog(
        env,
        data_dir,
        log_id,
        generation=0 if header is None else header.generation,
        epoch=header.epoch if same and header is not None else 0,
        base=header.base if same and header is not None else plan.applied,
        applied=plan.applied,
    )
    try:
        if plan.todo:
            if restored:
                wal.pin()  # LMDB is at the header's synced state: keep it whole while replaying
            else:
                wal.write_header(new_epoch=False)  # sync LMDB's own state, name it, pin it
            wal.applied = apply_replay(env, dbs, plan, path, wal)
        wal.checkpoint()
        if plan.log_id is None:
            # a store the log is new to: LMDB learns its id (synced by the next checkpoint)
            live = wal

            def learn() -> None:
                with env.begin(write=True) as txn:
                    txn.put(WAL_KEY, live.key_value(live.applied), db=dbs["meta"])

            growing(env, wal, learn)
    except BaseException:
        wal.drop()
        raise
    return wal


def settle_log(data_dir: str, path: str, map_size: int) -> None:
    """Replay the log of the store in ``data_dir`` into its data file and remove it (a rewrite's first step).

    Only under the owner lock. LMDB is opened synced for it and closed again;
    without a log file nothing is opened.

    Raises:
        LogCorruptError: as on a writable open; nothing was changed.
    """
    read = read_log(os.path.join(data_dir, LOG_NAME))
    if read is None:
        return
    restored = restore_after_restart(data_dir, read)
    env = lmdb.open(data_dir, map_size=map_size, max_dbs=len(DB_CODES) + 2, sync=True, readahead=False)
    try:
        dbs = {}
        for name in DB_CODES:
            try:
                dbs[name] = env.open_db(name.encode(), create=name == "meta")
            except lmdb.NotFoundError:
                pass
        plan = plan_replay(env, dbs, read, path=path, drop_damaged=False)
        start_log(env, dbs, data_dir, read, plan, restored=restored, enabled=False, path=path)
    finally:
        env.close()
