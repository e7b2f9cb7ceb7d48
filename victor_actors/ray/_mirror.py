"""The global scope's mirror on every shard but its home, and home's pushes to it.

A conversation's snapshot reads its workflow and team on its own shard, and
the global scope from this mirror. After each commit of the global scope,
home sends the new state to every other shard; a push that is under way when
more commits come is followed by one more with the newest state (so a burst
of global commits costs one call per shard, not one per commit). A mirror
keeps the highest version it was given: it never goes backwards.

A shard asks home for the global scope itself when a driver's snapshot
request says it has seen a newer version than the mirror holds (read your
writes), and a cross-shard commit carries global's new state to the
participant before its part is published (snapshots are never torn).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from victor_actors._model import GLOBAL_REF
from victor_actors._snapshot import ContextSnapshot
from victor_actors._state import ScopeState
from victor_actors.ray import _wire as w
from victor_actors.ray._placement import HOME

__all__ = ["Mirror"]


class Mirror:
    """One shard's copy of the global scope (off home), or home's pushes of it (on home)."""

    def __init__(self, index: int, shards: int, peer: Callable[[int], Any], drop_peer: Callable[[int], None]):
        self.index = index
        self.shards = shards
        self._peer = peer
        self._drop_peer = drop_peer
        self.copy: tuple[int, ScopeState] | None = None
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._state: Callable[[], ScopeState] | None = None
        self._dirty: set[int] = set()
        self._pushing: set[int] = set()

    @property
    def version(self) -> int:
        copy = self.copy
        return -1 if copy is None else copy[0]

    def set(self, raw: bytes) -> None:
        """Keep the global state framed in ``raw`` if it is newer than the copy held."""
        p = w.decode(raw)
        state = w.state_from(p["s"])
        with self._lock:
            if self.copy is None or state.version > self.copy[0]:
                self.copy = (state.version, state)

    def ancestors(self, snap: ContextSnapshot) -> tuple[ScopeState, ...]:
        """``snap``'s ancestors, with the global scope read from this mirror (off home)."""
        ancestors = snap._ancestors
        copy = self.copy
        if self.index == HOME or copy is None:
            return ancestors
        return tuple(copy[1] if a.ref == GLOBAL_REF else a for a in ancestors)

    async def fresh(self, at_least: int) -> None:
        """Make sure the copy holds global at ``at_least`` or later (asking home if not); with
        ``at_least < 0``, only that there is a copy."""
        copy = self.copy
        if self.index == HOME:
            return
        if copy is not None and (at_least < 0 or copy[0] >= at_least):
            return
        raw = await self._peer(HOME).global_state.remote()
        self.set(raw)

    # -- home: pushes ----------------------------------------------------------------

    def serve(self, loop: asyncio.AbstractEventLoop, state: Callable[[], ScopeState]) -> None:
        """On home: push ``state()`` to every other shard after each global commit (see :meth:`changed`)."""
        self._loop = loop
        self._state = state

    def changed(self, _record: Any = None) -> None:
        """Home only, from any thread: global committed; its new state goes to every other shard."""
        loop = self._loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(self._kick)
        except RuntimeError:  # the loop is closed: the shard is stopping
            pass

    def _kick(self) -> None:
        assert self._loop is not None
        for n in range(self.shards):
            if n == HOME:
                continue
            self._dirty.add(n)
            if n not in self._pushing:
                self._pushing.add(n)
                self._loop.create_task(self._push(n))

    async def _push(self, n: int) -> None:
        assert self._state is not None
        try:
            while n in self._dirty:
                self._dirty.discard(n)
                raw = w.encode({"s": w.state_to(self._state())})
                try:
                    await self._peer(n).take_global.remote(raw)
                except Exception:  # the peer is away: it asks home for global when it is back
                    self._drop_peer(n)
                    self._dirty.discard(n)
        finally:
            self._pushing.discard(n)
