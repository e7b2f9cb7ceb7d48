"""The store's files before LMDB maps them: the owner lock and the data file's own account of its size.

**The owner lock** is an exclusive ``flock`` on the data file itself
(``data/data.mdb``), not on a side file: a lock on a file that can be
deleted protects nothing once it is deleted, while deleting the data file
destroys the store anyway. ``owner.lock`` beside it only tells people which
process owns the store.

**The size check**: LMDB maps ``data.mdb`` and touches pages through the
map, so a file shorter than LMDB believes raises SIGBUS in the process
(the library and ``victor-actors inspect`` alike). Before mapping, the two
meta pages are read with plain file I/O; the newer one says how many pages
the file holds, and a file shorter than that is refused with a typed error.
"""

from __future__ import annotations

import fcntl
import os
import struct
from typing import IO

from victor_actors._errors import CheckpointCorruptError, StoreLockedError

__all__ = ["NEXT", "PREVIOUS", "OwnerLock", "check_data_file", "finish_swap", "swap_in"]

# A rewrite (rekey, encryption) writes a whole new store in NEXT beside the data, marks it COMPLETE,
# then swaps directories: data -> PREVIOUS, NEXT/data -> data. Each step is a rename, and
# finish_swap() carries an interrupted swap through (or drops an incomplete copy) on the next
# open, so after a crash at any point the store is either the old one or the new one, whole.
NEXT = "rewrite.next"
PREVIOUS = "rewrite.previous"
COMPLETE = "COMPLETE"

_MAGIC = 0xBEEFC0DE
_PAGE_HEADER = 16  # mp_pgno (8), mp_pad (2), mp_flags (2), mp_lower (2), mp_upper (2)
_DB_SIZE = 48  # one MDB_db record
_META = struct.Struct("<II")  # mm_magic, mm_version
_LAST = struct.Struct("<QQ")  # mm_last_pg, mm_txnid: after magic, version, address, mapsize, two MDB_db
_LAST_AT = 8 + 8 + 8 + 2 * _DB_SIZE
_PSIZE_AT = 8 + 8 + 8  # the free DB's md_pad holds the page size


def _meta(raw: bytes, offset: int) -> tuple[int, int, int] | None:
    """(page size, last page, txn id) of the meta page at ``offset``, or None if it is not one."""
    start = offset + _PAGE_HEADER
    if len(raw) < start + _LAST_AT + _LAST.size:
        return None
    magic, _version = _META.unpack_from(raw, start)
    if magic != _MAGIC:
        return None
    (psize,) = struct.unpack_from("<I", raw, start + _PSIZE_AT)
    last_pg, txnid = _LAST.unpack_from(raw, start + _LAST_AT)
    return psize, last_pg, txnid


def check_data_file(path: str) -> None:
    """Refuse a ``data.mdb`` that is shorter than its meta pages say (or has none), before mapping it.

    Raises:
        CheckpointCorruptError: the file is truncated or its meta pages are unreadable.
    """
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        return
    if size == 0:
        return  # a new store: LMDB writes the meta pages itself
    with open(path, "rb") as f:
        head = f.read(4096)
        first = _meta(head, 0)
        psize = first[0] if first is not None else 4096
        if psize < 512 or psize > 65536 or psize & (psize - 1):
            raise CheckpointCorruptError(
                f"{path}: its first meta page names a page size of {psize}; not opened"
            )
        f.seek(psize)
        second = _meta(f.read(psize), 0)
    metas = [m for m in (first, second) if m is not None]
    if not metas:
        raise CheckpointCorruptError(f"{path} has no readable LMDB meta page; the store was not opened")
    psize, last_pg, _txnid = max(metas, key=lambda m: m[2])
    needed = (last_pg + 1) * psize
    if size < needed:
        raise CheckpointCorruptError(
            f"{path} is truncated: {size} bytes where its meta page accounts for {needed} "
            f"({last_pg + 1} pages of {psize}); the store was not opened (restore the file from a copy)"
        )


class OwnerLock:
    """An exclusive lock on a store's data file, held for as long as one manager owns the store."""

    def __init__(self, store_path: str, data_file: str) -> None:
        self._file: IO[bytes] | None = None
        self._store_path = store_path
        handle = open(data_file, "ab")  # creates an empty data file for a new store
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise StoreLockedError(
                f"{store_path!r} is owned by another live manager; nothing was opened "
                "(open it with read_only=True to inspect it)"
            ) from None
        self._file = handle
        try:
            with open(os.path.join(store_path, "owner.lock"), "w") as note:
                note.write(f"{os.getpid()}\n")  # for people; the lock is on the data file
        except OSError:
            pass

    def release(self) -> None:
        handle, self._file = self._file, None
        if handle is not None:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
            finally:
                handle.close()


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def swap_in(store_path: str) -> None:
    """Replace the store's data with the complete rewrite in ``NEXT`` (two renames), then clean up."""
    nxt = os.path.join(store_path, NEXT)
    with open(os.path.join(nxt, COMPLETE), "w") as marker:
        marker.write("complete\n")
        marker.flush()
        os.fsync(marker.fileno())
    _fsync_dir(nxt)
    finish_swap(store_path)


def finish_swap(store_path: str) -> None:
    """Carry an interrupted rewrite through, or drop an incomplete one; a no-op when there is none."""
    import shutil

    data = os.path.join(store_path, "data")
    nxt = os.path.join(store_path, NEXT)
    prev = os.path.join(store_path, PREVIOUS)
    if os.path.isdir(nxt) and not os.path.exists(os.path.join(nxt, COMPLETE)):
        shutil.rmtree(nxt, ignore_errors=True)  # the copy never finished: the old store is whole
    if os.path.exists(os.path.join(nxt, COMPLETE)):
        if os.path.isdir(os.path.join(nxt, "data")):
            if os.path.isdir(data):
                if os.path.isdir(prev):
                    shutil.rmtree(prev)
                os.rename(data, prev)
            os.rename(os.path.join(nxt, "data"), data)
            _fsync_dir(store_path)
        shutil.rmtree(nxt, ignore_errors=True)
    if os.path.isdir(prev):
        if os.path.isdir(data):
            shutil.rmtree(prev, ignore_errors=True)
        else:  # cannot happen by the steps above; never lose the only copy
            os.rename(prev, data)
