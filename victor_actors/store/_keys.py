"""Keys: how a scope and a version become LMDB keys.

A scope key is ``kind (1 byte) + id length (2 bytes, big-endian) + the id in
UTF-8``; a versioned key appends the version as 8 big-endian bytes, so keys
sort as bytes into one scope's history in version order and one range scan
reads it.
"""

from __future__ import annotations

import struct

from victor_actors._model import ScopeRef, StateScope

__all__ = ["checkpoint_id", "place", "ref_from_key", "ref_key", "version_of", "versioned_key"]

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
    return int(_VERSION.unpack(bytes(key[-8:]))[0])


def checkpoint_id(ref: ScopeRef, version: int) -> str:
    return f"{ref}@{version}"


def place(db: str, key: bytes) -> bytes:
    """Where a record lives (its database and key): what its checksum binds it to."""
    return db.encode() + b"/" + key
