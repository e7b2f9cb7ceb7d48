"""One shard: a Ray actor (one process) hosting a local victor_actors runtime on its own store.

The shard is an asyncio Ray actor. Every request from a driver arrives in a
``call`` carrying many operations (the driver coalesces them), each decoded
from framed bytes (:mod:`._wire`) and run as its own task, so a shard's
scopes commit concurrently and share group commits in the local store.

**Holds.** The cross-shard protocol (two-phase commit, see
``docs/ray.md``) needs a prepared scope to stay at its prepared version
until the decision. A shard tracks, per scope, the transaction holding it
(``_held``) and the writes in progress (``_writing``). A write to a held
scope waits for its release (or its deadline); a prepare first marks its
scopes held, then waits for the writes already in progress, then reads the
versions and dry-runs its part through the pure reducer. So a prepared part
cannot fail at commit: its scopes cannot move and the reducer is a function.

**Decisions and recovery.** The global scope's shard (its home) is the
decision keeper: a cross-shard transaction is committed exactly when the
global scope's commit at the prepared version carries the transaction id
(in its first transition's metadata, durable with the commit itself).
Every other participant writes a durable prepare record (``txn`` database
of a small LMDB environment beside the store, synced) before it votes
yes. After a restart, or when a hold outlives ``hold_timeout``, a
participant asks the home for the outcome: the home aborts a transaction
that is still only prepared there (presumed abort) and answers from the
global scope's log otherwise.

**At most once.** Every batch a driver sends carries a batch id in its
first transition's metadata. A request the driver retries (its first
attempt's outcome unknown) is first looked up in the written scopes' last
:data:`DEDUPE_WINDOW` commits; if found, that commit is returned instead of
applying the batch again.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import attrs
import lmdb

from victor_actors._errors import (
    CheckpointCorruptError,
    DeadlineExceededError,
    ScopeAccessError,
    ScopeFailedError,
    VersionConflictError,
    VictorActorsError,
)
from victor_actors._manager import GlobalStateManager
from victor_actors._messages import ApplyRequest
from victor_actors._model import GLOBAL_REF, ScopeRef, StateScope, StateTransition
from victor_actors._reducer import reduce
from victor_actors._rollback import ScopeRollback
from victor_actors._runs import _Plan
from victor_actors._snapshot import ContextSnapshot
from victor_actors._state import ScopeState, StateChanged
from victor_actors._tools import ToolCall
from victor_actors._values import FrozenDict
from victor_actors.ray import _wire as w
from victor_actors.ray._placement import HOME, Address

__all__ = ["BATCH_KEY", "DEDUPE_WINDOW", "Shard", "shard_name"]

BATCH_KEY = "victor_actors.batch"  # transition metadata: the driver's batch (or transaction) id
DEDUPE_WINDOW = 256  # commits per scope searched for a retried batch id
EVENT_RING = 1024  # live events kept per subscribed scope for the driver's poll
ROLLED_BACK_KEPT = 4096  # recent rolled-back runs whose late writes a shard refuses


class ToolExecutionError(RuntimeError):
    """A driver-side tool raised; its message is the driver's error, recorded in the TOOL_RESULT."""


def shard_name(token: str, index: int) -> str:
    return f"victor-actors-{token}-shard-{index}"


class _Prepared:
    __slots__ = (
        "address",
        "deadline",
        "deciding",
        "global_version",
        "home",
        "refs",
        "role",
        "steps",
        "versions",
    )

    def __init__(
        self,
        role: str,
        address: Address,
        steps: tuple[StateTransition, ...],
        versions: dict[ScopeRef, int],
        refs: frozenset[ScopeRef],
        deadline: float,
        home: int,
        global_version: int,
    ) -> None:
        self.role = role
        self.address = address
        self.steps = steps
        self.versions = versions
        self.refs = refs
        self.deadline = deadline
        self.home = home
        self.global_version = global_version
        self.deciding: asyncio.Event | None = None  # set while its commit is being written


def _address(raw: Any) -> Address:
    if not isinstance(raw, (tuple, list)) or len(raw) != 4:
        raise ScopeAccessError("a scope address is (level, id, workflow_id, team_id)")
    level, ident, wf, team = raw
    for part in (level, ident):
        if not isinstance(part, str):
            raise ScopeAccessError("a scope address names its level and id as str")
    for part in (wf, team):
        if part is not None and not isinstance(part, str):
            raise ScopeAccessError("a scope address names its workflow and team ids as str or None")
    return (level, ident, wf, team)


def _tagged(steps: tuple[StateTransition, ...], batch_id: str) -> tuple[StateTransition, ...]:
    """``steps`` with the batch id in the first transition's metadata (durable with the commit).

    The first transition is already validated, and a str id is a frozen value: it is copied
    without validating its data again (the hot path pays this once per request).
    """
    if not steps:
        return steps
    first = steps[0]
    meta = dict(first.metadata)
    meta[BATCH_KEY] = batch_id
    tagged = object.__new__(StateTransition)
    tagged.__attrs_init__(first.transition_type, first.data, FrozenDict._wrap(meta))
    return (tagged, *steps[1:])


def _written(handle: Any, steps: tuple[StateTransition, ...]) -> frozenset[ScopeRef]:
    """The scopes ``steps`` write from ``handle``'s scope (its own alone unless one names a scope)."""
    for t in steps:
        if "scope" in t.data:
            return frozenset(handle.written_scopes(steps))
    return frozenset((handle.ref,))


def _carries(transitions: tuple[StateTransition, ...], batch_id: str) -> bool:
    return bool(transitions) and transitions[0].metadata.get(BATCH_KEY) == batch_id


class Shard:
    """The Ray actor class (wrapped with ``ray.remote`` by the driver). Methods take and return bytes."""

    def __init__(
        self, root: str | None, index: int, shards: int, token: str, options: Mapping[str, Any]
    ) -> None:
        self.index = index
        self.shards = shards
        self.token = token
        opts = dict(options)
        self.hold_timeout = float(opts.pop("hold_timeout", 30.0))
        if root is None:  # in memory: no store, and prepare records in a private temporary directory
            self._scratch = tempfile.TemporaryDirectory(prefix=f"victor-actors-shard-{index}-")
            self.path = None
            self.manager = GlobalStateManager.open(None, **opts)
            txpath = self._scratch.name
        else:
            os.makedirs(root, exist_ok=True)
            self.path = os.path.join(root, f"shard-{index}")
            self.manager = GlobalStateManager.open(self.path, **opts)
            txpath = os.path.join(root, f"shard-{index}.2pc")
        self._txlog = lmdb.open(txpath, max_dbs=2, map_size=1 << 26)
        self._txdb = self._txlog.open_db(b"txn")
        self._handles: dict[Address, Any] = {}
        self._held: dict[ScopeRef, str] = {}
        self._writing: collections.Counter[ScopeRef] = collections.Counter()
        self._run_writing: collections.Counter[str] = collections.Counter()  # writes in progress, by run
        self._rolled_back: collections.OrderedDict[str, None] = collections.OrderedDict()  # recent runs
        self._prepared: dict[str, _Prepared] = {}
        self._cond: asyncio.Condition | None = None
        self._mirror: tuple[int, ScopeState] | None = None
        self._mirror_lock = threading.Lock()
        self._peers: dict[int, Any] = {}
        self._rings: dict[ScopeRef, collections.deque[StateChanged]] = {}
        self._subs: dict[ScopeRef, Any] = {}
        self._commit_event: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = False
        self._fault: str | None = None
        # driver-side tool executors: requests waiting for the driver, by "scope|request id"
        self._tool_calls: dict[str, dict[str, Any]] = {}
        self._tool_names: set[str] = set()
        self._tool_timeouts: dict[str, float] = {}
        self._tool_event: asyncio.Event | None = None
        self._resumed = False
        self.counters: collections.Counter[str] = collections.Counter()
        self._in_doubt = self._read_prepare_records()
        if index == HOME:
            glob = self.manager.get_global_state()
            self._global_sub = glob.subscribe(self._push_mirror)

    # -- start-up ------------------------------------------------------------

    def _read_prepare_records(self) -> list[tuple[str, _Prepared]]:
        """Prepare records left by the last run: their scopes stay held until resolved."""
        out = []
        with self._txlog.begin(db=self._txdb) as t:
            for key, raw in t.cursor():
                try:
                    txid = bytes(key).decode()
                    p = w.decode(bytes(raw))
                except (UnicodeDecodeError, VictorActorsError) as exc:
                    raise CheckpointCorruptError(
                        f"shard {self.index}'s prepare record {bytes(key)!r} is unreadable ({exc}): "
                        "its cross-shard part can be neither finished nor dropped safely; "
                        "the shard refuses to start"
                    ) from None
                prepared = _Prepared(
                    "part",
                    _address(p["a"]),
                    w.transitions_from(p["t"]),
                    {ScopeRef.parse(r): v for r, v in p["v"]},
                    frozenset(ScopeRef.parse(r) for r, _ in p["v"]),
                    0.0,
                    int(p["home"]),
                    int(p["gv"]),
                )
                out.append((txid, prepared))
                self._prepared[txid] = prepared
                for ref in prepared.refs:
                    self._held[ref] = txid
        return out

    async def _start(self) -> None:
        if self._started:
            return
        self._started = True
        self._loop = asyncio.get_running_loop()
        self._cond = asyncio.Condition()
        self._commit_event = asyncio.Event()
        self._tool_event = asyncio.Event()
        self._loop.create_task(self._watchdog())

    async def _watchdog(self) -> None:
        """Resolve in-doubt parts left by a restart, then any hold that outlives ``hold_timeout``."""
        for txid, _ in self._in_doubt:
            await self._resolve(txid)
        while True:
            await asyncio.sleep(min(1.0, max(self.hold_timeout / 4, 0.05)))
            now = time.monotonic()
            for txid, p in list(self._prepared.items()):
                if p.deadline and now > p.deadline and p.deciding is None:
                    if p.role == "global":
                        self.counters["holds_expired"] += 1
                        await self._release(txid)
                    else:
                        await self._resolve(txid)

    def _peer(self, n: int) -> Any:
        import ray

        actor = self._peers.get(n)
        if actor is None:
            actor = self._peers[n] = ray.get_actor(shard_name(self.token, n), namespace="victor_actors")
        return actor

    # -- scopes ----------------------------------------------------------------

    def _handle(self, address: Address) -> Any:
        h = self._handles.get(address)
        if h is None:
            level, ident, wf, team = address
            m = self.manager
            if level == StateScope.GLOBAL.value:
                h = m.get_global_state()
            elif level == StateScope.TEAM.value:
                h = m.get_team_state(ident)
            elif level == StateScope.WORKFLOW.value:
                h = m.get_workflow_state(ident, team_id=team)
            elif level == StateScope.CONVERSATION.value:
                h = m.get_conversation_state(ident, workflow_id=wf, team_id=team)
            else:
                raise ScopeAccessError(f"unknown scope level {level!r}; nothing was applied")
            if len(self._handles) > 100_000:
                self._handles.clear()
            self._handles[address] = h
        return h

    def _ancestors(self, snap: ContextSnapshot) -> tuple[ScopeState, ...]:
        """The snapshot's ancestors, with the global scope read from this shard's mirror (off home)."""
        ancestors = snap._ancestors
        if self.index == HOME:
            return ancestors
        mirror = self._mirror
        if mirror is None:
            return ancestors
        return tuple(mirror[1] if a.ref == GLOBAL_REF else a for a in ancestors)

    async def _fresh_mirror(self, at_least: int) -> None:
        """Make sure the mirror holds the global scope at ``at_least`` or later (asking home if not)."""
        mirror = self._mirror
        if self.index == HOME or (mirror is not None and mirror[0] >= at_least and at_least >= 0):
            return
        if mirror is not None and at_least < 0:
            return
        raw = await self._peer(HOME).global_state.remote()
        self._set_mirror(raw)

    def _set_mirror(self, raw: bytes) -> None:
        p = w.decode(raw)
        state = w.state_from(p["s"])
        with self._mirror_lock:
            if self._mirror is None or state.version > self._mirror[0]:
                self._mirror = (state.version, state)

    def _push_mirror(self, record: StateChanged) -> None:
        """Home only, on the event thread: send the global scope's new state to every other shard."""
        state = self.manager.get_global_state().snapshot()._state
        raw = w.encode({"s": w.state_to(state)})
        for n in range(self.shards):
            if n != HOME:
                try:
                    self._peer(n).mirror.remote(raw)
                except Exception:
                    self._peers.pop(n, None)

    # -- Ray methods ------------------------------------------------------------

    async def inject(self, point: str) -> None:
        """Arm a one-shot crash (``os._exit``) at ``point``, for fault tests: ``part_after_prepare``
        (a participant, once its prepare record is durable), ``home_before_commit`` and
        ``home_after_commit`` (global's home, around its commit of a cross-shard batch),
        ``apply_after_commit`` (a plain write, durable, before its reply), ``rollback_after_commit``
        (a run's undo in one scope, likewise)."""
        if point not in (
            "part_after_prepare",
            "home_before_commit",
            "home_after_commit",
            "apply_after_commit",
            "rollback_after_commit",
        ):
            raise ValueError(f"unknown fault point {point!r}")
        self._fault = point

    def _crash_at(self, point: str) -> None:
        if self._fault == point:
            self.manager.flush()
            os._exit(70)

    async def ping(self) -> int:
        await self._start()
        return self.index

    async def node(self) -> str:
        """The id of the Ray node this shard runs on."""
        import ray

        return str(ray.get_runtime_context().get_node_id())

    async def mirror(self, raw: bytes) -> None:
        self._set_mirror(raw)

    async def global_state(self) -> bytes:
        state = self.manager.get_global_state().snapshot()._state
        return w.encode({"s": w.state_to(state)})

    async def call(self, raw: bytes) -> bytes:
        """Run every operation in ``raw`` concurrently; reply with one result per operation, in order."""
        await self._start()
        try:
            ops = w.ops_of(w.decode(raw))
        except VictorActorsError as exc:
            return w.encode({"r": (), "e": w.error_to(exc)})
        results = await asyncio.gather(*(self._op(op) for op in ops))
        self.counters["calls"] += 1
        self.counters["ops"] += len(ops)
        return w.encode({"r": tuple(results)})

    async def _op(self, op: Any) -> Any:
        try:
            kind = op["k"]
            fn = _OPS.get(kind)
            if fn is None:
                raise ScopeAccessError(f"unknown shard operation {kind!r}")
            return (True, await fn(self, op))
        except VictorActorsError as exc:
            return (False, w.error_to(exc))
        except Exception as exc:
            return (False, w.error_to(ScopeFailedError(f"bad shard request: {type(exc).__name__}: {exc}")))

    # -- holds -------------------------------------------------------------------

    async def _wait_unheld(self, refs: frozenset[ScopeRef], deadline: float, txid: str | None) -> None:
        cond = self._cond
        assert cond is not None
        async with cond:
            while any(self._held.get(r, txid) != txid for r in refs):
                left = deadline - time.monotonic()
                if left <= 0:
                    held = sorted(str(r) for r in refs if self._held.get(r, txid) != txid)
                    raise DeadlineExceededError(
                        f"{', '.join(held)} stayed held by a cross-shard commit until the request's "
                        "deadline; nothing was applied"
                    )
                try:
                    await asyncio.wait_for(cond.wait(), left)
                except TimeoutError:
                    pass

    async def _release(self, txid: str) -> None:
        p = self._prepared.pop(txid, None)
        if p is None:
            return
        for ref in p.refs:
            if self._held.get(ref) == txid:
                del self._held[ref]
        if p.role == "part":
            with self._txlog.begin(db=self._txdb, write=True) as t:
                t.delete(txid.encode())
        cond = self._cond
        if cond is not None:
            async with cond:
                cond.notify_all()

    @contextlib.asynccontextmanager
    async def _writing_to(
        self, refs: frozenset[ScopeRef], deadline: float, txid: str | None
    ) -> AsyncIterator[None]:
        """Write to ``refs``: once no other transaction holds them, counted as a write in progress
        (a prepare waits for those) until the block ends."""
        await self._wait_unheld(refs, deadline, txid)
        for r in refs:
            self._writing[r] += 1
        try:
            yield
        finally:
            for r in refs:
                self._writing[r] -= 1
                if not self._writing[r]:
                    del self._writing[r]
            cond = self._cond
            assert cond is not None
            async with cond:
                cond.notify_all()

    async def _write(
        self, handle: Any, steps: tuple[StateTransition, ...], expected: Any, timeout: float, txid: str | None
    ) -> StateChanged:
        deadline = time.monotonic() + timeout
        async with self._writing_to(_written(handle, steps), deadline, txid):
            record: StateChanged = await handle.aapply(
                steps, expected_version=expected, timeout=max(deadline - time.monotonic(), 0.001)
            )
        return record

    # -- operations ----------------------------------------------------------------

    def _find(self, refs: frozenset[ScopeRef], batch_id: str) -> StateChanged | None:
        """The commit of ``batch_id`` in ``refs``' last DEDUPE_WINDOW commits, as a full record.

        Full: its key changes, messages (with their place in the log), stage, tool requests and
        sessions, rebuilt by the reducer from the version before it, as the live commit made them.
        A run's rollback undoes a commit from exactly these fields: a record carrying only the
        transitions (what the log stores) would undo nothing. When the batch wrote several
        scopes, the other scopes' records are its ``related``.
        """
        store = self.manager.store
        if store is None:
            return None
        found: list[StateChanged] = []
        for ref in sorted(refs, key=str):
            head = store.head(ref) or 0
            for v in range(head, max(0, head - DEDUPE_WINDOW), -1):
                try:
                    rec = store.commit_record(ref, v)
                except VictorActorsError:
                    break
                if rec.kind == "batch" and _carries(rec.transitions, batch_id):
                    before = self.manager.state_at(ref, v - 1)._state
                    _state, full = reduce(
                        before,
                        rec.transitions,
                        commit_id=rec.commit_id,
                        run_id=rec.run_id,
                        timestamp=rec.timestamp,
                    )
                    found.append(full)
                    break
        if not found:
            return None
        if len(found) == 1:
            return found[0]
        involved = tuple(r.ref for r in found)
        return attrs.evolve(found[0], involved=involved, related=tuple(found[1:]))

    async def _apply(self, op: Any) -> Any:
        handle = self._handle(_address(op["a"]))
        steps = w.transitions_from(op["t"])
        batch_id = op.get("b")
        if isinstance(batch_id, str) and batch_id:
            steps = _tagged(steps, batch_id)
            if op.get("rt"):
                found = self._find(_written(handle, steps), batch_id)
                if found is not None:
                    self.counters["deduplicated"] += 1
                    return w.record_to(found)
        expected = _expected(op.get("x"))
        run = op.get("run")
        if not isinstance(run, str) or not run:
            record = await self._write(handle, steps, expected, float(op.get("to") or 30.0), None)
        else:
            if run in self._rolled_back:
                raise DeadlineExceededError(
                    f"run {run} was already rolled back on shard {self.index}; this write of it came "
                    "too late and was not applied"
                )
            self._run_writing[run] += 1  # its rollback here waits for it
            try:
                record = await self._write(handle, steps, expected, float(op.get("to") or 30.0), None)
            finally:
                await self._run_wrote(run)
        self._crash_at("apply_after_commit")
        return w.record_to(record, transitions=False)  # the driver has them

    async def _run_wrote(self, run: str) -> None:
        self._run_writing[run] -= 1
        if not self._run_writing[run]:
            del self._run_writing[run]
        cond = self._cond
        assert cond is not None
        async with cond:
            cond.notify_all()

    async def _snapshot(self, op: Any) -> Any:
        handle = self._handle(_address(op["a"]))
        await self._fresh_mirror(int(op.get("g", -1)))
        snap = await handle.asnapshot()
        return w.snapshot_to(snap, self._ancestors(snap))

    async def _prepare(self, op: Any) -> Any:
        """Vote on one part of a cross-shard batch; yes holds its scopes until the decision."""
        txid, role = str(op["id"]), str(op["role"])
        again = self._prepared.get(txid)
        if again is not None and again.role == role:  # a prepare sent again after a restart
            return {"v": tuple((str(r), v) for r, v in again.versions.items())}
        address = _address(op["a"])
        handle = self._handle(address)
        steps = w.transitions_from(op["t"])
        if role == "global":
            steps = _tagged(steps, txid)  # the decision record: durable with the global commit
        refs = _written(handle, steps) | {handle.ref}
        deadline = time.monotonic() + float(op.get("to") or 30.0)
        await self._wait_unheld(refs, deadline, None)
        for r in refs:
            self._held[r] = txid
        try:
            cond = self._cond
            assert cond is not None
            async with cond:
                while any(self._writing.get(r) for r in refs):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise DeadlineExceededError("writes in progress outlasted the prepare's deadline")
                    try:
                        await asyncio.wait_for(cond.wait(), left)
                    except TimeoutError:
                        pass
            snap = await handle.asnapshot()
            versions = _check_and_dry_run(snap, steps, _expected(op.get("x")), txid)
        except BaseException:
            for r in refs:
                if self._held.get(r) == txid:
                    del self._held[r]
            raise
        prepared = _Prepared(
            role,
            address,
            steps,
            versions,
            refs,
            time.monotonic() + self.hold_timeout,
            int(op.get("home", HOME)),
            int(op.get("gv", 0)),
        )
        self._prepared[txid] = prepared
        if role == "part":  # durable before the vote: a restart must find it
            record = w.encode(
                {
                    "a": address,
                    "t": w.transitions_to(steps),
                    "v": tuple((str(r), v) for r, v in versions.items()),
                    "home": prepared.home,
                    "gv": prepared.global_version,
                }
            )
            with self._txlog.begin(db=self._txdb, write=True) as t:
                t.put(txid.encode(), record)
            if self.path is not None:  # in memory nothing survives a restart: no sync to wait for
                self._txlog.sync(True)
            self._crash_at("part_after_prepare")
        self.counters["prepared"] += 1
        return {"v": tuple((str(r), v) for r, v in versions.items())}

    async def _commit(self, op: Any) -> Any:
        txid = str(op["id"])
        p = self._prepared.get(txid)
        if "m" in op:
            self._set_mirror(op["m"])
        if p is None:
            # already decided here: a part resolved after a restart, or a retried commit
            found = self._find(frozenset(ScopeRef.parse(r) for r in op.get("refs", ())), txid)
            if found is not None:
                reply: dict[str, Any] = {"r": w.record_to(found)}
                if found.ref == GLOBAL_REF:
                    reply["m"] = await self.global_state()
                return reply
            raise ScopeFailedError(
                f"cross-shard commit {txid} is not prepared on shard {self.index} (it was aborted, "
                "or its hold expired); nothing was applied here"
            )
        handle = self._handle(p.address)
        steps = p.steps if p.role == "global" else _tagged(p.steps, txid)
        expected = {r: v for r, v in p.versions.items()}
        if p.deciding is not None:  # a commit sent again while the first is being written
            await p.deciding.wait()
            return await self._commit(op)
        p.deciding = asyncio.Event()
        try:
            if p.role == "global":
                self._crash_at("home_before_commit")
            record = await self._write(handle, steps, expected, 30.0, txid)
            if p.role == "global":
                self._crash_at("home_after_commit")
            await self._release(txid)
        finally:
            p.deciding.set()
        out: dict[str, Any] = {"r": w.record_to(record)}
        if p.role == "global":
            out["m"] = await self.global_state()
        self.counters["committed"] += 1
        return out

    async def _abort(self, op: Any) -> Any:
        txid = str(op["id"])
        if txid in self._prepared:
            self.counters["aborted"] += 1
        await self._release(txid)
        return None

    async def _status(self, op: Any) -> Any:
        """Home only: the outcome of ``txid``, deciding abort if it is still only prepared here."""
        txid, version = str(op["id"]), int(op["gv"])
        deciding = self._prepared[txid].deciding if txid in self._prepared else None
        if deciding is not None:  # its commit is being written: the answer is in the log after it
            await deciding.wait()
        elif txid in self._prepared:
            self.counters["aborted_by_status"] += 1
            await self._release(txid)
            return "aborted"
        store = self.manager.store
        if store is not None and (store.head(GLOBAL_REF) or 0) >= version > 0:
            try:
                rec = store.commit_record(GLOBAL_REF, version)
            except VictorActorsError:
                return "unknown"
            return "committed" if _carries(rec.transitions, txid) else "aborted"
        return "aborted"

    async def _resolve(self, txid: str) -> None:
        """A participant's in-doubt part: ask home for the outcome and finish it."""
        p = self._prepared.get(txid)
        if p is None or p.deciding is not None:
            return
        try:
            reply = await self._peer(p.home).call.remote(
                w.encode({"ops": ({"k": "status", "id": txid, "gv": p.global_version},)})
            )
            ok, outcome = w.decode(reply)["r"][0]
        except Exception:
            self._peers.pop(p.home, None)
            p.deadline = time.monotonic() + 0.5
            return
        if not ok or outcome == "unknown":
            p.deadline = time.monotonic() + 0.5
            return
        if p.deciding is not None or txid not in self._prepared:
            return  # the driver's own commit (or abort) got here first
        p.deciding = asyncio.Event()
        try:
            if outcome == "committed":
                if self._find(p.refs, txid) is None:
                    await self._fresh_mirror(p.global_version)
                    handle = self._handle(p.address)
                    await self._write(handle, _tagged(p.steps, txid), dict(p.versions), 30.0, txid)
                self.counters["recovered_commits"] += 1
            else:
                self.counters["recovered_aborts"] += 1
            await self._release(txid)
        finally:
            p.deciding.set()

    async def _poll(self, op: Any) -> Any:
        """Events after the versions given, per scope: live ones from a ring, gaps from the store's log."""
        wanted = {ScopeRef.parse(r): int(v) for r, v in op["w"]}
        for ref in wanted:
            self._watch(ref)
        out = self._events_after(wanted)
        if not out:
            event = self._commit_event
            assert event is not None
            event.clear()
            out = self._events_after(wanted)
            if not out:
                try:
                    await asyncio.wait_for(event.wait(), float(op.get("wait", 0.5)))
                except TimeoutError:
                    pass
                out = self._events_after(wanted)
        return tuple(w.record_to(e) for e in out)

    def _watch(self, ref: ScopeRef) -> None:
        if ref in self._subs:
            return
        ring: collections.deque[StateChanged] = collections.deque(maxlen=EVENT_RING)
        self._rings[ref] = ring
        loop = self._loop

        def on_commit(record: StateChanged) -> None:
            ring.append(record)
            event = self._commit_event
            if loop is not None and event is not None:
                loop.call_soon_threadsafe(event.set)

        self._subs[ref] = self.manager.scope(ref).subscribe(on_commit)

    def _events_after(self, wanted: dict[ScopeRef, int]) -> list[StateChanged]:
        out: list[StateChanged] = []
        store = self.manager.store
        for ref, after in wanted.items():
            ring = list(self._rings.get(ref, ()))
            first = ring[0].new_version if ring else None
            head = store.head(ref) if store is not None else None
            top = ring[-1].new_version if ring else (head or 0)
            if store is not None and (first is None or first > after + 1):
                stop = (first - 1) if first is not None else (head or 0)
                for v in range(after + 1, min(stop, after + EVENT_RING) + 1):
                    try:
                        rec = store.commit_record(ref, v)
                    except VictorActorsError:
                        break
                    out.append(
                        StateChanged(
                            ref=ref,
                            commit_id=rec.commit_id,
                            old_version=v - 1,
                            new_version=v,
                            transitions=rec.transitions,
                            run_id=rec.run_id,
                            timestamp=rec.timestamp,
                            reset=rec.kind == "reset",
                        )
                    )
            out.extend(e for e in ring if e.new_version > after and e.new_version <= top)
        return out

    async def _rollback(self, op: Any) -> Any:
        """Undo a run's commits in one scope, by value, on the scope's actor (as a local run does).

        The commits are those the driver has records of, and those of the batch ids it lists as in
        doubt that this scope's log holds. The run is first marked rolled back here, so a write of
        it that arrives later is refused, and the writes of it already in progress are waited for.
        """
        handle = self._handle(_address(op["a"]))
        ref = handle.ref
        run = str(op.get("run") or "")
        wait = float(op.get("to") or 30.0)
        deadline = time.monotonic() + wait
        if run and op.get("rt"):
            done = self._rollback_commit(ref, run)
            if done is not None:  # a retry whose first attempt committed (its reply was lost)
                self.counters["rollbacks_deduplicated"] += 1
                return w.rollback_to(ScopeRollback(ref, version=done))
        if run:
            self._rolled_back[run] = None
            self._rolled_back.move_to_end(run)
            while len(self._rolled_back) > ROLLED_BACK_KEPT:
                self._rolled_back.popitem(last=False)
            await self._wait_for_run(run, deadline)
        by_version = {
            rec.new_version: rec
            for rec in (w.record_from(r) for r in op["r"])
            if rec.ref == ref  # rebuilt from the log below when the driver's copy is missing
        }
        for batch_id in op.get("b") or ():
            found = self._find(frozenset({ref}), str(batch_id))
            if found is not None:
                by_version.setdefault(found.new_version, found)
        records = [by_version[v] for v in sorted(by_version)]
        plans: list[_Plan] = []

        def target(state: ScopeState) -> ScopeState | None:
            plan = _Plan(ref)
            for rec in records:
                plan.add(rec)
            plans.append(plan)
            return plan.target(state)

        async with self._writing_to(frozenset({ref}), deadline, None):
            req = ApplyRequest((), None, deadline, run, None, target)
            commit: StateChanged = await asyncio.to_thread(handle._kernel.ask, handle._cell, req, wait)
        self._crash_at("rollback_after_commit")
        report = (plans[0].report if plans else None) or ScopeRollback(ref)
        return w.rollback_to(attrs.evolve(report, version=commit.version if commit.committed else None))

    def _rollback_commit(self, ref: ScopeRef, run: str) -> int | None:
        """The version of ``run``'s rollback commit in ``ref``'s last DEDUPE_WINDOW commits, if any."""
        store = self.manager.store
        if store is None:
            return None
        head = store.head(ref) or 0
        for v in range(head, max(0, head - DEDUPE_WINDOW), -1):
            try:
                rec = store.commit_record(ref, v)
            except VictorActorsError:
                return None
            if rec.kind == "reset" and rec.run_id == run:
                return v
        return None

    async def _wait_for_run(self, run: str, deadline: float) -> None:
        """Until no write of ``run`` is in progress here (or ``deadline``)."""
        cond = self._cond
        assert cond is not None
        async with cond:
            while self._run_writing.get(run):
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                try:
                    await asyncio.wait_for(cond.wait(), left)
                except TimeoutError:
                    pass

    # -- tools executed on the driver -------------------------------------------------

    def _proxy(self, call: ToolCall) -> Any:
        """The local executor of a driver-side tool (on the dispatcher's thread): hand the call to the
        driver's poll and wait for its answer; the dispatcher applies the TOOL_RESULT as usual."""
        key = f"{call.scope}|{call.request_id}"
        entry: dict[str, Any] = {
            "c": {
                "k": key,
                "id": call.request_id,
                "name": call.tool_name,
                "args": call.arguments,
                "scope": str(call.scope),
                "re": call.redelivery,
                "run": call.run_id,
            },
            "done": threading.Event(),
            "out": None,
            "sent": False,
        }
        self._tool_calls[key] = entry
        loop, event = self._loop, self._tool_event
        if loop is not None and event is not None:
            loop.call_soon_threadsafe(event.set)
        try:
            if not entry["done"].wait(self._tool_timeouts.get(call.tool_name, 30.0) + 1.0):
                raise TimeoutError(f"the driver did not answer tool call {call.request_id}")
            ok, value = entry["out"]
        finally:
            self._tool_calls.pop(key, None)
        if not ok:
            raise ToolExecutionError(str(value))
        return value

    async def _tools(self, op: Any) -> Any:
        """Register driver-side executors (again after a restart); redeliver pending requests once."""
        for name, timeout in op["t"]:
            if name not in self._tool_names:
                self.manager.register_tool(str(name), self._proxy, timeout=float(timeout))
                self._tool_names.add(str(name))
                self._tool_timeouts[str(name)] = float(timeout)
        if not self._resumed and self.manager.store is not None:
            self._resumed = True
            count = await asyncio.to_thread(self.manager.resume_tools)
            self.counters["tools_redelivered"] += count
        return len(self._tool_names)

    async def _tool_poll(self, op: Any) -> Any:
        """Tool calls not yet handed to the driver (long poll)."""
        event = self._tool_event
        assert event is not None

        def fresh() -> list[Any]:
            out = []
            for entry in list(self._tool_calls.values()):
                if not entry["sent"]:
                    entry["sent"] = True
                    out.append(entry["c"])
            return out

        calls = fresh()
        if not calls:
            event.clear()
            calls = fresh()
            if not calls:
                try:
                    await asyncio.wait_for(event.wait(), float(op.get("wait", 0.5)))
                except TimeoutError:
                    pass
                calls = fresh()
        return tuple(calls)

    async def _tool_done(self, op: Any) -> Any:
        entry = self._tool_calls.get(str(op["key"]))
        if entry is None:
            return False  # timed out here, or this shard restarted since: the request is redelivered
        entry["out"] = (bool(op["ok"]), op.get("v"))
        entry["done"].set()
        return True

    async def _checkpoint(self, op: Any) -> Any:
        ref = self._handle(_address(op["a"])).ref
        return await asyncio.to_thread(self.manager.save_checkpoint, ref, label=op.get("label"))

    async def _restore(self, op: Any) -> Any:
        handle = self._handle(_address(op["a"]))
        refs = frozenset({handle.ref})
        await self._wait_unheld(refs, time.monotonic() + 30.0, None)
        record = await asyncio.to_thread(self.manager.restore, handle.ref, op["c"])
        return w.record_to(record)

    async def _list_checkpoints(self, op: Any) -> Any:
        ref = self._handle(_address(op["a"])).ref
        return tuple((c.checkpoint_id, c.version) for c in self.manager.list_checkpoints(ref))

    async def _stats(self, op: Any) -> Any:
        out = dict(self.manager.stats())
        out.update({f"shard_{k}": v for k, v in self.counters.items()})
        out["shard_held"] = len(self._held)
        out["shard_in_doubt"] = sum(1 for p in self._prepared.values() if p.role == "part")
        return out

    async def close(self) -> None:
        await asyncio.to_thread(self.manager.close)
        self._txlog.close()


def _expected(raw: Any) -> Any:
    if raw is None or isinstance(raw, int):
        return raw
    if isinstance(raw, (tuple, list)):
        return {ScopeRef.parse(r): int(v) for r, v in raw}
    raise ScopeAccessError("expected_version on the wire is an int, None or (ref, version) pairs")


def _check_and_dry_run(
    snap: ContextSnapshot, steps: tuple[StateTransition, ...], expected: Any, txid: str
) -> dict[ScopeRef, int]:
    """The versions of the scopes ``steps`` write; raises as ``apply`` would if they cannot commit."""
    own = snap._state
    states = {own.ref: own}
    for anc in snap._ancestors:
        states[anc.ref] = anc
    by_name: dict[str, ScopeRef] = {}
    for ref in states:
        by_name[ref.scope.value] = ref
        by_name[str(ref)] = ref
    parts: dict[ScopeRef, list[StateTransition]] = {}
    indices: dict[ScopeRef, list[int]] = {}
    for i, t in enumerate(steps):
        target = t.data.get("scope")
        found = own.ref if target is None else by_name.get(str(target))
        if found is None:
            raise ScopeAccessError(
                f"transition {i} targets {target!r}, which is not {own.ref} or an ancestor"
            )
        parts.setdefault(found, []).append(t)
        indices.setdefault(found, []).append(i)
    parts.setdefault(own.ref, [])
    indices.setdefault(own.ref, [])  # a part with nothing to write (a batch that writes only global)
    versions = {}
    for ref, part in parts.items():
        state = states[ref]
        want = expected if isinstance(expected, int) and ref == own.ref else None
        if isinstance(expected, dict):
            want = expected.get(ref)
        if want is not None and want != state.version:
            raise VersionConflictError(ref, want, state.version)
        reduce(state, part, commit_id=txid, indices=indices[ref])
        versions[ref] = state.version
    return versions


_OPS = {
    "apply": Shard._apply,
    "snapshot": Shard._snapshot,
    "prepare": Shard._prepare,
    "commit": Shard._commit,
    "abort": Shard._abort,
    "status": Shard._status,
    "poll": Shard._poll,
    "checkpoint": Shard._checkpoint,
    "rollback": Shard._rollback,
    "tools": Shard._tools,
    "tool_poll": Shard._tool_poll,
    "tool_done": Shard._tool_done,
    "restore": Shard._restore,
    "checkpoints": Shard._list_checkpoints,
    "stats": Shard._stats,
}
