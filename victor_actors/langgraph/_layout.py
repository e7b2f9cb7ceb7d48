"""Where a LangGraph thread lives in the runtime: scope ids, state keys, and the batches the saver commits.

A thread is a team scope ``lg:<thread>``; each of its checkpoint namespaces
is a conversation scope ``lg:<thread>:<namespace>`` under that team. The team
lists its namespaces (``ns/<namespace>`` keys); a namespace's own key-value
state holds, as plain storable values:

=========================  ==================================================
``latest``                 the newest checkpoint id
``c/<checkpoint id>``      ``{"c": checkpoint without values, "m": metadata,
                           "p": parent id, "r": run id, "v": channel versions}``
``b/<channel>/<version>``  one channel value, written once per version
``wt/<checkpoint id>``     the task ids with pending writes for a checkpoint
``w/<checkpoint id>/<task>``  ``{"p": task path, "w": ((idx, channel, type,
                           bytes), ...)}``
=========================  ==================================================

Serialized values are ``(type, bytes)`` pairs from the serializer. Nothing
here does I/O: these are pure functions from a snapshot's state to keys and
transitions.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from victor_actors import StateTransition, TransitionType

__all__ = [
    "LATEST",
    "NS_PREFIX",
    "blob_key",
    "checkpoint_ids",
    "conv_id",
    "delete",
    "drop_checkpoints",
    "keep_only_latest",
    "record_key",
    "team_id",
    "thread_of_team",
    "update",
    "write_key",
    "write_tasks_key",
]

LATEST = "latest"
NS_PREFIX = "ns/"
TEAM_PREFIX = "lg:"
_UNESCAPE = re.compile(r"%(25|2F|3A)")
_UNESCAPED = {"25": "%", "2F": "/", "3A": ":"}


def _esc(text: str) -> str:
    """Escape ``%``, ``/`` and ``:`` so that a component never runs into the next one."""
    if "%" in text or "/" in text or ":" in text:
        return text.replace("%", "%25").replace("/", "%2F").replace(":", "%3A")
    return text


def _unesc(text: str) -> str:
    return _UNESCAPE.sub(lambda m: _UNESCAPED[m.group(1)], text) if "%" in text else text


def team_id(thread_id: str) -> str:
    return TEAM_PREFIX + _esc(thread_id)


def conv_id(thread_id: str, namespace: str) -> str:
    # The thread part holds no ':' once escaped, so the first ':' after the prefix ends it.
    return f"{TEAM_PREFIX}{_esc(thread_id)}:{namespace}"


def thread_of_team(ident: str) -> str | None:
    """The thread id of a team scope id, or None for a team that is not a LangGraph thread."""
    return _unesc(ident[len(TEAM_PREFIX) :]) if ident.startswith(TEAM_PREFIX) else None


def record_key(checkpoint_id: str) -> str:
    return "c/" + checkpoint_id


def blob_key(channel: str, version: Any) -> str:
    return f"b/{_esc(channel)}/{_esc(str(version))}"


def write_tasks_key(checkpoint_id: str) -> str:
    return "wt/" + _esc(checkpoint_id)


def write_key(checkpoint_id: str, task_id: str) -> str:
    return f"w/{_esc(checkpoint_id)}/{_esc(task_id)}"


def update(key: str, value: Any) -> StateTransition:
    return StateTransition(TransitionType.UPDATE_STATE, {"key": key, "value": value})


def delete(key: str) -> StateTransition:
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
    return {blob_key(channel, version) for channel, version in record["v"].items()}


def drop_checkpoints(state: Mapping[str, Any], victims: Collection[str]) -> list[StateTransition]:
    """Delete these checkpoints, their pending writes, and channel values no other checkpoint uses."""
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
    if state.get(LATEST) in victims:
        out.append(update(LATEST, kept[0]) if kept else delete(LATEST))
    return out


def keep_only_latest(state: Mapping[str, Any]) -> list[StateTransition]:
    """Delete everything but the newest checkpoint, its pending writes and the values it uses."""
    latest = state.get(LATEST)
    record = state.get(record_key(latest)) if isinstance(latest, str) else None
    if record is None or not isinstance(latest, str):
        return [delete(key) for key in state]
    keep = {LATEST, record_key(latest), *_writes_keys(state, latest), *_blobs_of(record)}
    return [delete(key) for key in state if key not in keep]
