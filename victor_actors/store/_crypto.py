"""Encryption at rest: the keyring, sealed records, and keyed hashes in place of scope ids.

A sealed record is::

    b"VE" | format (1) | key id length (1) | key id (UTF-8) | nonce (12) | AES-256-GCM ciphertext + tag

The plaintext is the record as the codec frames it (compressed before it is
encrypted, with its own checksum). The associated data is the header (so the
key id and the format cannot be swapped), then, in format 2, the store's id
(16 random bytes named in its ``meta`` record), then the record's place, its
database name and LMDB key: a valid record copied to another key, scope,
version, database or store fails authentication. Every record gets a fresh
random 96-bit nonce. Format 1 (no store id) is what stores created before
store ids hold; such a store goes on reading and writing format 1, and a
store with an id accepts only format 2 (see ``_meta.py``).

With encryption on, LMDB keys carry no scope id: a scope key is its level
byte and an HMAC-SHA-256 of the id (its first 128 bits) under a key derived (HKDF-SHA-256,
salted with the store id when there is one) from one key of the keyring, the
*id key*, which the store's ``meta`` record names. The id itself lives only
inside the encrypted scope record. Version suffixes stay big-endian, so a
scope's history is still one range scan.

Keys never appear in a repr, a log line or an error message: only key ids do.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import stat
from collections.abc import Callable, Mapping
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from victor_actors._errors import CheckpointCorruptError, EncryptionKeyError

__all__ = [
    "PLAIN_MAGIC",
    "SEALED_MAGIC",
    "STORE_ID_BYTES",
    "Keyring",
    "Sealer",
    "looks_sealed",
    "sealed_key_id",
]

SEALED_MAGIC = b"VE"
PLAIN_MAGIC = b"VA"
_UNBOUND = 1  # format 1: the associated data is the header and the place
_BOUND = 2  # format 2: the header, the store id, the place
_NONCE = 12
KEY_BYTES = 32
STORE_ID_BYTES = 16
MAX_KEY_FILE_BYTES = 1 << 20  # a key file of a thousand keys is ~60 KiB


def _check_id(key_id: object) -> str:
    if not isinstance(key_id, str) or not key_id or len(key_id.encode("utf-8", "surrogatepass")) > 64:
        raise EncryptionKeyError(f"a key id is a non-empty str of at most 64 bytes, not {key_id!r}")
    try:
        key_id.encode("utf-8")
    except UnicodeEncodeError:
        raise EncryptionKeyError(f"the key id {key_id!r} cannot be encoded as UTF-8") from None
    return key_id


class Keyring:
    """Named 32-byte keys, one of them active (new records are sealed with it).

    ``Keyring({"2026-12": key_b, "2026-06": key_a}, active="2026-12")``; the
    other keys stay to open records sealed before a rotation. The repr names
    the key ids, never the keys.

    Raises:
        EncryptionKeyError: a key is not 32 bytes, an id is empty or too
            long, or ``active`` is not one of the ids.
    """

    __slots__ = ("_aead", "_keys", "active")

    def __init__(self, keys: Mapping[str, bytes], active: str) -> None:
        if not isinstance(keys, Mapping) or not keys:
            raise EncryptionKeyError("a keyring needs at least one key")
        checked: dict[str, bytes] = {}
        for key_id, key in keys.items():
            _check_id(key_id)
            if not isinstance(key, (bytes, bytearray)) or len(key) != KEY_BYTES:
                size = len(key) if isinstance(key, (bytes, bytearray)) else type(key).__name__
                raise EncryptionKeyError(f"key {key_id!r} must be {KEY_BYTES} bytes, not {size}")
            checked[key_id] = bytes(key)
        if active not in checked:
            raise EncryptionKeyError(f"the active key {active!r} is not in the keyring ({sorted(checked)})")
        self._keys = checked
        self.active = active
        self._aead = {key_id: AESGCM(key) for key_id, key in checked.items()}

    # -- construction --------------------------------------------------------

    @staticmethod
    def generate_key() -> bytes:
        """A fresh random 32-byte key."""
        return AESGCM.generate_key(bit_length=256)

    @classmethod
    def from_json(cls, text: str, *, source: str = "the key text") -> Keyring:
        """A keyring from the key file format (see :meth:`from_file`).

        Raises:
            EncryptionKeyError: ``text`` is not a key file (bad JSON, nested
                without end, fields missing or of the wrong type, keys that are
                not base64 of 32 bytes); the message says which.
        """
        expected = '{"active": "<id>", "keys": {"<id>": "<base64 of 32 bytes>", ...}}'

        def refuse(why: str) -> EncryptionKeyError:
            return EncryptionKeyError(
                f"{source} is not a victor_actors key file ({why}); expected {expected}"
            )

        if not isinstance(text, str):
            raise refuse(f"a str is expected, not {type(text).__name__}")
        try:
            doc = json.loads(text)
        except RecursionError:
            raise refuse("JSON nested too deeply") from None
        except ValueError as exc:
            raise refuse(f"not JSON: {type(exc).__name__}") from None
        if not isinstance(doc, dict):
            raise refuse(f"the document is a JSON {type(doc).__name__}, not an object")
        entries, active = doc.get("keys"), doc.get("active")
        if not isinstance(entries, dict) or not entries:
            raise refuse('"keys" is not a non-empty object')
        if not isinstance(active, str):
            raise refuse('"active" is not a string')
        try:
            return cls._from_doc(entries, active, refuse)
        except EncryptionKeyError as exc:
            if str(exc).startswith(source):
                raise
            raise EncryptionKeyError(f"{source} is not a usable key file: {exc}") from None

    @classmethod
    def _from_doc(
        cls, entries: dict[str, Any], active: str, refuse: Callable[[str], EncryptionKeyError]
    ) -> Keyring:
        keys: dict[str, bytes] = {}
        for key_id, value in entries.items():
            if not isinstance(value, str):
                raise refuse(
                    f"key {_check_id(key_id)!r} is a JSON {type(value).__name__}, not a base64 string"
                )
            try:
                keys[key_id] = base64.b64decode(value.encode("ascii"), validate=True)
            except (ValueError, binascii.Error):
                raise refuse(f"key {_check_id(key_id)!r} is not valid base64") from None
        return cls(keys, active)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Keyring:
        """Read a key file: JSON ``{"active": "<id>", "keys": {"<id>": "<base64 key>", ...}}``.

        Raises:
            EncryptionKeyError: the file is missing or unreadable, not a
                regular file, readable by anyone but its owner (it must be
                mode 0600 or stricter), larger than a key file can be, not
                UTF-8, or malformed.
        """
        try:
            name = os.fspath(path)
        except TypeError:
            raise EncryptionKeyError(f"a key file is a path, not {type(path).__name__}") from None
        shown = repr(name)
        try:
            fd = os.open(name, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        except (OSError, ValueError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise EncryptionKeyError(f"cannot read the key file {shown}: {why}") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
                raise EncryptionKeyError(f"the key file {shown} is {kind}; nothing was read")
            if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
                raise EncryptionKeyError(
                    f"the key file {shown} is accessible to others (mode {stat.S_IMODE(info.st_mode):o}); "
                    f"make it private with chmod 600 {name}"
                )
            if info.st_size > MAX_KEY_FILE_BYTES:
                raise EncryptionKeyError(
                    f"the key file {shown} holds {info.st_size} bytes; a key file is at most "
                    f"{MAX_KEY_FILE_BYTES}; nothing was read"
                )
            chunks = []
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
                if sum(map(len, chunks)) > MAX_KEY_FILE_BYTES:
                    raise EncryptionKeyError(f"the key file {shown} grew past {MAX_KEY_FILE_BYTES} bytes")
        except OSError as exc:
            raise EncryptionKeyError(f"cannot read the key file {shown}: {exc.strerror or exc}") from None
        finally:
            os.close(fd)
        try:
            text = b"".join(chunks).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise EncryptionKeyError(
                f"the key file {shown} is not UTF-8 text (byte {exc.start}); expected the JSON of a key file"
            ) from None
        return cls.from_json(text, source=f"the key file {shown}")

    @classmethod
    def from_env(cls, name: str = "VICTOR_ACTORS_KEYS") -> Keyring:
        """A keyring from an environment variable holding the key file's JSON.

        Raises:
            EncryptionKeyError: the variable is unset or malformed.
        """
        text = os.environ.get(name)
        if not text:
            raise EncryptionKeyError(f"the environment variable {name} is not set")
        if len(text) > MAX_KEY_FILE_BYTES:
            raise EncryptionKeyError(f"the environment variable {name} is longer than a key file can be")
        return cls.from_json(text, source=f"the environment variable {name}")

    def to_json(self) -> str:
        """The key file format (for writing a key file: keep it mode 0600)."""
        keys = {k: base64.b64encode(v).decode("ascii") for k, v in self._keys.items()}
        return json.dumps({"active": self.active, "keys": keys}, indent=2)

    def write_file(self, path: str | os.PathLike[str]) -> None:
        """Write the key file, created with mode 0600."""
        fd = os.open(os.fspath(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(self.to_json())

    # -- use -----------------------------------------------------------------

    @property
    def key_ids(self) -> tuple[str, ...]:
        return tuple(self._keys)

    def __contains__(self, key_id: object) -> bool:
        return key_id in self._keys

    def __repr__(self) -> str:
        return f"Keyring(key ids {sorted(self._keys)}, active={self.active!r})"

    def __reduce__(self) -> Any:
        raise TypeError("a Keyring is never pickled")

    def id_key(self, key_id: str, salt: bytes | None = None) -> bytes:
        """The key scope ids are hashed with when ``key_id`` names the store's id key.

        ``salt`` is the store's id (None for a store from before store ids):
        two stores under one keyring hash the same scope id differently.
        """
        key = self._keys.get(key_id) if isinstance(key_id, str) else None
        if key is None:
            raise EncryptionKeyError(
                f"the store's scope ids are hashed under key {key_id!r}, which this keyring lacks "
                f"(it has {sorted(self._keys)}); nothing was opened"
            )
        hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=salt, info=b"victor-actors scope ids v1")
        return hkdf.derive(key)

    def with_keys(self, other: Keyring) -> Keyring:
        """This keyring, plus the keys of ``other`` under ids it lacks (its own keys win; same active)."""
        keys = {k: v for k, v in other._keys.items() if k not in self._keys}
        return Keyring({**self._keys, **keys}, self.active)

    def aead(self, key_id: str) -> AESGCM | None:
        return self._aead.get(key_id)


def looks_sealed(raw: bytes) -> bool:
    """Whether ``raw`` has the shape of a sealed record (magic, a known format, a key id, a tag)."""
    if len(raw) < 4 or bytes(raw[:2]) != SEALED_MAGIC or raw[2] not in (_UNBOUND, _BOUND) or not raw[3]:
        return False
    return len(raw) >= 4 + raw[3] + _NONCE + 16


def sealed_key_id(raw: bytes) -> str | None:
    """The key id a sealed record's header names (None if it is not shaped as one)."""
    if not looks_sealed(raw):
        return None
    try:
        return bytes(raw[4 : 4 + raw[3]]).decode("utf-8")
    except UnicodeDecodeError:
        return None


class Sealer:
    """Seals and opens records for one store: AES-256-GCM bound to each record's place and store.

    With ``keyring=None`` (a plaintext store) it passes plaintext records
    through and refuses sealed ones; with a keyring it seals with the active
    key, opens with the key the header names, and refuses plaintext records
    (never trusted in an encrypted store). With ``store_id`` (every store
    created since store ids) it seals in format 2, the store id in the
    associated data, and opens format 2 only; without, format 1 only. Every
    refusal is a :class:`CheckpointCorruptError` with the reason, as for damage.
    """

    __slots__ = ("keyring", "store_id")

    def __init__(self, keyring: Keyring | None, store_id: bytes | None = None) -> None:
        if store_id is not None and len(store_id) != STORE_ID_BYTES:
            raise ValueError(f"a store id is {STORE_ID_BYTES} bytes")
        self.keyring = keyring
        self.store_id = store_id

    @property
    def encrypted(self) -> bool:
        return self.keyring is not None

    def seal(self, raw: bytes, place: bytes) -> bytes:
        keyring = self.keyring
        if keyring is None:
            return raw
        key_id = keyring.active.encode("utf-8")
        fmt = _UNBOUND if self.store_id is None else _BOUND
        head = SEALED_MAGIC + bytes([fmt, len(key_id)]) + key_id
        nonce = os.urandom(_NONCE)
        aead = keyring.aead(keyring.active)
        assert aead is not None
        return head + nonce + aead.encrypt(nonce, raw, head + (self.store_id or b"") + place)

    def open(self, raw: bytes, place: bytes, what: str) -> bytes:
        """The plaintext record stored at ``place``; ``what`` names it in errors.

        Raises:
            CheckpointCorruptError: not sealed as this store requires, sealed
                with an unknown key, for another store, tampered with, or
                moved from another place.
        """
        keyring = self.keyring
        magic = bytes(raw[:2])
        if keyring is None:
            if magic == SEALED_MAGIC:
                raise CheckpointCorruptError(
                    f"{what} is encrypted, but this store is not; nothing was loaded"
                )
            return raw
        if magic != SEALED_MAGIC:
            raise CheckpointCorruptError(
                f"{what} is not encrypted in an encrypted store (never trusted); nothing was loaded"
            )
        if len(raw) < 4:
            raise CheckpointCorruptError(f"{what} is too short to be a sealed record")
        fmt, id_len = raw[2], raw[3]
        head_end = 4 + id_len
        if fmt not in (_UNBOUND, _BOUND) or len(raw) < head_end + _NONCE + 16:
            raise CheckpointCorruptError(f"{what} has an unknown sealed-record format ({fmt})")
        if fmt != (_UNBOUND if self.store_id is None else _BOUND):
            why = "written for a store with an id" if fmt == _BOUND else "copied from a store without one"
            raise CheckpointCorruptError(f"{what} is sealed in format {fmt}, not bound to this store ({why})")
        try:
            key_id = bytes(raw[4:head_end]).decode("utf-8")
        except UnicodeDecodeError:
            raise CheckpointCorruptError(f"{what} names an unreadable key id") from None
        aead = keyring.aead(key_id)
        if aead is None:
            raise CheckpointCorruptError(f"{what} is sealed with key {key_id!r}, which the keyring lacks")
        head = bytes(raw[:head_end])
        nonce = bytes(raw[head_end : head_end + _NONCE])
        try:
            return aead.decrypt(nonce, bytes(raw[head_end + _NONCE :]), head + (self.store_id or b"") + place)
        except InvalidTag:
            raise CheckpointCorruptError(
                f"{what} fails authentication: tampered with, moved here from another key, "
                "or written for another store"
            ) from None
