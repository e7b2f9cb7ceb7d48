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
the environment has allocated. A healthy file may be shorter than that: LMDB
never writes pages that a transaction allocated and freed again, and when
those are the last ones the file ends before them (a big group commit
leaves a dozen such pages; a SIGKILL then keeps the file that way). So a
short file is refused only when a page the store starts from lies past its
end: the free list's root, the main database's root, or the root of any
named database (read from the main root's leaf). Otherwise the missing tail
is free space, and it is filled with zeros (``posix_fallocate``, which never
shrinks a file or touches written data) before the file is mapped; damage
deeper in a database then reads as a typed error (LMDB's corrupted-page
check, or the records' CRCs), never as SIGBUS.
"""

from __future__ import annotations

import fcntl
import os
import struct
import time
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


_ROOT_AT = 40  # md_root within an MDB_db record
_FREE_AT = 8 + 8 + 8  # the free DB's record, after magic, version, address and map size
_INVALID = (1 << 64) - 1  # P_INVALID: an empty database has no root
_P_LEAF = 0x02
_F_BIGDATA = 0x01


def _meta(raw: bytes, offset: int) -> tuple[int, int, int, tuple[int, int]] | None:
    """(page size, last page, txn id, (free root, main root)) of the meta page at ``offset``, or None."""
    start = offset + _PAGE_HEADER
    if len(raw) < start + _LAST_AT + _LAST.size:
        return None
    magic, _version = _META.unpack_from(raw, start)
    if magic != _MAGIC:
        return None
    (psize,) = struct.unpack_from("<I", raw, start + _PSIZE_AT)
    last_pg, txnid = _LAST.unpack_from(raw, start + _LAST_AT)
    roots = tuple(
        struct.unpack_from("<Q", raw, start + _FREE_AT + i * _DB_SIZE + _ROOT_AT)[0] for i in (0, 1)
    )
    return psize, last_pg, txnid, (roots[0], roots[1])


def _named_roots(page: bytes) -> list[int]:
    """The roots of the named databases listed in the main database's root page (if it is a leaf)."""
    if len(page) < _PAGE_HEADER:
        return []
    flags, lower = struct.unpack_from("<HH", page, 10)
    if not flags & _P_LEAF:
        return []
    roots: list[int] = []
    for i in range((lower - _PAGE_HEADER) // 2):
        (at,) = struct.unpack_from("<H", page, _PAGE_HEADER + 2 * i)
        if at + 8 > len(page):
            return roots
        size_lo, size_hi, node_flags, ksize = struct.unpack_from("<HHHH", page, at)
        value = at + 8 + ksize
        if node_flags & _F_BIGDATA or (size_lo | size_hi << 16) != _DB_SIZE or value + _DB_SIZE > len(page):
            continue
        roots.append(struct.unpack_from("<Q", page, value + _ROOT_AT)[0])
    return roots


def check_data_file(path: str) -> None:
    """Refuse a ``data.mdb`` cut short before a page it starts from; fill a free tail with zeros.

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
        psize, last_pg, _txnid, (free_root, main_root) = max(metas, key=lambda m: m[2])
        needed = (last_pg + 1) * psize
        if size >= needed:
            return
        pages = size // psize
        roots = [r for r in (free_root, main_root) if r != _INVALID]
        if all(r < pages for r in roots) and main_root != _INVALID:
            f.seek(main_root * psize)
            roots += [r for r in _named_roots(f.read(psize)) if r != _INVALID]
    beyond = [r for r in roots if r >= pages]
    if beyond:
        raise CheckpointCorruptError(
            f"{path} is truncated: {size} bytes where its meta page accounts for {needed} "
            f"({last_pg + 1} pages of {psize}), and page {beyond[0]}, where a database starts, is past "
            "its end; the store was not opened (restore the file from a copy)"
        )
    _fill_free_tail(path, needed)


def _fill_free_tail(path: str, needed: int) -> None:
    """Make the file ``needed`` bytes long with zeros past its end (never shorter, never overwriting)."""
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError:
        return  # read-only access: the tail is free space, which nothing reads
    try:
        os.posix_fallocate(fd, 0, needed)
    except OSError:
        pass
    finally:
        os.close(fd)


class OwnerLock:
    """An exclusive lock on a store's data file, held for as long as one manager owns the store."""

    def __init__(self, store_path: str, data_file: str, timeout: float = 0.0) -> None:
        """Take the lock, waiting up to ``timeout`` seconds for another owner to let go of it.

        Raises:
            StoreLockedError: another live process held it for the whole ``timeout``.
        """
        self._file: IO[bytes] | None = None
        self._store_path = store_path
        handle = open(data_file, "ab")  # creates an empty data file for a new store
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left > 0:
                    # flock cannot be waited on with a deadline: poll (another process holds it,
                    # there is nothing in this one to wait on)
                    time.sleep(min(0.05, left))
                    continue
                handle.close()
                waited = f" for {timeout:g} s" if timeout > 0 else ""
                raise StoreLockedError(
                    f"{store_path!r} is owned by another live process (waited{waited or ' not at all'}); "
                    "nothing was opened (open it with read_only=True to inspect it, connect to its owner "
                    "with victor_actors.connect, or give lock_timeout to wait for it)"
                ) from None
        self._file = handle
        try:
            with open(os.path.join(store_path, "owner.lock"), "w") as note:
                note.write(f"{os.getpid()}\n")  # for people; the lock is on the data file
        except OSError:
            pass

    def forget(self) -> None:
        """In a forked child: close this process's copy of the lock's file without unlocking.

        ``flock`` belongs to the open file, which a fork shares: unlocking here
        would unlock the parent. Closing the child's descriptor leaves the
        parent the only holder, so the lock ends when the parent ends.
        """
        handle, self._file = self._file, None
        if handle is not None:
            handle.close()

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
