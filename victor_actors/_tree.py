"""The scope tree: creating, finding and restoring scopes, and claiming session ids.

A scope is created on first use under the parent its caller names, keeps
that parent for life, and is found again by its ref; with a store, a scope
not live in memory is restored from it (ancestors first). Ids are unique per
level across the whole tree: a conversation id taken under one workflow
cannot be reused under another. CREATE_SESSION claims its child ids on the
parent's actor thread before the commit is durable, so two parents never
create the same child.

Creating a scope costs no synced transaction of its own: its record is
queued for the next group commit, which its first durable commit leads (so
both share one transaction), or the flusher within ``flush_interval``. After
a crash a scope exists if its record or any commit of it was durable; one
created and never committed nor flushed may be absent, and is then created
afresh, empty, on next use (it held nothing). The record always precedes the
scope's commits in the writer's queue, so no commit is ever durable without
its scope. See docs/adr/0016.

A cell is built without an actor; the first request starts one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

from victor_actors._archive import MemoryArchive
from victor_actors._cell import ScopeCell
from victor_actors._errors import CheckpointCorruptError, RuntimeClosedError, ScopeAccessError
from victor_actors._kernel import Kernel
from victor_actors._model import GLOBAL_REF, ScopeRef, StateScope
from victor_actors._state import ScopeState
from victor_actors.store import RecoveryReport, Rows, ScopeRecord

__all__ = ["ScopeTree"]

logger = logging.getLogger("victor_actors")


class ScopeTree:
    """Creation, lookup and restore of one kernel's scopes.

    ``create_record(ref, lineage)`` queues a new scope's record;
    ``restored(cell)`` is told of every scope brought back from the store
    (to redeliver its pending tool requests); ``grew()`` of every new
    resident cell (so the passivator can keep the resident set bounded).
    ``archive`` holds evicted scopes of a manager without a store.
    """

    def __init__(
        self,
        kernel: Kernel,
        *,
        create_record: Callable[[ScopeRef, tuple[ScopeRef, ...]], None],
        restored: Callable[[ScopeCell], None],
        grew: Callable[[], None],
        archive: MemoryArchive | None,
    ) -> None:
        self.kernel = kernel
        self._create_record = create_record
        self._restored = restored
        self._grew = grew
        self.archive = archive
        self._reserved: dict[ScopeRef, ScopeRef] = {}  # session ids claimed by a commit in flight
        self.recovery_reports: list[RecoveryReport] = []

    # -- lookup ---------------------------------------------------------------

    def find(self, ref: ScopeRef) -> ScopeCell | None:
        """The cell of an existing scope (bringing an evicted one back), or None."""
        kernel = self.kernel
        cell = kernel.cells.get(ref)
        if cell is not None and not cell.evicted:
            return cell
        if kernel.store is None and self.archive is None:
            return None
        with kernel.lock:
            cell = kernel.cells.get(ref) or self._restore(ref)
        if cell is not None and cell.source != "memory":
            self._grew()
        return cell

    def resolve(self, ref: ScopeRef) -> ScopeCell:
        """:meth:`find`, raising ScopeAccessError for a scope that does not exist."""
        cell = self.find(ref)
        if cell is None:
            raise ScopeAccessError(f"no scope {ref} exists")
        return cell

    def parent(self, ref: ScopeRef) -> ScopeRef | None:
        cell = self.kernel.cells.get(ref)
        return None if cell is None else cell.state.parent

    def children(self, ref: ScopeRef | None) -> list[ScopeRef]:
        """The resident children of ``ref`` (evicted ones hold nothing to restart)."""
        with self.kernel.lock:
            return list(self.kernel.children.get(ref, ()))

    def exists(self, ref: ScopeRef) -> bool:
        """Whether ``ref`` exists: resident, evicted, or in the store; nothing is loaded."""
        kernel = self.kernel
        if ref in kernel.cells:
            return True
        if self.archive is not None and ref in self.archive:
            return True
        return kernel.store is not None and kernel.store.scope_record(ref) is not None

    def refs(self) -> Iterator[ScopeRef]:
        """Every scope instance, resident, evicted or only in the store: each once, read page by page."""
        kernel = self.kernel
        store = kernel.store
        resident = list(kernel.cells)
        if store is None:
            yield from resident
            if self.archive is not None:
                yield from (r for r in self.archive.refs() if r not in kernel.cells)
            return
        page = 1000
        after: ScopeRef | None = None
        while True:
            try:
                records = store.level_page(None, after, page)
            except CheckpointCorruptError as exc:
                if exc.fatal:
                    raise
                # a damaged record in this page: the rest by the slow reader, which skips it
                key = store.layout.ref_key
                past = b"" if after is None else key(after)
                rest = sorted(store.scope_records(), key=lambda r: key(r.ref))
                yield from (r.ref for r in rest if after is None or key(r.ref) > past)
                break
            for record in records:
                yield record.ref
            if len(records) < page:
                break
            after = records[-1].ref
        # resident scopes whose record is still queued for the next group commit
        for ref in resident:
            if store.scope_record(ref) is None and ref in kernel.cells:
                yield ref

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
        if cell is not None and not cell.evicted and (parent is None or cell.state.parent == parent):
            return cell
        with kernel.lock:
            if kernel.closed:
                raise RuntimeClosedError("the manager is closed")
            cell = kernel.cells.get(ref)
            stored = False  # the store holds commits or checkpoints of ref
            if cell is None and kernel.store is not None:
                # one read transaction: the scope record and everything its state is built from
                record, stored, rows = kernel.store.probe_rows(ref)
                cell = None if record is None else self._restore(ref, record, rows)
            elif cell is None:
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
                parent_cell = kernel.cells.get(parent_ref) or self._restore(parent_ref)
                if parent_cell is None:
                    raise ScopeAccessError(f"cannot create {ref}: its parent {parent_ref} does not exist")
                lineage = (parent_ref, *parent_cell.state.lineage)
            if stored:
                # its scope record is gone (damaged?) but its history is not: creating it afresh
                # would start at version 0 and overwrite acknowledged commits
                raise CheckpointCorruptError(
                    f"the store holds commits or checkpoints of {ref} but no readable scope record for it; "
                    "it was not created over them (inspect the store with victor-actors inspect)",
                    ref=ref,
                )
            self._create_record(ref, lineage)
            cell = self.start(ScopeState(ref=ref, lineage=lineage))
        self._grew()
        return cell

    def create_from(self, state: ScopeState, write: Callable[[], None]) -> ScopeCell:
        """Create the new scope ``state.ref`` holding ``state`` (a fork); ``write()`` stores it first.

        Under the kernel's lock, which guards every scope's creation: the
        scope must not exist, its ancestors are made resident (any of them
        may have been evicted meanwhile), ``write()`` makes the scope's first
        records durable (nothing else can reach a scope that does not exist
        yet, so this is its only writer), then its cell is registered.

        Raises:
            ScopeAccessError: the scope exists already, or an ancestor does
                not; nothing was written.
        """
        kernel = self.kernel
        ref = state.ref
        with kernel.lock:
            if kernel.closed:
                raise RuntimeClosedError("the manager is closed")
            if self.exists(ref) or ref in self._reserved:
                raise ScopeAccessError(f"{ref} already exists; nothing was written")
            self._restore_ancestors(ref, state.lineage)
            write()
            cell = self.start(state)
        self._grew()
        return cell

    def start(self, state: ScopeState, source: str = "new") -> ScopeCell:
        """Register the cell owning ``state`` (its parent is resident). Holds the kernel's lock.

        The cell has no actor yet: the first request starts one.
        """
        kernel = self.kernel
        if state.lineage:
            parent = kernel.cells[state.lineage[0]]
            ancestors: tuple[ScopeCell, ...] = (parent, *parent.ancestors)
        else:
            ancestors = ()
        cell = ScopeCell(state, ancestors, kernel.durability)
        cell.names = kernel.names
        cell.source = source
        kernel.register(cell)
        return cell

    def _restore(
        self, ref: ScopeRef, record: ScopeRecord | None = None, rows: Rows | None = None
    ) -> ScopeCell | None:
        """Bring an evicted or stored scope (and, first, its ancestors) back. Holds the kernel's lock."""
        kernel = self.kernel
        archive = self.archive
        if archive is not None:
            state = archive.peek(ref)
            if state is None:
                return None
            self._restore_ancestors(ref, state.lineage)
            state = archive.take(ref)
            assert state is not None
            return self.start(state, "memory")
        store = kernel.store
        if store is None:
            return None
        if record is None:
            record, _stored, rows = store.probe_rows(ref)  # one read transaction for the whole scope
        if record is None:
            return None
        self._restore_ancestors(ref, record.lineage, " from the store")
        state, report = store.load(ref, record.lineage, rows=rows)
        if not report.clean:
            logger.warning("recovered %s at version %d, skipping: %s", ref, state.version, report.skipped)
            if report not in self.recovery_reports:  # a scope refused below is asked for again
                self.recovery_reports.append(report)
            if not report.head_found and not store.read_only:
                # its newest version is unknown: serving what was found would write new commits
                # over acknowledged ones the store holds but could not show (docs/adr/0023)
                raise CheckpointCorruptError(
                    f"{ref} cannot be loaded as complete: {'; '.join(report.skipped)}; the records "
                    f"found reach version {state.version}. It was not loaded and nothing was written "
                    "(inspect it read-only: GlobalStateManager.open(path, read_only=True) or "
                    "victor-actors history)",
                    ref=ref,
                    version=state.version,
                )
            if not store.read_only and report.latest_stored_version > state.version:
                store.submit([store.op_quarantine_after(ref, state.version)], wait=True)
        cell = self.start(state, "store")
        self._restored(cell)
        return cell

    def _restore_ancestors(self, ref: ScopeRef, lineage: tuple[ScopeRef, ...], where: str = "") -> None:
        """Make every ancestor of ``ref`` resident, global first. Holds the kernel's lock."""
        for anc in reversed(lineage):
            if anc not in self.kernel.cells and self._restore(anc) is None:
                raise ScopeAccessError(f"{ref}'s ancestor {anc} is missing{where}")

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
                if owner is None and self.archive is not None:
                    archived = self.archive.peek(ref)
                    cell_or_archived = archived is not None
                    owner = archived.parent if archived is not None else None
                    if cell_or_archived and owner != parent:
                        raise ScopeAccessError(f"CREATE_SESSION: {ref} already exists under {owner}")
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
