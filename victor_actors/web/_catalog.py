"""The scope listing behind the tree and the search: one order, filters, and a cursor.

A page is asked for as ``after`` (the last scope of the previous page, or
none), ``limit``, and filters: the level, an id prefix, and the parent (for
the tree, whose nodes open one page of children at a time). The order is the
store's key order (plaintext: level, id length, id; encrypted: level, then a
keyed hash of the id), so a cursor is simply a scope ref and stays valid
while scopes are added.

On a store each page is read with the store's bounded readers
(``children_page``, ``level_page``, ``prefix_page``; see ``docs/store.md``):
a page costs its rows, not the store's size, except a prefix search in an
encrypted store (a scan, since its keys hold no ids) and a store from before
the ``children`` index (a full scan). In live mode, and for a manager
without a store, the owner may hold scopes its store has no record of yet,
so the listing there reads every scope and filters in memory.
"""

from __future__ import annotations

import bisect

import attrs

from victor_actors import GlobalStateManager, ScopeRef, StateScope
from victor_actors.store._codec import ScopeRecord
from victor_actors.store._keys import PLAIN
from victor_actors.store._store import Store

__all__ = ["ROOTS", "Catalog", "Entry", "Page"]

ROOTS = "none"  # parent=none: the scopes with no parent (global; in live mode, any orphan too)


@attrs.frozen
class Entry:
    """A scope and its parent in the tree (None at the root, or when its parent is not stored)."""

    ref: ScopeRef
    parent: ScopeRef | None


@attrs.frozen
class Page:
    entries: tuple[Entry, ...]
    more: bool  # scopes past this page match the filters too
    parents: frozenset[ScopeRef]  # the scopes of this page that have children


class Catalog:
    """Pages of a manager's scopes: those of its store, and in live mode those only in memory."""

    def __init__(self, manager: GlobalStateManager, *, live: bool) -> None:
        self._manager = manager
        self._live = live

    def page(
        self,
        *,
        after: ScopeRef | None = None,
        limit: int = 100,
        level: StateScope | None = None,
        prefix: str | None = None,
        parent: ScopeRef | str | None = None,
    ) -> Page:
        """Up to ``limit`` scopes past ``after`` that pass every filter given, in the listing's order.

        ``parent`` is a scope (its direct children) or :data:`ROOTS`.
        """
        store = self._manager.store
        if self._live or store is None:
            return self._scan_page(after, limit, level, prefix, parent)
        if isinstance(parent, str) and parent != ROOTS:
            return Page((), more=False, parents=frozenset())
        want = limit + 1  # one more than the page: is there a next one?
        if parent is not None:
            up = None if isinstance(parent, str) else parent
            records = self._children(store, up, after, want, level, prefix)
        elif prefix is not None:
            records = store.prefix_page(prefix, level, after, want)
        else:
            records = store.level_page(level, after, want)
        rows = records[:limit]
        with_children = store.with_children([r.ref for r in rows])
        return Page(
            tuple(Entry(r.ref, r.lineage[0] if r.lineage else None) for r in rows),
            more=len(records) > limit,
            parents=frozenset(with_children),
        )

    @staticmethod
    def _children(
        store: Store,
        parent: ScopeRef | None,
        after: ScopeRef | None,
        want: int,
        level: StateScope | None,
        prefix: str | None,
    ) -> list[ScopeRecord]:
        """``want`` children of ``parent`` past ``after`` that pass the level and prefix filters."""
        if level is None and prefix is None:
            return store.children_page(parent, after, want)
        out: list[ScopeRecord] = []
        while len(out) < want:  # filtered children: read pages of children until enough pass
            chunk = store.children_page(parent, after, max(want, 256))
            out += [
                r
                for r in chunk
                if (level is None or r.ref.scope == level) and (prefix is None or r.ref.id.startswith(prefix))
            ]
            if len(chunk) < max(want, 256):
                break
            after = chunk[-1].ref
        return out[:want]

    def _parents(self) -> dict[ScopeRef, ScopeRef | None]:
        manager, store = self._manager, self._manager.store
        parents: dict[ScopeRef, ScopeRef | None] = {}
        if store is not None:
            for rec in store.scope_records():
                parents[rec.ref] = rec.lineage[0] if rec.lineage else None
        for ref in manager.scopes():  # the owner may hold scopes its store has no record of yet
            if ref not in parents:
                parents[ref] = manager.scope(ref).snapshot().parent
        return {ref: (p if p in parents else None) for ref, p in parents.items()}

    def _scan_page(
        self,
        after: ScopeRef | None,
        limit: int,
        level: StateScope | None,
        prefix: str | None,
        parent: ScopeRef | str | None,
    ) -> Page:
        """The page from every scope, filtered and sorted in memory (live mode, or no store)."""
        store = self._manager.store
        layout = PLAIN if store is None else store.layout
        parents = self._parents()
        chosen = sorted(
            (
                (layout.ref_key(ref), ref)
                for ref, up in parents.items()
                if (level is None or ref.scope == level)
                and (prefix is None or ref.id.startswith(prefix))
                and (parent is None or up == (None if parent == ROOTS else parent))
            ),
            key=lambda kr: kr[0],
        )
        keys = [k for k, _ in chosen]
        start = 0 if after is None else bisect.bisect_right(keys, layout.ref_key(after))
        rows = [ref for _, ref in chosen[start : start + limit]]
        with_children = {up for up in parents.values() if up is not None}
        return Page(
            tuple(Entry(ref, parents[ref]) for ref in rows),
            more=len(chosen) > start + limit,
            parents=frozenset(ref for ref in rows if ref in with_children),
        )
