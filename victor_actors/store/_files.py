"""The store's files before LMDB maps them: the owner lock, rewrites swapped in, and the data file's size.

**The owner lock** is an exclusive ``flock`` on the store's directory, taken
before anything on disk is touched, and then on the data file itself
(``data/data.mdb``). Neither is a side file: a lock on a file that can be
deleted protects nothing once it is deleted, while deleting the directory or
the data file destroys the store anyway. The directory is what a rewrite
never renames (it swaps ``data`` for a new one inside it), so its lock holds
across a swap; the data file's lock is also refused to writers that only know
that one. ``owner.lock`` beside them only tells people which process owns the
store.

**Rewrites** (``_rekey.py``) write a whole new store in ``rewrite.next``
beside the data, mark it complete, and swap directories with renames. Only
the lock holder carries an interrupted rewrite through or drops an
unfinished copy (taking the lock does it, before the data file is opened); a
read-only open reads whichever directory is the store's at that moment
(``readable_data``) and changes nothing, and a refused writer has touched
nothing before it is refused.

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
check, or the records' CRCs), never as SIGBUS. A writable open, once it
succeeded, also leaves 128 KiB of zeros past the last page (``SLACK``: as
far as a damaged node offset or key size on the last pages can point; LMDB
writes its next pages over them); a read-only or refused open adds nothing.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import struct
import time
from typing import IO

from victor_actors._errors import CheckpointCorruptError, StoreLockedError, VictorActorsError

__all__ = [
    "COMPLETE",
    "NEXT",
    "PREVIOUS",
    "SLACK",
    "OwnerLock",
    "check_data_file",
    "leave_slack",
    "readable_data",
]

# A rewrite (rekey, encryption) writes a whole new store in NEXT beside the data, marks it COMPLETE,
# then swaps directories: data -> PREVIOUS, NEXT/data -> data. Each step is a rename, and the next
# lock holder carries an interrupted swap through (or drops an incomplete copy: _finish_swap), so
# after a crash at any point the store is either the old one or the new one, whole.
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
# Zeros kept past the last page: a damaged node offset (2 bytes) or key size (2 bytes) on one of
# the last pages points at most 128 KiB past it, which then reads zeros (a typed error, or keys
# that are not there) instead of raising SIGBUS. LMDB writes its next pages over them.
SLACK = 2 * 65536


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


def leave_slack(path: str) -> None:
    """Make sure ``SLACK`` zeros follow the last page of ``path`` (a writer, once its open succeeded)."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            first = _meta(f.read(4096), 0)
            if first is None:
                return
            f.seek(first[0])
            metas = [m for m in (first, _meta(f.read(first[0]), 0)) if m is not None]
    except OSError:
        return
    psize, last_pg, _txnid, _roots = max(metas, key=lambda m: m[2])
    if size < (last_pg + 1) * psize + SLACK:
        _fill_free_tail(path, (last_pg + 1) * psize + SLACK)


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
    """The exclusive right to write a store: held by one manager, or by a rewrite, from open to close.

    Taking it locks the store's directory (creating it if ``create``), then
    carries an interrupted rewrite through or drops an unfinished copy, then
    locks the data file (``data`` is its directory). A refusal changes
    nothing on disk.

    With ``timeout``, a lock another process holds is waited for that many
    seconds (polled: ``flock`` takes no deadline).

    Raises:
        StoreLockedError: another live owner holds either lock (for the whole ``timeout``).
        VictorActorsError: there is no store at ``store_path`` and ``create`` is False.
    """

    def __init__(self, store_path: str, *, create: bool = True, timeout: float = 0.0) -> None:
        self._dir: int | None = None
        self._file: IO[bytes] | None = None
        self.store_path = store_path
        self.data = os.path.join(store_path, "data")
        data_file = os.path.join(self.data, "data.mdb")
        deadline = time.monotonic() + timeout
        if create:
            os.makedirs(store_path, exist_ok=True)
        elif not os.path.isdir(store_path):
            raise VictorActorsError(f"no victor_actors store at {store_path!r}")
        fd = os.open(store_path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            _flock(fd, store_path, deadline, timeout)
        except BaseException:
            os.close(fd)
            raise
        self._dir = fd
        try:
            _finish_swap(store_path)
            if not create and not os.path.isfile(data_file):
                raise VictorActorsError(f"no victor_actors store at {store_path!r}")
            os.makedirs(self.data, exist_ok=True)
            handle = open(data_file, "ab")  # creates an empty data file for a new store
            try:
                _flock(handle.fileno(), store_path, deadline, timeout)
            except BaseException:
                handle.close()
                raise
            self._file = handle
        except BaseException:
            self.release()
            raise
        try:
            with open(os.path.join(store_path, "owner.lock"), "w") as note:
                note.write(f"{os.getpid()}\n")  # for people; the locks are on the directory and data file
        except OSError:
            pass

    def __enter__(self) -> OwnerLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def swap_in(self) -> None:
        """Replace the store's data with the complete rewrite in ``NEXT`` (marked complete, then renamed).

        From the marker on the rewrite is the store: a crash later leaves it
        to the next lock holder to finish, and a read-only open reads it.
        """
        if self._dir is None:
            raise VictorActorsError("the owner lock was released; the rewrite was not swapped in")
        nxt = os.path.join(self.store_path, NEXT)
        with open(os.path.join(nxt, COMPLETE), "w") as marker:
            marker.write("complete\n")
            marker.flush()
            os.fsync(marker.fileno())
        _fsync_dir(nxt)
        _finish_swap(self.store_path)

    def forget(self) -> None:
        """In a forked child: close this process's descriptors of the locks without unlocking them.

        ``flock`` belongs to the open file, which a fork shares: unlocking here
        would unlock the parent, which stays the only holder.
        """
        handle, self._file = self._file, None
        fd, self._dir = self._dir, None
        if handle is not None:
            handle.close()
        if fd is not None:
            os.close(fd)

    def release(self) -> None:
        handle, self._file = self._file, None
        fd, self._dir = self._dir, None
        try:
            if handle is not None:
                try:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
                finally:
                    handle.close()
        finally:
            if fd is not None:
                os.close(fd)  # closing the descriptor releases its lock


def _flock(fd: int, store_path: str, deadline: float, timeout: float) -> None:
    """Lock ``fd`` exclusively, polling until ``deadline`` while another process holds it."""
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0:
                waited = f"waited for {timeout:g} s" if timeout > 0 else "did not wait"
                raise StoreLockedError(
                    f"{store_path!r} is owned by another live manager or a rewrite ({waited}); nothing was "
                    "opened (open it with read_only=True to inspect it, connect to its owner with "
                    "victor_actors.connect, or give lock_timeout to wait for it)"
                ) from None
            time.sleep(min(0.05, left))


def readable_data(store_path: str) -> str:
    """The directory a read-only open reads: the data, or a complete rewrite not yet swapped in.

    Never changes anything on disk (a lock holder finishes the swap).
    """
    nxt = os.path.join(store_path, NEXT)
    if os.path.exists(os.path.join(nxt, COMPLETE)) and os.path.isfile(os.path.join(nxt, "data", "data.mdb")):
        return os.path.join(nxt, "data")
    data = os.path.join(store_path, "data")
    prev = os.path.join(store_path, PREVIOUS)
    if not os.path.isfile(os.path.join(data, "data.mdb")) and os.path.isfile(os.path.join(prev, "data.mdb")):
        return prev  # cannot happen by the swap's steps; never report the only copy missing
    return data


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _finish_swap(store_path: str) -> None:
    """Carry an interrupted rewrite through, or drop an incomplete one; a no-op when there is none.

    Only under the owner lock (``OwnerLock`` calls it).
    """
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
