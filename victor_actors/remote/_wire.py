"""What crosses between a client and an owner: requests, replies, snapshots and errors, as bytes.

One wire for every transport (a unix or TCP socket to an owner, a Ray call
to a shard). Nothing is pickled: every payload is framed by the store's
codec (msgpack, a CRC, zstd above 2 KiB), so an owner decodes exactly what
the store would accept, and the same validation runs on both sides.
Classes are never named on the wire: an error crosses as one of the names
in :data:`_ERRORS` (a fixed table: the runtime's own error family) with its
message and fields, and is rebuilt on the client from that table.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from victor_actors import _errors
from victor_actors._errors import (
    CheckpointCorruptError,
    OwnerUnavailableError,
    ScopeFailedError,
    TransitionValidationError,
    VersionConflictError,
    VictorActorsError,
)
from victor_actors._model import ScopeRef, StateTransition
from victor_actors._rollback import RollbackReport, ScopeRollback
from victor_actors._snapshot import ContextSnapshot
from victor_actors._state import KeyChange, ScopeState, StateChanged
from victor_actors.store import CheckpointInfo, Codec

__all__ = [
    "checkpoint_info_from",
    "checkpoint_info_to",
    "decode",
    "encode",
    "error_from",
    "error_to",
    "record_from",
    "rollback_from",
    "rollback_to",
    "record_to",
    "report_from",
    "report_to",
    "snapshot_from",
    "snapshot_to",
    "state_from",
    "state_to",
    "transitions_from",
    "transitions_to",
]


_CODEC = Codec()

# The only error classes an owner's reply can name: the runtime's own error family, by its curated
# names (a table in code, never a name read from the wire). Anything else arrives as ScopeFailedError.
_ERRORS: dict[str, type[VictorActorsError]] = {name: getattr(_errors, name) for name in _errors.__all__}


def encode(payload: Mapping[str, Any]) -> bytes:
    """Frame ``payload`` (plain values, frozen values, tuples) as bytes.

    Raises:
        TransitionValidationError: something in it is not storable.
    """
    return _CODEC.pack(payload)


def decode(raw: bytes) -> Mapping[str, Any]:
    """The payload ``raw`` framed.

    Raises:
        ScopeFailedError: ``raw`` is not a frame this codec wrote (its
            checksum, magic number or body is wrong), or not a mapping.
    """
    if not isinstance(raw, (bytes, bytearray)):
        raise ScopeFailedError(f"a wire message must be bytes, not {type(raw).__name__}")
    try:
        payload = _CODEC.unpack(bytes(raw), ref="wire message")
    except CheckpointCorruptError as exc:
        raise ScopeFailedError(f"a wire message could not be read: {exc}") from None
    if not isinstance(payload, Mapping):
        raise ScopeFailedError(f"a wire message is a mapping, not {type(payload).__name__}")
    return payload


def transitions_to(transitions: Iterable[StateTransition]) -> tuple[Any, ...]:
    return tuple((t.transition_type.value, t.data, t.metadata) for t in transitions)


def transitions_from(steps: Sequence[Any]) -> tuple[StateTransition, ...]:
    """Transitions from their wire form; each is validated again on the way in.

    Raises:
        TransitionValidationError: a step is malformed.
    """
    if not isinstance(steps, (tuple, list)):
        raise TransitionValidationError("a batch on the wire must be a sequence of steps")
    out = []
    for step in steps:
        if not isinstance(step, (tuple, list)) or len(step) != 3:
            raise TransitionValidationError("a step on the wire is (type, data, metadata)")
        out.append(StateTransition(step[0], step[1], step[2]))
    return tuple(out)


def state_to(state: ScopeState) -> Any:
    return _CODEC.unstructure(state)


def state_from(payload: Any) -> ScopeState:
    return _CODEC.structure_payload(payload, ScopeState, "wire message", None)


def snapshot_to(snapshot: ContextSnapshot, ancestors: Sequence[ScopeState]) -> Any:
    own = snapshot._state
    return (state_to(own), tuple(state_to(a) for a in ancestors))


def snapshot_from(payload: Any) -> ContextSnapshot:
    own, ancestors = payload
    return ContextSnapshot(state_from(own), tuple(state_from(a) for a in ancestors))


def _ref(text: str) -> ScopeRef:
    return ScopeRef.parse(text)


def _changes_to(changes: tuple[KeyChange, ...]) -> tuple[Any, ...]:
    return tuple(tuple(c) for c in changes)


def _changes_from(rows: Sequence[Any]) -> tuple[KeyChange, ...]:
    return tuple(KeyChange(*row) for row in rows)


def record_to(record: StateChanged, *, transitions: bool = True) -> Any:
    """A commit record's wire form (every field; ``related`` nested).

    ``transitions=False`` leaves out the top record's transitions: the driver
    that sent them puts them back (see :func:`record_from`).
    """
    return {
        "r": str(record.ref),
        "id": record.commit_id,
        "ov": record.old_version,
        "nv": record.new_version,
        "t": transitions_to(record.transitions) if transitions else None,
        "ch": _changes_to(record.changes),
        "cc": _changes_to(record.capability_changes),
        "am": record.added_messages,
        "fm": record.first_message_index,
        "os": record.old_stage,
        "ns": record.new_stage,
        "tr": record.tool_requests,
        "sc": record.sessions_created,
        "cl": record.closed,
        "run": record.run_id,
        "ts": record.timestamp,
        "rs": record.reset,
        "inv": tuple(str(r) for r in record.involved),
        "rel": tuple(record_to(r) for r in record.related),
    }


def record_from(p: Mapping[str, Any], sent: tuple[StateTransition, ...] = ()) -> StateChanged:
    """A commit record from its wire form; ``sent`` stands in for transitions left out of it."""
    return StateChanged(
        ref=_ref(p["r"]),
        commit_id=p["id"],
        old_version=p["ov"],
        new_version=p["nv"],
        transitions=sent if p["t"] is None else transitions_from(p["t"]),
        changes=_changes_from(p["ch"]),
        capability_changes=_changes_from(p["cc"]),
        added_messages=tuple(p["am"]),
        first_message_index=p["fm"],
        old_stage=p["os"],
        new_stage=p["ns"],
        tool_requests=tuple(p["tr"]),
        sessions_created=tuple(p["sc"]),
        closed=p["cl"],
        run_id=p["run"],
        timestamp=p["ts"],
        reset=p["rs"],
        involved=tuple(_ref(r) for r in p["inv"]),
        related=tuple(record_from(r) for r in p["rel"]),
    )


def rollback_to(r: ScopeRollback) -> Any:
    return {
        "r": str(r.ref),
        "k": r.keys_restored,
        "m": r.messages_removed,
        "c": r.capabilities_restored,
        "s": r.stage_restored,
        "t": r.tool_requests_released,
        "x": r.conflicts,
        "v": r.version,
    }


def rollback_from(p: Mapping[str, Any]) -> ScopeRollback:
    return ScopeRollback(
        _ref(p["r"]),
        tuple(p["k"]),
        int(p["m"]),
        tuple(p["c"]),
        bool(p["s"]),
        tuple(p["t"]),
        tuple(p["x"]),
        p["v"],
    )


def report_to(r: RollbackReport) -> Any:
    return {"id": r.run_id, "why": r.reason, "s": tuple(rollback_to(s) for s in r.scopes)}


def report_from(p: Mapping[str, Any]) -> RollbackReport:
    return RollbackReport(str(p["id"]), str(p["why"]), tuple(rollback_from(s) for s in p["s"]))


def checkpoint_info_to(c: CheckpointInfo) -> Any:
    return (c.checkpoint_id, str(c.ref), c.version, c.label, c.timestamp, c.size, c.readable)


def checkpoint_info_from(row: Sequence[Any]) -> CheckpointInfo:
    cid, ref, version, label, timestamp, size, readable = row
    return CheckpointInfo(
        str(cid),
        _ref(ref),
        int(version),
        None if label is None else str(label),
        float(timestamp),
        int(size),
        bool(readable),
    )


def error_to(exc: BaseException) -> dict[str, Any]:
    """An error's wire form: its class's name (from the fixed table) and message, and its fields."""
    name = type(exc).__name__
    if name not in _ERRORS or not isinstance(exc, VictorActorsError):
        return {"e": "ScopeFailedError", "m": f"the owner failed on the request: {type(exc).__name__}: {exc}"}
    out: dict[str, Any] = {"e": name, "m": str(exc)}
    if isinstance(exc, VersionConflictError):
        out["x"] = (str(exc.ref), exc.expected_version, exc.current_version)
    if isinstance(exc, OwnerUnavailableError):
        out["u"] = exc.may_have_applied
    out["i"] = (exc.index, exc.transition_type)
    return out


def error_from(p: Any, where: str) -> VictorActorsError:
    """The error an owner replied with, rebuilt on the client (message intact).

    ``where`` names the owner for a note on the error (``"shard 1"``, a URL).
    A malformed error payload is itself reported as a ScopeFailedError.
    """
    if not isinstance(p, Mapping):
        return ScopeFailedError(f"{where} replied with a malformed error: {p!r:.200}")
    cls = _ERRORS.get(str(p.get("e")), ScopeFailedError)
    message = str(p.get("m", ""))
    exc: VictorActorsError
    try:
        if cls is VersionConflictError and "x" in p:
            ref, expected, current = p["x"]
            exc = VersionConflictError(_ref(ref), int(expected), int(current))
        elif issubclass(cls, OwnerUnavailableError):
            exc = cls(message, may_have_applied=bool(p.get("u", True)))
        else:
            exc = cls(message)
        index, ttype = p.get("i", (None, None))
        if isinstance(index, int) and not isinstance(index, bool):
            exc.index = index
        if isinstance(ttype, str):
            exc.transition_type = ttype
    except (TypeError, ValueError, VictorActorsError):
        exc = ScopeFailedError(f"{where} replied with a malformed {cls.__name__}: {message}")
    exc.add_note(f"raised on {where}")
    return exc
