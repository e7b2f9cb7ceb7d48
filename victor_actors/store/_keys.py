"""Keys: how a scope and a version become LMDB keys.

A scope key is ``kind (1 byte) + id length (2 bytes, big-endian) + the id in
UTF-8``; a versioned key appends the version as 8 big-endian bytes, so keys
sort as bytes into one scope's history in version order and one range scan
reads it.
"""

from __future__ import annotations

import hashlib
import hmac
import struct

from victor_actors._model import ScopeRef, StateScope

__all__ = [
    "HEAD_SUFFIX",
    "ROOT_PARENT",
    "checkpoint_id",
    "head_key",
    "is_head",
    "level_byte",
    "plain_prefix_start",
    "place",
    "ref_from_key",
    "ref_key",
    "version_of",
    "versioned_key",
]

_KIND = {StateScope.GLOBAL: 0, StateScope.TEAM: 1, StateScope.WORKFLOW: 2, StateScope.CONVERSATION: 3}
_KIND_BACK = {v: k for k, v in _KIND.items()}
_VERSION = struct.Struct(">Q")
_PREFIX = struct.Struct(">BH")


def ref_key(ref: ScopeRef) -> bytes:
    ident = ref.id.encode("utf-8")
    return _PREFIX.pack(_KIND[ref.scope], len(ident)) + ident


def ref_from_key(key: bytes) -> ScopeRef:
    kind, n = _PREFIX.unpack_from(key)
    return ScopeRef(_KIND_BACK[kind], bytes(key[_PREFIX.size : _PREFIX.size + n]).decode("utf-8"))


def versioned_key(ref: ScopeRef, version: int) -> bytes:
    return ref_key(ref) + _VERSION.pack(version)


def version_of(key: bytes) -> int:
    """The version a versioned key ends with (total: a damaged, short key reads as some version,
    and the record under it then fails its checksum, which binds it to its key)."""
    return int.from_bytes(bytes(key[-8:]), "big")


def checkpoint_id(ref: ScopeRef, version: int) -> str:
    return f"{ref}@{version}"


def place(db: str, key: bytes) -> bytes:
    """Where a record lives (its database and key): what its checksum binds it to."""
    return db.encode() + b"/" + key


# A scope's head record lives in the log database at the start of the scope's range (version 0,
# which no commit has). There, new commits still append at the end of the range, so LMDB's
# append split keeps the log's pages full; a head at the end of the range made every commit an
# insert before it, and half-empty pages. A short scope's range fits in one page, which each
# commit dirties anyway.
HEAD_SUFFIX = b"\x00" * 8


def head_key(ref: ScopeRef) -> bytes:
    return ref_key(ref) + HEAD_SUFFIX


def is_head(key: bytes) -> bool:
    return key.endswith(HEAD_SUFFIX)


# An encrypted store's scope key: the level byte and the first 16 bytes (128 bits) of the HMAC, as
# truncated HMAC-SHA-256 is used for identifiers elsewhere; a collision among even a billion scopes
# has a chance of about 1e-21.
_HASHED_ID = 16


class Layout:
    """How one store spells its keys: with the scope id (plaintext) or a keyed hash of it (encrypted).

    An encrypted store's scope key is the level byte and HMAC-SHA-256 of the
    id under ``id_key``, truncated to 128 bits: no id is readable from a key. Both spellings are
    followed by the big-endian version (or the head suffix), so a scope's
    history is one range scan either way.
    """

    __slots__ = ("id_key",)

    def __init__(self, id_key: bytes | None = None) -> None:
        self.id_key = id_key

    @property
    def hashed(self) -> bool:
        return self.id_key is not None

    def ref_key(self, ref: ScopeRef) -> bytes:
        if self.id_key is None:
            return ref_key(ref)
        digest = hmac.new(self.id_key, ref.id.encode("utf-8"), hashlib.sha256).digest()
        return bytes([_KIND[ref.scope]]) + digest[:_HASHED_ID]

    def versioned_key(self, ref: ScopeRef, version: int) -> bytes:
        return self.ref_key(ref) + _VERSION.pack(version)

    def head_key(self, ref: ScopeRef) -> bytes:
        return self.ref_key(ref) + HEAD_SUFFIX

    def prefix_of(self, key: bytes) -> bytes:
        """The scope part of a versioned (or head) key."""
        if self.id_key is not None:
            return bytes(key[: 1 + _HASHED_ID])
        _kind, n = _PREFIX.unpack_from(key)
        return bytes(key[: _PREFIX.size + n])


PLAIN = Layout()

# The ``children`` index: the parent's scope key (or this, for a scope with no parent) followed by
# the child's scope key. No scope key starts with 0xff (its first byte is the level, 0 to 3), and a
# scope key is self-delimiting (plaintext: its length is in it; encrypted: always 17 bytes), so one
# parent's children are exactly the keys under its prefix.
ROOT_PARENT = b"\xff"


def level_byte(level: StateScope) -> bytes:
    """The first byte of every scope key of ``level`` (either layout)."""
    return bytes([_KIND[level]])


def plain_prefix_start(level: StateScope, id_bytes: int, prefix: bytes) -> bytes:
    """Where the plaintext keys of ``level`` with an id ``id_bytes`` long starting with ``prefix`` begin."""
    return _PREFIX.pack(_KIND[level], id_bytes) + prefix
