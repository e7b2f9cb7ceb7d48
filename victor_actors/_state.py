"""Immutable scope state, the snapshot users read, and the change event.

A scope's state is a handful of persistent maps (``immutables.Map``): a
commit costs O(changed keys) and sharing the state with readers costs
nothing, because nobody can change it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple, overload

import attrs
import immutables

from victor_actors._model import ScopeRef, StateTransition

__all__ = [
    "KeyChange",
    "MapView",
    "MessageLog",
    "ScopeState",
    "StateChanged",
]

_EMPTY: immutables.Map[Any, Any] = immutables.Map()


class MapView(Mapping[str, Any]):
    """A read-only view of a persistent map; equal to any mapping with the same items."""

    __slots__ = ("_map",)

    def __init__(self, backing: immutables.Map[str, Any] = _EMPTY) -> None:
        self._map = backing

    def __getitem__(self, key: str) -> Any:
        return self._map[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._map)

    def __len__(self) -> int:
        return len(self._map)

    def __contains__(self, key: object) -> bool:
        return key in self._map

    def __eq__(self, other: object) -> bool:
        if isinstance(other, MapView):
            return self._map == other._map
        if isinstance(other, Mapping):
            return len(self._map) == len(other) and all(
                k in other and other[k] == v for k, v in self._map.items()
            )
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"MapView({dict(self._map.items())!r})"


class MessageLog(Sequence[Any]):
    """An immutable, persistent sequence of messages.

    Appending shares everything already there (O(log n) per message), so a
    long conversation costs no copying per commit. Compares equal to any
    sequence (tuple or list) with the same items.
    """

    __slots__ = ("_items", "_len")

    def __init__(self, items: immutables.Map[int, Any] = _EMPTY, length: int = 0) -> None:
        self._items = items
        self._len = length

    def extended(self, messages: Sequence[Any]) -> MessageLog:
        """Return a new log with ``messages`` appended."""
        if not messages:
            return self
        mm = self._items.mutate()
        n = self._len
        for m in messages:
            mm[n] = m
            n += 1
        return MessageLog(mm.finish(), n)

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, index: int) -> Any: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[Any, ...]: ...
    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return tuple(self._items[i] for i in range(*index.indices(self._len)))
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError("message index out of range")
        return self._items[index]

    def __iter__(self) -> Iterator[Any]:
        items = self._items
        for i in range(self._len):
            yield items[i]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (MessageLog, tuple, list)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"MessageLog({tuple(self)!r})"


@attrs.frozen(slots=True)
class ScopeState:
    """Everything one scope holds at one version. Immutable; replaced on commit."""

    ref: ScopeRef
    lineage: tuple[ScopeRef, ...] = ()  # ancestors, nearest first, up to global
    version: int = 0
    values: immutables.Map[str, Any] = _EMPTY
    messages: MessageLog = attrs.field(factory=MessageLog)
    capabilities: immutables.Map[str, Any] = _EMPTY
    stage: str = "initial"
    closed: bool = False
    pending_tools: immutables.Map[str, Any] = _EMPTY
    sessions: immutables.Map[str, Any] = _EMPTY

    @property
    def parent(self) -> ScopeRef | None:
        return self.lineage[0] if self.lineage else None


class KeyChange(NamedTuple):
    """One key's change in a commit.

    A delete has ``new_present=False``; a set to None has
    ``new_present=True`` and ``new_value=None``. (A named tuple: the commit
    path makes one per changed key, and this is the cheapest immutable
    record Python has.)
    """

    key: str
    old_value: Any
    new_value: Any
    old_present: bool
    new_present: bool

    @property
    def is_delete(self) -> bool:
        return not self.new_present


@attrs.frozen(slots=True)
class StateChanged:
    """The record of one commit, and the event subscribers receive for it.

    ``apply`` returns it too. A batch that changed nothing (empty, or only
    deletes of missing keys) is not a commit: ``new_version == old_version``,
    ``committed`` is False, and no event is published.
    """

    ref: ScopeRef
    commit_id: str
    old_version: int
    new_version: int
    transitions: tuple[StateTransition, ...]
    changes: tuple[KeyChange, ...] = ()
    capability_changes: tuple[KeyChange, ...] = ()
    added_messages: tuple[Any, ...] = ()
    first_message_index: int = 0  # where added_messages start in the scope's message log
    old_stage: str | None = None
    new_stage: str | None = None
    tool_requests: tuple[Any, ...] = ()
    sessions_created: tuple[str, ...] = ()
    closed: bool = False
    run_id: str | None = None
    timestamp: float = 0.0
    reset: bool = False  # the scope was set as a whole (restore, rollback)
    # Cross-scope commits: every scope the batch committed in (all share commit_id), and on the
    # record apply() returns, the other scopes' records.
    involved: tuple[ScopeRef, ...] = ()
    related: tuple[StateChanged, ...] = ()

    @property
    def version(self) -> int:
        """The scope's version after this commit."""
        return self.new_version

    @property
    def committed(self) -> bool:
        return self.new_version != self.old_version

    def __repr__(self) -> str:
        keys = ", ".join(self.changed_keys[:5]) + (", ..." if len(self.changed_keys) > 5 else "")
        parts = [f"{self.ref}", f"v{self.old_version}->v{self.new_version}", f"commit {self.commit_id}"]
        parts.append(f"{len(self.transitions)} transition(s)")
        if keys:
            parts.append(f"keys [{keys}]")
        if self.added_messages:
            parts.append(f"{len(self.added_messages)} message(s)")
        if self.run_id is not None:
            parts.append(f"run {self.run_id}")
        if self.involved:
            parts.append(f"across {len(self.involved)} scopes")
        return f"<StateChanged {' '.join(parts)}>"

    @property
    def changed_keys(self) -> tuple[str, ...]:
        return tuple(c.key for c in self.changes)
