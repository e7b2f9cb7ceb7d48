"""The write-ahead log's file format: two header slots, then records; read and scanned here.

The log is ``data/wal.log`` beside ``data.mdb`` (a rewrite's swap moves it
with its data). Its layout::

    0 .. 4 KiB        header slot 0 }  the valid one with the higher generation is the header
    4 KiB .. 8 KiB    header slot 1 }  (generation g is written to slot g % 2)
    8 KiB ..          records, back to back, then zeros or records of older epochs

A **header** names the log (``log_id``, also kept in LMDB under
``meta/wal`` with the sequence number LMDB has applied), its generation, the
epoch of its records and where they start (``base``), the sequence number
LMDB held at its last sync (``synced``), the boot it was written in, whether the store was closed clean
(LMDB synced and nothing written since), and the first 256 bytes of LMDB's
two meta pages at that point with a digest of the main database's root page,
so that after a machine restart LMDB can be put back to that synced state
(``_walrecover.py``). It ends in a BLAKE2b digest of itself.

A **record** is one group commit's physical effect: every put and delete its
LMDB transaction made, in order. Framed as magic, length, sequence number,
the ops, and a BLAKE2b digest keyed with the log id over the epoch, the
frame and the ops: a record of an earlier epoch left in the file (the space
is reused after each checkpoint), or of another log, never passes as one of
this log's.
"""

from __future__ import annotations

import hashlib
import os
import struct
import uuid

import attrs

__all__ = [
    "DB_CODES",
    "HEADER_SLOT",
    "LOG_NAME",
    "META_BYTES",
    "RECORDS_START",
    "WAL_KEY",
    "Header",
    "LogRead",
    "boot_id",
    "decode_ops",
    "fsync_dir",
    "encode_ops",
    "frame",
    "pack_header",
    "read_log",
    "record_at",
]

LOG_NAME = "wal.log"
WAL_KEY = b"wal"  # in the meta database: log id (16 bytes) + applied sequence number (8, big-endian)
HEADER_SLOT = 4096
RECORDS_START = 2 * HEADER_SLOT
META_BYTES = 256  # of each LMDB meta page: its page header and MDB_meta (152 bytes) with room
# The databases a record may name, by code (the store's own; a new one is appended, never reordered).
DB_CODES = ("scopes", "log", "ckpt", "quarantine", "meta", "children", "chunks", "kv")
_CODE_OF = {name: i for i, name in enumerate(DB_CODES)}

_HEAD_MAGIC = b"VAWAL\x00\x01\x00"
# magic, generation, epoch, log id, base, synced, boot, clean, page size, root digest
_HEAD = struct.Struct("<8sQQ16sQQ16sB3xI16s")
_REC_MAGIC = b"VAWR"
_REC = struct.Struct("<4sIQ")  # magic, ops length, sequence number
_OP = struct.Struct("<BBHI")  # db code, kind (0 put, 1 delete), key length, value length
_DIGEST = 16
_PUT, _DELETE = 0, 1


def boot_id() -> bytes | None:
    """This boot of the machine (Linux's ``boot_id``), or None where the system does not say."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return uuid.UUID(f.read().strip()).bytes
    except (OSError, ValueError):
        return None


@attrs.frozen
class Header:
    generation: int  # of the header: one more at every header written
    epoch: int  # of the records: one more when the records are dropped (a checkpoint); in their digests
    log_id: bytes
    base: int  # the records of this epoch start at base + 1
    synced: int  # LMDB's applied sequence number at the meta pages below (synced then)
    boot: bytes
    clean: bool  # closed clean: LMDB synced at ``base`` and nothing written after it
    psize: int
    root_digest: bytes  # of the main database's root page at that point
    metas: tuple[bytes, bytes]  # the first META_BYTES of LMDB's meta pages 0 and 1 at that point


def pack_header(h: Header) -> bytes:
    body = _HEAD.pack(
        _HEAD_MAGIC,
        h.generation,
        h.epoch,
        h.log_id,
        h.base,
        h.synced,
        h.boot,
        int(h.clean),
        h.psize,
        h.root_digest,
    ) + b"".join(m.ljust(META_BYTES, b"\x00")[:META_BYTES] for m in h.metas)
    return (body + hashlib.blake2b(body, digest_size=_DIGEST).digest()).ljust(HEADER_SLOT, b"\x00")


def _unpack_header(raw: bytes) -> Header | None:
    n = _HEAD.size + 2 * META_BYTES
    if len(raw) < n + _DIGEST:
        return None
    body = raw[:n]
    if hashlib.blake2b(body, digest_size=_DIGEST).digest() != raw[n : n + _DIGEST]:
        return None
    magic, gen, epoch, log_id, base, synced, boot, clean, psize, root = _HEAD.unpack_from(body)
    if magic != _HEAD_MAGIC:
        return None
    metas = (body[_HEAD.size : _HEAD.size + META_BYTES], body[_HEAD.size + META_BYTES :])
    return Header(gen, epoch, log_id, base, synced, boot, bool(clean), psize, root, metas)


def encode_ops(ops: list[tuple[str, bytes, bytes | None]]) -> bytes:
    """One group's puts and deletes (``value`` None) as a record's body."""
    parts = []
    for db, key, value in ops:
        if value is None:
            parts.append(_OP.pack(_CODE_OF[db], _DELETE, len(key), 0))
            parts.append(key)
        else:
            parts.append(_OP.pack(_CODE_OF[db], _PUT, len(key), len(value)))
            parts.append(key)
            parts.append(value)
    return b"".join(parts)


def decode_ops(body: bytes) -> list[tuple[str, bytes, bytes | None]]:
    """The ops of a record's body (whose digest passed). ValueError if they do not parse."""
    out: list[tuple[str, bytes, bytes | None]] = []
    pos, end = 0, len(body)
    while pos < end:
        code, kind, klen, vlen = _OP.unpack_from(body, pos)
        pos += _OP.size
        if code >= len(DB_CODES) or kind not in (_PUT, _DELETE) or pos + klen + vlen > end:
            raise ValueError(f"an op at byte {pos - _OP.size} of a record does not parse")
        key = body[pos : pos + klen]
        pos += klen
        value = None
        if kind == _PUT:
            value = body[pos : pos + vlen]
            pos += vlen
        out.append((DB_CODES[code], key, value))
    return out


def _digest(log_id: bytes, epoch: int, head: bytes, body: bytes) -> bytes:
    h = hashlib.blake2b(key=log_id, digest_size=_DIGEST)
    h.update(epoch.to_bytes(8, "big"))
    h.update(head)
    h.update(body)
    return h.digest()


def frame(log_id: bytes, epoch: int, seq: int, body: bytes) -> bytes:
    """A record as written: frame header, ops, digest."""
    head = _REC.pack(_REC_MAGIC, len(body), seq)
    return head + body + _digest(log_id, epoch, head, body)


def record_at(data: bytes, pos: int, log_id: bytes, epoch: int) -> tuple[int, bytes, int] | None:
    """(sequence number, body, next offset) of a valid record of this log and epoch at ``pos``."""
    if pos + _REC.size + _DIGEST > len(data):
        return None
    magic, length, seq = _REC.unpack_from(data, pos)
    end = pos + _REC.size + length
    if magic != _REC_MAGIC or end + _DIGEST > len(data):
        return None
    head = data[pos : pos + _REC.size]
    body = data[pos + _REC.size : end]
    if _digest(log_id, epoch, head, body) != data[end : end + _DIGEST]:
        return None
    return seq, body, end + _DIGEST


@attrs.frozen
class LogRead:
    """What a log file holds: its header (None: no valid one) and its records in order.

    ``end`` is the offset after the last good record. ``damage`` says why a
    record is bad when a good record of this log follows it (flipped bytes,
    not a torn tail), or when sequence numbers are not contiguous; ``garbage``
    is set when no header is valid but the header region is not all zeros.
    """

    header: Header | None
    records: tuple[tuple[int, bytes], ...]
    end: int
    size: int
    damage: str | None
    garbage: bool


def read_log(path: str) -> LogRead | None:
    """Read and scan the log at ``path`` (None: there is none)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    heads = [_unpack_header(data[i * HEADER_SLOT : (i + 1) * HEADER_SLOT]) for i in (0, 1)]
    valid = [h for i, h in enumerate(heads) if h is not None and h.generation % 2 == i]
    if not valid:
        garbage = any(data[:RECORDS_START])
        return LogRead(None, (), RECORDS_START, len(data), None, garbage)
    header = max(valid, key=lambda h: h.generation)
    records: list[tuple[int, bytes]] = []
    pos, expected = RECORDS_START, header.base + 1
    damage = None
    while (found := record_at(data, pos, header.log_id, header.epoch)) is not None:
        seq, body, nxt = found
        if seq != expected:
            damage = f"record {len(records) + 1} at byte {pos} has sequence number {seq}, not {expected}"
            break
        records.append((seq, body))
        pos, expected = nxt, expected + 1
    if damage is None:
        at = data.find(_REC_MAGIC, pos + 1)
        while at != -1:  # a good record past the end: what ended the scan was damage, not a torn tail
            # records of earlier epochs (the space is reused) have lower numbers: skipped unchecked
            later = None
            if at + _REC.size <= len(data) and _REC.unpack_from(data, at)[2] >= expected:
                later = record_at(data, at, header.log_id, header.epoch)
            if later is not None:
                damage = (
                    f"the record at byte {pos} (sequence number {expected}) fails its check, "
                    f"and a good record (sequence number {later[0]}) follows it at byte {at}"
                )
                break
            at = data.find(_REC_MAGIC, at + 1)
    return LogRead(header, tuple(records), pos, len(data), damage, False)


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
