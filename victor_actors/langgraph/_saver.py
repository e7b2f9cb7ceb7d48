"""VictorActorsSaver: LangGraph's BaseCheckpointSaver on the runtime's scopes and LMDB store."""

from __future__ import annotations

import asyncio
import builtins
import os
import random
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from typing import Any, cast

from langchain_core.runnables import RunnableConfig  # type: ignore[import-not-found, unused-ignore]
from langgraph.checkpoint.base import (  # type: ignore[import-not-found, unused-ignore]
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    PendingWrite,
    get_checkpoint_id,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol  # type: ignore[import-not-found, unused-ignore]

from victor_actors import (
    ContextSnapshot,
    GlobalStateManager,
    ScopeAccessError,
    ScopeHandle,
    ScopeRef,
    StateScope,
    StateTransition,
    VersionConflictError,
)
from victor_actors.langgraph import _layout as L
from victor_actors.langgraph._serde import DisallowedTypeError, StrictSerializer
from victor_actors.lowlevel import MapView, Step, StepGen, adrive, drive

__all__ = ["VictorActorsSaver"]

# Optimistic attempts (handle.modify: snapshot, build, apply with the version read) before falling
# back to a locked read-modify-write. One is enough unless another writer of the namespace got in.
_TRIES = 3
Build = Callable[[ContextSnapshot], "builtins.list[StateTransition] | None"]


class _NothingToWrite(Exception):
    """A build found the namespace already as wanted: no commit, and no round trip to its actor."""


def _conf(config: RunnableConfig) -> tuple[str, str, str | None]:
    conf = config.get("configurable") or {}
    if conf.get("thread_id") is None:
        raise ValueError("a LangGraph checkpoint config needs configurable.thread_id")
    return str(conf["thread_id"]), str(conf.get("checkpoint_ns") or ""), conf.get("checkpoint_id") or None


def _config(thread_id: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}}


class VictorActorsSaver(BaseCheckpointSaver[str]):  # type: ignore[misc, unused-ignore]
    """A LangGraph checkpointer whose threads are victor_actors scopes.

    ``VictorActorsSaver.open(path)`` opens (and owns) a manager on an LMDB
    store; ``VictorActorsSaver(manager)`` uses one you already have (and
    leaves it open). A thread is the team scope ``lg:<thread_id>``; each
    checkpoint namespace is a conversation scope under it. So every write
    goes through that scope's actor, is durable on return (``durability=
    "sync"``), shares LMDB transactions with other scopes, survives crashes
    whole or not at all, and shows up in ``victor-actors inspect``.

    One ``put`` is one commit: the checkpoint record and the channel values
    it introduces, written once per channel version and shared by every
    later checkpoint that keeps that version. One ``put_writes`` is one
    commit too. Concurrent writers of one namespace are serialised by its
    actor; a write that raced another is retried on the new state, so none
    is lost.

    Values are serialized by ``serde`` (default: :class:`StrictSerializer`,
    LangGraph's msgpack format with a strict allowlist; ``allowed_types``
    extends it). Pickle is refused whatever the serializer.
    """

    serde: SerializerProtocol

    def __init__(
        self,
        manager: GlobalStateManager,
        *,
        serde: SerializerProtocol | None = None,
        allowed_types: Iterable[tuple[str, ...] | type] = (),
        timeout: float | None = None,
        close_manager: bool = False,
    ) -> None:
        allowed = tuple(allowed_types)
        if serde is not None and allowed:
            raise ValueError("pass allowed_types (for the default StrictSerializer) or serde, not both")
        super().__init__(serde=serde if serde is not None else StrictSerializer(allowed))
        self.manager = manager
        self.timeout = timeout
        self._close_manager = close_manager
        self._handles: dict[tuple[str, str], ScopeHandle] = {}
        self._registered: set[tuple[str, str]] = set()
        self._open_lock = threading.Lock()

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        serde: SerializerProtocol | None = None,
        allowed_types: Iterable[tuple[str, ...] | type] = (),
        timeout: float | None = None,
        **manager_options: Any,
    ) -> VictorActorsSaver:
        """Open an LMDB store at ``path`` (see ``GlobalStateManager.open``); :meth:`close` closes it."""
        manager = GlobalStateManager.open(path, **manager_options)
        try:
            return cls(manager, serde=serde, allowed_types=allowed_types, timeout=timeout, close_manager=True)
        except BaseException:
            manager.close()
            raise

    def close(self) -> None:
        """Close the manager if this saver opened it. Idempotent."""
        if self._close_manager:
            self.manager.close()

    def __enter__(self) -> VictorActorsSaver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> VictorActorsSaver:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.close)

    # -- scopes ----------------------------------------------------------------

    def _lookup(self, thread_id: str, ns: str) -> ScopeHandle | None:
        """The namespace's scope, or None if it was never written. Creates nothing."""
        handle = self._handles.get((thread_id, ns))
        if handle is None:
            try:
                handle = self.manager.scope(ScopeRef(StateScope.CONVERSATION, L.conv_id(thread_id, ns)))
            except ScopeAccessError:
                return None
            self._handles[(thread_id, ns)] = handle
        return handle

    async def _alookup(self, thread_id: str, ns: str) -> ScopeHandle | None:
        """:meth:`_lookup` for asyncio: off the loop, unless the handle is already known."""
        handle = self._handles.get((thread_id, ns))
        return handle if handle is not None else await asyncio.to_thread(self._lookup, thread_id, ns)

    def _opened(self, thread_id: str, ns: str) -> ScopeHandle | None:
        """The namespace's handle if this saver already created and listed it, else None."""
        key = (thread_id, ns)
        return self._handles.get(key) if key in self._registered else None

    def _open_ns(self, thread_id: str, ns: str) -> ScopeHandle:
        """The namespace's scope, created (and listed in its thread's team) on first use."""
        handle = self._opened(thread_id, ns)
        if handle is not None:
            return handle
        key = (thread_id, ns)
        with self._open_lock:
            team = self.manager.get_team_state(L.team_id(thread_id))
            ns_key = L.NS_PREFIX + ns
            if ns_key not in team.snapshot().state:
                # Listed before the namespace gets data, and never unlisted: a crash in between
                # leaves an empty namespace listed, never data that delete_thread cannot find.
                team.apply([L.update(ns_key, True)], timeout=self.timeout)
            handle = self.manager.get_conversation_state(
                L.conv_id(thread_id, ns), team_id=L.team_id(thread_id)
            )
            self._handles[key] = handle
            self._registered.add(key)
        return handle

    async def _aopen_ns(self, thread_id: str, ns: str) -> ScopeHandle:
        """:meth:`_open_ns` for asyncio: off the loop, unless the namespace is already open."""
        handle = self._opened(thread_id, ns)
        return handle if handle is not None else await asyncio.to_thread(self._open_ns, thread_id, ns)

    def _namespaces(self, thread_id: str) -> builtins.list[str]:
        try:
            team = self.manager.scope(ScopeRef(StateScope.TEAM, L.team_id(thread_id)))
        except ScopeAccessError:
            return []
        prefix = L.NS_PREFIX
        return sorted(key[len(prefix) :] for key in team.snapshot().state if key.startswith(prefix))

    def _threads(self) -> builtins.list[str]:
        out = []
        for ref in self.manager.scopes():
            if ref.scope is StateScope.TEAM:
                thread = L.thread_of_team(ref.id)
                if thread is not None:
                    out.append(thread)
        return sorted(out)

    def _targets(
        self, config: RunnableConfig | None
    ) -> builtins.list[tuple[str, str, ScopeHandle, str | None]]:
        """(thread, namespace, handle, checkpoint id filter) for every namespace a list() reads."""
        if config is None:
            threads, only_ns, only_id = self._threads(), None, None
        else:
            conf = config.get("configurable") or {}
            thread, _ns, only_id = _conf(config)
            threads = [thread]
            only_ns = None if conf.get("checkpoint_ns") is None else str(conf["checkpoint_ns"])
        out = []
        for thread in threads:
            for ns in [only_ns] if only_ns is not None else self._namespaces(thread):
                handle = self._lookup(thread, ns)
                if handle is not None:
                    out.append((thread, ns, handle, only_id))
        return out

    # -- serialization -----------------------------------------------------------

    def _dumps(self, obj: Any) -> tuple[str, bytes]:
        type_, data = self.serde.dumps_typed(obj)
        if type_ == "pickle":
            raise DisallowedTypeError(
                "refusing to store a pickled value; nothing was written", type_name=type_
            )
        return type_, bytes(data)

    def _loads(self, typed: Any) -> Any:
        type_, data = typed[0], typed[1]
        if type_ == "pickle":
            raise DisallowedTypeError(
                "refusing to load a pickled value; nothing was imported", type_name=type_
            )
        return self.serde.loads_typed((type_, data))

    def _tuple(self, thread_id: str, ns: str, cid: str, state: MapView) -> CheckpointTuple | None:
        record = state.get(L.record_key(cid))
        if record is None:
            return None
        checkpoint = self._loads(record["c"])
        versions = dict(record["v"])  # channel -> version: str, int or float, nothing to thaw
        values = {}
        for channel, version in versions.items():
            blob = state.get(L.blob_key(channel, version))
            if blob is not None and blob[0] != "empty":
                values[channel] = self._loads(blob)
        checkpoint["channel_values"] = values
        checkpoint["channel_versions"] = versions
        parent = record["p"]
        return CheckpointTuple(
            config=_config(thread_id, ns, cid),
            checkpoint=checkpoint,
            metadata=self._loads(record["m"]),
            parent_config=_config(thread_id, ns, parent) if parent else None,
            pending_writes=self._pending(state, cid),
        )

    def _pending(self, state: MapView, cid: str) -> builtins.list[PendingWrite]:
        rows = []
        for task_id in state.get(L.write_tasks_key(cid)) or ():
            entry = state.get(L.write_key(cid, task_id))
            if entry is not None:
                path = entry["p"]
                for idx, channel, type_, data in entry["w"]:
                    rows.append(((path, task_id, idx), task_id, channel, (type_, data)))
        rows.sort(key=lambda row: row[0])  # LangGraph's writes_sort_key: (task path, task id, idx)
        return [(task_id, channel, self._loads(typed)) for _key, task_id, channel, typed in rows]

    # -- commits ---------------------------------------------------------------

    def _write(self, thread_id: str, ns: str, build: Build) -> StepGen[None]:
        """Open the namespace and commit what ``build`` returns: once for each sync method and its twin."""
        handle = yield Step(self._open_ns, self._aopen_ns, thread_id, ns)
        yield from self._commit(handle, build)

    def _commit(self, handle: ScopeHandle, build: Build) -> StepGen[None]:
        """Commit what ``build(snapshot)`` returns, with no lost update; nothing if it returns nothing.

        Optimistic first (``handle.modify``: the batch applies only if the
        namespace is still at the version it was built from); after
        ``_TRIES`` conflicting tries, under the scope's lock (``transact``),
        where it cannot conflict.
        """

        def batch(snap: ContextSnapshot) -> builtins.list[StateTransition]:
            transitions = build(snap)
            if not transitions:
                raise _NothingToWrite
            return transitions

        try:
            yield Step(handle.modify, handle.amodify, batch, retries=_TRIES - 1, timeout=self.timeout)
        except _NothingToWrite:
            return
        except VersionConflictError:
            yield Step(
                handle.transact,
                handle.atransact,
                lambda snap: build(snap) or (),
                lock=[handle.ref],
                timeout=self.timeout,
            )

    def _purge(self, handle: ScopeHandle) -> None:
        """Drop a namespace's history from the store after a delete or prune.

        The runtime keeps a scope's log back to its oldest retained checkpoint,
        so deleted values would stay on disk. A checkpoint of the current state,
        written again with retention 1, becomes the scope's only base: the
        transaction that writes it drops every older log record and checkpoint.
        """
        store = self.manager.store
        if store is None or store.read_only:
            return
        saved = self.manager.save_checkpoint(handle.ref, label="langgraph: history purged")
        version = int(saved.rpartition("@")[2])  # the id is "<scope>@<version>"
        record = store.checkpoint(handle.ref, version)
        store.submit([store.op_put_checkpoint(handle.ref, record, 1)], wait=True)

    # -- put ---------------------------------------------------------------------

    def _put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> StepGen[RunnableConfig]:
        """:meth:`put` and :meth:`aput`, once."""
        thread_id, ns, parent = _conf(config)
        cid = checkpoint["id"]
        rest = cast(dict[str, Any], dict(checkpoint))
        values: dict[str, Any] = rest.pop("channel_values", None) or {}
        versions: dict[str, Any] = dict(rest.pop("channel_versions", None) or {})
        merged = cast(dict[str, Any], get_checkpoint_metadata(config, metadata))
        run_id = merged.get("run_id")
        transitions = [
            L.update(L.blob_key(ch, ver), self._dumps(values[ch]) if ch in values else ("empty", b""))
            for ch, ver in new_versions.items()
        ]
        record = {
            "c": self._dumps(rest),
            "m": self._dumps(merged),
            "p": parent,
            "r": run_id if isinstance(run_id, str) else None,
            "v": versions,
        }
        transitions.append(L.update(L.record_key(cid), record))

        def build(snap: ContextSnapshot) -> builtins.list[StateTransition]:
            state = snap.state
            out = list(transitions)
            for ch, ver in versions.items():  # values the caller did not announce in new_versions
                if ch in values and ch not in new_versions and L.blob_key(ch, ver) not in state:
                    out.append(L.update(L.blob_key(ch, ver), self._dumps(values[ch])))
            latest = state.get(L.LATEST)
            if latest is None or cid > latest:
                out.append(L.update(L.LATEST, cid))
            return out

        yield from self._write(thread_id, ns, build)
        return _config(thread_id, ns, cid)

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint and the channel values it introduces, in one commit."""
        return drive(self._put(config, checkpoint, metadata, new_versions))

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await adrive(self._put(config, checkpoint, metadata, new_versions))

    # -- put_writes -------------------------------------------------------------

    def _put_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str
    ) -> StepGen[None]:
        """:meth:`put_writes` and :meth:`aput_writes`, once."""
        if not writes:
            return
        thread_id, ns, cid = _conf(config)
        if cid is None:
            raise ValueError("put_writes needs configurable.checkpoint_id")
        entries = []
        for idx, (channel, value) in enumerate(writes):
            type_, data = self._dumps(value)
            entries.append((WRITES_IDX_MAP.get(channel, idx), channel, type_, data))
        key, tasks_key = L.write_key(cid, task_id), L.write_tasks_key(cid)

        def build(snap: ContextSnapshot) -> builtins.list[StateTransition] | None:
            state = snap.state
            existing = state.get(key)
            merged = {row[0]: row for row in existing["w"]} if existing is not None else {}
            changed = False
            for row in entries:
                old = merged.get(row[0])
                # A regular write (idx >= 0) is kept as first stored; special ones (errors,
                # interrupts) are replaced, as LangGraph's own savers do.
                if old is not None and (row[0] >= 0 or tuple(old) == row):
                    continue
                merged[row[0]] = row
                changed = True
            if not changed:
                return None
            rows = tuple(merged[i] for i in sorted(merged))
            out = [L.update(key, {"p": task_path, "w": rows})]
            tasks = state.get(tasks_key) or ()
            if task_id not in tasks:
                out.append(L.update(tasks_key, (*tasks, task_id)))
            return out

        yield from self._write(thread_id, ns, build)

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's pending writes for a checkpoint, in one commit; (task, idx) pairs are idempotent."""
        drive(self._put_writes(config, writes, task_id, task_path))

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await adrive(self._put_writes(config, writes, task_id, task_path))

    # -- reads -------------------------------------------------------------------

    def _get(
        self, handle: ScopeHandle | None, thread_id: str, ns: str, cid: str | None
    ) -> CheckpointTuple | None:
        if handle is None:
            return None
        state = handle.snapshot().state  # immutable: no lock held while values are decoded
        if cid is None:
            cid = state.get(L.LATEST)
            if cid is None:
                return None
        return self._tuple(thread_id, ns, cid, state)

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint named by ``config``, or the namespace's newest; None if there is none."""
        thread_id, ns, cid = _conf(config)
        return self._get(self._lookup(thread_id, ns), thread_id, ns, cid)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        thread_id, ns, cid = _conf(config)
        return self._get(await self._alookup(thread_id, ns), thread_id, ns, cid)

    def _iter(
        self,
        targets: builtins.list[tuple[str, str, ScopeHandle, str | None]],
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> Iterator[CheckpointTuple]:
        before_id = get_checkpoint_id(before) if before else None
        remaining = limit
        for thread_id, ns, handle, only_id in targets:
            state = handle.snapshot().state
            for cid in L.checkpoint_ids(state):
                if remaining is not None and remaining <= 0:
                    return
                if (only_id is not None and cid != only_id) or (before_id is not None and cid >= before_id):
                    continue
                if filter:
                    metadata = self._loads(state[L.record_key(cid)]["m"])
                    if not all(metadata.get(k) == v for k, v in filter.items()):
                        continue
                found = self._tuple(thread_id, ns, cid, state)
                if found is not None:
                    if remaining is not None:
                        remaining -= 1
                    yield found

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first, per namespace; ``config=None`` reads every thread.

        Each namespace is read from one immutable snapshot: no I/O, no lock.
        """
        return self._iter(self._targets(config), filter, before, limit)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        targets = await asyncio.to_thread(self._targets, config)  # may restore scopes from the store
        for item in self._iter(targets, filter, before, limit):
            yield item

    # -- deletes, copies, pruning --------------------------------------------------

    def _rewrite(self, thread_id: str, plan: Callable[[MapView], builtins.list[StateTransition]]) -> None:
        for ns in self._namespaces(thread_id):
            handle = self._lookup(thread_id, ns)
            if handle is None:
                continue
            before = handle.version
            drive(self._commit(handle, lambda snap: plan(snap.state)))
            if handle.version != before:
                self._purge(handle)

    def delete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint, value and pending write of a thread, in all its namespaces.

        Each namespace is emptied in one commit, and its history is dropped
        from the store. The (now empty) scopes stay, as runtime scopes do.
        """
        self._rewrite(str(thread_id), lambda state: [L.delete(key) for key in state])

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (with their writes) whose metadata names one of ``run_ids``.

        Reads every thread: its cost grows with the store.
        """
        runs = {str(r) for r in run_ids}
        if not runs:
            return

        def plan(state: MapView) -> builtins.list[StateTransition]:
            victims = {cid for cid in L.checkpoint_ids(state) if state[L.record_key(cid)]["r"] in runs}
            return L.drop_checkpoints(state, victims) if victims else []

        for thread_id in self._threads():
            self._rewrite(thread_id, plan)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every namespace of a thread (checkpoints, values, writes) to another thread.

        One commit per namespace; a checkpoint the target already has is replaced.
        """
        source, target = str(source_thread_id), str(target_thread_id)
        for ns in self._namespaces(source):
            src = self._lookup(source, ns)
            if src is None:
                continue
            items = dict(src.snapshot().state.items())
            if not items:
                continue
            dst = self._open_ns(target, ns)

            def build(snap: ContextSnapshot, items: dict[str, Any] = items) -> builtins.list[StateTransition]:
                out = [L.update(k, v) for k, v in items.items() if k != L.LATEST]
                latest = [c for c in (items.get(L.LATEST), snap.state.get(L.LATEST)) if c is not None]
                if latest:
                    out.append(L.update(L.LATEST, max(latest)))
                return out

            drive(self._commit(dst, build))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``"keep_latest"``: keep each namespace's newest checkpoint (with its writes); ``"delete"``: all."""
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"unknown prune strategy {strategy!r}: use 'keep_latest' or 'delete'")
        for thread_id in thread_ids:
            if strategy == "delete":
                self.delete_thread(thread_id)
            else:
                self._rewrite(str(thread_id), L.keep_only_latest)

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await asyncio.to_thread(self.prune, thread_ids, strategy=strategy)

    # -- versions ----------------------------------------------------------------

    def get_next_version(self, current: str | None, channel: None) -> str:
        """``<counter>.<random>``: increasing, and distinct across forks of one checkpoint."""
        if current is None:
            counter = 0
        elif isinstance(current, int):
            counter = current
        else:
            counter = int(str(current).split(".")[0])
        return f"{counter + 1:032}.{random.random():016}"
