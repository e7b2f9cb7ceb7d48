"""The store's ``meta`` record: whether it is encrypted, under which keys, which store it is.

It is msgpack in the ``meta`` database, under ``b"format"``, in the clear
(it has to be read before any key is known)::

    plaintext   {"format": 3, "encrypted": False}
    encrypted   {"format": 3, "encrypted": True, "id_key": "<key id>", "store": <16 random bytes>,
                 "check": sealed(META_CHECK + msgpack of every other field, sorted)}
    before store ids (still opened, never created)
                {"format": 1, 2 or 3, "encrypted": True, "id_key": "<key id>", "check": sealed(KEY_CHECK)}

**Authenticated as a whole.** Everything the open trusts is under the
check: it is sealed (format 2, so bound to the store id and to the meta
record's own place) over every other field, and an open compares the fields
it reads in the clear with the ones it unseals. Changing ``id_key`` (to
another key of the ring, say), ``format`` or ``encrypted``, or replacing the
store id, is refused with :class:`CheckpointCorruptError` (the keys opened
the check, so it is the record that was altered) or, when the check no
longer opens, with :class:`EncryptionKeyError`; nothing is opened or changed.

**Before store ids**, the check is a constant sealed with the key that was
active when the store was created, which is also the store's id key; so
``id_key`` is authenticated there too: it must name the key the check's
(authenticated) header names. The ``format`` field of such a store is not
covered; a wrong one makes a writable open move it to 3 again, or (3 read as 2) makes
recovery take a scope without a head for one never committed, as before format 3.

**A plaintext store** has no key to authenticate with. A meta record that
says ``encrypted: False`` but carries an ``id_key``, a ``store`` or a
``check`` was altered, and is refused. One that was replaced or deleted
outright looks like a plaintext store's: the store refuses to open as
plaintext when the first records of its databases are sealed (``Store``),
and a rewrite refuses any record that does not read as plaintext
(``_rewrite.py``), so no flag in this record can make a rewrite or an open
treat sealed records as absent.
"""

from __future__ import annotations

import os
from typing import Any

import msgpack

from victor_actors._errors import CheckpointCorruptError, EncryptionKeyError
from victor_actors.store._crypto import STORE_ID_BYTES, Keyring, Sealer, sealed_key_id
from victor_actors.store._keys import Layout, place

__all__ = [
    "FORMAT",
    "FORMATS",
    "META_KEY",
    "is_encrypted",
    "keys_for",
    "new_encrypted",
    "pack",
    "parse",
    "store_id_of",
    "upgraded",
    "with_record_limit",
]

META_KEY = b"format"
# The store's format: 1 wrote full checkpoints; 2 (incremental checkpoints: manifests, chunks, kv)
# reads both; 3 gives every scope a head from its creation on (``_heads.py``). A writable open
# moves a store to the newest format, after which code that knows only older ones refuses it.
FORMAT = 3
FORMATS = (1, 2, 3)
KEY_CHECK = b"victor-actors keyring check v1"  # before store ids: do the keys fit?
META_CHECK = b"victor-actors meta v2"  # since store ids: the fields below, authenticated
_PLAIN_FIELDS = frozenset({"format", "encrypted"})
_LEGACY_FIELDS = frozenset({"format", "encrypted", "id_key", "check"})
_FIELDS = frozenset({"format", "encrypted", "id_key", "store", "check"})
# optional in every record: the largest record limit the store was written with (docs/adr/0023)
LIMIT = "max_record_bytes"
WHERE = place("meta", META_KEY)

Meta = dict[str, Any]


def pack(meta: Meta) -> bytes:
    return bytes(msgpack.packb(meta, use_bin_type=True))


def parse(raw: bytes | None, path: str) -> Meta | None:
    """The meta record's fields, checked for shape (None: a store from before meta records).

    Raises:
        CheckpointCorruptError: it does not decode, or its fields are not
            those of any meta record (a plaintext one carrying key fields
            among them); nothing was opened.
    """
    if raw is None:
        return None

    def refuse(why: str) -> CheckpointCorruptError:
        return CheckpointCorruptError(f"the meta record of the store at {path!r} {why}; nothing was opened")

    try:
        meta = msgpack.unpackb(raw, raw=False)
    except Exception as exc:
        raise refuse(f"is unreadable ({type(exc).__name__})") from None
    if not isinstance(meta, dict) or not all(isinstance(k, str) for k in meta):
        raise refuse("is not a mapping of field names")
    if meta.get("format") not in FORMATS or type(meta.get("format")) is not int:
        raise refuse(f"names no known format (not {' or '.join(map(str, FORMATS))})")
    encrypted = meta.get("encrypted")
    if type(encrypted) is not bool:
        raise refuse("does not say whether the store is encrypted")
    fields = frozenset(meta) - {LIMIT}
    if LIMIT in meta and (type(meta[LIMIT]) is not int or meta[LIMIT] <= 0):
        raise refuse("has a record limit that is not a positive integer")
    if not encrypted:
        if fields - _PLAIN_FIELDS:
            raise refuse(
                f"says the store is not encrypted but carries {sorted(fields - _PLAIN_FIELDS)}: it was "
                "altered (restore the record, or the store, from a copy)"
            )
        return meta
    if fields not in (_FIELDS, _LEGACY_FIELDS):
        raise refuse(f"has the fields {sorted(fields)}, not those of an encrypted store's")
    if not isinstance(meta["id_key"], str) or not isinstance(meta["check"], bytes):
        raise refuse("has an id key or a check of the wrong type")
    if "store" in meta and (not isinstance(meta["store"], bytes) or len(meta["store"]) != STORE_ID_BYTES):
        raise refuse(f"has a store id that is not {STORE_ID_BYTES} bytes")
    return meta


def is_encrypted(meta: Meta | None) -> bool:
    return meta is not None and bool(meta["encrypted"])


def store_id_of(meta: Meta | None) -> bytes | None:
    """The store's id (None: plaintext, or encrypted before store ids)."""
    return None if meta is None else meta.get("store")


def _covered(meta: Meta) -> bytes:
    """What the check authenticates: every field but the check itself, in a fixed order."""
    return META_CHECK + bytes(
        msgpack.packb(sorted((k, v) for k, v in meta.items() if k != "check"), use_bin_type=True)
    )


def new_encrypted(keyring: Keyring) -> Meta:
    """The meta record of a new encrypted store: a fresh random store id, ids hashed under the active key."""
    meta: Meta = {
        "format": FORMAT,
        "encrypted": True,
        "id_key": keyring.active,
        "store": os.urandom(STORE_ID_BYTES),
    }
    meta["check"] = Sealer(keyring, meta["store"]).seal(_covered(meta), WHERE)
    return meta


def upgraded(meta: Meta | None, sealer: Sealer) -> Meta | None:
    """The meta record a writable open writes (None: the one stored stays): format moved to ``FORMAT``."""
    if meta is None:
        return {"format": FORMAT, "encrypted": False}
    if meta["format"] == FORMAT:
        return None
    new = {k: v for k, v in meta.items() if k != "check"} | {"format": FORMAT}
    if "store" in meta:  # authenticated as a whole: sealed again over the new fields
        new["check"] = sealer.seal(_covered(new), WHERE)
    elif "check" in meta:
        new["check"] = meta["check"]  # before store ids: the check does not cover the format
    return new


def with_record_limit(meta: Meta | None, limit: int, sealer: Sealer) -> Meta:
    """``meta`` recording ``limit`` as the store's record limit (its check sealed again over it
    when the check covers every field; before store ids it covers none of them)."""
    new = {k: v for k, v in (meta or {"format": FORMAT, "encrypted": False}).items() if k != "check"}
    new[LIMIT] = limit
    if meta is not None and "store" in meta:
        new["check"] = sealer.seal(_covered(new), WHERE)
    elif meta is not None and "check" in meta:
        new["check"] = meta["check"]
    return new


def keys_for(meta: Meta, keyring: Keyring, path: str) -> tuple[Layout, Sealer]:
    """The layout and sealer of the encrypted store ``meta`` describes, once ``keyring`` opens its check.

    Raises:
        EncryptionKeyError: the keys do not open the check (they are not the
            store's, or the check or the store id was altered).
        CheckpointCorruptError: the check opens, but the fields read in the
            clear are not the ones it seals (the record was altered).
    """
    check: bytes = meta["check"]
    store_id = store_id_of(meta)
    key_id = sealed_key_id(check)
    if key_id is not None and key_id not in keyring:
        raise EncryptionKeyError(
            f"the store at {path!r} is sealed under key {key_id!r}, which this keyring lacks "
            f"(it has {sorted(keyring.key_ids)}); nothing was opened"
        )
    sealer = Sealer(keyring, store_id)
    try:
        plain: bytes | None = sealer.open(check, WHERE, "the meta record's check")
    except CheckpointCorruptError:
        plain = None
    if plain is None or (store_id is None and plain != KEY_CHECK):
        raise EncryptionKeyError(
            f"the keys given do not open the store at {path!r} (key ids {sorted(keyring.key_ids)}; "
            f"its scope ids are under key {meta['id_key']!r}), or its meta record was altered; "
            "nothing was opened"
        )
    if store_id is None:
        if key_id != meta["id_key"]:
            raise CheckpointCorruptError(
                f"the meta record of the store at {path!r} was altered: it names {meta['id_key']!r} as the "
                f"key its scope ids are hashed under, but the store was created under {key_id!r}; "
                "nothing was opened"
            )
        return Layout(keyring.id_key(meta["id_key"])), sealer
    if plain != _covered(meta):
        raise CheckpointCorruptError(
            f"the meta record of the store at {path!r} was altered: {_differences(plain, meta)} "
            "differ from the values its check seals; nothing was opened"
        )
    return Layout(keyring.id_key(meta["id_key"], salt=store_id)), sealer


def _differences(plain: bytes, meta: Meta) -> str:
    """Which fields differ between the sealed copy and the record (names only, never values)."""
    try:
        sealed = dict(msgpack.unpackb(plain[len(META_CHECK) :], raw=False))
    except Exception:
        return "its fields"
    names = sorted(k for k in set(sealed) | set(meta) - {"check"} if sealed.get(k) != meta.get(k))
    return ", ".join(names) or "its fields"
