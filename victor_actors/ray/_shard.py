"""One shard: a detached Ray actor (one process) hosting a local victor_actors runtime on its own store.

A shard is the owner's side of the client protocol (:class:`remote.Host`:
apply with at-most-once retries, snapshots, events and tool calls by long
poll, checkpoints, transactions) plus what only shards need: scopes named
by address and created on first touch, holds and the cross-shard protocol
(:mod:`._twophase`), the global scope's mirror (:mod:`._mirror`), the
directory (:mod:`._directory`), and the undo of a driver's run.

**Its store.** ``path/shard-<n>/`` (``path=None``: in memory). A shard takes
the store's owner lock before it touches anything; a store another live
shard holds (two Ray clusters given the same path, or a shard Ray restarted
on another node while the old process still runs) is refused with
:class:`StoreLockedError`, naming the holder. The refusal is the shard's
answer to every call until the store is free (checked again at most once a
second). ``path/cluster.json`` pins the number of shards of a path.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import socket
import tempfile
import time
from collections.abc import Mapping
from typing import Any

import attrs
import lmdb

from victor_actors._errors import (
    DeadlineExceededError,
    ScopeAccessError,
    StoreLockedError,
    TransitionValidationError,
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
from victor_actors.ray import _wire as w
from victor_actors.ray._directory import DirectoryRecords
from victor_actors.ray._holds import Holds
from victor_actors.ray._mirror import Mirror
from victor_actors.ray._placement import HOME, Address
from victor_actors.remote._host import DEDUPE_WINDOW, Host, carries, expected_of, parse_address, tagged

__all__ = ["FAULT_POINTS", "NAMESPACE", "Shard", "shard_name"]

NAMESPACE = "victor_actors"  # the Ray namespace every shard is named in
ROLLED_BACK_KEPT = 4096  # recent rolled-back runs whose late writes a shard refuses
REOPEN_PAUSE = 1.0  # seconds between a refused shard's attempts to take its store
RESTART_LOCK_WAIT = 10.0  # seconds a restarted shard waits for its previous process to let go
FAULT_POINTS = frozenset(
    {
        "part_after_prepare",
        "home_before_commit",
        "home_after_commit",
        "apply_after_commit",
        "rollback_after_commit",
    }
)


def shard_name(token: str, index: int) -> str:
    return f"victor-actors-{token}-shard-{index}"


def _record_layout(meta: str, shards: int) -> bool:
    """Create ``meta`` with ``shards`` in it, whole; False when it exists already.

    Written beside it, then linked into place: shards starting at once never read a file another
    one has created but not written yet (``os.link`` refuses an existing name, atomically).
    """
    body = json.dumps({"format": 2, "shards": shards})
    fd, draft = tempfile.mkstemp(prefix=".cluster.json.", dir=os.path.dirname(meta))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(draft, meta)
        except FileExistsError:
            return False
        except OSError:  # a file system without hard links: create it in place
            try:
                with open(meta, "x", encoding="utf-8") as f:
                    f.write(body)
                    f.flush()
                    os.fsync(f.fileno())
            except FileExistsError:
                return False
        return True
    finally:
        os.unlink(draft)


def check_layout(root: str, shards: int) -> None:
    """Record the shard count in ``root/cluster.json``; refuse a path that holds another count.

    Raises:
        ScopeAccessError: the file holds another count, or is unreadable; nothing was opened.
    """
    meta = os.path.join(root, "cluster.json")
    if _record_layout(meta, shards):
        return
    try:
        with open(meta, encoding="utf-8") as f:
            found = json.load(f)
    except (OSError, ValueError) as exc:
        raise ScopeAccessError(f"{meta} is unreadable ({exc}); nothing was opened") from None
    count = found.get("shards") if isinstance(found, dict) else None
    if count != shards:
        raise ScopeAccessError(
            f"{root} holds a cluster of {count!r} shards, not {shards}: scopes would be routed to shards "
            "that do not hold them (resharding is not supported); nothing was opened"
        )


def _written(handle: Any, steps: tuple[StateTransition, ...]) -> frozenset[ScopeRef]:
    """The scopes ``steps`` write from ``handle``'s scope (its own alone unless one names a scope)."""
    for t in steps:
        if "scope" in t.data:
            return frozenset(handle.written_scopes(steps))
    return frozenset((handle.ref,))


class Shard(Host):
    """The Ray actor class (``ray.remote(Shard)``, detached and named). Its methods take and return bytes."""

    def __init__(
        self, root: str | None, index: int, shards: int, token: str, options: Mapping[str, Any]
    ) -> None:
        self.index = index
        self.shards = shards
        self.token = token
        self.root = root
        opts = dict(options)
        self.hold_timeout = float(opts.pop("hold_timeout", 30.0))
        self._options = opts
        self.holds = Holds()
        self._peers: dict[int, Any] = {}
        self.mirror = Mirror(index, shards, self.peer, self.drop_peer)
        self._fault: str | None = None
        self._by_address: dict[Address, Any] = {}
        self._run_writing: collections.Counter[str] = collections.Counter()  # writes in progress, by run
        self._rolled_back: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._tx_refs: dict[str, frozenset[ScopeRef]] = {}
        self._scratch: tempfile.TemporaryDirectory[str] | None = None
        self._broken: VictorActorsError | None = None
        self._tried = 0.0
        self._started_at = time.time()
        self._open_store(RESTART_LOCK_WAIT if _reconstructed() else 0.0)

    # -- the store ---------------------------------------------------------------------

    def _open_store(self, lock_wait: float) -> bool:
        """Take the store (and the side environment beside it); False, with the error kept, if refused."""
        self._tried = time.monotonic()
        root, index = self.root, self.index
        manager: GlobalStateManager | None = None
        try:
            if root is None:  # in memory: no store, and the side environment in a private directory
                self._scratch = tempfile.TemporaryDirectory(prefix=f"victor-actors-shard-{index}-")
                manager = GlobalStateManager.open(None, **self._options)
                side = self._scratch.name
            else:
                os.makedirs(root, exist_ok=True)
                check_layout(root, self.shards)
                path = os.path.join(root, f"shard-{index}")
                options = {"lock_timeout": lock_wait, **self._options}
                try:
                    manager = GlobalStateManager.open(path, **options)
                except StoreLockedError as exc:
                    raise StoreLockedError(
                        f"shard {index}'s store {path} is held by another live shard "
                        f"({_holder(root, index)}): a store has one owner, so this shard did not start and "
                        "nothing was opened (two Ray clusters given the same path? attach to the running "
                        f"one: RAY_ADDRESS, or open(..., address=...)) [{exc}]"
                    ) from None
                _write_holder(root, index)
                side = os.path.join(root, f"shard-{index}.2pc")
            env = lmdb.open(side, max_dbs=4, map_size=1 << 28)
            Host.__init__(self, manager, name=f"shard {index}")
            from victor_actors.ray._twophase import TwoPhase

            self.env = env
            self.twophase = TwoPhase(self, env, durable=root is not None)
            self.directory = DirectoryRecords(env, durable=root is not None)
        except VictorActorsError as exc:
            if manager is not None:
                manager.close()
            self._broken = exc
            return False
        self._broken = None
        if index == HOME:
            self._global_sub = manager.get_global_state().subscribe(self.mirror.changed)
        return True

    def _usable(self) -> bool:
        if self._broken is None:
            return True
        if isinstance(self._broken, StoreLockedError) and time.monotonic() - self._tried > REOPEN_PAUSE:
            return self._open_store(0.0)
        return False

    def _start(self) -> None:
        if self._loop is None:
            Host._start(self)
            assert self._loop is not None
            self._loop.create_task(self.twophase.watchdog())
            if self.index == HOME:
                self.mirror.serve(self._loop, self._global_now)

    def _global_now(self) -> ScopeState:
        return self.manager.get_global_state().snapshot()._state

    # -- Ray methods ---------------------------------------------------------------------

    async def ping(self) -> dict[str, Any]:
        """Who answers: index, shard count, pid, node; ``e``: why this shard refuses to serve, if it does."""
        usable = self._usable()
        if usable:
            self._start()
        return {
            "i": self.index,
            "n": self.shards,
            "pid": os.getpid(),
            "node": _node_id(),
            "instance": self.instance if usable else None,
            "e": None if self._broken is None else w.error_to(self._broken),
        }

    async def node(self) -> str:
        """The id of the Ray node this shard runs on."""
        return _node_id()

    async def take_global(self, raw: bytes) -> None:
        """Home's push of the global scope's new state (see :mod:`._mirror`)."""
        self.mirror.set(raw)

    async def global_state(self) -> bytes:
        return w.encode({"s": w.state_to(self._global_now())})

    async def inject(self, point: str) -> None:
        """Arm a one-shot crash (``os._exit``) at ``point`` (one of :data:`FAULT_POINTS`), for fault
        tests: ``part_after_prepare`` (a participant, once its prepare record is durable),
        ``home_before_commit`` and ``home_after_commit`` (global's home, around its decision),
        ``apply_after_commit`` (a plain write, durable, before its reply), ``rollback_after_commit``
        (a run's undo in one scope, likewise)."""
        if point not in FAULT_POINTS:
            raise ValueError(f"unknown fault point {point!r}")
        self._fault = point

    def crash_at(self, point: str) -> None:
        if self._fault == point:
            self.manager.flush()
            os._exit(70)

    async def call(self, raw: bytes) -> bytes:
        """Run every operation in ``raw`` concurrently; reply with one result per operation, in order."""
        if not self._usable():
            assert self._broken is not None
            return w.encode({"r": (), "e": w.error_to(self._broken)})
        self._start()
        try:
            ops = w.ops_of(w.decode(raw))
        except VictorActorsError as exc:
            return w.encode({"r": (), "e": w.error_to(exc)})
        results = await asyncio.gather(*(self._op(op) for op in ops))
        self.counters["calls"] += 1
        self.counters["ops"] += len(ops)
        return w.encode({"r": tuple(results)})

    async def close(self) -> None:
        """Flush and close the store (``manager.shutdown()``; the actor is killed next)."""
        if self._broken is None:
            await asyncio.to_thread(self.manager.close)
            self.env.close()

    # -- peers -------------------------------------------------------------------------------

    def peer(self, n: int) -> Any:
        import ray

        actor = self._peers.get(n)
        if actor is None:
            actor = self._peers[n] = ray.get_actor(shard_name(self.token, n), namespace=NAMESPACE)
        return actor

    def drop_peer(self, n: int) -> None:
        self._peers.pop(n, None)

    # -- scopes by address -------------------------------------------------------------------

    def handle_at(self, address: Address) -> Any:
        """The local handle of the scope at ``address``, created (with its parents) on first touch."""
        h = self._by_address.get(address)
        if h is None:
            level, ident, wf, team = address
            m = self.manager
            if level == StateScope.GLOBAL.value:
                if self.index != HOME:
                    raise ScopeAccessError(
                        f"the global scope lives on shard {HOME}, not on shard {self.index}; "
                        "nothing was applied"
                    )
                h = m.get_global_state()
            elif level == StateScope.TEAM.value:
                h = m.get_team_state(ident)
            elif level == StateScope.WORKFLOW.value:
                h = m.get_workflow_state(ident, team_id=team)
            elif level == StateScope.CONVERSATION.value:
                h = m.get_conversation_state(ident, workflow_id=wf, team_id=team)
            else:
                raise ScopeAccessError(f"unknown scope level {level!r:.40}; nothing was applied")
            if len(self._by_address) > 100_000:
                self._by_address.clear()
            self._by_address[address] = h
            self._handles.setdefault(h.ref, h)
        return h

    def _scope(self, op: Any) -> Any:
        raw = op.get("a")
        if raw is not None:
            return self.handle_at(parse_address(raw))
        return Host._scope(self, op)

    def written(self, handle: Any, steps: tuple[StateTransition, ...]) -> frozenset[ScopeRef]:
        return _written(handle, steps)

    def _ancestors(self, snap: ContextSnapshot) -> tuple[ScopeState, ...]:
        return self.mirror.ancestors(snap)

    # -- writes ------------------------------------------------------------------------------

    async def write(
        self,
        handle: Any,
        steps: tuple[StateTransition, ...],
        expected: Any,
        timeout: float,
        txid: str | None,
        refs: frozenset[ScopeRef] | None = None,
    ) -> StateChanged:
        """Apply ``steps`` on ``handle``'s actor once no other transaction holds the scopes they write."""
        deadline = time.monotonic() + timeout
        async with self.holds.writing_to(refs or _written(handle, steps), deadline, txid):
            record: StateChanged = await handle.aapply(
                steps, expected_version=expected, timeout=max(deadline - time.monotonic(), 0.001)
            )
        return record

    def find(self, refs: frozenset[ScopeRef], batch_id: str) -> StateChanged | None:
        """The commit of ``batch_id`` as a full record: remembered here, or in ``refs``' last
        :data:`DEDUPE_WINDOW` stored commits, rebuilt by the reducer from the version before it.

        Full: its key changes, messages (with their place in the log), stage, tool requests and
        sessions, as the live commit made them. A driver's run undoes a commit from exactly these
        fields: a record carrying only the transitions (what the log stores) would undo nothing.
        When the batch wrote several scopes, the other scopes' records are its ``related``.
        """
        found_live = self._recent.get(batch_id)
        if found_live is not None:
            return found_live
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
                if rec.kind == "batch" and carries(rec.transitions, batch_id):
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
        return attrs.evolve(found[0], involved=tuple(r.ref for r in found), related=tuple(found[1:]))

    def _find(self, refs: frozenset[ScopeRef], batch_id: str) -> StateChanged | None:
        return self.find(refs, batch_id)

    async def _apply(self, op: Any) -> Any:
        handle = self._scope(op)
        steps = w.transitions_from(op["t"])
        refs = _written(handle, steps)
        if GLOBAL_REF in refs and self.index != HOME:
            raise ScopeAccessError(
                f"a batch that writes the global scope from shard {self.index} commits through the global "
                f"scope's home (shard {HOME}); nothing was applied"
            )
        batch_id = op.get("b")
        if batch_id is not None:
            if batch_id.__class__ is not str or not batch_id:
                raise TransitionValidationError("a batch id is a non-empty str")
            steps = tagged(steps, batch_id)
            if op.get("rt"):
                found = self.find(refs, batch_id)
                if found is not None:
                    self.counters["deduplicated"] += 1
                    return w.record_to(found)
        expected = expected_of(op.get("x"))
        timeout = float(op.get("to") or 30.0)
        run = op.get("run")
        if not isinstance(run, str) or not run:
            record = await self.write(handle, steps, expected, timeout, None, refs)
        else:
            if run in self._rolled_back:
                raise DeadlineExceededError(
                    f"run {run} was already rolled back on shard {self.index}; this write of it came "
                    "too late and was not applied"
                )
            self._run_writing[run] += 1  # its rollback here waits for it
            try:
                record = await self.write(handle, steps, expected, timeout, None, refs)
            finally:
                self._run_writing[run] -= 1
                if not self._run_writing[run]:
                    del self._run_writing[run]
                await self.holds.notify()
        if batch_id is not None:
            self._remember(batch_id, record)
        self.crash_at("apply_after_commit")
        return w.record_to(record, transitions=False)  # the driver has them

    async def _snapshot(self, op: Any) -> Any:
        handle = self._scope(op)
        await self.mirror.fresh(int(op.get("g", -1)))
        snap = handle.snapshot()
        return w.snapshot_to(snap, self._ancestors(snap))

    async def _restore(self, op: Any) -> Any:
        handle = self._scope(op)
        timeout = float(op.get("to") or 30.0)
        async with self.holds.writing_to(frozenset({handle.ref}), time.monotonic() + timeout, None):
            return await Host._restore(self, op)

    async def _tx_open(self, op: Any) -> Any:
        """A transaction (``transact``) on this shard's scopes: as the host's, and held scopes wait."""
        handle = self._scope(op)
        refs = frozenset({handle.ref, *(r for r in handle.snapshot()._state.lineage if r != GLOBAL_REF)})
        timeout = float(op.get("to") or 30.0)
        await self.holds.wait_unheld(refs, time.monotonic() + timeout, None)
        self.holds.start_writing(refs)
        try:
            txid, snap = await Host._tx_open(self, op)
        except BaseException:
            self.holds.done_writing(refs)
            await self.holds.notify()
            raise
        _box, work = self._txs[txid]
        self._tx_refs[txid] = frozenset({handle.ref})

        def done(_f: Any) -> None:
            self._tx_refs.pop(txid, None)
            self.holds.done_writing(refs)
            assert self._loop is not None
            self._loop.create_task(self.holds.notify())

        work.add_done_callback(done)
        return (txid, snap)

    async def _tx_commit(self, op: Any) -> Any:
        refs = self._tx_refs.get(str(op.get("id")))
        if refs is not None and self.index != HOME:
            handle = self.handle(next(iter(refs)))
            steps = w.transitions_from(op["t"])
            if GLOBAL_REF in _written(handle, steps):
                await Host._tx_abort(self, op)
                raise ScopeAccessError(
                    f"transact on shard {self.index} cannot write the global scope, which lives on shard "
                    f"{HOME}: use modify, whose batch commits across shards; nothing was applied"
                )
        return await Host._tx_commit(self, op)

    # -- the undo of a driver's run ------------------------------------------------------------

    async def _rollback(self, op: Any) -> Any:
        """Undo a run's commits in one scope, by value, on the scope's actor (as a local run does).

        The commits are those the driver has records of, and those of the batch ids it lists as in
        doubt that this scope's log holds. The run is first marked rolled back here, so a write of
        it that arrives later is refused, and the writes of it already in progress are waited for.
        """
        handle = self._scope(op)
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
        by_version = {rec.new_version: rec for rec in (w.record_from(r) for r in op["r"]) if rec.ref == ref}
        for batch_id in op.get("b") or ():
            found = self.find(frozenset({ref}), str(batch_id))
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

        async with self.holds.writing_to(frozenset({ref}), deadline, None):
            req = ApplyRequest((), None, deadline, run, None, target)
            commit: StateChanged = await asyncio.to_thread(handle._kernel.ask, handle._cell, req, wait)
        self.crash_at("rollback_after_commit")
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
        cond = self.holds.cond
        async with cond:
            while self._run_writing.get(run):
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                try:
                    await asyncio.wait_for(cond.wait(), left)
                except TimeoutError:
                    pass

    # -- the protocol's operations --------------------------------------------------------------

    async def _prepare(self, op: Any) -> Any:
        return await self.twophase.prepare(op)

    async def _commit(self, op: Any) -> Any:
        return await self.twophase.commit(op)

    async def _abort(self, op: Any) -> Any:
        return await self.twophase.abort(op)

    async def _decide(self, op: Any) -> Any:
        if self.index != HOME:
            raise ScopeAccessError(f"shard {self.index} is not the global scope's home; nothing was applied")
        return await self.twophase.decide(op)

    async def _status(self, op: Any) -> Any:
        return await self.twophase.status(op)

    async def _place(self, op: Any) -> Any:
        return await self.directory.place(op)

    async def _stats(self, op: Any) -> Any:
        out = dict(self.manager.stats())
        out.update({f"shard_{k}": v for k, v in self.counters.items()})
        out["shard_held"] = len(self.holds.held)
        out["shard_in_doubt"] = self.twophase.in_doubt_count()
        out["shard_directory_writes"] = self.directory.writes
        out["shard_directory_entries"] = self.directory.entries
        return out

    async def _flush(self, op: Any) -> Any:
        await asyncio.to_thread(self.manager.flush)
        return None


Shard.OPS = {
    **Host.OPS,
    "apply": Shard._apply,
    "snapshot": Shard._snapshot,
    "restore": Shard._restore,
    "tx_open": Shard._tx_open,
    "tx_commit": Shard._tx_commit,
    "rollback": Shard._rollback,
    "prepare": Shard._prepare,
    "commit": Shard._commit,
    "abort": Shard._abort,
    "decide": Shard._decide,
    "status": Shard._status,
    "place": Shard._place,
    "stats": Shard._stats,
    "flush": Shard._flush,
}
for _gone in ("fork", "run_begin", "run_end"):  # a fork would need a directory entry; runs are the driver's
    Shard.OPS.pop(_gone, None)


def _reconstructed() -> bool:
    """Whether Ray restarted this actor (its previous process may still be letting go of the store)."""
    try:
        import ray

        return bool(ray.get_runtime_context().was_current_actor_reconstructed)
    except Exception:
        return False


def _node_id() -> str:
    try:
        import ray

        return str(ray.get_runtime_context().get_node_id())
    except Exception:
        return ""


def _write_holder(root: str, index: int) -> None:
    """Say who holds shard ``index``'s store (read by a shard refused it); under the store's lock."""
    info = {"pid": os.getpid(), "host": socket.gethostname(), "node": _node_id(), "since": time.time()}
    path = os.path.join(root, f"shard-{index}.holder")
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(info, f)
    os.replace(tmp, path)


def _holder(root: str, index: int) -> str:
    try:
        with open(os.path.join(root, f"shard-{index}.holder"), encoding="utf-8") as f:
            info = json.load(f)
        return f"pid {info['pid']} on {info['host']}, Ray node {str(info['node'])[:12] or '?'}"
    except (OSError, ValueError, KeyError, TypeError):
        return "its holder is unknown"
