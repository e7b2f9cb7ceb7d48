"""The write-ahead log of a writable store: one ``fdatasync`` per group commit, LMDB synced at checkpoints.

A group's LMDB transaction runs unsynced; before it commits, its physical
effect (every put and delete, in order) is appended to ``data/wal.log`` as
one record and made durable with one ``fdatasync`` (:meth:`append`). The
transaction also moves LMDB's applied sequence number (``meta/wal``), so
LMDB always knows which records it holds. Every ``checkpoint_groups`` groups
or ``checkpoint_bytes`` of log, on close, and before the map grows,
:meth:`checkpoint` syncs LMDB (``env.sync(True)``), writes a new header
naming the synced state, and only then starts the records over.

**The pin.** LMDB written without sync can, after a power loss, hold a meta
page that reached the disk before the pages it points to. So between
checkpoints the store keeps one read transaction open on the state the header
names (the last synced one): LMDB never reuses a page that state can reach,
so that state stays whole on disk whatever else was or was not written, and
recovery after a machine restart puts LMDB's meta pages back to it and replays
the log (``_walrecover.py``). The header is written before the pin moves.

The file is written once with zeros up to its capacity (``capacity``) and
its space is reused from the records' start after each checkpoint, so a
group's ``fdatasync`` flushes the record's pages and never a new file size;
a record that does not fit grows the file (zeros, then ``fsync``) first.
See docs/adr/0033-write-ahead-log.md.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable
from typing import Any, TypeVar

import lmdb

from victor_actors._errors import VictorActorsError
from victor_actors.store._files import _meta as parse_meta_page
from victor_actors.store._walfile import (
    HEADER_SLOT,
    LOG_NAME,
    META_BYTES,
    RECORDS_START,
    WAL_KEY,
    Header,
    boot_id,
    frame,
    fsync_dir,
    pack_header,
)

__all__ = [
    "CAPACITY",
    "CHECKPOINT_GROUPS",
    "WAL_KEY",
    "WriteAheadLog",
    "grow_map",
    "growing",
    "lmdb_snapshot",
    "wal_key_of",
]

logger = logging.getLogger("victor_actors")

T = TypeVar("T")

CAPACITY = 1 << 20  # bytes of log space written once with zeros (records start at RECORDS_START)
CHECKPOINT_GROUPS = 256


def lmdb_snapshot(data_file: str) -> tuple[int, tuple[bytes, bytes], bytes, int]:
    """(page size, the first META_BYTES of both meta pages, a digest of the main root page, txn id)
    of ``data_file`` as it is now (read with plain file I/O, which sees what LMDB wrote)."""
    with open(data_file, "rb") as f:
        page0 = f.read(4096)
        first = parse_meta_page(page0, 0)
        if first is None:
            raise VictorActorsError(f"{data_file} has no readable LMDB meta page; the log was not started")
        psize = first[0]
        f.seek(psize)
        page1 = f.read(psize)
        second = parse_meta_page(page1, 0)
        metas = [m for m in (first, second) if m is not None]
        newest = max(metas, key=lambda m: m[2])
        f.seek(newest[3][1] * psize)
        root = hashlib.blake2b(f.read(psize), digest_size=16).digest()
    return psize, (page0[:META_BYTES], page1[:META_BYTES]), root, newest[2]


class WriteAheadLog:
    """The live log of one writable store (its writer's leader calls it, one thread at a time)."""

    def __init__(
        self,
        env: Any,
        data_dir: str,
        log_id: bytes,
        *,
        generation: int,
        epoch: int,
        base: int,
        applied: int,
        capacity: int = CAPACITY,
        checkpoint_groups: int = CHECKPOINT_GROUPS,
        checkpoint_bytes: int | None = None,
    ) -> None:
        boot = boot_id()
        if boot is None:
            raise VictorActorsError("this system does not report its boot id; the log was not started")
        self.env = env
        self.path = os.path.join(data_dir, LOG_NAME)
        self.data_file = os.path.join(data_dir, "data.mdb")
        self.log_id = log_id
        self.boot = boot
        self.generation = generation
        self.epoch = epoch
        self.base = base
        self.applied = applied
        self.checkpoint_groups = checkpoint_groups
        self.checkpoint_bytes = checkpoint_bytes or capacity // 2  # room left for the group after it
        self.offset = RECORDS_START
        self.groups = 0  # since the last checkpoint
        self.checkpoints = 0
        self._last = 0  # bytes of the last record appended (for retract)
        self._pin: Any = None
        self.broken = False  # a record's write or sync failed: its fate is unknown
        created = not os.path.exists(self.path)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            self.size = os.fstat(self.fd).st_size
            if self.size < RECORDS_START + capacity:
                self._grow(RECORDS_START + capacity)
            if created:
                fsync_dir(data_dir)
        except BaseException:
            os.close(self.fd)
            raise

    def key_value(self, seq: int) -> bytes:
        """What ``meta/wal`` holds once LMDB has applied record ``seq``."""
        return self.log_id + seq.to_bytes(8, "big")

    # -- appending ---------------------------------------------------------------------------------

    def append(self, seq: int, body: bytes) -> None:
        """Write record ``seq`` after the last one and make it durable (one ``fdatasync``).

        Raises:
            OSError: growing the file failed (nothing of the record was written), or writing or
                syncing it failed, after which the log is ``broken``: whether the record reached
                the disk is unknown, so the store must take no more writes.
        """
        if self.broken:
            raise OSError("an earlier write of the write-ahead log failed; the store takes no more writes")
        record = frame(self.log_id, self.epoch, seq, body)
        if self.offset + len(record) > self.size:
            self._grow(max(self.size * 2, self.offset + len(record) + RECORDS_START))
        try:
            os.pwrite(self.fd, record, self.offset)
            os.fdatasync(self.fd)
        except BaseException:
            self.broken = True
            raise
        self.offset += len(record)
        self._last = len(record)

    def retract(self) -> None:
        """Take back the last record appended (its transaction did not commit): zeros over it, synced."""
        self.offset -= self._last
        os.pwrite(self.fd, bytes(self._last), self.offset)
        os.fdatasync(self.fd)
        self._last = 0

    def committed(self, seq: int) -> None:
        self.applied = seq
        self.groups += 1
        self._last = 0

    @property
    def due(self) -> bool:
        """Whether the next checkpoint is due (after the group just committed)."""
        return self.groups >= self.checkpoint_groups or self.offset - RECORDS_START >= self.checkpoint_bytes

    def _grow(self, size: int) -> None:
        """Zeros up to ``size`` (written, not only allocated: a later overwrite changes no extent)."""
        chunk = bytes(1 << 20)
        at = self.size
        while at < size:
            n = min(len(chunk), size - at)
            os.pwrite(self.fd, chunk[:n], at)
            at += n
        os.fsync(self.fd)
        self.size = size

    # -- checkpoints -------------------------------------------------------------------------------

    def pin(self) -> None:
        """Hold LMDB's current state (a read transaction): no page it reaches is reused until unpinned."""
        if self._pin is None:
            self._pin = self.env.begin()

    def unpin(self) -> None:
        pin, self._pin = self._pin, None
        if pin is not None:
            pin.abort()

    def write_header(self, *, clean: bool = False, new_epoch: bool = True) -> None:
        """Sync LMDB, then write a header naming that synced state (records start over with
        ``new_epoch``), durable before the pin moves to the synced state (unpinned with ``clean``).

        Raises:
            OSError, lmdb.Error: LMDB's sync failed (nothing changed), or the header's write
                or sync did, after which the log is ``broken`` (the store takes no more writes).
        """
        self.env.sync(True)
        psize, metas, root, _txnid = lmdb_snapshot(self.data_file)
        header = Header(
            generation=self.generation + 1,
            epoch=self.epoch + 1 if new_epoch else self.epoch,
            log_id=self.log_id,
            base=self.applied if new_epoch else self.base,
            synced=self.applied,
            boot=self.boot,
            clean=clean,
            psize=psize,
            root_digest=root,
            metas=metas,
        )
        slot = header.generation % 2
        try:
            os.pwrite(self.fd, pack_header(header), slot * HEADER_SLOT)
            os.fdatasync(self.fd)
        except BaseException:
            self.broken = True  # the new header may be on disk: records of the old epoch would not count
            raise
        self.generation, self.epoch, self.base = header.generation, header.epoch, header.base
        if new_epoch:
            self.offset = RECORDS_START
            self.groups = 0
            self.checkpoints += 1
        self.unpin()
        if not clean:
            self.pin()

    def checkpoint(self, *, clean: bool = False) -> None:
        """LMDB synced, then the records start over (``write_header`` with a new epoch)."""
        self.write_header(clean=clean, new_epoch=True)

    def close(self) -> None:
        """Checkpoint clean and close the file (a broken log is left as it is, for recovery to settle).
        Idempotent."""
        if self.fd < 0:
            return
        if self.broken:
            self.drop()
            return
        try:
            self.checkpoint(clean=True)
        finally:
            self.unpin()
            os.close(self.fd)
            self.fd = -1

    def drop(self) -> None:
        """Close without a checkpoint (the store failed to open; LMDB stays as recovery left it)."""
        self.unpin()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def grow_map(env: Any, wal: WriteAheadLog | None) -> None:
    """Double LMDB's map at an open (no reader of the store exists yet), the log's pin let go meanwhile.

    The header first names LMDB's synced state, keeping the records (a replay in progress still
    needs them), so a crash while the pin is off goes back to a whole state.
    """
    size = int(env.info()["map_size"])
    logger.info("growing the LMDB map of %s to %d bytes", env.path(), size * 2)
    if wal is not None:
        wal.write_header(new_epoch=False)
        wal.unpin()
    try:
        env.set_mapsize(size * 2)
    finally:
        if wal is not None:
            wal.pin()


def growing(env: Any, wal: WriteAheadLog | None, write: Callable[[], T]) -> T:
    """``write()``, the map doubled and ``write`` run again for as long as it fills the map."""
    while True:
        try:
            return write()
        except lmdb.MapFullError:
            grow_map(env, wal)


def wal_key_of(raw: bytes | None) -> tuple[bytes, int] | None:
    """(log id, applied sequence number) from ``meta/wal`` (None: absent; ValueError: malformed)."""
    if raw is None:
        return None
    if len(raw) != 24:
        raise ValueError(f"meta/wal holds {len(raw)} bytes, not 24")
    return bytes(raw[:16]), int.from_bytes(raw[16:], "big")
