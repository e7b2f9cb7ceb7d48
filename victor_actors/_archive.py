"""Evicted scopes of a manager without a store: each kept as one encoded bytes object.

With a store, an evicted scope leaves memory entirely and the store brings
it back. Without one there is nowhere else to keep it, so its last committed
state is encoded with the store's codec (msgpack, zstd above a size, a CRC
bound to the scope) and decoded when the scope is next used: a few hundred
bytes in place of the many small objects a live state is made of.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from victor_actors._model import ScopeRef
from victor_actors._state import ScopeState
from victor_actors.store import CheckpointRecord, Codec

__all__ = ["MemoryArchive"]


class MemoryArchive:
    """Encoded states of evicted scopes, by ref. Thread-safe."""

    def __init__(self) -> None:
        self._codec = Codec()
        self._states: dict[ScopeRef, bytes] = {}
        self._lock = threading.Lock()
        self.bytes = 0  # the encoded bytes held (what stays of the evicted scopes, besides the dict)

    def encode(self, state: ScopeState) -> bytes:
        return self._codec.encode_checkpoint(CheckpointRecord(state, None, 0.0), place=_place(state.ref))

    def put(self, ref: ScopeRef, raw: bytes) -> None:
        """Keep ``raw`` (from :meth:`encode`) as the state of the evicted scope ``ref``."""
        with self._lock:
            old = self._states.get(ref)
            self._states[ref] = raw
            self.bytes += len(raw) - (0 if old is None else len(old))

    def peek(self, ref: ScopeRef) -> ScopeState | None:
        """The evicted scope's state, left in place; None if ``ref`` is not evicted here."""
        raw = self._states.get(ref)
        return None if raw is None else self._decode(ref, raw)

    def take(self, ref: ScopeRef) -> ScopeState | None:
        """The evicted scope's state, removed from here (it becomes resident again); None if absent."""
        with self._lock:
            raw = self._states.pop(ref, None)
            if raw is None:
                return None
            self.bytes -= len(raw)
        return self._decode(ref, raw)

    def _decode(self, ref: ScopeRef, raw: bytes) -> ScopeState:
        return self._codec.decode_checkpoint(raw, ref=ref, place=_place(ref)).state

    def __contains__(self, ref: object) -> bool:
        return ref in self._states

    def __len__(self) -> int:
        return len(self._states)

    def refs(self) -> Iterator[ScopeRef]:
        """The evicted scopes' refs (a copy taken now: evictions meanwhile do not disturb it)."""
        with self._lock:
            refs = list(self._states)
        return iter(refs)


def _place(ref: ScopeRef) -> bytes:
    return f"memory/{ref}".encode()
