"""How the command line writes what a store holds: JSON values, times, commit summaries."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from typing import Any

from victor_actors import ContextSnapshot, ScopeRef, StateScope, TransitionType
from victor_actors.lowlevel import thaw
from victor_actors.store import CommitRecord

__all__ = ["commit_json", "iso", "plain", "scope_key", "snapshot_dict", "summary", "to_json"]

_LEVEL = {scope: i for i, scope in enumerate(StateScope)}
_KEYED = (TransitionType.UPDATE_STATE, TransitionType.DELETE_STATE)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, bytes):
        return {"$bytes": base64.b64encode(obj).decode("ascii")}
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def to_json(value: Any, *, pretty: bool = False) -> str:
    return json.dumps(thaw(value), default=_json_default, ensure_ascii=False, indent=2 if pretty else None)


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


def summary(rec: CommitRecord) -> str:
    if rec.kind == "reset":
        state = rec.state
        size = "" if state is None else f": {len(state.values)} keys, {len(state.messages)} messages"
        return f"scope set as a whole (restore or rollback){size}"
    counts, keys = tally(rec)
    parts = []
    for name, n in counts.items():
        named = keys.get(name)
        parts.append(f"{name} x{n}" + (f" ({', '.join(named)})" if named else ""))
    return "; ".join(parts) or "no transitions"


def commit_json(rec: CommitRecord) -> dict[str, Any]:
    counts, keys = tally(rec)
    out: dict[str, Any] = {"version": rec.version, "commit_id": rec.commit_id, "time": iso(rec.timestamp)}
    out |= {"run_id": rec.run_id, "kind": rec.kind, "summary": summary(rec)}
    return out | {"transitions": counts, "keys": keys}
