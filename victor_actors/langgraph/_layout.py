"""Where a LangGraph thread lives in the runtime: scope ids, state keys, and the batches the saver commits.

A thread is a team scope ``lg:<thread>``; each of its checkpoint namespaces
is a chain of *segments*, conversation scopes under that team: segment 0 is
``lg:<thread>:<namespace>`` (the scope a namespace always was), segment
``k >= 1`` is ``lgs:<thread>:<k>:<namespace>``. New checkpoints go to the
newest segment; once it holds ``segment_keys`` keys, the next new checkpoint
opens the next segment, and the full one is never written again (see
docs/adr/0019). The team lists its namespaces: ``ns/<namespace>`` is
``True`` for one segment (the layout before segments) or the number of
segments; ``deleted`` is the thread's tombstone (the cut-off id of its last
``delete_thread``, docs/adr/0029) and ``touched`` the time of its last read a
TTL sweep wrote down. Each segment's key-value state holds, as plain storable
values:

=========================  ==================================================
``latest``                 the newest checkpoint id when this segment was the
                           newest (the newest segment's is the namespace's)
``c/<checkpoint id>``      ``{"c": checkpoint without values (plain msgpack
                           bytes, or the serializer's pair), "m": metadata,
                           "p": parent id, "r": run id, "v": channel versions,
                           "d": DeltaChannel names the metadata counts,
                           "t": the time it was put}``
``b/<channel>/<version>``  one channel value, written once per version
``compacted``              how often the store copy was compacted (bookkeeping)
``wt/<checkpoint id>``     the task ids with pending writes for a checkpoint
``w/<checkpoint id>/<task>``  ``{"p": task path, "w": ((idx, channel, type,
                           bytes), ...)}``
=========================  ==================================================

A segment is self-contained: every value one of its checkpoints uses is
stored in it (a put copies in, from the checkpoint it carries, any value
the segment lacks). Serialized values are ``(type, bytes)`` pairs from the
serializer. The saver stores each record (``c/``, ``w/``) as one msgpack
``bytes`` value and each channel value as one ``bytes`` value (the type's
length, the type, the payload): a value the runtime freezes and encodes in
one step, not a tree of small ones. Records and values written before
(plain mappings and ``(type, bytes)`` pairs) read the same. Nothing
here does I/O: these are pure functions from a snapshot's state to keys and
transitions.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from typing import Any

import ormsgpack  # type: ignore[import-not-found, unused-ignore]

from victor_actors import (
    CheckpointCorruptError,
    ScopeRef,
    StateScope,
    StateTransition,
    TransitionType,
    TransitionValidationError,
)
from victor_actors.lowlevel import FrozenDict

__all__ = [
    "COMPACTED",
    "DELETED",
    "LATEST",
    "NS_PREFIX",
    "TOUCHED",
    "blob_key",
    "channel_of_blob",
    "check_names",
    "check_text",
    "checkpoint_ids",
    "checkpoint_of",
    "conv_id",
    "delete",
    "drop_checkpoints",
    "empty",
    "keep_only",
    "pack",
    "plain",
    "populated",
    "record_key",
    "record_of",
    "segment_count",
    "segment_id",
    "team_id",
    "thread_of_team",
    "typed",
    "untyped",
    "update",
    "write_key",
    "write_rows",
    "write_tasks_key",
]

LATEST = "latest"
DELETED = "deleted"  # a thread's tombstone, in its team: the cut-off id of its last deletion
TOUCHED = "touched"  # in a thread's team: the time of its last read a TTL sweep wrote down
COMPACTED = "compacted"  # a segment's bookkeeping counter (see Segments.compact); no checkpoint data
NS_PREFIX = "ns/"
TEAM_PREFIX = "lg:"
SEGMENT_PREFIX = "lgs:"
# The largest segment index a namespace's ids are checked for when it is first written: a chain
# that long (about 2 * 10**11 graph steps at the smallest segment_keys) is never reached.
RESERVED_INDEX = 10**12 - 1
_UNESCAPE = re.compile(r"%(25|2F|3A)")
_UNESCAPED = {"25": "%", "2F": "/", "3A": ":"}


def _esc(text: str) -> str:
    """Escape ``%``, ``/`` and ``:`` so that a component never runs into the next one."""
    if "%" in text or "/" in text or ":" in text:
        return text.replace("%", "%25").replace("/", "%2F").replace(":", "%3A")
    return text


def _unesc(text: str) -> str:
    return _UNESCAPE.sub(lambda m: _UNESCAPED[m.group(1)], text) if "%" in text else text


def check_text(text: str, what: str, field: str) -> str:
    """``text`` if UTF-8 can encode it (the store keeps ids and records as UTF-8).

    Raises:
        TransitionValidationError: a lone surrogate; names ``what`` and where.
    """
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = exc.object[exc.start : exc.end]
        raise TransitionValidationError(
            f"{what} holds {bad!r} at index {exc.start}, which UTF-8 cannot encode; "
            "nothing was read or written",
            field=field,
        ) from None
    return text


def check_names(thread_id: str, namespace: str) -> None:
    """Refuse a thread id and namespace whose scopes could not all be created, before any is listed.

    The namespace's longest id is that of a segment far beyond any chain a
    graph reaches (:data:`RESERVED_INDEX`): a name that fits now and not at a
    later roll-over is refused now, not after a hundred steps.

    Raises:
        TransitionValidationError: a lone surrogate, or ids longer than a scope id may be.
    """
    check_text(thread_id, "the thread id", "thread_id")
    check_text(namespace, "the checkpoint namespace", "checkpoint_ns")
    try:
        ScopeRef(StateScope.CONVERSATION, segment_id(thread_id, namespace, RESERVED_INDEX))
    except TransitionValidationError as exc:
        raise TransitionValidationError(
            f"the thread id and checkpoint namespace are too long to name the namespace's scopes ({exc}); "
            "the namespace was not listed and nothing was written",
            field="checkpoint_ns",
        ) from None


def team_id(thread_id: str) -> str:
    return TEAM_PREFIX + _esc(thread_id)


def conv_id(thread_id: str, namespace: str) -> str:
    # The thread part holds no ':' once escaped, so the first ':' after the prefix ends it.
    return f"{TEAM_PREFIX}{_esc(thread_id)}:{namespace}"


def segment_id(thread_id: str, namespace: str, index: int) -> str:
    """Segment ``index`` of a namespace: 0 is :func:`conv_id`; the others can never equal one of those."""
    if index == 0:
        return conv_id(thread_id, namespace)
    # "lgs:" differs from "lg:" at its third character; the thread part holds no ':' and the index
    # none, so thread, index and namespace split back apart.
    return f"{SEGMENT_PREFIX}{_esc(thread_id)}:{index}:{namespace}"


def segment_count(listed: Any) -> int:
    """How many segments a namespace has, from its ``ns/`` entry in the team (anything odd: 1)."""
    return listed if listed.__class__ is int and listed >= 1 else 1


def thread_of_team(ident: str) -> str | None:
    """The thread id of a team scope id, or None for a team that is not a LangGraph thread."""
    return _unesc(ident[len(TEAM_PREFIX) :]) if ident.startswith(TEAM_PREFIX) else None


def record_key(checkpoint_id: str) -> str:
    return "c/" + checkpoint_id


def blob_key(channel: str, version: Any) -> str:
    return f"b/{_esc(channel)}/{_esc(str(version))}"


def channel_of_blob(key: str) -> str | None:
    """The channel of a ``b/<channel>/<version>`` key, or None for another key."""
    if not key.startswith("b/"):
        return None
    return _unesc(key[2:].split("/", 1)[0])


def write_tasks_key(checkpoint_id: str) -> str:
    return "wt/" + _esc(checkpoint_id)


def write_key(checkpoint_id: str, task_id: str) -> str:
    return f"w/{_esc(checkpoint_id)}/{_esc(task_id)}"


def pack(record: Mapping[str, Any]) -> bytes:
    """A record (``c/`` or ``w/``) as the one bytes value the saver stores.

    Raises:
        TransitionValidationError: a field msgpack cannot encode (text UTF-8 cannot encode).
    """
    try:
        return bytes(ormsgpack.packb(record))
    except (TypeError, ValueError) as exc:  # ormsgpack.MsgpackEncodeError is a TypeError
        raise TransitionValidationError(
            f"a LangGraph checkpoint record cannot be encoded ({exc}); nothing was written"
        ) from None


# Anything but str, int, float, bool, None, bytes, and lists and str-keyed mappings of them is refused.
_PLAIN_ONLY = (
    ormsgpack.OPT_PASSTHROUGH_BIG_INT
    | ormsgpack.OPT_PASSTHROUGH_DATACLASS
    | ormsgpack.OPT_PASSTHROUGH_DATETIME
    | ormsgpack.OPT_PASSTHROUGH_ENUM
    | ormsgpack.OPT_PASSTHROUGH_SUBCLASS
    | ormsgpack.OPT_PASSTHROUGH_TUPLE
    | ormsgpack.OPT_PASSTHROUGH_UUID
)


def plain(value: Any) -> bytes | None:
    """``value`` as msgpack bytes if it is plain data (it reads back equal), else None.

    For a checkpoint's own fields (id, timestamps, versions seen): stored as
    they are, without the serializer's typed pair (whose checks they do not
    need); anything else (a tuple, a datetime, a class) goes to the
    serializer.
    """
    try:
        return bytes(ormsgpack.packb(value, option=_PLAIN_ONLY))
    except (TypeError, ValueError):
        return None


def checkpoint_of(stored: Any) -> Any:
    """A record's ``c`` field, if it was stored as plain msgpack bytes (see :func:`plain`); else None."""
    if stored.__class__ is bytes:
        return ormsgpack.unpackb(stored)
    return None


def record_of(value: Any) -> Mapping[str, Any]:
    """A stored record as a mapping, packed (:func:`pack`) or, from before packing, plain.

    Raises:
        CheckpointCorruptError: packed bytes that do not decode to a mapping.
    """
    if value.__class__ is not bytes:
        return value  # type: ignore[no-any-return]
    try:
        out = ormsgpack.unpackb(value)
    except ormsgpack.MsgpackDecodeError as exc:
        raise CheckpointCorruptError(f"a LangGraph checkpoint record does not decode ({exc})") from None
    if not isinstance(out, dict):
        raise CheckpointCorruptError("a LangGraph checkpoint record decodes to something not a mapping")
    return out


def typed(type_: str, data: bytes) -> bytes:
    """A serialized channel value ``(type, bytes)`` as one bytes value."""
    name = type_.encode("utf-8")
    return bytes((len(name),)) + name + data


def untyped(value: Any) -> tuple[str, bytes]:
    """A stored channel value as ``(type, bytes)``, from :func:`typed` or, from before it, a pair.

    Raises:
        CheckpointCorruptError: a value in neither form.
    """
    if value.__class__ is bytes and value:
        n = value[0]
        try:
            return value[1 : 1 + n].decode("utf-8"), value[1 + n :]
        except UnicodeDecodeError:
            pass
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        return value[0], value[1]
    raise CheckpointCorruptError("a LangGraph channel value is in no known form")


def populated(state: Mapping[str, Any], channel: str, version: Any) -> bool:
    """Whether a segment stores a value (not the ``empty`` marker) for a channel at a version."""
    blob = state.get(blob_key(channel, version))
    return blob is not None and untyped(blob)[0] != "empty"


def write_rows(state: Mapping[str, Any], checkpoint_id: str) -> list[tuple[str, str, int, str, str, bytes]]:
    """A checkpoint's pending writes as ``(task path, task id, idx, channel, type, bytes)`` rows.

    In LangGraph's ``writes_sort_key`` order, (task path, task id, idx): the
    order a super-step applies its tasks' writes in.
    """
    rows = []
    for task_id in state.get(write_tasks_key(checkpoint_id)) or ():
        stored = state.get(write_key(checkpoint_id, task_id))
        if stored is not None:
            entry = record_of(stored)
            path = entry["p"]
            for idx, channel, type_, data in entry["w"]:
                rows.append((path, task_id, idx, channel, type_, data))
    rows.sort(key=lambda row: row[:3])
    return rows


# Values a transition holds as they are (already immutable and storable); ASCII text needs no UTF-8 check.
_PLAIN = frozenset({bytes, float, bool, type(None)})
_NO_META = StateTransition(TransitionType.DELETE_STATE, {"key": "-"}).metadata


def _trusted(ttype: TransitionType, data: dict[str, Any]) -> StateTransition:
    """A transition built as the core builds a valid one, without checking again what the caller checked.

    Only for an ASCII ``key`` and a value of a plain immutable type: what the
    core's validation would accept unchanged (``tests/test_langgraph_layout.py``
    checks that both build equal transitions). It is most of a put's own CPU
    otherwise: a put builds four.
    """
    transition = StateTransition.__new__(StateTransition)
    transition.__attrs_init__(ttype, FrozenDict._wrap(data, 1), _NO_META)
    return transition


def update(key: str, value: Any) -> StateTransition:
    if (
        key.__class__ is str
        and key.isascii()
        and (value.__class__ in _PLAIN or (value.__class__ is str and value.isascii()))
    ):
        return _trusted(TransitionType.UPDATE_STATE, {"key": key, "value": value})
    return StateTransition(TransitionType.UPDATE_STATE, {"key": key, "value": value})


def delete(key: str) -> StateTransition:
    if key.__class__ is str and key.isascii() and key:
        return _trusted(TransitionType.DELETE_STATE, {"key": key})
    return StateTransition(TransitionType.DELETE_STATE, {"key": key})


def checkpoint_ids(state: Mapping[str, Any]) -> list[str]:
    """Every checkpoint id of a namespace, newest first (ids sort by time)."""
    return sorted((key[2:] for key in state if key.startswith("c/")), reverse=True)


def _writes_keys(state: Mapping[str, Any], checkpoint_id: str) -> Iterable[str]:
    tasks_key = write_tasks_key(checkpoint_id)
    tasks = state.get(tasks_key)
    if tasks:
        yield tasks_key
        for task in tasks:
            yield write_key(checkpoint_id, task)


def _blobs_of(record: Mapping[str, Any]) -> set[str]:
    return {blob_key(channel, version) for channel, version in record_of(record)["v"].items()}


def drop_checkpoints(
    state: Mapping[str, Any], victims: Collection[str], *, keep_latest_key: bool = False
) -> list[StateTransition]:
    """Delete these checkpoints, their pending writes, and channel values no other checkpoint uses.

    With ``keep_latest_key`` the ``latest`` key is left as it is (the caller
    sets it from every segment).
    """
    out: list[StateTransition] = []
    kept: list[str] = []
    used: set[str] = set()
    for cid in checkpoint_ids(state):
        if cid in victims:
            out.append(delete(record_key(cid)))
            out.extend(delete(key) for key in _writes_keys(state, cid))
        else:
            kept.append(cid)
            used |= _blobs_of(state[record_key(cid)])
    if not out:
        return out
    out.extend(delete(key) for key in state if key.startswith("b/") and key not in used)
    if not keep_latest_key and state.get(LATEST) in victims:
        out.append(update(LATEST, kept[0]) if kept else delete(LATEST))
    return out


def keep_only(
    state: Mapping[str, Any], cids: Collection[str], *, keep_latest_key: bool
) -> list[StateTransition]:
    """Delete everything of a segment but the checkpoints ``cids`` it holds, their writes and values.

    ``latest`` stays with ``keep_latest_key``.
    """
    keep = {LATEST} if keep_latest_key else set()
    for cid in cids:
        record = state.get(record_key(cid))
        if record is not None:
            keep |= {record_key(cid), *_writes_keys(state, cid), *_blobs_of(record)}
    return [delete(key) for key in state if key not in keep]


def empty(state: Mapping[str, Any]) -> list[StateTransition]:
    """Delete every key of a segment."""
    return [delete(key) for key in state]
