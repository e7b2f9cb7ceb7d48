"""Incremental checkpoints: a checkpoint writes what changed since the one before it.

A checkpoint (store format 2) is three kinds of record, each framed by the
codec and sealed for its own place like every other record:

``ckpt``    ref key + version -> the manifest: the scope's small fields (stage,
            closed, capabilities, pending tool requests, sessions), the label and
            time, ``msgs = (root, n)`` and ``kv = (kv version, full kv version)``
``chunks``  ref key + root (8 bytes) + end index -> ``{"start": s, "msgs": [...]}``:
            messages ``s .. end - 1`` of the message log, written once
``kv``      ref key + version -> ``{"base": None or a kv version, "set": {...}, "del": [...]}``:
            the values map in full (``base`` None) or as a delta on ``base``; one
            too large for a record has ``"parts": k`` and its other keys in ``k``
            more records at ref key + version + part (4 bytes, 1 to k):
            ``{"part": i, "set": {...}, "del": [...]}`` (store format 3)

No record is larger than the codec's ``max_record_bytes``, whatever the
state holds (docs/adr/0023): chunks end early when their messages' sizes
would pass it, and a values record too large is cut into parts, each put
together from whole keys by the sizes ``size_bound`` gives (never below the
encoded size, so each part fits without being encoded twice).

A *root* is a random 8-byte name for one append-only history of the message
log. Checkpoints of the same root share its chunks: the next checkpoint
writes only the messages added since the last one. A restore, a rollback, a
fork or a failed transaction starts a new root (its first checkpoint writes
the whole log once), so a chunk's key always names one content: a log that is
not append-only never reuses a key. A scope loaded from the store goes on
with its root when the store can show it descends from that load
(``Store.base_after_load``).
The checkpoint with ``msgs = (root, n)`` holds the chunks of ``root`` that
end at or before ``n``; they must tile ``0 .. n`` exactly.

The values map is a delta against the previous checkpoint's, with a full copy
whenever the deltas since the last full one would outgrow it, so the chain a
load reads is at most about twice the full copy's size.

Each incremental checkpoint checks, inside its write transaction, that what
it builds on is stored (the base chunk ending at its ``n``, the base kv record
and the full one its chain starts from); if not, it writes itself in full
instead. So a stored checkpoint never refers to records that are not there,
whatever happened to the transactions before it.

The pure part lives here; ``Store`` binds it to its keys, sealer and writer.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs
import immutables

from victor_actors._errors import CheckpointCorruptError
from victor_actors._model import ScopeRef
from victor_actors._state import MessageLog, ScopeState
from victor_actors._values import FrozenDict, size_bound
from victor_actors.store._codec import CheckpointRecord, Codec

__all__ = [
    "CHUNK_MESSAGES",
    "FORM",
    "CheckpointBase",
    "assemble",
    "chunk_key",
    "chunk_ranges",
    "is_manifest",
    "kv_full_of",
    "kv_part_key",
    "kv_payloads",
    "kv_version",
    "manifest_root",
]

FORM = 2  # the "form" field of format-2 records
ROOT_BYTES = 8
CHUNK_MESSAGES = 256  # at most this many messages per chunk record
_END = struct.Struct(">Q")
_PART = struct.Struct(">I")
_EMPTY: immutables.Map[str, Any] = immutables.Map()
_ABSENT = object()
_FRAME = 64  # more than a chunk's or values part's bytes besides its messages or entries


@attrs.frozen(slots=True)
class CheckpointBase:
    """What a scope's newest checkpoint holds, for the next one to build on (kept in memory).

    ``messages`` and ``values`` are the checkpointed state's own persistent
    objects (shared with the live state, so holding them costs little).
    """

    version: int
    root: bytes
    n: int
    messages: MessageLog
    values: immutables.Map[str, Any]
    kv_version: int
    kv_full: int
    chain_bytes: int  # bytes of the kv deltas written since the full one
    full_bytes: int  # bytes of that full kv record


def new_root() -> bytes:
    return os.urandom(ROOT_BYTES)


def chunk_key(prefix: bytes, root: bytes, end: int) -> bytes:
    return prefix + root + _END.pack(end)


def chunk_ranges(
    start: int, end: int, messages: Sequence[Any] | None = None, limit: int | None = None
) -> list[tuple[int, int]]:
    """``start .. end`` cut into chunks of at most ``CHUNK_MESSAGES`` messages and, with
    ``messages`` and ``limit``, of at most ``limit`` bytes by their ``size_bound``s (a message
    larger than that alone is a chunk alone)."""
    if messages is None or limit is None:
        return [(s, min(s + CHUNK_MESSAGES, end)) for s in range(start, end, CHUNK_MESSAGES)]
    budget = limit - _FRAME
    out: list[tuple[int, int]] = []
    first, size = start, 0
    for i in range(start, end):
        bound = size_bound(messages[i])
        if i > first and (i - first >= CHUNK_MESSAGES or size + bound > budget):
            out.append((first, i))
            first, size = i, 0
        size += bound
    if first < end:
        out.append((first, end))
    return out


def is_manifest(payload: Mapping[str, Any]) -> bool:
    return payload.get("form") == FORM


def manifest_root(payload: Mapping[str, Any]) -> bytes | None:
    """The message root a manifest refers to (None for an empty log or a legacy full record)."""
    if not is_manifest(payload):
        return None
    root, n = payload["msgs"]
    return bytes(root) if n else None


def kv_full_of(payload: Mapping[str, Any]) -> int | None:
    """The full kv record a manifest's values chain starts from (None for a legacy full record)."""
    return int(payload["kv"][1]) if is_manifest(payload) else None


def manifest_payload(
    codec: Codec, record: CheckpointRecord, root: bytes, kv_version: int, kv_full: int
) -> dict[str, Any]:
    rest = attrs.evolve(record.state, values=_EMPTY, messages=MessageLog())
    return {
        "form": FORM,
        "state": codec.unstructure(rest),
        "label": record.label,
        "timestamp": record.timestamp,
        "msgs": (root, len(record.state.messages)),
        "kv": (kv_version, kv_full),
    }


def chunk_payload(messages: Sequence[Any], start: int, end: int) -> dict[str, Any]:
    return {"form": FORM, "start": start, "msgs": messages[start:end]}


def kv_payloads(
    values: immutables.Map[str, Any], base: int | None, touched: Iterable[str] | None, limit: int
) -> list[dict[str, Any]]:
    """The values record: in full (``touched`` None) or the keys ``touched`` since ``base``.

    One payload when it fits ``limit`` bytes; else the record and its parts
    (``"parts"`` in the first says how many follow), each of whole keys.
    """
    if touched is None:
        sets = dict(values.items())
        dels: list[str] = []
    else:
        sets, dels = {}, []
        for key in touched:
            value = values.get(key, _ABSENT)
            if value is _ABSENT:
                dels.append(key)
            else:
                sets[key] = value
    budget = limit - _FRAME
    groups: list[tuple[dict[str, Any], list[str]]] = [({}, [])]
    size = 0
    for key, value in sets.items():
        bound = 2 * _KEY_HEADER + 4 * len(key) + size_bound(value)
        if size and size + bound > budget:
            groups.append(({}, []))
            size = 0
        groups[-1][0][key] = value
        size += bound
    for key in dels:
        bound = _KEY_HEADER + 4 * len(key)
        if size and size + bound > budget:
            groups.append(({}, []))
            size = 0
        groups[-1][1].append(key)
        size += bound
    first = {"form": FORM, "base": base, "set": FrozenDict._wrap(groups[0][0]), "del": tuple(groups[0][1])}
    if len(groups) > 1:
        first["parts"] = len(groups) - 1
    parts = [
        {"form": FORM, "part": i, "set": FrozenDict._wrap(g[0]), "del": tuple(g[1])}
        for i, g in enumerate(groups[1:], start=1)
    ]
    return [first, *parts]


_KEY_HEADER = 5


def kv_part_key(key: bytes, part: int) -> bytes:
    """Where part ``part`` (1 on) of the values record at ``key`` lives."""
    return key + _PART.pack(part)


def kv_version(prefix_len: int, key: bytes) -> int:
    """The version of a values record's key or of one of its parts' (after a scope key of that length)."""
    return int.from_bytes(bytes(key[prefix_len : prefix_len + 8]), "big")  # total, as version_of


def changed_keys(old: immutables.Map[str, Any], new: immutables.Map[str, Any]) -> list[str]:
    """Every key whose value differs between two maps (a full comparison: for offline copies)."""
    out = [k for k, v in new.items() if old.get(k, _ABSENT) is _ABSENT or old[k] != v]
    out.extend(k for k in old if k not in new)
    return out


# -- reading -----------------------------------------------------------------------------------

Open = Callable[[str, bytes, bytes, int | None, str], Mapping[str, Any]]
# open_record(db, key, raw, version, what): the record's payload (CheckpointCorruptError if damaged)


def assemble(
    codec: Codec,
    ref: ScopeRef,
    version: int,
    payload: Mapping[str, Any],
    prefix: bytes,
    chunks: Sequence[tuple[bytes, bytes]],
    kvs: Mapping[int, Sequence[tuple[bytes, bytes]]],
    open_record: Open,
) -> CheckpointRecord:
    """The full checkpoint a manifest describes, from the scope's chunk and kv records.

    ``chunks`` are the scope's chunk records in key order; ``kvs`` its kv
    records by version: ``[(key, raw)]``, the record and then its parts, in key order.

    Raises:
        CheckpointCorruptError: a record it needs is missing, damaged or does not fit.
    """

    def corrupt(why: str) -> CheckpointCorruptError:
        return CheckpointCorruptError(
            f"checkpoint v{version} of {ref} cannot be rebuilt: {why}", ref=ref, version=version
        )

    try:
        rest = codec.structure_payload(payload["state"], ScopeState, ref, version)
        root, n = payload["msgs"]
        kv_version, kv_full = (int(x) for x in payload["kv"])
        root, n = bytes(root), int(n)
        label, timestamp = payload["label"], float(payload["timestamp"])
    except CheckpointCorruptError:
        raise
    except Exception as exc:
        raise corrupt(f"the manifest is malformed ({type(exc).__name__}: {exc})") from None
    if rest.version != version or (label is not None and not isinstance(label, str)):
        raise corrupt("the manifest does not match its key")
    messages: list[Any] = []
    if n:
        head = prefix + root
        for key, raw in chunks:
            if not key.startswith(head) or len(key) != len(head) + _END.size:
                continue
            end = int(_END.unpack(key[len(head) :])[0])
            if end > n:
                break
            what = f"a message chunk of checkpoint v{version} of {ref}"
            chunk = open_record("chunks", key, raw, version, what)
            msgs, start = chunk.get("msgs"), chunk.get("start")
            if start != len(messages) or not isinstance(msgs, tuple) or start + len(msgs) != end:
                raise corrupt(f"the message chunk ending at {end} does not follow on message {len(messages)}")
            messages.extend(msgs)
        if len(messages) != n:
            raise corrupt(f"its message chunks reach {len(messages)} of its {n} messages")
    chain: list[Mapping[str, Any]] = []
    at: int | None = kv_version
    while at is not None:
        found = kvs.get(at)
        if not found or len(found[0][0]) != len(prefix) + _END.size:
            raise corrupt(f"its values record v{at} is missing")
        rec = open_record("kv", found[0][0], found[0][1], version, f"values record v{at} of {ref}")
        chain.append(rec)
        parts = rec.get("parts", 0)
        if parts.__class__ is not int or len(found) != 1 + parts:
            raise corrupt(f"values record v{at} has {len(found) - 1} of its {parts!r} parts")
        for i, (key, raw) in enumerate(found[1:], start=1):
            part = open_record("kv", key, raw, version, f"part {i} of values record v{at} of {ref}")
            if key != kv_part_key(found[0][0], i) or part.get("part") != i:
                raise corrupt(f"part {i} of values record v{at} is not in its place")
            chain.append(part)
        base = rec.get("base")
        if base is not None and (not isinstance(base, int) or base >= at):
            raise corrupt(f"values record v{at} names a bad base ({base!r})")
        if base is None and at != kv_full:
            raise corrupt(f"its values chain starts at v{at}, not at v{kv_full}")
        at = base
    values: dict[str, Any] = {}
    try:
        for rec in reversed(chain):
            values.update(rec["set"])
            for key in rec["del"]:
                values.pop(key, None)
    except Exception as exc:
        raise corrupt(f"a values record is malformed ({type(exc).__name__}: {exc})") from None
    if any(k.__class__ is not str for k in values):
        raise corrupt("a values record has a non-str key")
    state = attrs.evolve(rest, values=immutables.Map(values), messages=MessageLog().extended(messages))
    return CheckpointRecord(state, label, timestamp)
