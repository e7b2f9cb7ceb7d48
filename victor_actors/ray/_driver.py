"""The driver side: :class:`RayStateManager` and its scope handles, the coalescing lanes, 2PC.

Every request goes to its shard through that shard's *lane*, a coroutine on
the driver's private event loop (thread ``victor-actors-ray-driver``). A
lane keeps at most :data:`IN_FLIGHT` Ray calls outstanding; requests that
arrive meanwhile wait and leave together in the next call (up to
:data:`MAX_OPS`). A lone caller pays one call per request; a thousand
callers share a call per few hundred microseconds. That is where the
throughput comes from, not from more actors.

A call whose shard went away (killed, restarting, its node gone) is sent
again once the shard is back, each write marked as a retry so the shard
applies it at most once (by batch id); when the request's deadline passes
first, it fails with :class:`ShardUnavailableError`, which says whether it
may have been applied.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import hashlib
import json
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any, TypeVar

from victor_actors._errors import (
    DeadlineExceededError,
    RuntimeClosedError,
    ScopeAccessError,
    ScopeFailedError,
    VictorActorsError,
)
from victor_actors._handle import _transitions
from victor_actors._model import GLOBAL_REF, ScopeRef, StateScope, StateTransition, TransitionBatch
from victor_actors._rollback import RollbackReport, RunFailedError, RunTimeoutError, ScopeRollback
from victor_actors._snapshot import ContextSnapshot
from victor_actors._state import StateChanged
from victor_actors.ray import _wire as w
from victor_actors.ray._placement import HOME, Address, ref_of, shard_for
from victor_actors.ray._run import RayRun, RunWrite, refused
from victor_actors.ray._shard import Shard, shard_name
from victor_actors.ray._wire import ShardUnavailableError

T = TypeVar("T")

__all__ = ["RayRun", "RayScopeHandle", "RayStateManager", "RaySubscription"]

IN_FLIGHT = 2  # Ray calls outstanding per shard
MAX_OPS = 1000  # operations per call
RETRY_PAUSE = 0.2  # seconds between attempts to reach a shard that went away
SETTLE_SLACK = 5.0  # seconds past a run's deadline its rollback waits for the run's writes in flight
ROLLBACK_WAIT = 10.0  # at least this long for each scope's undo: it rides out a shard's restart
_WRITES = frozenset({"apply", "commit", "restore", "checkpoint", "rollback"})
_PROTOCOL = frozenset({"prepare", "commit", "abort", "status"})
_CURRENT_RUN: contextvars.ContextVar[RayRun | None] = contextvars.ContextVar(
    "victor_actors_ray_run", default=None
)


def _ray() -> Any:
    import ray

    return ray


def _unreachable_types() -> tuple[type[BaseException], ...]:
    ex = _ray().exceptions
    return tuple(
        getattr(ex, n) for n in ("RayActorError", "ActorUnavailableError", "ActorDiedError") if hasattr(ex, n)
    )


class _Item:
    __slots__ = ("attempts", "deadline", "future", "op", "sent", "write")

    def __init__(
        self, op: dict[str, Any], deadline: float, future: asyncio.Future[Any], write: RunWrite | None
    ) -> None:
        self.op = op
        self.deadline = deadline
        self.future = future
        self.attempts = 0
        self.sent = False
        self.write = write  # a run's write: told its outcome however late it comes

    def settle(self, committed: bool | None, value: Any = None) -> None:
        if self.write is not None:
            self.write.settle(committed, value)


class _Lane:
    """One shard's queue and its outstanding calls (runs on the driver loop)."""

    def __init__(self, manager: RayStateManager, index: int, actor: Any) -> None:
        self.manager = manager
        self.index = index
        self.actor = actor
        self.queue: list[_Item] = []
        self.inflight = 0
        self.calls = 0

    def submit(self, item: _Item) -> None:
        if item.op["k"] in _PROTOCOL:
            # a protocol step may wait at the shard for a hold: it never takes a lane's slot, or a
            # commit stuck behind prepares waiting for its own hold would wait for the hold to expire
            self.manager._loop.create_task(self._send([item], counted=False))
            return
        self.queue.append(item)
        self._pump()

    def _pump(self) -> None:
        loop = self.manager._loop
        while self.queue and self.inflight < IN_FLIGHT:
            batch, self.queue = self.queue[:MAX_OPS], self.queue[MAX_OPS:]
            self.inflight += 1
            loop.create_task(self._send(batch))

    async def _send(self, batch: list[_Item], counted: bool = True) -> None:
        try:
            live = []
            for item in batch:
                if item.future.done():  # its deadline passed while it waited: never sent again
                    item.settle(None if item.sent else False)
                    continue
                item.attempts += 1
                item.sent = True
                live.append(item)
            if not live:
                return
            batch = live
            payload = w.encode({"ops": tuple(i.op for i in batch)})
            self.calls += 1
            try:
                raw = await self.actor.call.remote(payload)
            except self.manager._unreachable as exc:
                self._retry(batch, exc)
                return
            except Exception as exc:
                for item in batch:
                    item.settle(None)
                    if not item.future.done():
                        item.future.set_exception(
                            ScopeFailedError(
                                f"shard {self.index} failed the call: {type(exc).__name__}: {exc}"
                            )
                        )
                return
            reply = w.decode(raw)
            if "e" in reply:
                err = w.error_from(reply["e"], f"shard {self.index}")
                for item in batch:
                    item.settle(False)
                    if not item.future.done():
                        item.future.set_exception(err)
                return
            for item, (ok, value) in zip(batch, reply["r"], strict=True):
                item.settle(bool(ok), value if ok else None)  # before the caller hears: the run knows first
                if item.future.done():
                    continue
                if ok:
                    item.future.set_result(value)
                else:
                    item.future.set_exception(w.error_from(value, f"shard {self.index}"))
        finally:
            if counted:
                self.inflight -= 1
                self._pump()

    def _retry(self, batch: list[_Item], exc: BaseException) -> None:
        loop = self.manager._loop
        now = time.monotonic()
        again = []
        for item in batch:
            if item.future.done():
                item.settle(None)  # sent to a shard that went away: it may have applied
                continue
            if now + RETRY_PAUSE >= item.deadline or self.manager.closed:
                item.settle(None)
                write = item.op["k"] in _WRITES
                item.future.set_exception(
                    ShardUnavailableError(
                        f"shard {self.index} could not be reached before the request's deadline "
                        f"({type(exc).__name__}); "
                        + (
                            "the request may have been applied (retry it: retries apply at most once)"
                            if write
                            else "it was a read; nothing was applied"
                        ),
                        shard=self.index,
                        may_have_applied=write,
                    )
                )
                continue
            if item.op["k"] in ("apply", "rollback"):
                item.op["rt"] = True  # the first attempt's outcome is unknown: look it up first
            again.append(item)
        self.manager.counters["retries"] += len(again)
        if again:

            def resend() -> None:
                for i in again:
                    self.submit(i)

            loop.call_later(RETRY_PAUSE, resend)


class RaySubscription:
    """A driver-side subscription to one scope's commits; ``close()`` ends it."""

    def __init__(self, manager: RayStateManager, ref: ScopeRef, shard: int, callback: Callable[..., object]):
        self.ref = ref
        self.shard = shard
        self._callback = callback
        self._manager = manager
        self.closed = False
        self.delivered = 0  # the last version delivered

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._manager._unsubscribe(self)


class RayScopeHandle:
    """One scope on a shard, seen from the driver: the local handle's API over Ray calls."""

    def __init__(self, manager: RayStateManager, address: Address) -> None:
        self._manager = manager
        self.address = address
        self.ref = ref_of(address)
        self.shard = shard_for(address, manager.shards)

    def __repr__(self) -> str:
        return f"<RayScopeHandle {self.ref} on shard {self.shard}>"

    # -- reads ------------------------------------------------------------------

    def snapshot(self, *, timeout: float | None = None) -> ContextSnapshot:
        """This scope's snapshot with its ancestors (global read through the shard's mirror)."""
        return self._manager._sync(self.asnapshot(timeout=timeout))

    async def asnapshot(self, *, timeout: float | None = None) -> ContextSnapshot:
        m = self._manager
        op = {"k": "snapshot", "a": self.address, "g": m._global_seen if self.shard != HOME else -1}
        snap = w.snapshot_from(await m._ask(self.shard, op, timeout))
        m._saw(snap.versions().get(GLOBAL_REF))
        return snap

    @property
    def version(self) -> int:
        return self.snapshot().version

    def get(self, key: str, default: Any = None) -> Any:
        return self.snapshot().get_state(key, default)

    async def aget(self, key: str, default: Any = None) -> Any:
        return (await self.asnapshot()).get_state(key, default)

    # -- writes -----------------------------------------------------------------

    def apply(
        self, batch: Any, *, expected_version: Any = None, timeout: float | None = None
    ) -> StateChanged:
        """Apply a batch all or nothing, across shards when it writes the global scope from elsewhere.

        Raises: as ``ScopeHandle.apply``, and ``ShardUnavailableError`` when a
        shard could not be reached (it says whether the batch may have been applied).
        """
        return self._manager._sync(self.aapply(batch, expected_version=expected_version, timeout=timeout))

    async def aapply(
        self, batch: Any, *, expected_version: Any = None, timeout: float | None = None
    ) -> StateChanged:
        steps = _transitions(batch)
        return await self._manager._apply(self, steps, expected_version, timeout, _CURRENT_RUN.get())

    def update(self, values: Mapping[str, Any], *, timeout: float | None = None) -> StateChanged:
        return self.apply(_update(values), timeout=timeout)

    async def aupdate(self, values: Mapping[str, Any], *, timeout: float | None = None) -> StateChanged:
        return await self.aapply(_update(values), timeout=timeout)

    def set(self, key: str, value: Any, *, timeout: float | None = None) -> StateChanged:
        return self.apply(TransitionBatch().update_state(key, value), timeout=timeout)

    async def aset(self, key: str, value: Any, *, timeout: float | None = None) -> StateChanged:
        return await self.aapply(TransitionBatch().update_state(key, value), timeout=timeout)

    def delete(self, key: str, *, timeout: float | None = None) -> StateChanged:
        return self.apply(TransitionBatch().delete_state(key), timeout=timeout)

    async def adelete(self, key: str, *, timeout: float | None = None) -> StateChanged:
        return await self.aapply(TransitionBatch().delete_state(key), timeout=timeout)

    def add_message(self, message: Any, *, timeout: float | None = None) -> StateChanged:
        return self.apply(TransitionBatch().add_message(message), timeout=timeout)

    async def aadd_message(self, message: Any, *, timeout: float | None = None) -> StateChanged:
        return await self.aapply(TransitionBatch().add_message(message), timeout=timeout)

    # -- events -----------------------------------------------------------------

    def subscribe(self, callback: Callable[[StateChanged], object]) -> RaySubscription:
        """Call ``callback(event)`` on the driver after every later commit of this scope, in order.

        Events come from the shard's log by version, so a shard restart
        loses none and doubles none: delivery resumes after the last version
        delivered. Callbacks run on the driver's delivery thread.
        """
        if not callable(callback):
            raise TypeError("subscribe takes a callable")
        return self._manager._subscribe(self, callback)


def _update(values: Mapping[str, Any]) -> TransitionBatch:
    if not isinstance(values, Mapping):
        raise TypeError("update takes a mapping of keys to values")
    batch = TransitionBatch()
    for key, value in values.items():
        batch.update_state(key, value)
    return batch


def _is_global(t: StateTransition) -> bool:
    return t.data.get("scope") in (StateScope.GLOBAL.value, str(GLOBAL_REF))


class RayStateManager:
    """Scopes sharded over a Ray cluster, with the local manager's API and guarantees.

    ``RayStateManager.open(path, shards=2)`` starts ``shards`` shard actors
    (Ray actors, one process each), each with its own store under
    ``path/shard-<n>/``. It calls ``ray.init()`` when Ray is not initialised
    (and then shuts Ray down on close). It is also a context manager.
    """

    def __init__(
        self, path: str | None, shards: int, actors: list[Any], owns_ray: bool, request_timeout: float
    ):
        self.path = path
        self.shards = shards
        self._actors = actors
        self._owns_ray = owns_ray
        self.request_timeout = request_timeout
        self.closed = False
        self.counters: dict[str, int] = {"retries": 0, "cross_shard": 0, "cross_shard_aborted": 0}
        self._unreachable = _unreachable_types()
        self._global_seen = 0
        self._addresses: dict[ScopeRef, Address] = {GLOBAL_REF: ("global", "global", None, None)}
        self._subs: dict[int, list[RaySubscription]] = {}
        self._events: list[tuple[RaySubscription, StateChanged]] = []
        self._events_cv = threading.Condition()
        self._loop = asyncio.new_event_loop()
        started = threading.Event()
        self._thread = threading.Thread(
            target=self._run_loop, args=(started,), name="victor-actors-ray-driver", daemon=True
        )
        self._thread.start()
        started.wait()
        self._lanes = [_Lane(self, n, a) for n, a in enumerate(actors)]
        self._pollers: dict[int, concurrent.futures.Future[None]] = {}
        self._tools: dict[str, tuple[Callable[..., Any], float]] = {}
        self._tool_pollers: dict[int, concurrent.futures.Future[None]] = {}
        self._delivery = threading.Thread(target=self._deliver, name="victor-actors-ray-events", daemon=True)
        self._delivery.start()

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str] | None,
        shards: int = 2,
        *,
        durability: str = "sync",
        request_timeout: float = 30.0,
        hold_timeout: float = 30.0,
        max_restarts: int = -1,
        shard_options: Mapping[int, Mapping[str, Any]] | None = None,
        **options: Any,
    ) -> RayStateManager:
        """Start (or reconnect to the stores of) ``shards`` shards under ``path``.

        ``options`` go to each shard's local ``StateManager.open``.
        ``shard_options`` gives Ray actor options per shard (for example a
        scheduling strategy placing a shard on a node).

        Raises:
            ValueError: ``shards`` is not a positive int.
        """
        if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
            raise ValueError(f"shards must be a positive int, not {shards!r}")
        root: str | None
        if path is None:  # in memory: every shard without a store (nothing survives a restart)
            root = None
            token = uuid.uuid4().hex[:12]
        else:
            root = os.path.abspath(os.fspath(path))
            os.makedirs(root, exist_ok=True)
            _check_layout(root, shards)
            token = hashlib.blake2b(root.encode(), digest_size=6).hexdigest()
        ray = _ray()
        owns = not ray.is_initialized()
        if owns:
            ray.init(address="local", num_cpus=max(2, shards), include_dashboard=False, log_to_driver=False)
        local = {
            "durability": durability,
            "request_timeout": request_timeout,
            **options,
            "hold_timeout": hold_timeout,
        }
        if root is None:
            local.pop("durability")
        remote = ray.remote(Shard)
        actors = []
        for n in range(shards):
            extra = dict((shard_options or {}).get(n, {}))
            actors.append(
                remote.options(
                    name=shard_name(token, n),
                    namespace="victor_actors",
                    max_restarts=max_restarts,
                    max_task_retries=0,
                    num_cpus=0,
                    max_concurrency=1000,
                    **extra,
                ).remote(root, n, shards, token, local)
            )
        try:
            ray.get([a.ping.remote() for a in actors])
        except Exception as exc:  # a shard's constructor failed: its store is locked, damaged, ...
            for a in actors:
                ray.kill(a, no_restart=True)
            if owns:
                ray.shutdown()
            cause = getattr(exc, "cause", None) or exc
            raise ScopeFailedError(
                f"a shard could not start under {root}: {type(cause).__name__}: {cause}; nothing was opened"
            ) from None
        return cls(root, shards, actors, owns, request_timeout)

    def __enter__(self) -> RayStateManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run_loop(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(started.set)
        self._loop.run_forever()

    # -- plumbing ---------------------------------------------------------------

    def _sync(self, coro: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is self._thread:
            raise RuntimeError("a RayStateManager's sync methods cannot run on its own driver loop")
        return asyncio.run_coroutine_threadsafe(self._guard(coro), self._loop).result()

    async def _guard(self, coro: Coroutine[Any, Any, T]) -> T:
        return await coro

    async def _on_loop(self, coro: Coroutine[Any, Any, T], *, shield: bool = False) -> T:
        """Run ``coro`` on the driver loop, from whatever loop the caller is on.

        ``shield``: cancelling the caller does not cancel ``coro``, which runs to its end.
        """
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            return await (asyncio.shield(coro) if shield else coro)
        future = asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._guard(coro), self._loop))
        return await (asyncio.shield(future) if shield else future)

    async def _ask(
        self, shard: int, op: dict[str, Any], timeout: float | None, write: RunWrite | None = None
    ) -> Any:
        if self.closed:
            raise RuntimeClosedError("the RayStateManager was closed; nothing was applied")
        wait = self.request_timeout if timeout is None else timeout
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop or running is None:
            return await self._submit(shard, op, wait, write)
        # From the caller's own loop: hand the request to the driver loop and get the answer back
        # with one call_soon_threadsafe each way (no task, no wait_for on the hot path).
        answer: asyncio.Future[Any] = running.create_future()

        def deliver(src: asyncio.Future[Any]) -> None:  # on the driver loop
            running.call_soon_threadsafe(_copy_outcome, src, answer)

        def submit() -> None:
            self._submit(shard, op, wait, write).add_done_callback(deliver)

        self._loop.call_soon_threadsafe(submit)
        return await answer

    def _submit(
        self, shard: int, op: dict[str, Any], wait: float, write: RunWrite | None = None
    ) -> asyncio.Future[Any]:
        """Queue ``op`` on its lane (on the driver loop); the future fails at the deadline if unanswered.

        ``write``, a run's write, is tracked from here until its reply (see ``_run.py``).
        """
        future: asyncio.Future[Any] = self._loop.create_future()
        op.setdefault("to", wait)
        if write is not None:
            write.begin()
        self._lanes[shard].submit(_Item(op, time.monotonic() + wait, future, write))
        timer = self._loop.call_later(wait + RETRY_PAUSE * 2, _expire, future, shard, wait)
        future.add_done_callback(lambda _f: timer.cancel())
        return future

    async def _ask_here(self, shard: int, op: dict[str, Any], wait: float) -> Any:
        return await self._submit(shard, op, wait)

    def _saw(self, global_version: int | None) -> None:
        if global_version is not None and global_version > self._global_seen:
            self._global_seen = global_version

    def _known_handle(self, ref: ScopeRef) -> RayScopeHandle:
        address = self._addresses.get(ref)
        if address is None:
            raise ScopeAccessError(f"{ref} is unknown to this manager; open it with get_*_state first")
        return RayScopeHandle(self, address)

    def _handle(self, address: Address) -> RayScopeHandle:
        if self.closed:
            raise RuntimeClosedError("the RayStateManager was closed")
        h = RayScopeHandle(self, address)
        self._addresses[h.ref] = address
        _level, _, wf, team = address
        if team is not None:
            self._addresses.setdefault(ScopeRef(StateScope.TEAM, team), ("team", team, None, None))
        if wf is not None:
            self._addresses.setdefault(ScopeRef(StateScope.WORKFLOW, wf), ("workflow", wf, None, team))
        return h

    def _expected_pairs(self, handle: RayScopeHandle, expected: Any) -> Any:
        """``expected_version`` in its wire form: an int, None, or (ref, version) pairs."""
        if expected is None or (isinstance(expected, int) and not isinstance(expected, bool)):
            return expected
        if not isinstance(expected, Mapping):
            raise TypeError("expected_version is an int, None, or a mapping of scope to version")
        _, _ident, wf, team = handle.address
        levels = {StateScope.GLOBAL.value: GLOBAL_REF, handle.ref.scope.value: handle.ref}
        if team is not None:
            levels[StateScope.TEAM.value] = ScopeRef(StateScope.TEAM, team)
        if wf is not None:
            levels[StateScope.WORKFLOW.value] = ScopeRef(StateScope.WORKFLOW, wf)
        out = []
        for key, version in expected.items():
            if isinstance(key, ScopeRef):
                ref = key
            elif isinstance(key, str) and key in levels:
                ref = levels[key]
            elif isinstance(key, str):
                ref = ScopeRef.parse(key)
            else:
                raise TypeError(f"expected_version keys are ScopeRef or str, not {type(key).__name__}")
            out.append((str(ref), version))
        return tuple(out)

    # -- writes -------------------------------------------------------------------

    async def _apply(
        self,
        handle: RayScopeHandle,
        steps: tuple[StateTransition, ...],
        expected: Any,
        timeout: float | None,
        run: RayRun | None = None,
    ) -> StateChanged:
        pairs = self._expected_pairs(handle, expected)
        glob = [t for t in steps if _is_global(t)]
        wait = self.request_timeout if timeout is None else timeout
        if run is not None:  # as locally: a run's request is bounded by the run's deadline
            if run.remaining <= 0:
                raise DeadlineExceededError(f"run {run.id} exceeded its timeout; nothing was applied")
            wait = min(wait, run.remaining)
        batch_id = uuid.uuid4().hex
        if handle.shard == HOME or not glob:
            op = {
                "k": "apply",
                "a": handle.address,
                "t": w.transitions_to(steps),
                "x": pairs,
                "b": batch_id,
            }
            write = None
            if run is not None:
                op["run"] = run.id
                write = RunWrite(run, handle, steps, batch_id, self._known_handle)
            record = w.record_from(await self._ask(handle.shard, op, wait, write), steps)
            self._saw_record(record)
            return record
        rest = tuple(t for t in steps if not _is_global(t))
        if run is None:
            return await self._on_loop(self._across(handle, rest, tuple(glob), pairs, wait))
        write = RunWrite(run, handle, steps, batch_id, self._known_handle, across=True)
        # shielded: a caller cancelled at the run's timeout leaves the protocol to finish, and the
        # run to learn its outcome, before the rollback
        return await self._on_loop(
            self._across_for(handle, write, rest, tuple(glob), pairs, wait), shield=True
        )

    async def _across_for(
        self,
        handle: RayScopeHandle,
        write: RunWrite,
        rest: tuple[StateTransition, ...],
        glob: tuple[StateTransition, ...],
        pairs: Any,
        wait: float,
    ) -> StateChanged:
        """:meth:`_across` for a run's write: its outcome goes to the run (on the driver loop)."""
        write.begin()
        try:
            record = await self._across(handle, rest, glob, pairs, wait, write.batch_id)
        except BaseException as exc:
            write.settle(False if refused(exc) else None)
            raise
        write.settle(True, record)
        return record

    def _saw_record(self, record: StateChanged) -> None:
        for rec in (record, *record.related):
            if rec.ref == GLOBAL_REF:
                self._saw(rec.new_version)

    async def _across(
        self,
        handle: RayScopeHandle,
        rest: tuple[StateTransition, ...],
        glob: tuple[StateTransition, ...],
        pairs: Any,
        timeout: float | None,
        txid: str | None = None,
    ) -> StateChanged:
        """Two-phase commit: global's home first (the lock order), then the part; home decides."""
        wait = self.request_timeout if timeout is None else timeout
        txid = txid or uuid.uuid4().hex
        gx: Any = None
        px: Any = pairs
        if isinstance(pairs, tuple):
            gx = tuple(p for p in pairs if p[0] == str(GLOBAL_REF))
            px = tuple(p for p in pairs if p[0] != str(GLOBAL_REF))
        self.counters["cross_shard"] += 1
        gsteps = w.transitions_to(t for t in glob)
        home_op = {
            "k": "prepare",
            "id": txid,
            "role": "global",
            "a": self._addresses[GLOBAL_REF],
            "t": gsteps,
            "x": gx,
        }
        vote = await self._ask_here(HOME, home_op, wait)
        gv = dict(vote["v"])[str(GLOBAL_REF)] + 1
        part_op = {
            "k": "prepare",
            "id": txid,
            "role": "part",
            "a": handle.address,
            "t": w.transitions_to(rest),
            "x": px,
            "home": HOME,
            "gv": gv,
        }
        try:
            pvote = await self._ask_here(handle.shard, part_op, wait)
        except BaseException:
            self.counters["cross_shard_aborted"] += 1
            await self._quiet(HOME, {"k": "abort", "id": txid}, wait)
            await self._quiet(handle.shard, {"k": "abort", "id": txid}, wait)
            raise
        refs = tuple(r for r, _ in pvote["v"])
        try:
            home_commit = {"k": "commit", "id": txid, "refs": (str(GLOBAL_REF),)}
            done: Any = await self._ask_here(HOME, home_commit, wait)
        except ShardUnavailableError:
            outcome = await self._outcome(txid, gv, wait)
            if outcome != "committed":
                await self._quiet(handle.shard, {"k": "abort", "id": txid}, wait)
                raise ShardUnavailableError(
                    f"shard {HOME} (the global scope's home) went away during a cross-shard commit; "
                    + (
                        "it was aborted, nothing was applied"
                        if outcome == "aborted"
                        else "its outcome is unknown: it may have been applied"
                    ),
                    shard=HOME,
                    may_have_applied=outcome != "aborted",
                ) from None
            done = None
        except VictorActorsError:  # home refused: the hold expired, so home aborted
            self.counters["cross_shard_aborted"] += 1
            await self._quiet(handle.shard, {"k": "abort", "id": txid}, wait)
            raise
        commit_op: dict[str, Any] = {"k": "commit", "id": txid, "refs": refs}
        if done is not None and "m" in done:
            commit_op["m"] = done["m"]
        out = await self._ask_here(handle.shard, commit_op, wait)
        record = w.record_from(out["r"])
        if done is not None:
            grec = w.record_from(done["r"])
            self._saw(grec.new_version)
            involved = (grec.ref, *(record.involved or (record.ref,)))
            record = _with_related(record, grec, involved)
        return record

    async def _outcome(self, txid: str, gv: int, wait: float) -> str:
        end = time.monotonic() + wait
        while time.monotonic() < end:
            try:
                outcome = await self._ask_here(
                    HOME, {"k": "status", "id": txid, "gv": gv}, max(end - time.monotonic(), 0.1)
                )
                return str(outcome)
            except ShardUnavailableError:
                await asyncio.sleep(RETRY_PAUSE)
        return "unknown"

    async def _quiet(self, shard: int, op: dict[str, Any], wait: float) -> None:
        try:
            await self._ask_here(shard, op, wait)
        except VictorActorsError:
            pass  # a part left prepared resolves itself through home (presumed abort)

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

    # -- scopes -------------------------------------------------------------------

    def get_global_state(self) -> RayScopeHandle:
        return self._handle(("global", "global", None, None))

    def get_team_state(self, team_id: str) -> RayScopeHandle:
        return self._handle(("team", _id(team_id), None, None))

    def get_workflow_state(self, workflow_id: str, team_id: str | None = None) -> RayScopeHandle:
        return self._handle(("workflow", _id(workflow_id), None, _opt_id(team_id)))

    def get_conversation_state(
        self, session_id: str, workflow_id: str | None = None, team_id: str | None = None
    ) -> RayScopeHandle:
        return self._handle(("conversation", _id(session_id), _opt_id(workflow_id), _opt_id(team_id)))

    def shard_of(self, ref: ScopeRef | str | RayScopeHandle) -> int:
        """The shard hosting ``ref`` (a scope this manager opened, or the global scope)."""
        if isinstance(ref, RayScopeHandle):
            return ref.shard
        r = ScopeRef.parse(ref) if isinstance(ref, str) else ref
        return self._known_handle(r).shard

    def shard_actor(self, n: int) -> Any:
        """Shard ``n``'s Ray actor handle (for operations and fault tests)."""
        return self._actors[n]

    def _handle_for(self, ref: ScopeRef | str | RayScopeHandle) -> RayScopeHandle:
        if isinstance(ref, RayScopeHandle):
            return ref
        return self._known_handle(ScopeRef.parse(ref) if isinstance(ref, str) else ref)

    # -- checkpoints, stats ----------------------------------------------------------

    def save_checkpoint(self, ref: ScopeRef | str | RayScopeHandle, *, label: str | None = None) -> str:
        """Write a checkpoint of the scope's committed state on its shard; return its id."""
        return self._sync(self.asave_checkpoint(ref, label=label))

    async def asave_checkpoint(
        self, ref: ScopeRef | str | RayScopeHandle, *, label: str | None = None
    ) -> str:
        h = self._handle_for(ref)
        return str(await self._ask(h.shard, {"k": "checkpoint", "a": h.address, "label": label}, None))

    def list_checkpoints(self, ref: ScopeRef | str | RayScopeHandle) -> list[tuple[str, int]]:
        """The scope's checkpoints as ``(checkpoint id, version)``, oldest first."""
        return self._sync(self.alist_checkpoints(ref))

    async def alist_checkpoints(self, ref: ScopeRef | str | RayScopeHandle) -> list[tuple[str, int]]:
        h = self._handle_for(ref)
        rows = await self._ask(h.shard, {"k": "checkpoints", "a": h.address}, None)
        return [(str(c), int(v)) for c, v in rows]

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

    def stats(self) -> dict[str, int]:
        """Every shard's counters summed, ``shards``, and the driver's own (retries, cross-shard commits)."""
        return self._sync(self.astats())

    async def astats(self) -> dict[str, int]:
        per = await self.ashard_stats()
        out: dict[str, int] = {}
        for s in per:
            for k, v in s.items():
                if isinstance(v, int):
                    out[k] = out.get(k, 0) + v
        out["shards"] = self.shards
        out.update({f"driver_{k}": v for k, v in self.counters.items()})
        out["driver_calls"] = sum(lane.calls for lane in self._lanes)
        return out

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
            except ShardUnavailableError:
                pass
            if time.monotonic() > end:
                raise DeadlineExceededError(f"the shards did not settle within {timeout:g} s")
            time.sleep(0.05)  # polling a condition across processes; nothing is ordered by it

    def shard_stats(self) -> list[dict[str, int]]:
        """Each shard's own counters (its local manager's stats and the shard's), by shard number."""
        return self._sync(self.ashard_stats())

    async def ashard_stats(self) -> list[dict[str, int]]:
        return list(await asyncio.gather(*(self._ask(n, {"k": "stats"}, None) for n in range(self.shards))))

    # -- runs ------------------------------------------------------------------------

    @contextmanager
    def run(self, session_id: str, timeout: float = 30.0) -> Iterator[RayRun]:
        """A run, as ``GlobalStateManager.run``: if the body raises or outlives ``timeout``, its writes
        are undone in every scope it committed in, on whatever shard, and the run raises
        ``RunFailedError`` (the body's exception as its ``error`` and ``__cause__``) or
        ``RunTimeoutError``, with the ``rollback_report``.

        The undo is by value, as locally: a key, message, capability or stage another writer
        changed since the run wrote it is left as it is and listed in the report's conflicts, so a
        rollback never erases someone else's commit. Each scope is undone on its own shard (not
        atomically across shards); a shard that cannot be reached is reported, not raised.
        """
        run = RayRun(_id(session_id), timeout)
        token = _CURRENT_RUN.set(run)
        try:
            yield run
        except BaseException as exc:
            _CURRENT_RUN.reset(token)
            self._sync(self._finish(run, exc))
            raise
        _CURRENT_RUN.reset(token)
        self._sync(self._finish(run, None))

    @asynccontextmanager
    async def arun(self, session_id: str, timeout: float = 30.0) -> AsyncIterator[RayRun]:
        """The asyncio twin of :meth:`run`; the body is also cancelled at the timeout."""
        run = RayRun(_id(session_id), timeout)
        token = _CURRENT_RUN.set(run)
        try:
            async with asyncio.timeout(timeout):
                yield run
        except BaseException as exc:
            _CURRENT_RUN.reset(token)
            await self._on_loop(self._finish(run, exc))
            raise
        _CURRENT_RUN.reset(token)
        await self._on_loop(self._finish(run, None))

    async def _finish(self, run: RayRun, exc: BaseException | None) -> None:
        timed_out = run.remaining <= 0 or isinstance(exc, TimeoutError)
        if exc is None and not timed_out:
            run.status = "succeeded"
            return
        reason = "timed out" if timed_out and exc is None else f"{type(exc).__name__}: {exc}"
        report = await self._roll_back(run, reason)
        note = ""
        if report.conflicts:
            note = f"; left as another writer changed them: {list(report.conflicts)}"
        if (
            exc is None
            or isinstance(exc, TimeoutError)
            or (timed_out and isinstance(exc, DeadlineExceededError))
        ):
            err = RunTimeoutError(
                f"run {run.id} exceeded its timeout of {run.timeout} s; its writes were rolled back{note}",
                run_id=run.id,
                rollback_report=report,
            )
            raise err from exc
        if not isinstance(exc, Exception):
            return  # cancellation, KeyboardInterrupt, SystemExit: propagate as they are
        raise RunFailedError(
            f"run {run.id} failed ({type(exc).__name__}: {exc}); its writes were rolled back{note}",
            error=exc,
            run_id=run.id,
            rollback_report=report,
        ) from exc

    async def _roll_back(self, run: RayRun, reason: str) -> RollbackReport:
        """Undo the run's writes scope by scope, each on its shard; failures are reported, not raised.

        First the run's writes still on their way are waited for (up to the run's deadline plus
        the few seconds a dead shard takes to be noticed); a write still unanswered then, or sent
        to a shard that died, is in doubt: each scope it may have written looks for its batch id.
        """
        doubt = await run._settle(min(self.request_timeout, max(run.remaining, 0.0) + SETTLE_SLACK))
        handles = dict(run.handles)
        batches: dict[ScopeRef, list[str]] = {}
        for write in doubt:
            for ref, h in write.handles.items():
                handles.setdefault(ref, h)
                batches.setdefault(ref, []).append(write.batch_id)

        async def one(ref: ScopeRef) -> ScopeRollback:
            h = handles[ref]
            records = tuple(w.record_to(r) for r in run.commits if r.ref == ref)
            op = {
                "k": "rollback",
                "a": h.address,
                "run": run.id,
                "r": records,
                "b": tuple(batches.get(ref, ())),
            }
            try:
                return w.rollback_from(
                    await self._ask_here(h.shard, op, max(self.request_timeout, ROLLBACK_WAIT))
                )
            except VictorActorsError as exc:
                return ScopeRollback(ref, conflicts=(f"the rollback of {ref} failed: {exc!r}",))

        scopes = await asyncio.gather(*(one(ref) for ref in handles))
        run.rollback_report = RollbackReport(run.id, reason, tuple(scopes))
        run.status = "rolled_back"
        return run.rollback_report

    # -- tools ------------------------------------------------------------------------

    def register_tool(self, name: str, fn: Callable[..., Any], *, timeout: float = 30.0) -> None:
        """Execute committed EXECUTE_TOOL requests for ``name`` on the driver, with ``fn(call: ToolCall)``.

        As ``GlobalStateManager.register_tool``: ``fn`` may be sync or ``async``; its return value
        (or its error, or a timeout) comes back as a TOOL_RESULT in the requesting scope, on its
        shard. A request pending when a shard restarts is delivered again with ``redelivery=True``
        and its idempotency key, so a call may run twice but a result is applied once.
        """
        if not isinstance(name, str) or not name:
            raise TypeError("a tool name is a non-empty str")
        if not callable(fn):
            raise TypeError("a tool executor must be callable")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValueError("a tool's timeout must be a positive number of seconds")
        self._tools[name] = (fn, float(timeout))
        self._sync(self._register_tools())
        for shard in range(self.shards):
            if shard not in self._tool_pollers:
                self._tool_pollers[shard] = asyncio.run_coroutine_threadsafe(
                    self._tool_poll(shard), self._loop
                )

    async def _register_tools(self, shards: Iterable[int] | None = None) -> None:
        table = tuple((n, t) for n, (_, t) in self._tools.items())
        targets = range(self.shards) if shards is None else shards
        await asyncio.gather(
            *(self._ask_here(n, {"k": "tools", "t": table}, self.request_timeout) for n in targets)
        )

    async def _tool_poll(self, shard: int) -> None:
        actor = self._actors[shard]
        while not self.closed:
            payload = w.encode({"ops": ({"k": "tool_poll", "wait": 0.5},)})
            try:
                ok, calls = w.decode(await actor.call.remote(payload))["r"][0]
            except Exception:  # the shard is away: once it is back, register again (it redelivers)
                await asyncio.sleep(RETRY_PAUSE)
                try:
                    await self._register_tools((shard,))
                except VictorActorsError:
                    pass
                continue
            if not ok:
                await asyncio.sleep(RETRY_PAUSE)
                continue
            for c in calls:
                self._loop.create_task(self._run_tool(shard, c))

    async def _run_tool(self, shard: int, c: Mapping[str, Any]) -> None:
        from victor_actors._tools import ToolCall
        from victor_actors._values import thaw

        fn, timeout = self._tools.get(str(c["name"]), (None, 0.0))
        out: dict[str, Any] = {"k": "tool_done", "key": c["k"]}
        try:
            if fn is None:
                raise LookupError(f"no executor for tool {c['name']!r} on this driver")
            call = ToolCall(
                str(c["id"]),
                str(c["name"]),
                thaw(c["args"]),
                ScopeRef.parse(c["scope"]),
                bool(c["re"]),
                c["run"],
            )
            if asyncio.iscoroutinefunction(fn):
                value = await asyncio.wait_for(fn(call), timeout)
            else:
                value = await asyncio.wait_for(asyncio.to_thread(fn, call), timeout)
            out.update(ok=True, v=value)
            w.encode(out)  # a result that cannot be stored is the tool's error, not a crash here
        except Exception as exc:
            out.update(ok=False, v=f"{type(exc).__name__}: {exc}")
        try:
            await self._ask_here(shard, out, self.request_timeout)
        except VictorActorsError:
            pass  # the shard restarted meanwhile: it delivers the request again

    # -- events ------------------------------------------------------------------------

    def _subscribe(self, handle: RayScopeHandle, callback: Callable[..., object]) -> RaySubscription:
        sub = RaySubscription(self, handle.ref, handle.shard, callback)
        sub.delivered = handle.version
        self._subs.setdefault(handle.shard, []).append(sub)
        if handle.shard not in self._pollers:
            self._pollers[handle.shard] = asyncio.run_coroutine_threadsafe(
                self._poll(handle.shard), self._loop
            )
        return sub

    def _unsubscribe(self, sub: RaySubscription) -> None:
        subs = self._subs.get(sub.shard, [])
        if sub in subs:
            subs.remove(sub)

    async def _poll(self, shard: int) -> None:
        actor = self._actors[shard]
        while not self.closed:
            subs = [s for s in self._subs.get(shard, []) if not s.closed]
            if not subs:
                await asyncio.sleep(0.05)
                continue
            after: dict[str, int] = {}
            for s in subs:
                key = str(s.ref)
                after[key] = min(after.get(key, s.delivered), s.delivered)
            payload = w.encode({"ops": ({"k": "poll", "w": tuple(after.items()), "wait": 0.5},)})
            try:
                raw = await actor.call.remote(payload)
                ok, events = w.decode(raw)["r"][0]
            except Exception:
                await asyncio.sleep(RETRY_PAUSE)
                continue
            if not ok:
                await asyncio.sleep(RETRY_PAUSE)
                continue
            out = []
            for payload_event in events:
                record = w.record_from(payload_event)
                for s in subs:
                    if s.ref == record.ref and record.new_version > s.delivered and not s.closed:
                        s.delivered = record.new_version
                        out.append((s, record))
            if out:
                with self._events_cv:
                    self._events.extend(out)
                    self._events_cv.notify()

    def _deliver(self) -> None:
        while True:
            with self._events_cv:
                while not self._events and not self.closed:
                    self._events_cv.wait()
                if self.closed and not self._events:
                    return
                batch, self._events = self._events, []
            for sub, record in batch:
                if not sub.closed:
                    try:
                        sub._callback(record)
                    except Exception:
                        pass

    # -- closing ------------------------------------------------------------------------

    def close(self) -> None:
        """Flush and stop every shard; shut Ray down if this manager started it. Idempotent."""
        if self.closed:
            return
        ray = _ray()
        try:
            ray.get([a.close.remote() for a in self._actors], timeout=30)
        except Exception:
            pass
        self.closed = True
        for a in self._actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:
                pass
        with self._events_cv:
            self._events_cv.notify_all()
        for poller in (*self._pollers.values(), *self._tool_pollers.values()):
            poller.cancel()

        def stop() -> None:
            for task in asyncio.all_tasks(self._loop):
                task.cancel()
            self._loop.call_soon(self._loop.stop)

        self._loop.call_soon_threadsafe(stop)
        self._thread.join(timeout=5)
        if self._owns_ray:
            ray.shutdown()


def _check_layout(root: str, shards: int) -> None:
    """Record the shard count in ``root/cluster.json``; refuse to reopen with another one."""
    meta = os.path.join(root, "cluster.json")
    try:
        with open(meta, encoding="utf-8") as f:
            found = json.load(f)
    except FileNotFoundError:
        with open(meta, "w", encoding="utf-8") as f:
            json.dump({"format": 1, "shards": shards}, f)
        return
    except (OSError, ValueError) as exc:
        raise ScopeAccessError(f"{meta} is unreadable ({exc}); nothing was opened") from None
    count = found.get("shards") if isinstance(found, dict) else None
    if count != shards:
        raise ScopeAccessError(
            f"{root} holds a cluster of {count!r} shards, not {shards}: scopes would be routed to shards "
            "that do not hold them (resharding is not supported); nothing was opened"
        )


def _expire(future: asyncio.Future[Any], shard: int, wait: float) -> None:
    if not future.done():
        future.set_exception(
            DeadlineExceededError(
                f"shard {shard} did not answer within {wait:g} s; a write may still be applied"
            )
        )


def _copy_outcome(src: asyncio.Future[Any], dst: asyncio.Future[Any]) -> None:
    if dst.done():
        return
    if src.cancelled():
        dst.cancel()
    elif src.exception() is not None:
        dst.set_exception(src.exception())  # type: ignore[arg-type]
    else:
        dst.set_result(src.result())


def _with_related(record: StateChanged, other: StateChanged, involved: Sequence[ScopeRef]) -> StateChanged:
    import attrs

    return attrs.evolve(record, related=(*record.related, other), involved=tuple(dict.fromkeys(involved)))


def _id(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ScopeAccessError(f"a scope id must be a non-empty str, not {value!r}; nothing was created")
    ScopeRef(StateScope.TEAM, value)  # the same checks as a local id (length, text)
    return value


def _opt_id(value: Any) -> str | None:
    return None if value is None else _id(value)
