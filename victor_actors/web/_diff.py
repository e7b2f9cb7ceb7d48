"""What changed in a scope between two versions, as data for a side-by-side view.

The same comparison as ``victor-actors diff``: keys added, removed and
changed in the key-value state and the capabilities, the messages after
the common prefix (and how many of the old ones are gone, as after a
restore), the stage and the closed flag. Values are strict JSON
(:func:`victor_actors.cli._format.jsonable`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from victor_actors import ContextSnapshot
from victor_actors.cli._format import jsonable

__all__ = ["MAX_ROWS", "diff_snapshots", "map_rows"]

MAX_ROWS = 1000  # rows of one map, or added messages, sent at most; the rest are counted


def map_rows(old: Mapping[str, Any], new: Mapping[str, Any]) -> tuple[list[dict[str, Any]], int]:
    """The changed keys of two maps, in key order (at most :data:`MAX_ROWS`), and how many keys are equal."""
    rows: list[dict[str, Any]] = []
    same = 0
    for key in sorted(old.keys() | new.keys()):
        if key not in old:
            row = {"key": key, "change": "added", "new": jsonable(new[key])}
        elif key not in new:
            row = {"key": key, "change": "removed", "old": jsonable(old[key])}
        elif old[key] != new[key]:
            row = {"key": key, "change": "changed", "old": jsonable(old[key]), "new": jsonable(new[key])}
        else:
            same += 1
            continue
        rows.append(row)
    return rows, same


def _map_section(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    rows, same = map_rows(old, new)
    return {"rows": rows[:MAX_ROWS], "changed": len(rows), "unchanged": same}


def diff_snapshots(a: ContextSnapshot, b: ContextSnapshot) -> dict[str, Any]:
    """The difference from ``a`` to ``b`` (two versions of one scope, either way round)."""
    old, new = a.messages, b.messages
    common = 0
    while common < min(len(old), len(new)) and old[common] == new[common]:
        common += 1
    added = [jsonable(m) for m in new[common : common + MAX_ROWS]]
    gone = [jsonable(m) for m in old[common : common + MAX_ROWS]]
    return {
        "ref": str(a.ref),
        "a": a.version,
        "b": b.version,
        "state": _map_section(a.state, b.state),
        "capabilities": _map_section(a.capabilities, b.capabilities),
        "messages": {
            "old_count": len(old),
            "new_count": len(new),
            "common": common,
            "removed": len(old) - common,
            "added_count": len(new) - common,
            "first_added_index": common,
            "added": added,
            "removed_messages": gone,
        },
        "stage": {"old": a.conversation_stage, "new": b.conversation_stage},
        "closed": {"old": a.is_closed, "new": b.is_closed},
    }
