"""The driver: :class:`RayStateManager`, the shared client (:class:`remote.Client`) over Ray shards.

Each shard is one owner of the client engine (a coalescing lane per shard,
retries with batch ids, long polls for events and tool calls), reached
through :class:`._transport.RayTransport`. What is Ray's own: finding or
starting the shards (:mod:`._cluster`), finding a scope by its id
(:mod:`._directory`), batches across shards (:mod:`._crossshard`) and runs
rolled back on every shard they wrote (:mod:`._run`).

Any number of drivers, in any processes on any nodes, attach to the same
shards and share the same state; ``close()`` detaches this one (the shards
carry on), ``shutdown()`` stops the shards for everyone.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Coroutine, Iterable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from types import MappingProxyType
from typing import Any, TypeVar

from victor_actors._errors import (
    DeadlineExceededError,
    ScopeAccessError,
    VictorActorsError,
)
from victor_actors._model import GLOBAL_REF, ScopeRef, StateScope, StateTransition
from victor_actors._snapshot import ContextSnapshot
from victor_actors._state import StateChanged
from victor_actors._typed import register_message_type
from victor_actors.ray import _wire as w
from victor_actors.ray._cluster import Shards, existing_count, join_ray, token_for
from victor_actors.ray._crossshard import commit_across
from victor_actors.ray._directory import Directory
from victor_actors.ray._handle import RayScopeHandle
from victor_actors.ray._placement import GLOBAL_ADDRESS, HOME, Address, shard_for
from victor_actors.ray._run import CURRENT_RAY_RUN, RayRun, RunWrite, finish, refused
from victor_actors.ray._wire import ShardUnavailableError
from victor_actors.remote._client import Client, Subscription, batch_id
from victor_actors.remote._transport import Transport

T = TypeVar("T")

__all__ = ["RayRun", "RayScopeHandle", "RayStateManager", "RaySubscription"]

RaySubscription = Subscription  # a driver-side subscription: the client's

# Operations that may wait at a shard (a lock, a flush, a decision being written): each goes in a call
# of its own, so it never holds a lane's slot (a cross-shard batch's prepare and commit: GROUPED).
_BYPASS = frozenset(
    {
        "status",
        "rollback",
        "tx_open",
        "tx_commit",
        "tx_abort",
        "quiesce",
        "flush",
        "restore",
        "checkpoint",
        "checkpoints",
        "compact",
        "load_checkpoint",
        "state_at",
        "scopes",
    }
)


def _id(value: Any, what: str = "a scope id") -> str:
    if not isinstance(value, str) or not value:
        raise ScopeAccessError(f"{what} must be a non-empty str, not {value!r:.80}; nothing was created")
    ScopeRef(StateScope.TEAM, value)  # the same checks as a local id (length, text)
    return value


def _opt(value: Any, what: str) -> str | None:
    return None if value is None else _id(value, what)


class RayStateManager(Client):
    """Scopes sharded over a Ray cluster, with the local manager's API and guarantees.

    ``RayStateManager.open(path, shards=2)`` attaches to the shards of the
    store at ``path`` (detached Ray actors, one process each, each with its
    own store under ``path/shard-<n>/``), starting the ones that do not run
    yet. It is also a context manager (``close()`` on exit). See
    ``docs/ray.md``.
    """

    BYPASS = _BYPASS
    # A cross-shard batch's steps on its participant share calls with the same steps of other batches,
    # each kind in a stream of its own: a prepare may wait at the shard for another batch's hold, and
    # the commits and aborts that release holds never queue behind prepares or ordinary writes.
    GROUPED = MappingProxyType({"prepare": "prepare", "commit": "resolve", "abort": "resolve"})
    WRITES = Client.WRITES | {"decide"}
    LOOKUP = frozenset({"apply", "rollback", "decide"})

    def __init__(
        self,
        path: str | None,
        shards: int,
        found: Shards,
        joined: bool,
        private: bool,
        request_timeout: float,
    ) -> None:
        self.path = path
        self.shards = shards
        self.url = f"victor-ray://{path or ''}?shards={shards}"
        self._found = found
        self._joined = joined  # this manager connected this process to Ray
        self._private = private  # ... to a cluster of its own, which ends on close
        self._global_seen = 0
        self._addresses: dict[ScopeRef, Address] = {GLOBAL_REF: GLOBAL_ADDRESS}
        self._handles: dict[Address, RayScopeHandle] = {}
        super().__init__(self._transports_for, request_timeout)
        self.counters.update(cross_shard=0, cross_shard_aborted=0)
        self._directory = Directory(self._ask, shards)

    def _transports_for(self) -> list[Transport]:
        from victor_actors.ray._transport import RayTransport

        return [
            RayTransport(n, name, a)
            for n, (name, a) in enumerate(zip(self._found.names, self._found.actors, strict=True))
        ]

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str] | None,
        shards: int | None = None,
        *,
        address: str | None = None,
        durability: str = "sync",
        request_timeout: float = 30.0,
        hold_timeout: float = 30.0,
        max_restarts: int = -1,
        shard_options: Mapping[int, Mapping[str, Any]] | None = None,
        **options: Any,
    ) -> RayStateManager:
        """Attach to the shards of the store at ``path``, starting those that do not run yet.

        Ray: the one this process initialised, else the cluster at ``address``
        (or ``RAY_ADDRESS``), else a private local one that ends with this
        manager. ``shards``: how many (default: as many as run for ``path``,
        else 2); a path keeps its count. ``options`` go to each shard's local
        ``GlobalStateManager.open`` when the shard starts (a running shard
        keeps its own); ``shard_options`` gives Ray actor options per shard
        (a scheduling strategy placing a shard on a node, ...). ``path=None``:
        shards in memory, private to this manager.

        Raises:
            ValueError: ``shards`` is not a positive int.
            ScopeAccessError: the path holds (or runs) another number of shards.
            StoreLockedError: a shard's store is held by another live shard (another cluster).
            VictorActorsError: a shard refused to start (its store is damaged, ...), as typed.
        """
        if shards is not None and (isinstance(shards, bool) or not isinstance(shards, int) or shards < 1):
            raise ValueError(f"shards must be a positive int, not {shards!r}")
        root = None if path is None else os.path.abspath(os.fspath(path))
        joined, private = join_ray(address, max(2, shards or 2))
        try:
            token = token_for(root)
            if root is not None:  # the path's count, from its running shards or its cluster.json
                known = existing_count(token) or _count_on_disk(root)
                if shards is None:
                    shards = known or 2
                elif known is not None and known != shards:
                    raise ScopeAccessError(
                        f"{root} holds a cluster of {known} shards, not {shards}: scopes would be routed "
                        "to shards that do not hold them (resharding is not supported); nothing was opened"
                    )
            shards = shards or 2
            local = {"durability": durability, "request_timeout": request_timeout, **options}
            local["hold_timeout"] = hold_timeout
            if root is None:
                local.pop("durability")
            found = Shards.attach(
                root, shards, token, local, max_restarts=max_restarts, shard_options=shard_options
            )
        except BaseException:
            if joined:
                _ray().shutdown()
            raise
        return cls(root, shards, found, joined, private, request_timeout)

    def __enter__(self) -> RayStateManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<RayStateManager {self.url}{' closed' if self.closed else ''}>"

    # -- plumbing -----------------------------------------------------------------

    def _unavailable(self, owner: int, message: str, *, may_have_applied: bool) -> VictorActorsError:
        return ShardUnavailableError(message, shard=owner, may_have_applied=may_have_applied)

    async def _shielded(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the driver's loop to its end, even if the caller is cancelled."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            return await asyncio.shield(coro)
        return await asyncio.shield(asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop)))

    def _saw(self, global_version: int | None) -> None:
        if global_version is not None and global_version > self._global_seen:
            self._global_seen = global_version

    def _saw_record(self, record: StateChanged) -> None:
        for rec in (record, *record.related):
            if rec.ref == GLOBAL_REF:
                self._saw(rec.new_version)

    def _blocking_on(self, shard: int, kind: str, op: dict[str, Any], timeout: float | None) -> Any:
        return self._sync(self._ask(shard, {"k": kind, **op}, timeout))

    async def _atx_on(self, shard: int, kind: str, op: dict[str, Any], timeout: float | None) -> Any:
        return await self._ask(shard, {"k": kind, **op}, timeout)

    # -- writes --------------------------------------------------------------------

    async def _apply(
        self, handle: RayScopeHandle, steps: tuple[StateTransition, ...], pairs: Any, timeout: float | None
    ) -> StateChanged:
        written = handle._written(steps)  # a target that is not an ancestor: refused here
        run = CURRENT_RAY_RUN.get()
        wait = self.request_timeout if timeout is None else timeout
        if run is not None:  # as locally: a run's request is bounded by the run's deadline
            if run.remaining <= 0:
                raise DeadlineExceededError(f"run {run.id} exceeded its timeout; nothing was applied")
            wait = min(wait, run.remaining)
        bid = batch_id()
        if handle.shard == HOME or GLOBAL_REF not in written:
            op = {"k": "apply", "a": handle.address, "t": w.transitions_to(steps), "x": pairs, "b": bid}
            outcome = None
            if run is not None:
                op["run"] = run.id
                write = RunWrite(run, handle, steps, bid, self._known_handle)
                write.begin()
                outcome = write.settle
            record = w.record_from(await self._ask(handle.shard, op, wait, outcome), steps)
            self._saw_record(record)
            return record
        across = commit_across(self, handle.address, handle.shard, steps, pairs, wait, bid)
        if run is None:
            return await self._on_loop(across)
        write = RunWrite(run, handle, steps, bid, self._known_handle, across=True)
        write.begin()

        async def tracked() -> StateChanged:
            try:
                record = await across
            except BaseException as exc:
                write.settle(False if refused(exc) else None)
                raise
            write.settle(True, record)
            return record

        # shielded: a caller cancelled at the run's timeout leaves the protocol to finish, and the
        # run to learn its outcome, before the rollback
        return await self._shielded(tracked())

    def apply_many(
        self, items: Iterable[tuple[RayScopeHandle, Any]], *, timeout: float | None = None
    ) -> list[StateChanged | VictorActorsError]:
        """Apply many batches at once (one Ray call per shard per few hundred); one result each.

        A batch that failed has its error in its place, like
        ``asyncio.gather(..., return_exceptions=True)``.
        """
        return self._sync(self.aapply_many(items, timeout=timeout))

    async def aapply_many(
        self, items: Iterable[tuple[RayScopeHandle, Any]], *, timeout: float | None = None
    ) -> list[StateChanged | VictorActorsError]:
        pairs = list(items)
        for h, _ in pairs:
            if not isinstance(h, RayScopeHandle):
                raise TypeError("apply_many takes (RayScopeHandle, batch) pairs")
        results = await asyncio.gather(
            *(h.aapply(b, timeout=timeout) for h, b in pairs), return_exceptions=True
        )
        out: list[StateChanged | VictorActorsError] = []
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, VictorActorsError):
                raise r
            out.append(r)
        return out

    # -- scopes --------------------------------------------------------------------

    def _handle(self, address: Address) -> RayScopeHandle:
        h = self._handles.get(address)
        if h is None:
            h = RayScopeHandle(self, address)
            if len(self._handles) > 100_000:
                self._handles.clear()
            self._handles[address] = h
            self._addresses[h.ref] = address
            _level, _, wf, team = address
            if team is not None:
                self._addresses.setdefault(ScopeRef(StateScope.TEAM, team), ("team", team, None, None))
            if wf is not None:
                self._addresses.setdefault(ScopeRef(StateScope.WORKFLOW, wf), ("workflow", wf, None, team))
        return h

    def _open(self, address: Address, create: bool) -> RayScopeHandle:
        self._check()
        found = self._directory.cached(address)
        if found is None or (not create and address[0] == StateScope.TEAM.value):
            return self._sync(self._aopen(address, create))
        return self._handle(found)

    async def _aopen(self, address: Address, create: bool) -> RayScopeHandle:
        self._check()
        if address[0] == StateScope.TEAM.value:
            if not create:
                shard = shard_for(address, self.shards)
                await self._ask(shard, {"k": "open", "a": address, "c": False}, None)
            return self._handle(address)
        found = self._directory.cached(address)
        if found is None:
            found = await self._on_loop(self._directory.resolve(address, create))
        return self._handle(found)

    def get_global_state(self) -> RayScopeHandle:
        """The application-wide scope (on shard 0, its home)."""
        self._check()
        return self._handle(GLOBAL_ADDRESS)

    def get_team_state(self, team_id: str, *, create: bool = True) -> RayScopeHandle:
        """A team's scope (under global), on the shard of its id."""
        return self._open(("team", _id(team_id), None, None), create)

    def get_workflow_state(
        self, workflow_id: str, team_id: str | None = None, *, create: bool = True
    ) -> RayScopeHandle:
        """A workflow's scope: under ``team_id``'s team or, without one, wherever it lives (or global)."""
        return self._open(("workflow", _id(workflow_id), None, _opt(team_id, "a team id")), create)

    def get_conversation_state(
        self,
        session_id: str,
        workflow_id: str | None = None,
        team_id: str | None = None,
        *,
        create: bool = True,
    ) -> RayScopeHandle:
        """One agent's conversation, as ``GlobalStateManager.get_conversation_state``: by its id alone
        it is found wherever it was created (by any driver); under a parent it was not created under,
        refused with ``ScopeAccessError``."""
        address = (
            "conversation",
            _id(session_id),
            _opt(workflow_id, "a workflow id"),
            _opt(team_id, "a team id"),
        )
        return self._open(address, create)

    async def aget_global_state(self) -> RayScopeHandle:
        return self.get_global_state()

    async def aget_team_state(self, team_id: str, *, create: bool = True) -> RayScopeHandle:
        return await self._aopen(("team", _id(team_id), None, None), create)

    async def aget_workflow_state(
        self, workflow_id: str, team_id: str | None = None, *, create: bool = True
    ) -> RayScopeHandle:
        return await self._aopen(("workflow", _id(workflow_id), None, _opt(team_id, "a team id")), create)

    async def aget_conversation_state(
        self,
        session_id: str,
        workflow_id: str | None = None,
        team_id: str | None = None,
        *,
        create: bool = True,
    ) -> RayScopeHandle:
        address = (
            "conversation",
            _id(session_id),
            _opt(workflow_id, "a workflow id"),
            _opt(team_id, "a team id"),
        )
        return await self._aopen(address, create)

    def scope(self, ref: ScopeRef | str) -> RayScopeHandle:
        """The handle of an existing scope, by its ref alone.

        Raises:
            ScopeAccessError: no such scope exists.
        """
        return self._sync(self.ascope(ref))

    async def ascope(self, ref: ScopeRef | str) -> RayScopeHandle:
        r = ScopeRef.parse(ref) if isinstance(ref, str) else ref
        if r == GLOBAL_REF:
            return self.get_global_state()
        return await self._aopen((r.scope.value, r.id, None, None), False)

    def scopes(self) -> Iterator[ScopeRef]:
        """Every scope the shards hold (each shard's, a page at a time; nothing is loaded)."""
        for n in range(self.shards):
            cursor: Any = None
            while True:
                op: dict[str, Any] = {"k": "scopes", "n": 1000}
                if cursor is not None:
                    op["cur"] = cursor
                page, cursor = self._sync(self._ask(n, op, None))
                for raw in page:
                    ref = ScopeRef.parse(raw)
                    if ref != GLOBAL_REF or n == HOME:  # every shard has a local root; home's is global
                        yield ref
                if cursor is None:
                    break

    def shard_of(self, ref: ScopeRef | str | RayScopeHandle) -> int:
        """The shard hosting ``ref`` (found through the directory if this driver has not opened it)."""
        return self._handle_for(ref).shard

    def shard_actor(self, n: int) -> Any:
        """Shard ``n``'s Ray actor handle (for operations and fault tests)."""
        return getattr(self._transports[n], "actor", None)

    def _known_handle(self, ref: ScopeRef) -> RayScopeHandle:
        address = self._addresses.get(ref)
        if address is None:
            cached = self._directory.cache.get(ref)
            if cached is None:
                raise ScopeAccessError(f"{ref} is unknown to this driver; open it with get_*_state first")
            address = cached
        return self._handle(address)

    def _handle_for(self, ref: ScopeRef | str | RayScopeHandle) -> RayScopeHandle:
        if isinstance(ref, RayScopeHandle):
            return ref
        r = ScopeRef.parse(ref) if isinstance(ref, str) else ref
        try:
            return self._known_handle(r)
        except ScopeAccessError:
            return self.scope(r)

    # -- checkpoints, stats ------------------------------------------------------------

    def save_checkpoint(self, ref: ScopeRef | str | RayScopeHandle, *, label: str | None = None) -> str:
        """Write a checkpoint of the scope's committed state on its shard; return its id."""
        return self._sync(self.asave_checkpoint(ref, label=label))

    async def asave_checkpoint(
        self, ref: ScopeRef | str | RayScopeHandle, *, label: str | None = None
    ) -> str:
        h = self._handle_for(ref)
        return str(await self._ask(h.shard, {"k": "checkpoint", "a": h.address, "label": label}, None))

    def list_checkpoints(self, ref: ScopeRef | str | RayScopeHandle) -> list[tuple[str, int]]:
        """The scope's checkpoints as ``(checkpoint id, version)``, newest first."""
        return self._sync(self.alist_checkpoints(ref))

    async def alist_checkpoints(self, ref: ScopeRef | str | RayScopeHandle) -> list[tuple[str, int]]:
        h = self._handle_for(ref)
        rows = await self._ask(h.shard, {"k": "checkpoints", "a": h.address}, None)
        return [(str(row[0]), int(row[2])) for row in rows]

    def restore(self, ref: ScopeRef | str | RayScopeHandle, checkpoint: str | int) -> StateChanged:
        """Return the scope to a checkpoint (by id) or a version, as a new commit."""
        return self._sync(self.arestore(ref, checkpoint))

    async def arestore(self, ref: ScopeRef | str | RayScopeHandle, checkpoint: str | int) -> StateChanged:
        if isinstance(checkpoint, bool) or not isinstance(checkpoint, (str, int)):
            raise TypeError("checkpoint is a checkpoint id (str) or a version (int)")
        h = self._handle_for(ref)
        return w.record_from(
            await self._ask(h.shard, {"k": "restore", "a": h.address, "c": checkpoint}, None)
        )

    def state_at(self, ref: ScopeRef | str | RayScopeHandle, version: int) -> ContextSnapshot:
        """The scope as it was at ``version`` (its ancestors as they are in its shard's store)."""
        h = self._handle_for(ref)
        return w.snapshot_from(
            self._sync(self._ask(h.shard, {"k": "state_at", "a": h.address, "v": version}, None))
        )

    def flush(self) -> None:
        """Return once every commit the shards made so far is durable (for ``async`` durability)."""
        self._sync(self.aflush())

    async def aflush(self) -> None:
        await asyncio.gather(*(self._ask(n, {"k": "flush"}, None) for n in range(self.shards)))

    def stats(self) -> dict[str, int]:
        """Every shard's counters summed, ``shards``, and this driver's own (``driver_*``)."""
        return self._sync(self.astats())

    async def astats(self) -> dict[str, int]:
        per = await self.ashard_stats()
        out: dict[str, int] = {}
        for s in per:
            for k, v in s.items():
                if isinstance(v, int) and not isinstance(v, bool):
                    out[k] = out.get(k, 0) + v
        out["shards"] = self.shards
        out.update({f"driver_{k}": v for k, v in self.counters.items()})
        out["driver_calls"] = sum(lane.calls for lane in self._lanes)
        out["driver_directory_misses"] = self._directory.misses
        return out

    def shard_stats(self) -> list[dict[str, int]]:
        """Each shard's own counters (its local manager's stats and the shard's), by shard number."""
        return self._sync(self.ashard_stats())

    async def ashard_stats(self) -> list[dict[str, int]]:
        return list(await asyncio.gather(*(self._ask(n, {"k": "stats"}, None) for n in range(self.shards))))

    def settle(self, timeout: float = 60.0) -> None:
        """Wait until every shard answers and holds no prepared or in-doubt part (after faults).

        Raises:
            DeadlineExceededError: some shard was still away or holding at the deadline.
        """
        end = time.monotonic() + timeout
        while True:
            try:
                per = self.shard_stats()
                if all(s.get("shard_held", 0) == 0 and s.get("shard_in_doubt", 0) == 0 for s in per):
                    return
            except (ShardUnavailableError, DeadlineExceededError):
                pass
            if time.monotonic() > end:
                raise DeadlineExceededError(f"the shards did not settle within {timeout:g} s")
            time.sleep(0.05)  # polling a condition across processes; nothing is ordered by it

    # -- runs ----------------------------------------------------------------------------

    @contextmanager
    def run(self, session_id: str, timeout: float = 30.0) -> Iterator[RayRun]:
        """A run, as ``GlobalStateManager.run``: if the body raises or outlives ``timeout``, its writes
        are undone in every scope it committed in, on whatever shard, and the run raises
        ``RunFailedError`` (the body's exception as its ``error`` and ``__cause__``) or
        ``RunTimeoutError``, with the ``rollback_report``.

        The undo is by value, as locally: a key, message, capability or stage another writer
        changed since the run wrote it is left as it is and listed in the report's conflicts, so a
        rollback never erases someone else's commit. Each scope is undone on its own shard (not
        atomically across shards); a shard that cannot be reached is reported, not raised. The run
        is this driver's: a driver killed inside it leaves its writes, as a local process would.
        """
        run = RayRun(_id(session_id, "a run's session id"), timeout)
        token = CURRENT_RAY_RUN.set(run)
        try:
            yield run
        except BaseException as exc:
            CURRENT_RAY_RUN.reset(token)
            self._sync(finish(self, run, exc))
            raise
        CURRENT_RAY_RUN.reset(token)
        self._sync(finish(self, run, None))

    @asynccontextmanager
    async def arun(self, session_id: str, timeout: float = 30.0) -> AsyncIterator[RayRun]:
        """The asyncio twin of :meth:`run`; the body is also cancelled at the timeout."""
        run = RayRun(_id(session_id, "a run's session id"), timeout)
        token = CURRENT_RAY_RUN.set(run)
        try:
            async with asyncio.timeout(timeout):
                yield run
        except BaseException as exc:
            CURRENT_RAY_RUN.reset(token)
            await self._on_loop(finish(self, run, exc))
            raise
        CURRENT_RAY_RUN.reset(token)
        await self._on_loop(finish(self, run, None))

    # -- tools -----------------------------------------------------------------------------

    def register_tool(self, name: str, fn: Any, *, timeout: float = 30.0) -> None:
        """Execute committed EXECUTE_TOOL requests for ``name`` on this driver, with ``fn(call: ToolCall)``.

        As ``GlobalStateManager.register_tool``: ``fn`` may be sync or ``async``; its return value
        (or its error, or a timeout) comes back as a TOOL_RESULT in the requesting scope, on its
        shard. A shard hands each request only to a driver that registered its tool; a request
        held by a driver that went away goes to another one, and one no driver takes within the
        tool's timeout is answered with ``ToolUnavailableError``. A request pending when a shard
        restarts is delivered again with ``redelivery=True`` and its idempotency key, so a call
        may run twice but a result is applied once.
        """
        self._register_tool(name, fn, timeout)

    def register_message_type(self, cls: type, *, tag: str | None = None) -> str:
        """Let ``cls`` (an attrs class or a dataclass) come back as itself in this driver (see
        ``GlobalStateManager.register_message_type``; the registry is the process's, so each driver
        registers its own). Returns the tag."""
        return register_message_type(cls, tag=tag)

    # -- closing ---------------------------------------------------------------------------

    def close(self) -> None:
        """Detach this driver (its loop, polls and tools); the shards carry on for other drivers.

        When this manager started a private Ray for itself (no Ray was initialised and no address
        given), or its shards are in memory (``path=None``), no other driver can reach them: they
        end with it, their stores flushed first. Idempotent.
        """
        if self.closed:
            return
        self._close_client()
        if self._private or self.path is None:  # shards no other driver can reach: they end here
            self._found.stop()
        if self._joined:
            _ray().shutdown()

    def shutdown(self) -> None:
        """Stop the shards for every driver: each flushes and closes its store, then its actor ends.

        Other drivers' requests then fail with ``ShardUnavailableError`` at their deadline (or
        carry on with new shards, if someone opens the path again meanwhile). Also closes this
        manager.
        """
        self._close_client()
        self._found.stop()
        if self._joined:
            _ray().shutdown()
            self._joined = False


def _ray() -> Any:
    import ray

    return ray


def _count_on_disk(root: str) -> int | None:
    """The shard count ``root/cluster.json`` records, or None when this process cannot read one there
    (no such file, or a disk the shards see and the driver does not); the shards check it again.

    Raises:
        ScopeAccessError: the file is there but holds no count; nothing was opened.
    """
    import json

    meta = os.path.join(root, "cluster.json")
    try:
        with open(meta, encoding="utf-8") as f:
            raw = f.read()
    except OSError:
        return None
    try:
        count = json.loads(raw).get("shards")
    except (ValueError, AttributeError) as exc:
        raise ScopeAccessError(f"{meta} is unreadable ({exc}); nothing was opened") from None
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ScopeAccessError(f"{meta} is unreadable (no shard count in it); nothing was opened")
    return count
