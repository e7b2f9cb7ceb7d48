"""The scope listing behind the tree and the search: one order, filters, and a cursor.

A page is asked for as ``after`` (the last scope of the previous page, or
none), ``limit``, and filters: the level, an id prefix, and the parent (for
the tree, whose nodes open one page of children at a time). The order is
the level (global, team, workflow, conversation) then the id, so a cursor is
simply a scope ref and stays valid while scopes are added.

Today the listing reads every scope record (``Store.scope_records()``) and
filters them in memory: fine for thousands of scopes, and the only place
that would change for a million. What that needs from the store is written
down in ``docs/inspector.md`` (an iterating listing from a cursor, and an
index by parent and by id prefix); nothing else in the inspector holds more
than one page of rows.
"""

from __future__ import annotations

import bisect

import attrs

from victor_actors import GlobalStateManager, ScopeRef, StateScope
from victor_actors.cli._format import scope_key

__all__ = ["ROOTS", "Catalog", "Entry", "Page"]

ROOTS = "none"  # parent=none: the scopes with no stored parent (global, and any orphan)


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

    def _parents(self) -> dict[ScopeRef, ScopeRef | None]:
        manager, store = self._manager, self._manager.store
        parents: dict[ScopeRef, ScopeRef | None] = {}
        if store is not None:
            for rec in store.scope_records():
                parents[rec.ref] = rec.lineage[0] if rec.lineage else None
        if self._live or store is None:  # the owner may hold scopes its store has no record of yet
            for ref in manager.scopes():
                if ref not in parents:
                    parents[ref] = manager.scope(ref).snapshot().parent
        return {ref: (p if p in parents else None) for ref, p in parents.items()}

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
        parents = self._parents()
        chosen = [
            ref
            for ref, up in parents.items()
            if (level is None or ref.scope == level)
            and (prefix is None or ref.id.startswith(prefix))
            and (parent is None or up == (None if parent == ROOTS else parent))
        ]
        chosen.sort(key=scope_key)
        start = 0 if after is None else bisect.bisect_right(chosen, scope_key(after), key=scope_key)
        rows = chosen[start : start + limit]
        with_children = {up for up in parents.values() if up is not None}
        return Page(
            tuple(Entry(ref, parents[ref]) for ref in rows),
            more=len(chosen) > start + limit,
            parents=frozenset(ref for ref in rows if ref in with_children),
        )
