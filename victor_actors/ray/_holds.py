"""Holds: a shard keeps a prepared scope at its prepared version until the decision.

The cross-shard protocol (``docs/ray.md``) needs the part of a batch that a
shard prepared to commit exactly as it was dry-run. So a shard tracks, per
scope, the transaction holding it and the writes in progress. A write to a
held scope waits for its release (or its deadline); a prepare first marks
its scopes held, then waits for the writes already in progress. A prepared
part therefore cannot fail at commit: its scopes cannot move, and the
reducer that accepted it is a pure function.

Everything here runs on the shard's event loop.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import AsyncIterator, Iterable

from victor_actors._errors import DeadlineExceededError
from victor_actors._model import ScopeRef

__all__ = ["Holds"]


class Holds:
    """Which transaction holds which scope, and the writes in progress, on one shard."""

    def __init__(self) -> None:
        self.held: dict[ScopeRef, str] = {}
        self.writing: collections.Counter[ScopeRef] = collections.Counter()
        self._cond: asyncio.Condition | None = None

    @property
    def cond(self) -> asyncio.Condition:
        if self._cond is None:
            self._cond = asyncio.Condition()
        return self._cond

    async def notify(self) -> None:
        async with self.cond:
            self.cond.notify_all()

    async def wait_unheld(self, refs: Iterable[ScopeRef], deadline: float, txid: str | None) -> None:
        """Until no transaction but ``txid`` holds any of ``refs``.

        Raises:
            DeadlineExceededError: one was still held at ``deadline``; nothing was applied.
        """
        wanted = tuple(refs)
        cond = self.cond
        async with cond:
            while any(self.held.get(r, txid) != txid for r in wanted):
                left = deadline - time.monotonic()
                if left <= 0:
                    held = sorted(str(r) for r in wanted if self.held.get(r, txid) != txid)
                    raise DeadlineExceededError(
                        f"{', '.join(held)} stayed held by a cross-shard commit until the request's "
                        "deadline; nothing was applied"
                    )
                try:
                    await asyncio.wait_for(cond.wait(), left)
                except TimeoutError:
                    pass

    async def hold(self, refs: frozenset[ScopeRef], txid: str, deadline: float) -> None:
        """Hold ``refs`` for ``txid`` once no one else does, then wait for the writes in progress.

        Raises:
            DeadlineExceededError: another hold or a write outlasted ``deadline``; nothing is held.
        """
        await self.wait_unheld(refs, deadline, None)
        for r in refs:
            self.held[r] = txid
        try:
            cond = self.cond
            async with cond:
                while any(self.writing.get(r) for r in refs):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise DeadlineExceededError(
                            "writes in progress outlasted the prepare's deadline; nothing was held"
                        )
                    try:
                        await asyncio.wait_for(cond.wait(), left)
                    except TimeoutError:
                        pass
        except BaseException:
            self.drop(refs, txid)
            raise

    def take(self, refs: Iterable[ScopeRef], txid: str) -> None:
        """Hold ``refs`` for ``txid`` at once (a prepare record found at start-up)."""
        for r in refs:
            self.held[r] = txid

    def drop(self, refs: Iterable[ScopeRef], txid: str) -> None:
        for r in refs:
            if self.held.get(r) == txid:
                del self.held[r]

    async def release(self, refs: Iterable[ScopeRef], txid: str) -> None:
        self.drop(refs, txid)
        await self.notify()

    @contextlib.asynccontextmanager
    async def writing_to(
        self, refs: frozenset[ScopeRef], deadline: float, txid: str | None
    ) -> AsyncIterator[None]:
        """Write to ``refs``: once no other transaction holds them, counted as a write in progress
        (a prepare waits for those) until the block ends."""
        await self.wait_unheld(refs, deadline, txid)
        for r in refs:
            self.writing[r] += 1
        try:
            yield
        finally:
            self.done_writing(refs)
            await self.notify()

    def start_writing(self, refs: Iterable[ScopeRef]) -> None:
        for r in refs:
            self.writing[r] += 1

    def done_writing(self, refs: Iterable[ScopeRef]) -> None:
        for r in refs:
            self.writing[r] -= 1
            if not self.writing[r]:
                del self.writing[r]
