"""What crosses a Ray call: requests, replies, snapshots and errors, as framed msgpack bytes.

Ray would pickle whatever a call carries; we never hand it anything but
``bytes``. Every payload is framed by the store's codec (msgpack, a CRC,
zstd above 2 KiB), so a shard decodes exactly what the store would accept,
and the same validation runs on both sides. Classes are never named on the
wire: an error crosses as one of the names in :data:`_ERRORS` (a fixed
table) with its message, and is rebuilt on the driver from that table.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from victor_actors import _errors
from victor_actors._errors import (
    CheckpointCorruptError,
    ScopeFailedError,
    TransitionValidationError,
    VersionConflictError,
    VictorActorsError,
)
from victor_actors._model import ScopeRef, StateTransition
from victor_actors._rollback import ScopeRollback
from victor_actors._state import ContextSnapshot, KeyChange, ScopeState, StateChanged
from victor_actors.store import Codec

__all__ = [
    "ShardUnavailableError",
    "decode",
    "encode",
    "error_from",
    "error_to",
    "record_from",
    "rollback_from",
    "rollback_to",
    "record_to",
    "snapshot_from",
    "snapshot_to",
    "state_from",
    "state_to",
    "transitions_from",
    "transitions_to",
]


class ShardUnavailableError(VictorActorsError):
    """A shard could not be reached (killed, restarting, or its node gone).

    ``shard`` is its number. ``may_have_applied`` says whether the request
    may have been applied before the shard went away: False means it was
    certainly not; True means it may have been (read the scope's version
    once the shard is back, or retry: the manager's retries are applied at
    most once, by batch id).
    """

    def __init__(self, message: str, *, shard: int, may_have_applied: bool) -> None:
        super().__init__(message)
        self.shard = shard
        self.may_have_applied = may_have_applied


_CODEC = Codec()

# The only error classes a shard's reply can name: the runtime's own error family, by its curated
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
            checksum, magic number or body is wrong).
    """
    if not isinstance(raw, (bytes, bytearray)):
        raise ScopeFailedError(f"a shard message must be bytes, not {type(raw).__name__}")
    try:
        return _CODEC.unpack(bytes(raw), ref="ray message")
    except CheckpointCorruptError as exc:
        raise ScopeFailedError(f"a shard message could not be read: {exc}") from None


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
    return _CODEC.structure_payload(payload, ScopeState, "ray message", None)


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


def error_to(exc: BaseException) -> dict[str, Any]:
    """An error's wire form: its class's name (from the fixed table) and message, and its fields."""
    name = type(exc).__name__ if type(exc).__name__ in _ERRORS and isinstance(exc, VictorActorsError) else ""
    if not name:
        return {"e": "ScopeFailedError", "m": f"the shard failed on the request: {type(exc).__name__}: {exc}"}
    out: dict[str, Any] = {"e": name, "m": str(exc)}
    if isinstance(exc, VersionConflictError):
        out["x"] = (str(exc.ref), exc.expected_version, exc.current_version)
    if isinstance(exc, VictorActorsError):
        out["i"] = (exc.index, exc.transition_type)
    return out


def error_from(p: Mapping[str, Any], shard: int) -> VictorActorsError:
    """The error a shard replied with, rebuilt on the driver (message intact)."""
    cls = _ERRORS.get(str(p.get("e")), ScopeFailedError)
    message = str(p.get("m", ""))
    exc: VictorActorsError
    if cls is VersionConflictError and "x" in p:
        ref, expected, current = p["x"]
        exc = VersionConflictError(_ref(ref), expected, current)
    else:
        exc = cls(message)
        index, ttype = p.get("i", (None, None))
        if index is not None:
            exc.index = index
        if ttype is not None:
            exc.transition_type = ttype
    exc.add_note(f"raised on shard {shard}")
    return exc
