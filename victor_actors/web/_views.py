"""What the inspector's JSON routes answer: plain data read from a manager and its store.

Every answer is built here, apart from the web framework, and only through
public APIs: ``GlobalStateManager`` (``scope``, ``scopes``, ``state_at``,
handles' ``snapshot``) and ``manager.store`` (``scope_record``, ``head``,
``log_versions``, ``commit_record``, ``checkpoints``, ``size_of``). Nothing
here writes: the manager is read-only (``victor-actors serve``) or is the
running owner's (live mode), and the inspector asks it only for reads.

Versions. The tree and the history show what the store holds (the head
record of each scope, its log and checkpoints). In live mode the scope page
also shows the owner's current state, which in ``async`` durability may be
a few commits ahead of the store.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from victor_actors import (
    CheckpointCorruptError,
    CheckpointNotFoundError,
    ContextSnapshot,
    GlobalStateManager,
    RuntimeClosedError,
    ScopeAccessError,
    ScopeRef,
    StateScope,
    VictorActorsError,
    __version__,
)
from victor_actors.cli._format import commit_json, iso, jsonable
from victor_actors.store import Store
from victor_actors.web._catalog import Catalog
from victor_actors.web._diff import MAX_ROWS, diff_snapshots
from victor_actors.web._errors import InspectorError

__all__ = ["Inspector", "translate"]


@contextlib.contextmanager
def translate() -> Iterator[None]:
    """Turn the runtime's errors into typed 4xx answers (an unknown scope, a pruned version, ...)."""
    try:
        yield
    except InspectorError:
        raise
    except ScopeAccessError as exc:
        raise InspectorError(404, "no_scope", str(exc)) from exc
    except CheckpointNotFoundError as exc:
        raise InspectorError(404, "no_version", str(exc)) from exc
    except CheckpointCorruptError as exc:
        raise InspectorError(422, "unreadable", str(exc)) from exc
    except RuntimeClosedError as exc:
        raise InspectorError(410, "closed", str(exc)) from exc
    except VictorActorsError as exc:
        raise InspectorError(409, "refused", str(exc)) from exc


class Inspector:
    """The read model of one manager: the pages of the tree, a scope's history, states and diffs."""

    def __init__(self, manager: GlobalStateManager, *, live: bool) -> None:
        self.manager = manager
        self.live = live
        self.catalog = Catalog(manager, live=live)

    # -- helpers ---------------------------------------------------------------

    @property
    def store(self) -> Store | None:
        return self.manager.store

    def _need_store(self, what: str) -> Store:
        store = self.store
        if store is None:
            raise InspectorError(404, "no_store", f"this manager keeps no store, so it has no {what}")
        return store

    def _exists(self, ref: ScopeRef) -> None:
        store = self.store
        if store is not None and store.scope_record(ref) is not None:
            return
        if self.live or store is None:
            self.manager.scope(ref)  # ScopeAccessError if the owner does not know it either
            return
        raise InspectorError(404, "no_scope", f"no scope {ref} exists")

    def _stored_versions(self, ref: ScopeRef) -> tuple[list[int], dict[int, Any]]:
        store = self._need_store("history")
        return store.log_versions(ref), {c.version: c for c in store.checkpoints(ref)}

    def _newest(self, ref: ScopeRef) -> int:
        """The newest durable version: the head record, else the newest stored record, else 0."""
        store = self.store
        if store is None:
            return self.manager.scope(ref).version
        head = store.head(ref)
        if head is not None:
            return head
        logged, ckpts = self._stored_versions(ref)
        return max([0, *logged, *ckpts])

    def _last_commit(self, ref: ScopeRef, version: int) -> str | None:
        store = self.store
        if store is None or version <= 0:
            return None
        try:
            return iso(store.commit_record(ref, version).timestamp)
        except CheckpointNotFoundError:  # only a checkpoint holds that version (a fork's first)
            return None

    def snapshot(self, ref: ScopeRef, version: int | None) -> ContextSnapshot:
        """The scope at ``version`` (None: current), rebuilt from the store unless the owner holds it.

        Raises:
            InspectorError: 404 ``no_version`` for a version never reached or no longer stored;
                422 ``unreadable`` when a damaged record stops its rebuild; 404 ``no_store`` for an
                older version of a manager kept in memory.
        """
        self._exists(ref)
        if self.live:
            current = self.manager.scope(ref).snapshot()
            if version is None or version == current.version:
                return current
            if version > current.version:
                raise InspectorError(
                    404, "no_version", f"{ref} has no version {version}; its newest is {current.version}"
                )
        self._need_store("stored versions")
        newest = self._newest(ref)
        if version is None:
            version = newest
        if version > newest:
            raise InspectorError(404, "no_version", f"{ref} has no version {version}; its newest is {newest}")
        try:
            snap = self.manager.state_at(ref, version)
        except CheckpointNotFoundError as exc:
            logged, ckpts = self._stored_versions(ref)
            oldest = min(ckpts) if ckpts else (min(logged) - 1 if logged else 0)
            if version >= oldest:  # stored, but a damaged record below it stops the replay
                raise InspectorError(422, "unreadable", str(exc)) from None
            raise InspectorError(
                404,
                "no_version",
                f"{ref}: version {version} is no longer stored; retention keeps v{oldest} to v{newest}",
                oldest=oldest,
                newest=newest,
            ) from None
        if snap.version != version:  # never show one version as another
            raise InspectorError(
                422,
                "unreadable",
                f"{ref}: version {version} cannot be rebuilt from the store (reached {snap.version})",
            )
        return snap

    # -- the routes' answers -----------------------------------------------------

    def info(self) -> dict[str, Any]:
        store = self.store
        return {
            "victor_actors": __version__,
            "mode": "live" if self.live else "store",
            "store": None if store is None else os.path.abspath(store.path),
            "read_only": True,
            "owner_read_only": self.manager.read_only,
            "durability": self.manager.durability,
            "levels": [s.value for s in StateScope],
        }

    def scopes(
        self,
        *,
        after: ScopeRef | None,
        limit: int,
        level: StateScope | None,
        prefix: str | None,
        parent: ScopeRef | str | None,
    ) -> dict[str, Any]:
        page = self.catalog.page(after=after, limit=limit, level=level, prefix=prefix, parent=parent)
        store = self.store
        items = []
        for entry in page.entries:
            ref = entry.ref
            row: dict[str, Any] = {
                "ref": str(ref),
                "level": ref.scope.value,
                "id": ref.id,
                "parent": None if entry.parent is None else str(entry.parent),
                "has_children": ref in page.parents,
            }
            try:
                version = self._newest(ref)
                row["version"] = version
                row["last_commit"] = self._last_commit(ref, version)
                row["size"] = None if store is None else store.size_of(ref)
            except VictorActorsError as exc:  # one damaged scope does not hide the others
                row["unreadable"] = str(exc)
            items.append(row)
        last = page.entries[-1].ref if page.entries and page.more else None
        return {"items": items, "next": None if last is None else str(last)}

    def scope(self, ref: ScopeRef) -> dict[str, Any]:
        self._exists(ref)
        store = self.store
        out: dict[str, Any] = {"ref": str(ref), "level": ref.scope.value, "id": ref.id}
        record = None if store is None else store.scope_record(ref)
        if record is not None:
            out["parent"] = str(record.lineage[0]) if record.lineage else None
            out["lineage"] = [str(r) for r in record.lineage]
            out["created"] = iso(record.created)
        else:
            snap = self.manager.scope(ref).snapshot()
            out["parent"] = None if snap.parent is None else str(snap.parent)
            out["lineage"] = [str(r) for r in snap.ancestors]
            out["created"] = None
        version = self._newest(ref)
        out["version"] = version
        out["last_commit"] = self._last_commit(ref, version)
        if store is not None:
            logged, ckpts = self._stored_versions(ref)
            out["size"] = store.size_of(ref)
            out["log"] = {
                "count": len(logged),
                "first": logged[0] if logged else None,
                "last": max(logged, default=None),
            }
            out["checkpoints"] = len(ckpts)
        if self.live:
            handle = self.manager.scope(ref)
            out["live"] = {"version": handle.version, "is_live": handle.is_live}
        return out

    def history(
        self, ref: ScopeRef, *, before: int | None, limit: int, run: str | None = None
    ) -> dict[str, Any]:
        """One row per stored version, newest first, up to ``limit`` below ``before``.

        With ``run``, only the commits of that run (its writes and its rollback): the log is
        read newest first until a page of them is found, so a page costs at most the log, which
        retention bounds.
        """
        self._exists(ref)
        store = self._need_store("history")
        logged, ckpts = self._stored_versions(ref)
        in_log = set(logged)
        versions = sorted(in_log | set(ckpts) if run is None else in_log, reverse=True)
        if before is not None:
            versions = [v for v in versions if v < before]
        rows: list[dict[str, Any]] = []
        older = False
        for v in versions:
            row = None
            if run is not None:
                row = self._history_row(store, ref, v, ckpts, in_log)
                if row.get("run_id") != run:
                    continue
            if len(rows) == limit:  # one more row below this page
                older = True
                break
            rows.append(row or self._history_row(store, ref, v, ckpts, in_log))
        out: dict[str, Any] = {
            "ref": str(ref),
            "count": len(in_log),
            "checkpoints": sorted(ckpts),
            "items": rows,
            "next_before": rows[-1]["version"] if older and rows else None,
        }
        if run is not None:
            out["run"] = run
        return out

    @staticmethod
    def _history_row(
        store: Store, ref: ScopeRef, v: int, ckpts: dict[int, Any], in_log: set[int]
    ) -> dict[str, Any]:
        info = ckpts.get(v)
        row: dict[str, Any] = {"version": v}
        row["checkpoint"] = None if info is None else {"id": info.checkpoint_id, "label": info.label}
        if v not in in_log:
            row["in_log"] = False
            return row
        row["in_log"] = True
        try:
            rec = store.commit_record(ref, v)
        except CheckpointCorruptError as exc:
            row["unreadable"] = str(exc)
        except CheckpointNotFoundError:
            row["in_log"] = False  # pruned while reading
        else:
            row |= commit_json(rec)
            row["changed_keys"] = sorted({k for keys in row["keys"].values() for k in keys})
        return row

    def state(
        self, ref: ScopeRef, *, version: int | None, messages_from: int | None, messages_limit: int
    ) -> dict[str, Any]:
        """The scope at a version: its maps, stage, and a window of its messages (the newest by default)."""
        with translate():
            snap = self.snapshot(ref, version)
        values = sorted(snap.state.items())
        total = snap.message_count
        start = max(0, total - messages_limit) if messages_from is None else min(messages_from, total)
        window = snap.messages[start : start + messages_limit]
        return {
            "ref": str(ref),
            "version": snap.version,
            "state": [{"key": k, "value": jsonable(v)} for k, v in values[:MAX_ROWS]],
            "state_count": len(values),
            "capabilities": jsonable(dict(sorted(snap.capabilities.items()))),
            "conversation_stage": snap.conversation_stage,
            "closed": snap.is_closed,
            "pending_tool_requests": jsonable(dict(sorted(snap.pending_tool_requests.items()))),
            "message_count": total,
            "messages_from": start,
            "messages": [jsonable(m) for m in window],
        }

    def diff(self, ref: ScopeRef, a: int, b: int) -> dict[str, Any]:
        with translate():
            return diff_snapshots(self.snapshot(ref, a), self.snapshot(ref, b))

    def checkpoints(self, ref: ScopeRef) -> dict[str, Any]:
        self._exists(ref)
        store = self._need_store("checkpoints")
        items = [
            {
                "id": c.checkpoint_id,
                "version": c.version,
                "label": c.label,
                "time": iso(c.timestamp) if c.readable else None,
                "size": c.size,
                "readable": c.readable,
            }
            for c in store.checkpoints(ref)
        ]
        return {"ref": str(ref), "items": items}
