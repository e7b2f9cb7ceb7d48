"""A scope's head record: its newest committed version, kept apart from its commit records.

The head lives in the ``log`` database at the scope key + ``00`` x 8 (version
0, which no commit has), at the start of the scope's range, so a commit's
put and the head's share a page on a short log. It is 12 bytes: the version
and a CRC-32 over its place and the version (sealed like any record in an
encrypted store).

What recovery may conclude from it (docs/adr/0023):

- Every scope record has a head, from the transaction that creates the scope
  (version 0) on (store format 3; a writable open of an older store gives
  every scope that has none and holds no commit or checkpoint a head at 0).
  So a scope whose head cannot be found is damaged, never new: recovery
  reports it, and a writable manager refuses to serve it
  (``CheckpointCorruptError``) rather than load it short and write new
  commits over the ones it cannot see.
- A put into a page with a damaged key can leave a second node with the
  head's key beside a stale one; every head record found is read and the
  newest that passes its check counts, and any that fails its check is
  reported.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterable

from victor_actors._errors import CheckpointCorruptError
from victor_actors.store._keys import place

__all__ = ["HEADED_FORMAT", "encode_head", "decode_head", "newest_head"]

HEADED_FORMAT = 3  # the store format from which every scope record has a head
_HEAD = struct.Struct(">QI")  # version, crc32 over place + version


def _crc(key: bytes, version: int) -> int:
    return zlib.crc32(struct.pack(">Q", version), zlib.crc32(place("log", key)))


def encode_head(key: bytes, version: int) -> bytes:
    """The (plain) head record saying ``version``, for the head key ``key``."""
    return _HEAD.pack(version, _crc(key, version))


def decode_head(raw: bytes, key: bytes, ref: object, what: str | None = None) -> int:
    """The version a plain head record stored at ``key`` holds (``what`` names it in errors).

    Raises:
        CheckpointCorruptError: it is damaged (wrong length or checksum).
    """
    what = what or f"the head record of {ref}"
    if len(raw) != _HEAD.size:
        raise CheckpointCorruptError(f"{what} is damaged (length {len(raw)})", ref=ref)
    version, crc = _HEAD.unpack(raw)
    if _crc(key, version) != crc:
        raise CheckpointCorruptError(f"{what} fails its checksum", ref=ref)
    return int(version)


def newest_head(
    ref: object, key: bytes, sealed: Iterable[bytes], unseal: Callable[[bytes], bytes]
) -> tuple[int | None, str | None]:
    """``(version, note)`` from every head record found at ``key``: the newest good one, and
    what was wrong with the others (None when nothing was). ``(None, None)``: none was found."""
    best: int | None = None
    notes: list[str] = []
    for raw in sealed:
        try:
            version = decode_head(unseal(raw), key, ref)
        except CheckpointCorruptError as exc:
            notes.append(str(exc))
            continue
        best = version if best is None else max(best, version)
    return best, "; ".join(notes) or None
