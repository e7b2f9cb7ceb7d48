"""Durability: how commits reach the store, and the checkpoint operations.

The actors call the persister this service builds (one scope's commit, made
durable before it is published); cross-scope commits go through the
kernel's persist port (``persist_many``: every part in one store job, so in
one LMDB transaction). Checkpoints, restores and forks read and write the
store here; the manager only routes the user's call.

Checkpoints are incremental (docs/adr/0018): each scope's cell has a
tracker holding what its newest checkpoint wrote (a ``CheckpointBase``) and
the values keys changed since, so the next checkpoint writes only the new
messages and a delta of the values. The tracker vouches that the scope's
state descends from its base with no reset between: a reset (restore,
rollback), a reload from the store, or a checkpoint of an older state than
the base clears it or is written in full. A cell leaving memory takes its
tracker with it (a weak map). A scope's first checkpoint after it was
loaded builds on the checkpoint it was loaded from when the store can show
its state descends from that load (``Store.base_after_load``); otherwise,
and after any reset, the next checkpoint starts a new chain.

One owner per scope, on this path too (docs/adr/0022): every checkpoint is
written on the scope's actor thread, either inside a commit (the periodic
ones) or as a :class:`CheckpointRequest` the actor takes between two commits
(``save_checkpoint``, ``compact``, leaving ``manual``). So a checkpoint
reads exactly the state the actor last committed, the tracker's base is
always what the store holds for the scope, and no second writer of the
scope's records exists: a compaction is a full checkpoint that becomes the
base, never a record written beside it. Restores are reset commits through
the actor; a fork's first records are written before its scope exists,
under the kernel's lock that guards the scope's creation.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Any

import attrs

from victor_actors._actor import Checkpointer, Persist, Stager
from victor_actors._cell import ScopeCell
from victor_actors._errors import (
    CheckpointNotFoundError,
    ScopeAccessError,
    TransitionValidationError,
    VictorActorsError,
)
from victor_actors._kernel import Kernel
from victor_actors._messages import ApplyRequest, CheckpointRequest
from victor_actors._model import ScopeRef
from victor_actors._options import DURABILITY_MODES
from victor_actors._snapshot import ContextSnapshot
from victor_actors._state import ScopeState, StateChanged
from victor_actors._values import check_text
from victor_actors.store import (
    CheckpointBase,
    CheckpointInfo,
    CheckpointRecord,
    Codec,
    CommitRecord,
    ScopeRecord,
    Store,
    TxnOp,
    apply_record,
    plan_compaction,
)
from victor_actors.store import checkpoint_id as _checkpoint_id

CATCH_UP = 64  # a read-only reader replays at most this many new commits before it loads afresh

__all__ = ["Durability", "parse_checkpoint_id"]

logger = logging.getLogger("victor_actors")


def parse_checkpoint_id(ref: ScopeRef, ident: str | int) -> int:
    """The version a checkpoint id (``"<scope>@<version>"``) or a plain version names."""
    if isinstance(ident, bool) or not isinstance(ident, (str, int)):
        raise CheckpointNotFoundError(f"{ident!r} is neither a checkpoint id nor a version")
    if isinstance(ident, int):
        return ident
    prefix = f"{ref}@"
    if not ident.startswith(prefix) or not ident[len(prefix) :].isdigit():
        raise CheckpointNotFoundError(f"{ident!r} is not a checkpoint id of {ref}")
    return int(ident[len(prefix) :])


class _Tracker:
    """One cell's incremental-checkpoint state: its newest checkpoint, and values keys changed since.

    ``touched`` maps a key to the newest version that changed it; a
    checkpoint on top of ``base`` writes the keys touched after
    ``base.version``. ``noted`` is the newest commit version seen: a checkpoint of an
    older state (a ``save_checkpoint`` racing the actor) may not become the base of a
    chain while commits after it went unrecorded. Guarded by its own ``lock`` (the scope's
    actor, callers of ``save_checkpoint`` on other threads, and the writer's thread when a
    checkpoint fell back all use it).
    """

    __slots__ = ("base", "fresh", "lock", "noted", "touched")

    def __init__(self) -> None:
        self.base: CheckpointBase | None = None
        self.touched: dict[str, int] = {}
        self.noted = 0
        self.fresh = True  # no reset seen: the cell's state descends from the one it started with
        self.lock = threading.Lock()


class Durability:
    """The commit path to the store and the checkpoint API, for one kernel (a no-op without a store)."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self.store = kernel.store
        if self.store is None or not self.store.read_only:
            kernel.persist = self
        if self.store is not None and self.store.read_only:
            kernel.fresh = self.fresh_snapshot
        # without a store, commits are still held to a store's record limit (Codec.check_commit)
        self._limit = Codec() if self.store is None else None
        self._trackers: weakref.WeakKeyDictionary[ScopeCell, _Tracker] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()  # around the map of trackers only

    # -- incremental checkpoints ---------------------------------------------

    def _tracker(self, cell: ScopeCell) -> _Tracker:
        tracker = self._trackers.get(cell)
        if tracker is None:
            with self._lock:
                tracker = self._trackers.get(cell)
                if tracker is None:
                    tracker = self._trackers[cell] = _Tracker()
        return tracker

    def _track(self, cell: ScopeCell, version: int, record: StateChanged, reset: bool) -> None:
        """Note one commit of ``cell`` (before it is written): its changed keys, or a reset."""
        tracker = self._tracker(cell)
        with tracker.lock:
            if version > tracker.noted:
                tracker.noted = version
            if reset:
                tracker.base = None
                tracker.touched.clear()
                tracker.fresh = False
            elif tracker.base is not None:
                touched = tracker.touched
                for change in record.changes:
                    touched[change.key] = version

    def _forget(self, cell: ScopeCell) -> None:
        """The cell's state was replaced from outside its commits: its next checkpoint is full."""
        with self._lock:
            tracker = self._trackers.pop(cell, None)
        if tracker is not None:
            with tracker.lock:
                tracker.base = None

    def _checkpoint_op(self, cell: ScopeCell, record: CheckpointRecord, keep: int | None) -> TxnOp:
        """The store operation writing ``record`` (of ``cell``'s state) on top of its previous checkpoint."""
        store = self.store
        assert store is not None
        state = record.state
        tracker = self._tracker(cell)
        with tracker.lock:
            base = tracker.base
            touched = None
            if base is not None and base.version <= state.version:
                touched = [k for k, v in tracker.touched.items() if v > base.version]
            elif base is None and tracker.fresh:
                # the cell's first checkpoint: build on the one its state was loaded from, if
                # the store can tell it descends from that load (values in full: touched None)
                base = store.base_after_load(state.ref, state)
            else:
                base = None

            def replaced(planned: CheckpointBase, actual: CheckpointBase) -> None:
                with tracker.lock:
                    if tracker.base is planned:
                        tracker.base = actual

            op, planned = store.plan_checkpoint(state.ref, record, keep, base, touched, replaced=replaced)
            current = tracker.base
            if (
                planned.version >= current.version
                if current is not None
                else tracker.noted <= planned.version  # no later commit went unrecorded
            ):
                tracker.base = planned
                floor = planned.version
                tracker.touched = {k: v for k, v in tracker.touched.items() if v > floor}
        return op

    # -- the commit path ----------------------------------------------------

    def _commit_ops(
        self, cell: ScopeCell, new_state: ScopeState, record: StateChanged, transitions: Any, reset: bool
    ) -> list[TxnOp]:
        """The store operations that make one scope's commit durable (none in manual mode)."""
        store = self.store
        assert store is not None
        self._track(cell, new_state.version, record, reset)
        if cell.durability == "manual":
            return []
        ref = new_state.ref
        commit = CommitRecord(
            "reset" if reset else "batch",
            new_state.version,
            record.commit_id,
            record.timestamp,
            record.run_id,
            () if reset else transitions,
            new_state if reset else None,
        )
        ops = [store.op_put_commit(ref, commit)]
        options = self.kernel.options
        if new_state.version % options.checkpoint_every == 0:
            checkpoint = CheckpointRecord(new_state, None, record.timestamp)
            try:
                ops.append(self._checkpoint_op(cell, checkpoint, options.keep_checkpoints))
            except TransitionValidationError as exc:
                # the commit fits: a checkpoint that cannot be written never refuses it (the log
                # holds the commit; the next periodic checkpoint tries again)
                logger.warning("%s: no checkpoint at v%d: %s", ref, new_state.version, exc)
        return ops

    def persister(self) -> Persist | None:
        """What an actor calls to make its commit durable (None with a read-only store).

        In memory it only refuses a batch too large for a store's record, so
        that an in-memory manager accepts exactly what a store does.
        """
        store = self.store
        if store is None:
            return self._check_size
        if store.read_only:
            return None

        def persist(cell: ScopeCell, new_state: ScopeState, record: StateChanged, req: ApplyRequest) -> None:
            ops = self._commit_ops(cell, new_state, record, req.transitions, req.reset_to is not None)
            if ops:
                store.submit(ops, wait=cell.durability == "sync")

        return persist

    def _check_size(
        self, cell: ScopeCell, new_state: ScopeState, record: StateChanged, req: ApplyRequest
    ) -> None:
        if req.reset_to is None:  # a store writes a reset of any size (as a checkpoint)
            self._check(new_state, record, req.transitions)

    def _check(self, new_state: ScopeState, record: StateChanged, transitions: Any) -> None:
        assert self._limit is not None
        self._limit.check_commit(tuple(transitions), new_state.version, record.commit_id, record.run_id)

    def stager(self) -> Stager | None:
        """What an actor uses to write a group of its commits in one transaction (None without a store)."""
        store = self.store
        if store is None or store.read_only:
            return None
        return _GroupStager(self, store)

    def persist_many(self, parts: list[tuple[ScopeCell, ScopeState, StateChanged, Any]]) -> None:
        """Make several scopes' parts of one cross-scope commit durable in one LMDB transaction."""
        store = self.store
        if store is None:
            for _cell, new_state, record, transitions in parts:
                if record.committed:
                    self._check(new_state, record, transitions)
            return
        ops: list[TxnOp] = []
        wait = False
        for cell, new_state, record, transitions in parts:
            if record.committed:
                ops.extend(self._commit_ops(cell, new_state, record, transitions, False))
                wait = wait or cell.durability == "sync"
        if ops:
            store.submit(ops, wait=wait)

    def create_scope(self, ref: ScopeRef, lineage: tuple[ScopeRef, ...]) -> None:
        """Queue a new scope's record for the next group commit (no synced transaction of its own).

        The scope's first durable commit leads that group commit, so the
        record and the commit share one transaction; a scope never committed
        is written by the flusher within ``flush_interval`` (or by any flush,
        eviction or close). See docs/adr/0016.
        """
        if self.store is not None:
            self.store.submit([self.store.op_put_scope(ScopeRecord(ref, lineage, time.time()))], wait=False)

    def flush(self) -> None:
        """Return once every commit made so far is durable (for ``async`` mode)."""
        if self.store is not None and not self.store.read_only:
            self.store.flush()

    def flush_for_eviction(self) -> None:
        """Before scopes leave memory: what they will be loaded from must be in the store.

        Cheap when nothing is queued (``sync`` mode with no new scopes).
        """
        self.flush()

    def load_committed(self, cell: ScopeCell) -> ScopeState:
        """The scope's last committed state as the store holds it (for a restart).

        Falls back to the committed state in memory when the store has none
        of its own to offer (in memory, read-only, ``manual``) or disagrees.
        """
        state = cell.state
        store = self.store
        if store is None or store.read_only or cell.durability == "manual":
            return state
        store.flush()
        loaded, report = store.load(state.ref, state.lineage)
        if not report.head_found:  # the store cannot show how far it reaches: memory can
            return state
        self._forget(cell)  # the cell's state is set to this: its next checkpoint starts a new chain
        return loaded

    # -- a read-only manager's reads -----------------------------------------

    def fresh_snapshot(self, cell: ScopeCell) -> ContextSnapshot:
        """A read-only manager's snapshot of ``cell``: the store's newest consistent cut.

        Another process owns the store and keeps committing. Each read asks
        LMDB for the newest write transaction's id (off its meta page, no
        transaction); when it is the one the cell's last snapshot was read
        at, that snapshot is still current. Otherwise the heads of the scope and
        its ancestors are read in one read transaction (one cut: a
        cross-scope batch writes all its heads in one transaction, so no
        batch is half in it), and each scope whose head moved is loaded at
        exactly that version (its newest checkpoint and the log after it).
        So a snapshot is never torn, and never older than a commit the owner
        acknowledged before the read began (``sync`` durability; an ``async``
        commit is acknowledged before it is in the store).
        """
        store = self.store
        assert store is not None
        seen = cell.fresh
        if seen is not None and seen[0] == store.last_txnid():
            return seen[1]
        chain = (cell, *cell.ancestors)
        while True:
            mark, heads = store.heads([c.state.ref for c in chain])
            states: list[ScopeState] = []
            for c in chain:
                state = c.state
                head = heads[state.ref]
                if head is not None and head != state.version:
                    if head < state.version:  # another reader loaded a later cut: read the cut again
                        break
                    state = _catch_up(store, state, head)
                states.append(state)
            else:
                break
        with self.kernel.publish_lock:
            for c, state in zip(chain, states, strict=True):
                if state.version > c.state.version:
                    c.state = state
        snapshot = ContextSnapshot(states[0], tuple(states[1:]))
        cell.fresh = (mark, snapshot)
        return snapshot

    # -- checkpoints --------------------------------------------------------

    def need_store(self) -> Store:
        if self.store is None:
            raise VictorActorsError(
                "checkpoints need a store: open the manager with GlobalStateManager.open(path)"
            )
        return self.store

    def need_writable_store(self, what: str) -> Store:
        store = self.need_store()
        if store.read_only:
            raise ScopeAccessError(f"the manager is read-only and {what} writes; nothing was done")
        return store

    def set_durability(self, cell: ScopeCell, mode: str) -> None:
        """Override the durability mode for one scope (leaving ``manual`` checkpoints first).

        Leaving ``manual`` is one request to the scope's actor: the checkpoint
        and the switch, with no commit between them (a commit there would be
        in neither the checkpoint nor the log).
        """
        store = self.need_writable_store("set_durability")
        if mode not in DURABILITY_MODES:
            raise ValueError(f"durability must be one of {DURABILITY_MODES}, not {mode!r}")
        if cell.durability == "manual" and mode != "manual":
            self._ask_owner(cell, CheckpointRequest(None, durability=mode))
        else:
            cell.durability = mode
        if mode == "sync":
            store.flush()

    @staticmethod
    def _label(label: str | None) -> str | None:
        if label is not None and not isinstance(label, str):
            raise TypeError("label must be a str")
        if label is not None:
            label = str.__str__(label)
            why = check_text(label, "the label")
            if why is not None:
                raise TransitionValidationError(f"{why}; no checkpoint was written", field="label")
        return label

    def save_checkpoint(self, cell: ScopeCell, label: str | None) -> str:
        """Write a checkpoint of the scope's committed state, through its actor; return its id."""
        self.need_writable_store("save_checkpoint")
        return self._ask_owner(cell, CheckpointRequest(self._label(label)))

    def compact(self, cell: ScopeCell, label: str | None) -> str:
        """Make the scope's committed state its only stored base, through its actor; return its id."""
        self.need_writable_store("compact")
        return self._ask_owner(cell, CheckpointRequest(self._label(label), compact=True))

    def _ask_owner(self, cell: ScopeCell, req: CheckpointRequest) -> str:
        """Have the scope's actor write the checkpoint (inline if this is the actor's thread)."""
        if cell.owner is threading.current_thread() and not cell.evicted:
            return self._write_checkpoint(cell, req)
        answer: str = self.kernel.ask(cell, req, self.kernel.options.request_timeout)
        return answer

    def checkpointer(self) -> Checkpointer | None:
        """What an actor calls for a :class:`CheckpointRequest` (None without a writable store)."""
        store = self.store
        if store is None or store.read_only:
            return None
        return self._write_checkpoint

    def _write_checkpoint(self, cell: ScopeCell, req: CheckpointRequest) -> str:
        """On the scope's actor thread: write a checkpoint of ``cell.state`` (or compact to it)."""
        store = self.need_writable_store("a checkpoint")
        state = cell.state
        record = CheckpointRecord(state, req.label, time.time())
        if req.compact:
            op, planned = plan_compaction(store, state.ref, record)
            store.submit([op], wait=True)
            tracker = self._tracker(cell)
            with tracker.lock:  # the only stored base now: later checkpoints build on it
                tracker.base = planned
                tracker.touched = {k: v for k, v in tracker.touched.items() if v > state.version}
        else:
            store.submit([self._checkpoint_op(cell, record, self.kernel.options.keep_checkpoints)], wait=True)
        if req.durability is not None:
            cell.durability = req.durability
        return _checkpoint_id(state.ref, state.version)

    def list_checkpoints(self, ref: ScopeRef) -> list[CheckpointInfo]:
        return self.need_store().checkpoints(ref)

    def load_checkpoint(self, ref: ScopeRef, checkpoint_id: str | None) -> ContextSnapshot:
        store = self.need_store()
        if checkpoint_id is None:
            infos = store.checkpoints(ref)
            if not infos:
                raise CheckpointNotFoundError(f"{ref} has no checkpoint")
            version = infos[0].version
        else:
            version = parse_checkpoint_id(ref, checkpoint_id)
        return ContextSnapshot(store.checkpoint(ref, version).state)

    def state_at(self, cell: ScopeCell, version: int) -> ContextSnapshot:
        store = self.need_store()
        state, _report = store.load(cell.state.ref, cell.state.lineage, upto=version)
        return ContextSnapshot(state)

    def target(self, cell: ScopeCell, checkpoint: str | int) -> ScopeState:
        """The state a restore or a fork to ``checkpoint`` (an id, or a version) starts from.

        Every commit made before the call is in the store first (``async``
        mode queues them), so a version just committed can be named.
        """
        store = self.need_store()
        if not store.read_only:
            store.flush()
        ref = cell.state.ref
        if isinstance(checkpoint, str):
            return store.checkpoint(ref, parse_checkpoint_id(ref, checkpoint)).state
        return store.load(ref, cell.state.lineage, upto=parse_checkpoint_id(ref, checkpoint))[0]

    @staticmethod
    def fork_state(source: ScopeCell, target: ScopeState, new_ref: ScopeRef) -> ScopeState:
        """A fork's first state: ``target``'s contents under ``new_ref``, beside its source."""
        return attrs.evolve(target, ref=new_ref, lineage=source.state.lineage)

    def write_fork(self, source: ScopeCell, state: ScopeState) -> None:
        """Write a fork's scope record and its first full checkpoint (before its scope exists)."""
        store = self.need_writable_store("fork")
        now = time.time()
        label = f"fork of {source.state.ref}"
        store.submit(
            [
                store.op_put_scope(ScopeRecord(state.ref, state.lineage, now)),
                store.op_put_checkpoint(state.ref, CheckpointRecord(state, label, now), None),
            ],
            wait=True,
        )


def _catch_up(store: Store, state: ScopeState, head: int) -> ScopeState:
    """``state`` brought to version ``head``: the few commits since replayed, or a load at ``head``.

    Stored commits up to a head never change, so they are read one by one;
    a reader far behind (or one whose log was trimmed since) loads afresh.
    """
    if head - state.version <= CATCH_UP:
        try:
            for version in range(state.version + 1, head + 1):
                state = apply_record(state, store.commit_record(state.ref, version))
            return state
        except VictorActorsError:
            pass  # a record it cannot read: load from the newest checkpoint instead
    try:
        return store.load(state.ref, state.lineage, upto=head)[0]
    except VictorActorsError:
        # Damage the store cannot rebuild ``head`` past: serve what recovery could load (it was
        # reported when the scope was loaded: ``manager.recovery_reports``), as an owner would.
        return state


class _GroupStager:
    """The durability service's side of an actor's group commit (see ``ScopeActor._stage``)."""

    __slots__ = ("_durability", "_store")

    def __init__(self, durability: Durability, store: Store) -> None:
        self._durability = durability
        self._store = store

    def ops(
        self, cell: ScopeCell, new_state: ScopeState, record: StateChanged, req: ApplyRequest
    ) -> list[TxnOp]:
        return self._durability._commit_ops(cell, new_state, record, req.transitions, False)

    def commit(self, ops: list[TxnOp]) -> None:
        self._store.submit(ops, wait=True)
