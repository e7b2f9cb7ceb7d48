"""Where a named LMDB database's keys lie in ``data.mdb``: for tests that damage real pages.

A reader of LMDB's on-disk format (64-bit builds), just enough to find the
pages of one named database and the byte range of each key on them, so a test
can flip a byte of a key the way a bad sector or a stray write would, and
then open the store through LMDB itself. Nothing here writes through LMDB.

Page layout: a 16-byte header (``mp_pgno`` 8, ``mp_pad`` 2, ``mp_flags`` 2,
``mp_lower`` 2, ``mp_upper`` 2), then 2-byte node offsets up to ``mp_lower``.
A node is ``lo`` 2, ``hi`` 2, ``flags`` 2, ``ksize`` 2, the key, then (on a
leaf) the value or (on a branch) nothing: a branch node's child page number
is ``lo | hi << 16 | flags << 32``. The two meta pages hold the main
database's record; the main database's leaves map each name to its record
(``md_root`` at offset 40 of 48 bytes).
"""

from __future__ import annotations

import struct
from pathlib import Path

__all__ = ["KeySpan", "db_pages", "key_spans", "page_size"]

_HEADER = 16
_P_BRANCH, _P_LEAF, _P_LEAF2 = 0x01, 0x02, 0x20
_F_BIGDATA, _F_SUBDATA = 0x01, 0x02
_DB = 48
_ROOT_AT = 40
_INVALID = (1 << 64) - 1


class KeySpan:
    """One key on a page: the page number, whether it is a leaf, and the key's offset and bytes."""

    __slots__ = ("key", "leaf", "offset", "page")

    def __init__(self, page: int, leaf: bool, offset: int, key: bytes) -> None:
        self.page, self.leaf, self.offset, self.key = page, leaf, offset, key

    def __repr__(self) -> str:
        return f"KeySpan(page={self.page}, leaf={self.leaf}, key={self.key.hex()})"


def _meta_root(raw: bytes) -> tuple[int, int]:
    """(page size, main database root) from the newer meta page."""
    best = None
    psize = struct.unpack_from("<I", raw, _HEADER + 24)[0] or 4096
    for page in (0, 1):
        start = page * psize + _HEADER
        magic = struct.unpack_from("<I", raw, start)[0]
        if magic != 0xBEEFC0DE:
            continue
        main_root = struct.unpack_from("<Q", raw, start + 24 + _DB + _ROOT_AT)[0]
        txnid = struct.unpack_from("<Q", raw, start + 24 + 2 * _DB + 8)[0]
        if best is None or txnid > best[0]:
            best = (txnid, main_root)
    assert best is not None, "no meta page"
    return psize, best[1]


def _nodes(raw: bytes, psize: int, pgno: int) -> tuple[int, list[tuple[int, int, int, int, int]]]:
    """(page flags, [(node offset, lo, hi, flags, ksize)]) of page ``pgno``."""
    base = pgno * psize
    flags, lower = struct.unpack_from("<HH", raw, base + 10)
    out = []
    for i in range((lower - _HEADER) // 2):
        (at,) = struct.unpack_from("<H", raw, base + _HEADER + 2 * i)
        lo, hi, nflags, ksize = struct.unpack_from("<HHHH", raw, base + at)
        out.append((base + at, lo, hi, nflags, ksize))
    return flags, out


def _walk(raw: bytes, psize: int, root: int) -> list[KeySpan]:
    spans: list[KeySpan] = []
    todo = [root]
    while todo:
        pgno = todo.pop()
        flags, nodes = _nodes(raw, psize, pgno)
        if flags & _P_LEAF2:
            continue
        leaf = bool(flags & _P_LEAF)
        for i, (at, lo, hi, nflags, ksize) in enumerate(nodes):
            key = bytes(raw[at + 8 : at + 8 + ksize])
            if leaf:
                spans.append(KeySpan(pgno, True, at + 8, key))
            else:
                todo.append(lo | hi << 16 | nflags << 32)
                if i:  # a branch page's first key is empty (it stands for "everything below")
                    spans.append(KeySpan(pgno, False, at + 8, key))
    return spans


def _named_root(raw: bytes, psize: int, main_root: int, name: bytes) -> int:
    for span in _walk(raw, psize, main_root):
        if span.key == name:
            record = span.offset + len(name)
            return int(struct.unpack_from("<Q", raw, record + _ROOT_AT)[0])
    raise KeyError(name)


def key_spans(data_file: Path, db: str) -> list[KeySpan]:
    """Every key of the named database ``db`` in ``data_file``, leaves and branches, as stored."""
    raw = data_file.read_bytes()
    psize, main_root = _meta_root(raw)
    root = _named_root(raw, psize, main_root, db.encode())
    if root == _INVALID:
        return []
    return _walk(raw, psize, root)


def page_size(data_file: Path) -> int:
    """The page size ``data_file`` was written with."""
    return _meta_root(data_file.read_bytes())[0]


def db_pages(data_file: Path, db: str) -> set[int]:
    """The page numbers of ``db``'s tree (branch and leaf pages)."""
    return {span.page for span in key_spans(data_file, db)}
