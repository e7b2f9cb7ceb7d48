"""LangGraph's DeltaChannel on the saver's segments: the history walk, and what a delete must keep.

A ``DeltaChannel`` (langgraph-checkpoint 4.3) stores its value only now and
then (a ``_DeltaSnapshot``, every ``snapshot_frequency`` updates); at the other
checkpoints it stores nothing, and LangGraph rebuilds it by replaying the
writes stored along the parent chain since the nearest stored value
(``get_delta_channel_history``). Two things follow for the saver, both
pure functions of a namespace's segment states here:

- :func:`history` answers that walk from the stored records directly: one
  pass up the parent chain for every channel asked, decoding only the
  writes of those channels and the seeds found, never a whole checkpoint.
- :func:`needed` tells a whole-thread operation (``prune``,
  ``delete_for_runs``) which ancestors a checkpoint it keeps rebuilds its
  delta channels through, so that it keeps them too: deleting them would
  make those channels start empty, silently.

The contract (what is a seed, whose writes are replayed, in which order)
is LangGraph's ``DeltaChannelHistory``: the seed is the value stored at the
nearest ancestor (on the parent chain, not the listing order) that stores one;
the writes are those stored at every ancestor from the target's parent back
to and including that seed's checkpoint (its own writes produced its child),
oldest checkpoint first and, within one, in ``writes_sort_key`` order. The
target's own writes are pending for its next step and are not part of it.

Which channels are delta channels? LangGraph names them, per checkpoint, in
the metadata's ``counters_since_delta_snapshot`` (every delta channel not
snapshotted at that checkpoint); the saver keeps those names in the record
(``"d"``) so that finding them decodes nothing. Channels whose stored values
include a ``_DeltaSnapshot`` are counted too, in case a later LangGraph
renames that metadata field.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from langgraph.checkpoint.serde.jsonplus import EXT_DELTA_SNAPSHOT  # type: ignore[import-not-found, unused-ignore]

from victor_actors.langgraph import _layout as L

__all__ = ["delta_names", "history", "locate", "needed", "snapshot_channels"]

Loads = Callable[[tuple[str, bytes]], Any]
# Where a msgpack extension record's type code sits, by its first byte (fixext 1..16, ext 8/16/32).
_EXT_CODE_AT = {0xD4: 1, 0xD5: 1, 0xD6: 1, 0xD7: 1, 0xD8: 1, 0xC7: 2, 0xC8: 3, 0xC9: 5}


def locate(
    states: Sequence[Mapping[str, Any]], cid: str
) -> tuple[Mapping[str, Any], Mapping[str, Any]] | None:
    """(segment state, record) of a checkpoint, newest segment first (a newer copy wins, as reads do)."""
    key = L.record_key(cid)
    for state in states:
        stored = state.get(key)
        if stored is not None:
            return state, L.record_of(stored)
    return None


def history(
    states: Sequence[Mapping[str, Any]], cid: str | None, channels: Iterable[str], loads: Loads
) -> dict[str, dict[str, Any]]:
    """``get_delta_channel_history`` on a namespace's segment states (newest first).

    ``cid`` None names the namespace's newest checkpoint. A target that does
    not exist has no history: every channel gets no writes and no seed, as
    LangGraph's default walk gives. ``loads`` decodes one ``(type, bytes)``.
    """
    wanted = list(dict.fromkeys(channels))
    if not wanted:
        return {}
    chunks: dict[str, list[list[tuple[str, str, Any]]]] = {ch: [] for ch in wanted}  # newest first
    seeds: dict[str, Any] = {}
    remaining = set(wanted)
    target = cid if cid is not None else _latest(states)
    found = locate(states, target) if target is not None else None
    cursor = found[1]["p"] if found is not None else None
    while cursor and remaining:
        found = locate(states, cursor)
        if found is None:  # a parent deleted, or never stored: the walk ends as at a root
            break
        state, record = found
        mine: dict[str, list[tuple[str, str, Any]]] = {}
        for _path, task_id, _idx, channel, type_, data in L.write_rows(state, cursor):
            if channel in remaining:
                mine.setdefault(channel, []).append((task_id, channel, loads((type_, data))))
        for channel, rows in mine.items():
            chunks[channel].append(rows)
        versions = record["v"]
        for channel in [ch for ch in remaining if ch in versions]:
            blob = state.get(L.blob_key(channel, versions[channel]))
            if blob is not None:
                type_, data = L.untyped(blob)
                if type_ != "empty":
                    seeds[channel] = loads((type_, data))
                    remaining.discard(channel)
        cursor = record["p"]
    out: dict[str, dict[str, Any]] = {}
    for channel in wanted:
        entry: dict[str, Any] = {"writes": [w for rows in reversed(chunks[channel]) for w in rows]}
        if channel in seeds:
            entry["seed"] = seeds[channel]
        out[channel] = entry
    return out


def _latest(states: Sequence[Mapping[str, Any]]) -> str | None:
    for state in states:
        latest = state.get(L.LATEST)
        if isinstance(latest, str):
            return latest
    return None


def is_snapshot(blob: Any) -> bool:
    """Whether a stored channel value is a ``_DeltaSnapshot`` (read from its first bytes, nothing decoded)."""
    type_, data = L.untyped(blob)
    if type_ != "msgpack" or not data:
        return False
    at = _EXT_CODE_AT.get(data[0])
    return at is not None and len(data) > at and data[at] == EXT_DELTA_SNAPSHOT


def snapshot_channels(states: Iterable[Mapping[str, Any]]) -> set[str]:
    """The channels with a ``_DeltaSnapshot`` stored anywhere in these segments."""
    out: set[str] = set()
    for state in states:
        for key, blob in state.items():
            channel = L.channel_of_blob(key)
            if channel is not None and channel not in out and is_snapshot(blob):
                out.add(channel)
    return out


def delta_names(record: Mapping[str, Any], loads: Loads) -> Collection[str]:
    """The delta channels a checkpoint's metadata counts (not snapshotted at it).

    From the record's ``"d"``; a record written before that field existed has
    its metadata decoded instead.
    """
    if "d" in record:
        return record["d"] or ()
    counters = loads(record["m"]).get("counters_since_delta_snapshot")
    return tuple(counters) if isinstance(counters, Mapping) else ()


def needed(
    states: Sequence[Mapping[str, Any]],
    cid: str,
    deltas: Collection[str],
    loads: Loads,
    *,
    stop: Callable[[str], bool] = lambda _cid: False,
) -> list[str]:
    """The ancestors checkpoint ``cid`` rebuilds its delta channels through, nearest first.

    A channel of ``cid`` needs history when it has a version there but no
    stored value and is a delta channel (named by ``cid``'s record, or in
    ``deltas``, the namespace's :func:`snapshot_channels`). The walk follows
    the parent chain, as :func:`history` does, until every such channel has
    met a stored value or the chain ends; each checkpoint it visits is
    returned (its writes and the seed are read from it). ``stop(ancestor)``
    ends the walk at an ancestor (returned too) whose own walk the caller
    makes anyway.
    """
    found = locate(states, cid)
    if found is None:
        return []
    state, record = found
    versions = record["v"]
    names = set(delta_names(record, loads)) | set(deltas)
    remaining = {ch for ch in names if ch in versions and not L.populated(state, ch, versions[ch])}
    out: list[str] = []
    cursor = record["p"]
    while cursor and remaining:
        found = locate(states, cursor)
        if found is None:
            break
        out.append(cursor)
        if stop(cursor):
            break
        state, record = found
        versions = record["v"]
        remaining = {ch for ch in remaining if not (ch in versions and L.populated(state, ch, versions[ch]))}
        cursor = record["p"]
    return out
