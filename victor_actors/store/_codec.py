"""The record codec: cattrs + msgpack, zstd above a threshold, a checksum and a schema version.

Every stored record is ``header + body``. The header holds a magic number,
flags (bit 0: the body is zstd-compressed; bit 1: the checksum binds the
record to its place), the schema version the record was written with, and a
CRC-32 over the place (the database name and the LMDB key the record is
stored under), the rest of the header and the body. A record copied or
swapped to another key, scope, version or database fails its checksum like
a damaged one. (Records of stores written before the place was bound carry
no bit 1 and are checked without it.) A record decompresses to at most
``max_record_bytes``, and nothing larger is ever written: the limit counts
the encoded body before compression, which is what reading a record costs in
memory, so it also bounds what a damaged or hostile record can make a reader
decompress. A batch whose commit record would pass it is refused at the
edge, by an in-memory manager as by a store (:meth:`Codec.check_commit`);
everything else a store writes is cut into records that fit (docs/adr/0023).
The body is msgpack. Nothing is ever pickled and no class is ever looked up
by a name read from disk: records decode to plain values, and cattrs
structures them into the few record types this module knows.

A record written with an older schema is passed through the registered
migrations (one function per step, ``v -> v + 1``, on the plain-dict form)
before it is structured. A record that fails its checksum, does not decode,
or comes from a newer schema raises :class:`CheckpointCorruptError`.
"""

from __future__ import annotations

import struct
import threading
import zlib
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

import attrs
import cattrs
import immutables
import msgpack
import zstandard

from victor_actors._errors import CheckpointCorruptError, TransitionValidationError
from victor_actors._model import ScopeRef, StateTransition
from victor_actors._state import MessageLog, ScopeState
from victor_actors._typed import TaggedValue
from victor_actors._values import FrozenDict, size_bound, thaw

__all__ = [
    "SCHEMA_VERSION",
    "CheckpointRecord",
    "Codec",
    "CommitRecord",
    "RecordTooLargeError",
    "ScopeRecord",
]

SCHEMA_VERSION = 1
_MAGIC = b"VA"
_HEADER = struct.Struct(">2sBHI")  # magic, flags, schema version, crc32
_FLAG_ZSTD = 1
_FLAG_PLACED = 2
MAX_RECORD_BYTES = 64 * 1024 * 1024

R = TypeVar("R")
Migration = Callable[[dict[str, Any]], dict[str, Any]]
_COMMIT_FRAME = 256  # more than a compact commit's bytes besides its steps, ids and run id


class RecordTooLargeError(TransitionValidationError):
    """A record's body would pass ``max_record_bytes``: the store splits what it can, and
    refuses the rest with this (a ``TransitionValidationError``); nothing was written."""

    def __init__(self, size: int, limit: int, what: str = "the record") -> None:
        super().__init__(
            f"{what} would take {size} bytes; a stored record holds at most {limit} bytes "
            f"(Codec max_record_bytes, counted before compression); nothing was written"
        )
        self.size = size
        self.limit = limit


@attrs.frozen(slots=True)
class CommitRecord:
    """One commit in a scope's log.

    ``kind`` is ``"batch"`` (replay ``transitions`` through the reducer) or
    ``"reset"`` (the scope was set to ``state`` as a whole, by a restore or a
    rollback).
    """

    kind: str
    version: int
    commit_id: str
    timestamp: float
    run_id: str | None = None
    transitions: tuple[StateTransition, ...] = ()
    state: ScopeState | None = None


@attrs.frozen(slots=True)
class CheckpointRecord:
    """A scope's full state at one version."""

    state: ScopeState
    label: str | None
    timestamp: float


@attrs.frozen(slots=True)
class ScopeRecord:
    """That a scope exists, and where it sits in the tree."""

    ref: ScopeRef
    lineage: tuple[ScopeRef, ...]
    created: float


def _pairs_hook(pairs: list[tuple[Any, Any]]) -> FrozenDict:
    data = {}
    for key, value in pairs:
        if key.__class__ is not str:
            raise ValueError(f"a stored mapping has a non-str key {key!r}")
        data[key] = value
    return FrozenDict._wrap(data)


# A registered message type's instance (docs/adr/0027): msgpack extension 1 holds ``(tag, fields)``.
# The tag is only ever looked up in the reading process's registry (``_typed.py``), never imported.
_EXT_TAGGED = 1


def _default(obj: Any) -> Any:
    if obj.__class__ is FrozenDict:
        return obj._data
    if obj.__class__ is TaggedValue:
        inner = msgpack.packb((obj.tag, obj._data), default=_default, use_bin_type=True)
        return msgpack.ExtType(_EXT_TAGGED, inner)
    if isinstance(obj, FrozenDict):
        return obj._data
    raise TypeError(f"cannot encode {type(obj).__name__}")


def _ext_hook(code: int, data: bytes) -> TaggedValue:
    if code != _EXT_TAGGED:
        raise ValueError(f"unknown msgpack extension type {code}")
    tag, fields = msgpack.unpackb(
        data, object_pairs_hook=_pairs_hook, ext_hook=_ext_hook, use_list=False, raw=False
    )
    if tag.__class__ is not str or fields.__class__ is not FrozenDict:
        raise ValueError("a tagged value is not a (str, mapping) pair")
    return TaggedValue._of(tag, fields)


def _make_converter() -> cattrs.Converter:
    conv = cattrs.Converter()
    conv.register_unstructure_hook(ScopeRef, str)
    conv.register_structure_hook(ScopeRef, lambda v, _t: ScopeRef.parse(v))
    conv.register_unstructure_hook(immutables.Map, lambda m: FrozenDict._wrap(dict(m.items())))
    conv.register_structure_hook(immutables.Map, lambda v, _t: immutables.Map(_mapping(v)))
    conv.register_unstructure_hook(MessageLog, tuple)
    conv.register_structure_hook(MessageLog, lambda v, _t: MessageLog().extended(tuple(v)))
    conv.register_unstructure_hook(
        StateTransition,
        lambda t: {"t": t.transition_type.value, "d": t.data, "m": t.metadata},
    )
    conv.register_structure_hook(
        StateTransition, lambda v, _t: StateTransition(v["t"], _mapping(v["d"]), _mapping(v["m"]))
    )
    return conv


def _mapping(value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"expected a mapping, found {type(value).__name__}")
    return value


class Codec:
    """Encodes and decodes store records.

    Args:
        schema_version: the version new records are written with.
        migrations: ``{v: fn}`` where ``fn`` turns a record's plain-dict form
            at schema ``v`` into its form at ``v + 1``.
        compress_above: bodies at least this many bytes are zstd-compressed.
        max_record_bytes: the largest body (before compression) written or read;
            a record claiming more is refused as corrupt, a value that would
            need more is refused with ``TransitionValidationError``.
    """

    def __init__(
        self,
        schema_version: int = SCHEMA_VERSION,
        migrations: Mapping[int, Migration] | None = None,
        *,
        compress_above: int = 2048,
        max_record_bytes: int = MAX_RECORD_BYTES,
    ) -> None:
        if not 1 <= schema_version <= 0xFFFF:
            raise ValueError("schema_version must be within 1..65535")
        self.schema_version = schema_version
        self.migrations: dict[int, Migration] = dict(migrations or {})
        for v in range(1, schema_version):
            if v not in self.migrations and self.migrations:
                raise ValueError(f"migrations must cover every step below {schema_version}; {v} is missing")
        self.compress_above = compress_above
        self.max_record_bytes = max_record_bytes
        self._conv = _make_converter()
        self._local = threading.local()

    def with_max_record_bytes(self, max_record_bytes: int) -> Codec:
        """This codec with another record limit (the same schema, migrations and compression)."""
        return Codec(
            self.schema_version,
            self.migrations,
            compress_above=self.compress_above,
            max_record_bytes=max_record_bytes,
        )

    # -- framing ----------------------------------------------------------

    def _zstd(self) -> tuple[zstandard.ZstdCompressor, zstandard.ZstdDecompressor]:
        pair = getattr(self._local, "zstd", None)
        if pair is None:
            pair = (zstandard.ZstdCompressor(level=3), zstandard.ZstdDecompressor())
            self._local.zstd = pair
        return pair

    def pack(self, payload: Mapping[str, Any], place: bytes | None = None) -> bytes:
        """Frame ``payload``; with ``place`` (database name and key), the checksum binds it there.

        Raises:
            TransitionValidationError: the payload cannot be encoded (or is
                larger than ``max_record_bytes``); nothing is written.
        """
        try:
            body = msgpack.packb(payload, default=_default, use_bin_type=True)
        except (TypeError, ValueError, OverflowError, RecursionError, UnicodeError) as exc:
            raise _unencodable(exc) from None
        if len(body) > self.max_record_bytes:
            raise RecordTooLargeError(len(body), self.max_record_bytes)
        flags = 0
        if len(body) >= self.compress_above:
            body = self._zstd()[0].compress(body)
            flags |= _FLAG_ZSTD
        if place is not None:
            flags |= _FLAG_PLACED
        head = _HEADER.pack(_MAGIC, flags, self.schema_version, 0)[:-4]
        crc = zlib.crc32(body, zlib.crc32(head, 0 if place is None else zlib.crc32(place)))
        return bytes(head + struct.pack(">I", crc) + body)

    def rebind(self, raw: bytes, old: bytes, new: bytes, what: str) -> bytes:
        """The record framed for place ``old``, framed for ``new`` instead; its body is untouched.

        For copies between stores whose keys differ (``_rewrite.py``): the
        checksum is verified at ``old`` (or without a place, for a record
        from before places were bound) and computed again over ``new``.

        Raises:
            CheckpointCorruptError: the record fails its checksum at ``old``.
        """
        raw = bytes(raw)
        if len(raw) < _HEADER.size:
            raise CheckpointCorruptError(f"{what} is too short to be a record")
        magic, flags, schema, crc = _HEADER.unpack_from(raw)
        body = raw[_HEADER.size :]
        seed = zlib.crc32(old) if flags & _FLAG_PLACED else 0
        if magic != _MAGIC or zlib.crc32(body, zlib.crc32(raw[: _HEADER.size - 4], seed)) != crc:
            raise CheckpointCorruptError(
                f"{what} fails its checksum (damaged, or moved here from another key)"
            )
        head = _HEADER.pack(_MAGIC, flags | _FLAG_PLACED, schema, 0)[:-4]
        return bytes(head + struct.pack(">I", zlib.crc32(body, zlib.crc32(head, zlib.crc32(new)))) + body)

    def unpack(
        self, raw: bytes, *, ref: object = None, version: int | None = None, place: bytes | None = None
    ) -> Mapping[str, Any]:
        """Check, decompress, decode and migrate one record to the current schema.

        ``place`` is where the record was read from (database name and key):
        a record bound to another place fails its checksum.
        """

        def corrupt(why: str, fatal: bool = False) -> CheckpointCorruptError:
            where = f"{ref} version {version}" if version is not None else f"{ref}"
            return CheckpointCorruptError(
                f"stored record for {where} is unreadable: {why}", ref=ref, version=version, fatal=fatal
            )

        raw = bytes(raw)
        if len(raw) < _HEADER.size:
            raise corrupt("too short")
        magic, flags, schema, crc = _HEADER.unpack_from(raw)
        if magic != _MAGIC:
            raise corrupt("bad magic number")
        body = raw[_HEADER.size :]
        seed = zlib.crc32(place) if flags & _FLAG_PLACED and place is not None else 0
        if zlib.crc32(body, zlib.crc32(raw[: _HEADER.size - 4], seed)) != crc:
            moved = " (or it was moved here from another key)" if flags & _FLAG_PLACED else ""
            raise corrupt(f"checksum mismatch{moved}")
        if schema > self.schema_version:
            raise corrupt(
                f"written with schema {schema}, newer than this codec's {self.schema_version}", fatal=True
            )
        try:
            if flags & _FLAG_ZSTD:
                size = zstandard.frame_content_size(body)
                if size < 0 or size > self.max_record_bytes:
                    raise ValueError(
                        f"it claims to decompress to {size} bytes (at most {self.max_record_bytes} are read)"
                    )
                body = self._zstd()[1].decompress(body, max_output_size=self.max_record_bytes)
            payload = msgpack.unpackb(
                body, object_pairs_hook=_pairs_hook, ext_hook=_ext_hook, use_list=False, raw=False
            )
        except Exception as exc:
            raise corrupt(f"{type(exc).__name__}: {exc}") from None
        if not isinstance(payload, Mapping):
            raise corrupt("the body is not a mapping")
        if schema < self.schema_version:
            plain: dict[str, Any] = thaw(payload)
            for step in range(schema, self.schema_version):
                migrate = self.migrations.get(step)
                if migrate is None:
                    raise corrupt(f"no migration registered from schema {step} to {step + 1}", fatal=True)
                try:
                    plain = migrate(plain)
                except Exception as exc:
                    raise corrupt(f"migration {step}->{step + 1} failed: {exc}") from None
            payload = _refreeze(plain)
        return cast(Mapping[str, Any], payload)

    # -- records ------------------------------------------------------------

    def _unstructure(self, record: Any) -> Any:
        try:
            return self._conv.unstructure(record)
        except (TypeError, ValueError, OverflowError, RecursionError, UnicodeError) as exc:
            raise _unencodable(exc) from None

    def encode_commit(self, record: CommitRecord, *, place: bytes | None = None) -> bytes:
        """A commit record; a batch is written in the compact form (see ``_compact_commit``).

        Raises:
            TransitionValidationError: it cannot be encoded, or a batch is too large for a
                record (then a ``RecordTooLargeError`` naming the limit); nothing is written.
        """
        if record.kind == "batch" and record.state is None:
            try:
                return self.pack(_compact_payload(record), place)
            except RecordTooLargeError as exc:
                raise _batch_too_large(exc.size, exc.limit) from None
        return self.pack(self._unstructure(record), place)

    def check_commit(
        self, transitions: tuple[StateTransition, ...], version: int, commit_id: str, run_id: str | None
    ) -> None:
        """Refuse a batch whose commit record would pass ``max_record_bytes``, without a store.

        What an in-memory manager checks, so that it refuses exactly the
        batches a store refuses. A bound from the frozen values (no encoding)
        settles nearly every batch; only one whose bound passes the limit is
        encoded to be measured.

        Raises:
            RecordTooLargeError: the batch would not fit a record; nothing was applied.
        """
        limit = self.max_record_bytes
        bound = _COMMIT_FRAME + 4 * (len(commit_id) + len(run_id or ""))
        for t in transitions:
            bound += _COMMIT_FRAME + size_bound(t.data) + size_bound(t.metadata)
            if bound > limit:
                break
        else:
            return
        record = CommitRecord("batch", version, commit_id, 0.0, run_id, transitions)
        try:
            body = msgpack.packb(_compact_payload(record), default=_default, use_bin_type=True)
        except (TypeError, ValueError, OverflowError, RecursionError, UnicodeError) as exc:
            raise _unencodable(exc) from None
        if len(body) > limit:
            raise _batch_too_large(len(body), limit)

    def decode_commit(
        self, raw: bytes, *, ref: object = None, version: int | None = None, place: bytes | None = None
    ) -> CommitRecord:
        payload = self.unpack(raw, ref=ref, version=version, place=place)
        body = payload.get("c")
        if body is not None:
            return _compact_commit(body, ref, version)
        return self.structure_payload(payload, CommitRecord, ref, version)

    def encode_checkpoint(self, record: CheckpointRecord, *, place: bytes | None = None) -> bytes:
        return self.pack(self._unstructure(record), place)

    def decode_checkpoint(
        self, raw: bytes, *, ref: object = None, version: int | None = None, place: bytes | None = None
    ) -> CheckpointRecord:
        return self._structure(raw, CheckpointRecord, ref, version, place)

    def encode_scope(self, record: ScopeRecord, *, place: bytes | None = None) -> bytes:
        return self.pack(self._unstructure(record), place)

    def decode_scope(self, raw: bytes, *, ref: object = None, place: bytes | None = None) -> ScopeRecord:
        return self._structure(raw, ScopeRecord, ref, None, place)

    def unstructure(self, record: Any) -> Any:
        """The plain (msgpack-ready) form of a record or state.

        Raises:
            TransitionValidationError: it cannot be encoded.
        """
        return self._unstructure(record)

    def structure_payload(self, payload: Any, cls: type[R], ref: object, version: int | None) -> R:
        """A decoded payload (or part of one) structured as ``cls``.

        Raises:
            CheckpointCorruptError: it does not hold a valid ``cls``.
        """
        try:
            return self._conv.structure(payload, cls)
        except (Exception, TransitionValidationError) as exc:
            raise CheckpointCorruptError(
                f"stored record for {ref} version {version} does not hold a valid {cls.__name__}: {exc}",
                ref=ref,
                version=version,
            ) from None

    def _structure(
        self, raw: bytes, cls: type[R], ref: object, version: int | None, place: bytes | None
    ) -> R:
        payload = self.unpack(raw, ref=ref, version=version, place=place)
        return self.structure_payload(payload, cls, ref, version)


def _compact_commit(body: Any, ref: object, version: int | None) -> CommitRecord:
    """A batch commit from its compact form, ``{"c": (kind, version, commit id, time, run id, steps)}``
    with each step ``(type, data, metadata)``: plain tuples, no cattrs on the commit path.

    Raises:
        CheckpointCorruptError: the body does not hold a valid batch commit.
    """
    try:
        kind, number, commit_id, timestamp, run_id, steps = body
        if (
            kind != "batch"
            or number.__class__ is not int
            or commit_id.__class__ is not str
            or timestamp.__class__ not in (int, float)
            or not (run_id is None or run_id.__class__ is str)
            or steps.__class__ is not tuple
        ):
            raise ValueError("a field has the wrong type")
        transitions = tuple(StateTransition(t, _mapping(d), _mapping(m)) for t, d, m in steps)
    except (Exception, TransitionValidationError) as exc:
        raise CheckpointCorruptError(
            f"stored record for {ref} version {version} does not hold a valid CommitRecord: "
            f"{type(exc).__name__}: {exc}",
            ref=ref,
            version=version,
        ) from None
    return CommitRecord(kind, number, commit_id, float(timestamp), run_id, transitions)


def _compact_payload(record: CommitRecord) -> dict[str, Any]:
    try:
        steps = tuple((t.transition_type.value, t.data, t.metadata) for t in record.transitions)
    except AttributeError as exc:
        raise _unencodable(exc) from None
    return {"c": (record.kind, record.version, record.commit_id, record.timestamp, record.run_id, steps)}


def _batch_too_large(size: int, limit: int) -> RecordTooLargeError:
    error = RecordTooLargeError(size, limit)
    error.args = (
        f"the batch would take {size} bytes as a commit record; a stored record holds at most "
        f"{limit} bytes (Codec max_record_bytes, counted before compression), in memory as in a "
        "store; nothing was applied",
    )
    return error


def _unencodable(exc: BaseException) -> TransitionValidationError:
    why = f"{type(exc).__name__}: {exc}"
    return TransitionValidationError(
        f"the record cannot be encoded for the store ({why}); nothing was written"
    )


def _refreeze(value: Any) -> Any:
    if isinstance(value, dict):
        return FrozenDict._wrap({k: _refreeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(_refreeze(v) for v in value)
    return value
