"""Keys: how a scope and a version become LMDB keys.

A scope key is ``kind (1 byte) + id length (2 bytes, big-endian) + the id in
UTF-8``; a versioned key appends the version as 8 big-endian bytes, so keys
sort as bytes into one scope's history in version order and one range scan
reads it.
"""

from __future__ import annotations

import struct

from victor_actors._model import ScopeRef, StateScope

__all__ = [
    "HEAD_SUFFIX",
    "checkpoint_id",
    "head_key",
    "is_head",
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
    return int(_VERSION.unpack(bytes(key[-8:]))[0])


def checkpoint_id(ref: ScopeRef, version: int) -> str:
    return f"{ref}@{version}"


def place(db: str, key: bytes) -> bytes:
    """Where a record lives (its database and key): what its checksum binds it to."""
    return db.encode() + b"/" + key


# A scope's head record lives in the log database at the very end of the scope's range (the
# largest version suffix), next to its newest commit: moving it dirties no page the commit's own
# put does not already dirty. No commit ever has this version.
HEAD_SUFFIX = b"\xff" * 8


def head_key(ref: ScopeRef) -> bytes:
    return ref_key(ref) + HEAD_SUFFIX


def is_head(key: bytes) -> bool:
    return key.endswith(HEAD_SUFFIX)
