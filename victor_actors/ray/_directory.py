"""Found by id alone: where each workflow and conversation lives, durable on the shards.

A scope's shard follows from its parents (a team and everything under it
share the team's shard), but a caller may name a conversation by its id
alone. So every workflow and conversation has an entry, its *address*
``(level, id, workflow id, team id)``, in the **directory**: on the shard a
hash of its own ref picks (:func:`directory_shard`; for a scope directly
under global, the very shard that hosts it). Teams and the global scope need
none: a team lives under global, on the shard of its own id.

- The entry is written the first time the scope is opened, before anything
  is created on its shard, and synced; entries that arrive together share
  one LMDB transaction (a group commit), and an entry never changes.
- Opening by id alone returns the entry; opening under a parent that is not
  the entry's is refused as it is locally (a scope keeps the parent it was
  created under). Creating the same id from two drivers at once cannot split
  it: both ask the same shard, which answers one after the other.
- Drivers cache entries (they never change), so only a driver's first open
  of a scope asks the directory (a *miss*).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable
from typing import Any

import lmdb

from victor_actors._errors import ScopeAccessError
from victor_actors._model import ScopeRef, StateScope
from victor_actors.ray import _wire as w
from victor_actors.ray._placement import GLOBAL_ADDRESS, Address, directory_shard
from victor_actors.remote._host import parse_address

__all__ = ["CACHE_LIMIT", "Directory", "DirectoryRecords", "parent_of"]

CACHE_LIMIT = 1_000_000  # entries a driver keeps before it starts afresh

_LEVELS = (StateScope.WORKFLOW.value, StateScope.CONVERSATION.value)


def parent_of(address: Address) -> str:
    """The parent an address names, as a ref's text."""
    _level, _ident, wf, team = address
    if wf is not None:
        return f"workflow:{wf}"
    if team is not None:
        return f"team:{team}"
    return "global:global"


def _moved(ref: ScopeRef, found: Address, wanted: Address) -> ScopeAccessError:
    return ScopeAccessError(
        f"{ref} already exists under {parent_of(found)}, not under {parent_of(wanted)}; a scope keeps "
        "the parent it was created under; nothing was created"
    )


class DirectoryRecords:
    """The entries one shard keeps (a database of its side LMDB environment), group-committed."""

    def __init__(self, env: lmdb.Environment, durable: bool) -> None:
        self.env = env
        self.db = env.open_db(b"dir")
        self.durable = durable
        self._pending: dict[bytes, Address] = {}  # entries being written
        self._waiters: list[asyncio.Future[None]] = []
        self._scheduled = False
        self.writes = 0  # LMDB transactions written
        self.entries = 0  # entries written

    def _stored(self, key: bytes) -> Address | None:
        with self.env.begin(db=self.db) as t:
            raw = t.get(key)
        return None if raw is None else parse_address(w.decode(bytes(raw))["a"])

    async def place(self, op: Any) -> Any:
        """The address of ``op["a"]``'s scope: its entry, or a new one (see the module's docs).

        ``any``: the caller named no parent (by id alone). ``c``: create it if it has no entry.

        Raises:
            ScopeAccessError: it exists under another parent than the one named, or it does not
                exist and ``c`` is false; nothing was created.
        """
        address = parse_address(op["a"])
        level, ident, _wf, _team = address
        if level not in _LEVELS:
            raise ScopeAccessError(f"the directory keeps workflows and conversations, not {level!r:.40}")
        ref = ScopeRef(StateScope.coerce(level), ident)  # the local checks of an id
        any_parent = bool(op.get("any"))
        key = str(ref).encode()
        found = self._pending.get(key) or self._stored(key)
        if found is not None:
            if not any_parent and found[2:] != address[2:]:
                raise _moved(ref, found, address)
            if key in self._pending:
                await self._commit()  # answered once it is durable
            return found
        if not op.get("c", True):
            raise ScopeAccessError(f"no scope {ref} exists, and create=False: nothing was created")
        if any_parent:
            address = (level, ident, None, None)  # a new scope named by id alone lives under global
        self._pending[key] = address
        await self._commit()
        return address

    async def _commit(self) -> None:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._waiters.append(done)
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(lambda: loop.create_task(self._write()))
        await done

    async def _write(self) -> None:
        self._scheduled = False
        batch, waiters = dict(self._pending), self._waiters
        self._waiters = []

        def work() -> None:
            with self.env.begin(db=self.db, write=True) as t:
                for key, address in batch.items():
                    t.put(key, w.encode({"a": address}))
            if self.durable:
                self.env.sync(True)

        error: BaseException | None = None
        try:
            await asyncio.to_thread(work)
            self.writes += 1
            self.entries += len(batch)
        except Exception as exc:
            error = exc
        for key, address in batch.items():
            if self._pending.get(key) == address:
                del self._pending[key]
        for fut in waiters:
            if fut.done():
                continue
            if error is None:
                fut.set_result(None)
            else:
                fut.set_exception(
                    ScopeAccessError(
                        f"the directory entry could not be written ({error!r}); nothing was created"
                    )
                )


class Directory:
    """A driver's view of the directory: a cache, and a question to the right shard on a miss."""

    def __init__(
        self, ask: Callable[[int, dict[str, Any], float | None], Awaitable[Any]], shards: int
    ) -> None:
        self._ask = ask
        self.shards = shards
        self.cache: collections.OrderedDict[ScopeRef, Address] = collections.OrderedDict()
        self.misses = 0

    def cached(self, address: Address) -> Address | None:
        """The scope's full address from the cache alone, or None (a miss).

        Raises:
            ScopeAccessError: the cache knows it under another parent than the one named.
        """
        level, ident, wf, team = address
        if level == StateScope.GLOBAL.value:
            return GLOBAL_ADDRESS
        if level == StateScope.TEAM.value:
            return address
        if level == StateScope.CONVERSATION.value and wf is not None:
            parent = self.cached((StateScope.WORKFLOW.value, wf, None, team))
            if parent is None:
                return None
            address = (level, ident, wf, parent[3])
        ref = ScopeRef(StateScope.coerce(level), ident)
        found = self.cache.get(ref)
        if found is not None and (wf is not None or team is not None) and found[2:] != address[2:]:
            raise _moved(ref, found, address)
        return found

    async def resolve(self, address: Address, create: bool) -> Address:
        """The scope's full address, from the cache or the directory (recording it if it is new).

        Raises:
            ScopeAccessError: it exists under another parent, or (``create=False``) it or a
                parent named does not exist; nothing was created.
        """
        level, ident, wf, team = address
        if level in (StateScope.GLOBAL.value, StateScope.TEAM.value):
            return self.cached(address) or address
        if level == StateScope.CONVERSATION.value and wf is not None:
            parent = await self.resolve((StateScope.WORKFLOW.value, wf, None, team), create)
            address = (level, ident, wf, parent[3])
        found = self.cached(address)
        if found is not None:
            return found
        ref = ScopeRef(StateScope.coerce(level), ident)
        self.misses += 1
        op = {"k": "place", "a": address, "any": wf is None and team is None, "c": create}
        found = parse_address(await self._ask(directory_shard(ref, self.shards), op, None))
        if len(self.cache) >= CACHE_LIMIT:
            self.cache.popitem(last=False)
        self.cache[ref] = found
        return found

    def learn(self, address: Address) -> None:
        """Remember an address the directory gave (another way than :meth:`resolve`)."""
        level, ident, _wf, _team = address
        if level in _LEVELS:
            self.cache[ScopeRef(StateScope.coerce(level), ident)] = address
