"""The scope tree: creating, finding and restoring scopes, and claiming session ids.

A scope is created on first use under the parent its caller names, keeps
that parent for life, and is found again by its ref; with a store, a scope
not live in memory is restored from it (ancestors first). Ids are unique per
level across the whole tree: a conversation id taken under one workflow
cannot be reused under another. CREATE_SESSION claims its child ids on the
parent's actor thread before the commit is durable, so two parents never
create the same child.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from victor_actors._cell import ScopeCell
from victor_actors._errors import CheckpointCorruptError, RuntimeClosedError, ScopeAccessError
from victor_actors._kernel import Kernel
from victor_actors._model import GLOBAL_REF, ScopeRef, StateScope
from victor_actors._state import ScopeState
from victor_actors.store import RecoveryReport

__all__ = ["ScopeTree"]

logger = logging.getLogger("victor_actors")


class ScopeTree:
    """Creation, lookup and restore of one kernel's scopes.

    ``start(cell)`` gives a new cell its actor; ``create_record(ref,
    lineage)`` makes a new scope durable before it starts; ``restored(cell)``
    is told of every scope brought back from the store (to redeliver its
    pending tool requests).
    """

    def __init__(
        self,
        kernel: Kernel,
        *,
        start: Callable[[ScopeCell], None],
        create_record: Callable[[ScopeRef, tuple[ScopeRef, ...]], None],
        restored: Callable[[ScopeCell], None],
    ) -> None:
        self.kernel = kernel
        self._start_actor = start
        self._create_record = create_record
        self._restored = restored
        self._reserved: dict[ScopeRef, ScopeRef] = {}  # session ids claimed by a commit in flight
        self.recovery_reports: list[RecoveryReport] = []

    # -- lookup ---------------------------------------------------------------

    def find(self, ref: ScopeRef) -> ScopeCell | None:
        """The cell of an existing scope (restoring it from the store), or None."""
        kernel = self.kernel
        cell = kernel.cells.get(ref)
        if cell is not None or kernel.store is None:
            return cell
        with kernel.lock:
            return kernel.cells.get(ref) or self._restore(ref)

    def parent(self, ref: ScopeRef) -> ScopeRef | None:
        cell = self.kernel.cells.get(ref)
        return None if cell is None else cell.state.parent

    def children(self, ref: ScopeRef | None) -> list[ScopeRef]:
        return list(self.kernel.children.get(ref, ()))

    def refs(self) -> list[ScopeRef]:
        """Every scope instance, live or only in the store."""
        refs = dict.fromkeys(self.kernel.cells)
        store = self.kernel.store
        if store is not None:
            refs.update(dict.fromkeys(r.ref for r in store.scope_records()))
        return list(refs)

    # -- creation ---------------------------------------------------------------

    def ensure(self, ref: ScopeRef, parent: ScopeRef | None, *, create: bool = True) -> ScopeCell:
        """The cell of ``ref``, created under ``parent`` if it does not exist (and ``create``).

        ``parent=None`` means "any parent" for an existing scope and the
        global scope for a new one.

        Raises:
            ScopeAccessError: ``ref`` exists under another parent, or the
                parent does not exist, or the manager is read-only, or
                ``ref`` does not exist and ``create`` is False.
        """
        kernel = self.kernel
        cell = kernel.cells.get(ref)
        if cell is not None and (parent is None or cell.state.parent == parent):
            return cell
        with kernel.lock:
            if kernel.closed:
                raise RuntimeClosedError("the manager is closed")
            cell = kernel.cells.get(ref)
            if cell is None and kernel.store is not None:
                cell = self._restore(ref)
            if cell is not None:
                if parent is not None and cell.state.parent != parent:
                    raise ScopeAccessError(
                        f"{ref} already exists under {cell.state.parent}, not under {parent}; "
                        "a scope keeps the parent it was created under"
                    )
                return cell
            if not create:
                raise ScopeAccessError(f"no scope {ref} exists, and create=False: nothing was created")
            if kernel.read_only:
                raise ScopeAccessError(f"no scope {ref} in the store, and a read-only manager creates none")
            claimed = self._reserved.get(ref)
            if claimed is not None and parent != claimed:
                raise ScopeAccessError(f"{ref} is being created under {claimed}")
            if ref == GLOBAL_REF:
                lineage: tuple[ScopeRef, ...] = ()
            else:
                parent_ref = GLOBAL_REF if parent is None else parent
                parent_cell = kernel.cells.get(parent_ref)
                if parent_cell is None:
                    raise ScopeAccessError(f"cannot create {ref}: its parent {parent_ref} does not exist")
                lineage = (parent_ref, *parent_cell.state.lineage)
            if kernel.store is not None and kernel.store.has_records(ref):
                # its scope record is gone (damaged?) but its history is not: creating it afresh
                # would start at version 0 and overwrite acknowledged commits
                raise CheckpointCorruptError(
                    f"the store holds commits or checkpoints of {ref} but no readable scope record for it; "
                    "it was not created over them (inspect the store with victor-actors inspect)",
                    ref=ref,
                )
            self._create_record(ref, lineage)
            return self.start(ScopeState(ref=ref, lineage=lineage))

    def start(self, state: ScopeState) -> ScopeCell:
        """Register and start the cell owning ``state`` (its parent is live). Holds the kernel's lock."""
        kernel = self.kernel
        if state.lineage:
            parent = kernel.cells[state.lineage[0]]
            ancestors: tuple[ScopeCell, ...] = (parent, *parent.ancestors)
        else:
            ancestors = ()
        cell = ScopeCell(state, ancestors, kernel.durability)
        cell.observer = kernel.observer
        self._start_actor(cell)
        kernel.register(cell)
        return cell

    def _restore(self, ref: ScopeRef) -> ScopeCell | None:
        """Bring a stored scope (and, first, its ancestors) back to life. Holds the kernel's lock."""
        kernel = self.kernel
        store = kernel.store
        assert store is not None
        record = store.scope_record(ref)
        if record is None:
            return None
        for anc in reversed(record.lineage):
            if anc not in kernel.cells and self._restore(anc) is None:
                raise ScopeAccessError(f"{ref}'s ancestor {anc} is missing from the store")
        state, report = store.load(ref, record.lineage)
        if not report.clean:
            logger.warning("recovered %s at version %d, skipping: %s", ref, state.version, report.skipped)
            self.recovery_reports.append(report)
            if not store.read_only and report.latest_stored_version > state.version:
                store.submit([store.op_quarantine_after(ref, state.version)], wait=True)
        cell = self.start(state)
        self._restored(cell)
        return cell

    # -- sessions (called on the parent's actor thread) ---------------------------

    def reserve_sessions(self, parent: ScopeRef, session_ids: tuple[str, ...]) -> None:
        """Claim child conversation ids for ``parent`` before its commit is made durable.

        Raises ScopeAccessError (and claims nothing) when an id is taken by
        a scope under another parent.
        """
        kernel = self.kernel
        refs = [ScopeRef(StateScope.CONVERSATION, sid) for sid in session_ids]
        with kernel.lock:
            for ref in refs:
                cell = kernel.cells.get(ref)
                owner = cell.state.parent if cell is not None else self._reserved.get(ref)
                if owner is None and kernel.store is not None:
                    record = kernel.store.scope_record(ref)
                    owner = record.lineage[0] if record is not None and record.lineage else None
                if (cell is not None or owner is not None) and owner != parent:
                    raise ScopeAccessError(f"CREATE_SESSION: {ref} already exists under {owner}")
            for ref in refs:
                self._reserved[ref] = parent

    def release_sessions(self, session_ids: tuple[str, ...]) -> None:
        with self.kernel.lock:
            for sid in session_ids:
                self._reserved.pop(ScopeRef(StateScope.CONVERSATION, sid), None)

    def adopt_sessions(self, parent: ScopeRef, session_ids: tuple[str, ...]) -> None:
        """Start the claimed child conversations once the parent's commit is published."""
        try:
            for sid in session_ids:
                self.ensure(ScopeRef(StateScope.CONVERSATION, sid), parent)
        finally:
            self.release_sessions(session_ids)
