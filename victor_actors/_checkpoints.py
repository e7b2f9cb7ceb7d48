"""Durability on the manager: how commits reach the store, and the checkpoint API.

Kept beside the manager (as a mixin) so that the facade file stays about
scopes and handles, and this one about time: logs, checkpoints, restore,
fork.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import TYPE_CHECKING, Any

import attrs

from victor_actors._actor import ApplyRequest, Persist, ScopeCell
from victor_actors._errors import (
    CheckpointNotFoundError,
    DeadlineExceededError,
    ScopeAccessError,
    VictorActorsError,
)
from victor_actors._model import ScopeRef
from victor_actors._state import ContextSnapshot, ScopeState, StateChanged
from victor_actors.store import CheckpointInfo, Store, TxnOp, checkpoint_id
from victor_actors.store._codec import CheckpointRecord, CommitRecord, ScopeRecord

if TYPE_CHECKING:
    from victor_actors._handle import ScopeHandle

__all__ = ["DURABILITY_MODES", "CheckpointsMixin"]

DURABILITY_MODES = ("sync", "async", "manual")


def _parse_checkpoint_id(ref: ScopeRef, ident: str | int) -> int:
    if isinstance(ident, bool) or not isinstance(ident, (str, int)):
        raise CheckpointNotFoundError(f"{ident!r} is neither a checkpoint id nor a version")
    if isinstance(ident, int):
        return ident
    prefix = f"{ref}@"
    if not ident.startswith(prefix) or not ident[len(prefix) :].isdigit():
        raise CheckpointNotFoundError(f"{ident!r} is not a checkpoint id of {ref}")
    return int(ident[len(prefix) :])


class CheckpointsMixin:
    """Checkpoint, restore and fork, for managers opened on a store."""

    _store: Store | None
    _lock: threading.RLock
    _closed: bool
    checkpoint_every: int
    keep_checkpoints: int
    request_timeout: float

    if TYPE_CHECKING:

        def scope(self, ref: ScopeRef | str) -> ScopeHandle: ...
        def _start(self, state: ScopeState) -> Any: ...
        def _ensure(self, ref: ScopeRef, parent: ScopeRef | None) -> ScopeHandle: ...

    # -- the commit path ----------------------------------------------------

    def _commit_ops(
        self, cell: ScopeCell, new_state: ScopeState, record: StateChanged, transitions: Any, reset: bool
    ) -> list[TxnOp]:
        """The store operations that make one scope's commit durable (none in manual mode)."""
        store = self._store
        assert store is not None
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
        if new_state.version % self.checkpoint_every == 0:
            checkpoint = CheckpointRecord(new_state, None, record.timestamp)
            ops.append(store.op_put_checkpoint(ref, checkpoint, self.keep_checkpoints))
        return ops

    def _persister(self, cell: ScopeCell) -> Persist:
        store = self._store
        assert store is not None

        def persist(new_state: ScopeState, record: StateChanged, req: ApplyRequest) -> None:
            ops = self._commit_ops(cell, new_state, record, req.transitions, req.reset_to is not None)
            if ops:
                store.submit(ops, wait=cell.durability == "sync")

        return persist

    def _persist_many(self, parts: list[tuple[ScopeCell, ScopeState, StateChanged, Any]]) -> None:
        """Make several scopes' parts of one cross-scope commit durable in one LMDB transaction."""
        store = self._store
        if store is None:
            return
        ops: list[TxnOp] = []
        wait = False
        for cell, new_state, record, transitions in parts:
            if record.committed:
                ops.extend(self._commit_ops(cell, new_state, record, transitions, False))
                wait = wait or cell.durability == "sync"
        if ops:
            store.submit(ops, wait=wait)

    def _need_store(self) -> Store:
        if self._store is None:
            raise VictorActorsError(
                "checkpoints need a store: open the manager with GlobalStateManager.open(path)"
            )
        return self._store

    def _ref(self, scope_ref: ScopeRef | str) -> ScopeRef:
        return self.scope(scope_ref).ref  # also restores a stored scope

    def set_durability(self, scope_ref: ScopeRef | str, mode: str) -> None:
        """Override the manager's durability mode for one scope.

        Leaving ``manual`` writes a checkpoint first, so the log that follows
        has a base to replay from.
        """
        store = self._need_store()
        if mode not in DURABILITY_MODES:
            raise ValueError(f"durability must be one of {DURABILITY_MODES}, not {mode!r}")
        handle = self.scope(scope_ref)
        cell = handle._cell
        if cell.durability == "manual" and mode != "manual":
            self.save_checkpoint(handle.ref)
        cell.durability = mode
        if mode == "sync":
            store.flush()

    def flush(self) -> None:
        """Return once every commit made so far is durable (for ``async`` mode)."""
        if self._store is not None and not self._store.read_only:
            self._store.flush()

    # -- checkpoints --------------------------------------------------------

    def save_checkpoint(self, scope_ref: ScopeRef | str, *, label: str | None = None) -> str:
        """Write a full checkpoint of the scope's current committed state; return its id.

        The id is ``"<scope>:<id>@<version>"``. Saving twice at one version
        keeps one checkpoint (the later label wins).
        """
        store = self._need_store()
        if label is not None and not isinstance(label, str):
            raise TypeError("label must be a str")
        handle = self.scope(scope_ref)
        state = handle._cell.state
        record = CheckpointRecord(state, label, time.time())
        store.submit([store.op_put_checkpoint(state.ref, record, self.keep_checkpoints)], wait=True)
        return checkpoint_id(state.ref, state.version)

    def list_checkpoints(self, scope_ref: ScopeRef | str) -> list[CheckpointInfo]:
        """The scope's stored checkpoints, newest first."""
        return self._need_store().checkpoints(self._ref(scope_ref))

    def load_checkpoint(self, scope_ref: ScopeRef | str, checkpoint_id: str | None = None) -> ContextSnapshot:
        """The stored state of a checkpoint (the newest if no id) as a snapshot.

        Raises:
            CheckpointNotFoundError: no such checkpoint.
            CheckpointCorruptError: the checkpoint is unreadable.
        """
        store = self._need_store()
        ref = self._ref(scope_ref)
        if checkpoint_id is None:
            infos = store.checkpoints(ref)
            if not infos:
                raise CheckpointNotFoundError(f"{ref} has no checkpoint")
            version = infos[0].version
        else:
            version = _parse_checkpoint_id(ref, checkpoint_id)
        return ContextSnapshot(store.checkpoint(ref, version).state)

    def state_at(self, scope_ref: ScopeRef | str, version: int) -> ContextSnapshot:
        """The scope as it was at ``version``, rebuilt from a checkpoint and the log."""
        store = self._need_store()
        ref = self._ref(scope_ref)
        lineage = self.scope(ref)._cell.state.lineage
        state, _report = store.load(ref, lineage, upto=version)
        return ContextSnapshot(state)

    def restore(
        self, scope_ref: ScopeRef | str, checkpoint: str | int, *, timeout: float | None = None
    ) -> StateChanged:
        """Return the scope to a checkpoint (by id) or a version, as a new commit.

        History is kept: the version keeps rising and subscribers see the
        change like any other.
        """
        handle = self.scope(scope_ref)
        target = self._target(handle.ref, checkpoint)
        wait = self.request_timeout if timeout is None else timeout
        req = ApplyRequest((), None, time.monotonic() + wait, None, None, target)
        try:
            record: StateChanged = handle._ask(req, wait)
        except Exception as exc:
            if type(exc).__name__ == "Timeout":
                raise DeadlineExceededError(f"{handle.ref}: restore got no reply within {wait} s") from None
            raise
        return record

    def _target(self, ref: ScopeRef, checkpoint: str | int) -> ScopeState:
        store = self._need_store()
        if isinstance(checkpoint, str):
            return store.checkpoint(ref, _parse_checkpoint_id(ref, checkpoint)).state
        lineage = self.scope(ref)._cell.state.lineage
        return store.load(ref, lineage, upto=_parse_checkpoint_id(ref, checkpoint))[0]

    def fork(self, scope_ref: ScopeRef | str, checkpoint: str | int, new_id: str) -> ScopeHandle:
        """Start a new scope instance ``new_id`` (same level, same parent) from a checkpoint or version.

        The fork's history starts at the checkpoint's version with a full
        checkpoint of its own, so it depends on nothing of its source and
        retention on the source can never break it.

        Raises:
            ScopeAccessError: ``new_id`` already exists.
        """
        store = self._need_store()
        source = self.scope(scope_ref)
        new_ref = ScopeRef(source.ref.scope, new_id)
        target = self._target(source.ref, checkpoint)
        with self._lock:
            if new_ref in self.scopes():  # type: ignore[attr-defined]
                raise ScopeAccessError(f"cannot fork to {new_ref}: it already exists; nothing was written")
            lineage = source._cell.state.lineage
            state = attrs.evolve(target, ref=new_ref, lineage=lineage)  # the contents, renamed
            now = time.time()
            store.submit(
                [
                    store.op_put_scope(ScopeRecord(new_ref, lineage, now)),
                    store.op_put_checkpoint(
                        new_ref, CheckpointRecord(state, f"fork of {source.ref}", now), None
                    ),
                ],
                wait=True,
            )
            return self._start(state).handle  # type: ignore[no-any-return]

    # -- asyncio twins ------------------------------------------------------

    async def asave_checkpoint(self, scope_ref: ScopeRef | str, *, label: str | None = None) -> str:
        return await asyncio.to_thread(self.save_checkpoint, scope_ref, label=label)

    async def alist_checkpoints(self, scope_ref: ScopeRef | str) -> list[CheckpointInfo]:
        return await asyncio.to_thread(self.list_checkpoints, scope_ref)

    async def aload_checkpoint(
        self, scope_ref: ScopeRef | str, checkpoint_id: str | None = None
    ) -> ContextSnapshot:
        return await asyncio.to_thread(self.load_checkpoint, scope_ref, checkpoint_id)

    async def arestore(
        self, scope_ref: ScopeRef | str, checkpoint: str | int, *, timeout: float | None = None
    ) -> StateChanged:
        return await asyncio.to_thread(self.restore, scope_ref, checkpoint, timeout=timeout)

    async def afork(self, scope_ref: ScopeRef | str, checkpoint: str | int, new_id: str) -> ScopeHandle:
        return await asyncio.to_thread(self.fork, scope_ref, checkpoint, new_id)

    async def aflush(self) -> None:
        await asyncio.to_thread(self.flush)
