"""How the command line writes what a store holds: JSON values, times, commit summaries."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from victor_actors import ContextSnapshot, ScopeRef, StateScope, TransitionType
from victor_actors._typed import is_registered
from victor_actors._values import freeze
from victor_actors.store import CommitRecord

__all__ = [
    "commit_json",
    "iso",
    "jsonable",
    "kind_of",
    "plain",
    "scope_key",
    "snapshot_dict",
    "summary",
    "to_json",
]

_LEVEL = {scope: i for i, scope in enumerate(StateScope)}
_KEYED = (TransitionType.UPDATE_STATE, TransitionType.DELETE_STATE)


def jsonable(value: Any) -> Any:
    """A stored value as strict JSON (RFC 8259: no NaN, no Infinity), with nothing ambiguous.

    What JSON cannot say is written as a one-key object whose key starts with
    ``$``: ``{"$bytes": "<base64>"}``, ``{"$float": "nan" | "inf" | "-inf"}``.
    A stored mapping that itself has exactly one key starting with ``$``
    is wrapped as ``{"$map": {...}}``, so a user's ``{"$bytes": "..."}``
    never reads as bytes.
    """
    if isinstance(value, float):
        if value != value:
            return {"$float": "nan"}
        if value in (float("inf"), float("-inf")):
            return {"$float": "inf" if value > 0 else "-inf"}
        return value
    if isinstance(value, bytes):
        return {"$bytes": base64.b64encode(value).decode("ascii")}
    if isinstance(value, Mapping):
        out = {str(k): jsonable(v) for k, v in value.items()}
        if len(out) == 1 and next(iter(out)).startswith("$"):
            return {"$map": out}
        return out
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if is_registered(type(value)):  # a registered message type, revived: its stored fields
        return jsonable(freeze(value))
    return value


def to_json(value: Any, *, pretty: bool = False) -> str:
    """Strict JSON (``allow_nan=False``) of a stored value, see :func:`jsonable`."""
    return json.dumps(jsonable(value), ensure_ascii=False, allow_nan=False, indent=2 if pretty else None)


def plain(_inst: Any, _field: Any, value: Any) -> Any:
    return str(value) if isinstance(value, ScopeRef) else value


def iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def scope_key(ref: ScopeRef) -> tuple[int, str]:
    return _LEVEL[ref.scope], ref.id


def snapshot_dict(snap: ContextSnapshot) -> dict[str, Any]:
    """``snap.to_dict()`` with its maps in key order (persistent maps iterate in hash order)."""
    out = snap.to_dict()
    for name in ("state", "capabilities", "pending_tool_requests"):
        out[name] = dict(sorted(out[name].items()))
    return out


def tally(rec: CommitRecord) -> tuple[dict[str, int], dict[str, list[str]]]:
    counts: dict[str, int] = {}
    keys: dict[str, list[str]] = {}
    for outer in rec.transitions:
        for t in outer.flatten():
            name = t.transition_type.value
            counts[name] = counts.get(name, 0) + 1
            if t.transition_type in _KEYED and t.data["key"] not in keys.setdefault(name, []):
                keys[name].append(t.data["key"])
    return counts, keys


def is_rollback(rec: CommitRecord) -> bool:
    """Whether a commit is a run's rollback: a reset made by a run (a restore is made by none)."""
    return rec.kind == "reset" and rec.run_id is not None


def kind_of(rec: CommitRecord) -> str:
    """What a commit was, as the history shows it: ``batch``, ``restore`` or ``rollback``."""
    if rec.kind != "reset":
        return rec.kind
    return "rollback" if is_rollback(rec) else "restore"


def summary(rec: CommitRecord) -> str:
    if rec.kind == "reset":
        state = rec.state
        size = "" if state is None else f": {len(state.values)} keys, {len(state.messages)} messages"
        if is_rollback(rec):
            return f"the run's writes undone, the scope set as a whole{size}"
        return f"restored, the scope set as a whole{size}"
    counts, keys = tally(rec)
    parts = []
    for name, n in counts.items():
        named = keys.get(name)
        parts.append(f"{name} x{n}" + (f" ({', '.join(named)})" if named else ""))
    return "; ".join(parts) or "no transitions"


def commit_json(rec: CommitRecord) -> dict[str, Any]:
    counts, keys = tally(rec)
    out: dict[str, Any] = {"version": rec.version, "commit_id": rec.commit_id, "time": iso(rec.timestamp)}
    out |= {"run_id": rec.run_id, "kind": rec.kind, "rollback": is_rollback(rec), "summary": summary(rec)}
    return out | {"transitions": counts, "keys": keys}
