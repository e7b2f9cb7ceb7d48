"""VictorActorsSaver: LangGraph's BaseCheckpointSaver on the runtime's scopes and LMDB store."""

from __future__ import annotations

import asyncio
import builtins
import logging
import os
import random
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, cast

from langchain_core.runnables import RunnableConfig  # type: ignore[import-not-found, unused-ignore]
from langgraph.checkpoint.base import (  # type: ignore[import-not-found, unused-ignore]
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
    PendingWrite,
    get_checkpoint_id,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol  # type: ignore[import-not-found, unused-ignore]

from victor_actors import (
    GlobalStateManager,
    StateTransition,
    TransitionValidationError,
    VictorActorsError,
)
from victor_actors.langgraph import _delta
from victor_actors.langgraph import _layout as L
from victor_actors.langgraph._lanes import Job, View
from victor_actors.langgraph._retention import Activity, Retention, check_ttl
from victor_actors.langgraph._segments import Handle, Manager, Segments
from victor_actors.langgraph._serde import DisallowedTypeError, StrictSerializer
from victor_actors.langgraph._threadops import ThreadOps
from victor_actors.langgraph._writes import Writer
from victor_actors.lowlevel import MapView, StepGen, adrive, drive

__all__ = ["VictorActorsSaver"]

logger = logging.getLogger("victor_actors")

EMPTY = L.typed("empty", b"")  # a channel announced without a value
# Keys a segment holds before the next new checkpoint opens the next one (about 100 graph steps).
SEGMENT_KEYS = 512
# How long a round of put_writes alone waits for the step's put to share its commit (seconds).
WRITES_LINGER = 0.0005
Target = tuple[str, str, "builtins.list[Handle]", "str | None"]


def _conf(config: RunnableConfig) -> tuple[str, str, str | None]:
    """(thread id, namespace, checkpoint id) of a config, each text UTF-8 can encode.

    Raises:
        ValueError: no ``thread_id``.
        TransitionValidationError: a lone surrogate in one of them; nothing was read or written.
    """
    conf = config.get("configurable") or {}
    if conf.get("thread_id") is None:
        raise ValueError("a LangGraph checkpoint config needs configurable.thread_id")
    thread = L.check_text(str(conf["thread_id"]), "the thread id", "thread_id")
    ns = L.check_text(str(conf.get("checkpoint_ns") or ""), "the checkpoint namespace", "checkpoint_ns")
    cid = conf.get("checkpoint_id") or None
    if cid is not None:
        cid = L.check_text(str(cid), "the checkpoint id", "checkpoint_id")
    return thread, ns, cid


def _config(thread_id: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}}


class VictorActorsSaver(BaseCheckpointSaver[str]):  # type: ignore[misc, unused-ignore]
    """A LangGraph checkpointer whose threads are victor_actors scopes.

    ``VictorActorsSaver.open(path)`` opens (and owns) a manager on an LMDB
    store; ``VictorActorsSaver(manager)`` uses one you already have (and
    leaves it open). A thread is the team scope ``lg:<thread_id>``; each
    checkpoint namespace is a chain of conversation scopes under it
    (segments of at most ``segment_keys`` keys, see ``docs/langgraph.md``).
    So every write goes through a scope's actor, is durable on return
    (``durability="sync"``), shares LMDB transactions with other scopes,
    survives crashes whole or not at all, and shows up in
    ``victor-actors inspect``.

    One ``put`` stores the checkpoint record and the channel values it
    introduces, written once per channel version (per segment) and shared
    by every later checkpoint that keeps that version; one ``put_writes``
    stores a task's writes. Writes of one namespace queue in its lane (one
    per namespace for every saver on the manager): the first caller leads
    and commits everything queued as one commit (a graph step's overlapping
    ``put_writes`` and ``put`` share it), so they never conflict with each
    other and none is lost. Whole-thread operations (``delete_thread``,
    ``prune``, ``delete_for_runs``) run in each namespace's lane, alone, and
    compact through the segments' actors (``manager.compact``): no record is
    written beside a scope's owner (docs/adr/0022).

    Thread ids, namespaces, checkpoint and task ids, ``run_id`` and values
    are checked before anything is written: text UTF-8 cannot encode, a
    namespace too long for its segments' scope ids, or a value the
    serializer cannot store raise ``TransitionValidationError`` (a
    ``ValueError``); a type outside the allowlist ``DisallowedTypeError``.

    Values are serialized by ``serde`` (default: :class:`StrictSerializer`,
    LangGraph's msgpack format with a strict allowlist; ``allowed_types``
    extends it). Pickle is refused whatever the serializer.

    ``segment_keys`` (at least 8): the keys a segment holds before new
    checkpoints go to the next one. ``writes_linger`` (seconds, 0 to 0.1):
    how long a round of ``put_writes`` alone waits for a ``put`` to share its
    commit; 0 commits at once.

    Raises:
        ValueError: from the constructor, for ``serde`` with
            ``allowed_types``, or a ``segment_keys`` or ``writes_linger`` out
            of range; nothing is opened.
    """

    serde: SerializerProtocol

    def __init__(
        self,
        manager: Manager,
        *,
        serde: SerializerProtocol | None = None,
        allowed_types: Iterable[tuple[str, ...] | type] = (),
        timeout: float | None = None,
        close_manager: bool = False,
        segment_keys: int = SEGMENT_KEYS,
        writes_linger: float = WRITES_LINGER,
        ttl: Mapping[str, Any] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        allowed = tuple(allowed_types)
        if serde is not None and allowed:
            raise ValueError("pass allowed_types (for the default StrictSerializer) or serde, not both")
        if segment_keys.__class__ is not int or segment_keys < 8:
            raise ValueError(f"segment_keys must be an int of at least 8, not {segment_keys!r}")
        super().__init__(serde=serde if serde is not None else StrictSerializer(allowed))
        self.manager = manager
        self.timeout = timeout
        self.segment_keys = segment_keys
        if not 0 <= writes_linger <= 0.1:
            raise ValueError(f"writes_linger must be within 0 and 0.1 seconds, not {writes_linger!r}")
        self.writes_linger = float(writes_linger)
        self._close_manager = close_manager
        self._segments = Segments(manager, timeout)
        self._writer = Writer(
            self._segments, segment_keys=segment_keys, linger=self.writes_linger, timeout=timeout
        )
        self._ops = ThreadOps(manager, self._segments, self._writer, self._loads, timeout)
        self._names_ok: set[tuple[str, str]] = set()
        self.ttl = check_ttl(ttl)
        self._clock = clock
        self._activity = Activity.of(manager)
        self._refresh = self.ttl is not None and self.ttl["refresh_on_read"]
        self._retention = Retention(
            self.ttl or check_ttl({}) or {}, self._segments, self._ops, self._activity, clock, timeout
        )
        self._retention.start()

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        serde: SerializerProtocol | None = None,
        allowed_types: Iterable[tuple[str, ...] | type] = (),
        timeout: float | None = None,
        segment_keys: int = SEGMENT_KEYS,
        writes_linger: float = WRITES_LINGER,
        ttl: Mapping[str, Any] | None = None,
        clock: Callable[[], float] = time.time,
        **manager_options: Any,
    ) -> VictorActorsSaver:
        """Open an LMDB store at ``path`` (see ``GlobalStateManager.open``); :meth:`close` closes it."""
        manager = GlobalStateManager.open(path, **manager_options)
        try:
            return cls(
                manager,
                serde=serde,
                allowed_types=allowed_types,
                timeout=timeout,
                close_manager=True,
                segment_keys=segment_keys,
                writes_linger=writes_linger,
                ttl=ttl,
                clock=clock,
            )
        except BaseException:
            manager.close()
            raise

    def close(self) -> None:
        """Stop the TTL sweeper; close the manager if this saver opened it. Idempotent."""
        self._retention.stop()
        if self._close_manager:
            self.manager.close()

    def sweep(self) -> int:
        """Expire the threads idle for ``ttl["default_ttl"]`` minutes now; the number expired.

        What the background sweeper does every ``sweep_interval_minutes``
        (see ``docs/langgraph.md``); 0 without a ``default_ttl``.
        """
        return self._retention.sweep()

    async def asweep(self) -> int:
        return await asyncio.to_thread(self.sweep)

    def __enter__(self) -> VictorActorsSaver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> VictorActorsSaver:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.close)

    # -- namespaces and threads ------------------------------------------------------

    def _listed(self, thread_id: str) -> builtins.list[str]:
        return self._segments.listed(thread_id)

    def _namespaces(self, thread_id: str) -> builtins.list[str]:
        return self._segments.namespaces(thread_id)

    def _threads(self) -> builtins.list[str]:
        return self._segments.threads()

    def _targets(self, config: RunnableConfig | None) -> builtins.list[Target]:
        """(thread, namespace, segments newest first, checkpoint id filter) for every namespace read."""
        if config is None:
            threads, only_ns, only_id = self._threads(), None, None
        else:
            conf = config.get("configurable") or {}
            thread, _ns, only_id = _conf(config)
            self._was_read(thread)
            threads = [thread]
            only_ns = None if conf.get("checkpoint_ns") is None else str(conf["checkpoint_ns"])
        out = []
        for thread in threads:
            for ns in [only_ns] if only_ns is not None else self._namespaces(thread):
                segments = list(self._segments.newest_first(thread, ns))
                if segments:
                    out.append((thread, ns, segments, only_id))
        return out

    def _check_names(self, thread_id: str, ns: str) -> None:
        """``L.check_names``, once per thread and namespace this saver wrote (a put checks it every time)."""
        if (thread_id, ns) not in self._names_ok:
            L.check_names(thread_id, ns)
            self._names_ok.add((thread_id, ns))

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
        self._check_names(thread_id, ns)  # before the namespace is listed in its thread
        now = self._clock()
        cid = L.check_text(str(checkpoint["id"]), "the checkpoint id", "checkpoint_id")
        rest = cast(dict[str, Any], dict(checkpoint))
        values: dict[str, Any] = rest.pop("channel_values", None) or {}
        versions: dict[str, Any] = dict(rest.pop("channel_versions", None) or {})
        merged = cast(dict[str, Any], get_checkpoint_metadata(config, metadata))
        counters = merged.get("counters_since_delta_snapshot")  # LangGraph's DeltaChannel names
        run_id = merged.get("run_id")
        if isinstance(run_id, str):
            run_id = L.check_text(str.__str__(run_id), "metadata run_id", "run_id")
        transitions = [
            L.update(L.blob_key(ch, ver), L.typed(*self._dumps(values[ch])) if ch in values else EMPTY)
            for ch, ver in new_versions.items()
        ]
        record = {
            "c": L.plain(rest) or self._dumps(rest),
            "m": self._dumps(merged),
            "p": parent,
            "r": run_id if isinstance(run_id, str) else None,
            "v": versions,
            "d": builtins.list(counters) if isinstance(counters, dict) and counters else None,
            "t": now,
        }
        transitions.append(L.update(L.record_key(cid), L.pack(record)))

        def build(view: View) -> builtins.list[StateTransition]:
            out = list(transitions)
            for ch, ver in versions.items():
                # a value the caller did not announce in new_versions that this segment lacks (the first
                # put into a new segment, a fork from an older one): copied in, so the segment stands alone
                if ch in values and ch not in new_versions and L.blob_key(ch, ver) not in view:
                    out.append(L.update(L.blob_key(ch, ver), L.typed(*self._dumps(values[ch]))))
            if view.active:
                latest = view.get(L.LATEST, view.fallback_latest)
                if latest is None or cid > latest:
                    out.append(L.update(L.LATEST, cid))
                elif L.LATEST not in view:  # a new segment carries the namespace's newest id
                    out.append(L.update(L.LATEST, latest))
            return out

        yield from self._writer.enqueue(thread_id, ns, Job("put", cid, build, parent=parent))
        self._activity.wrote(thread_id, now)  # once acknowledged: a refused write is no activity
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
        self._check_names(thread_id, ns)
        task_id = L.check_text(str(task_id), "the task id", "task_id")
        task_path = L.check_text(str(task_path), "the task path", "task_path")
        entries = []
        for idx, (channel, value) in enumerate(writes):
            channel = L.check_text(str(channel), "a write's channel", "channel")
            type_, data = self._dumps(value)
            entries.append((WRITES_IDX_MAP.get(channel, idx), channel, type_, data))
        key, tasks_key = L.write_key(cid, task_id), L.write_tasks_key(cid)

        def build(view: View) -> builtins.list[StateTransition] | None:
            existing = view.get(key)
            merged = (
                {row[0]: tuple(row) for row in L.record_of(existing)["w"]} if existing is not None else {}
            )
            changed = False
            for row in entries:
                old = merged.get(row[0])
                # A regular write (idx >= 0) is kept as first stored; special ones (errors,
                # interrupts) are replaced, as LangGraph's own savers do.
                if old is not None and (row[0] >= 0 or old == row):
                    continue
                merged[row[0]] = row
                changed = True
            if not changed:
                return None
            rows = tuple(merged[i] for i in sorted(merged))
            out = [L.update(key, L.pack({"p": task_path, "w": rows}))]
            tasks = view.get(tasks_key) or ()
            if task_id not in tasks:
                out.append(L.update(tasks_key, (*tasks, task_id)))
            return out

        yield from self._writer.enqueue(thread_id, ns, Job("writes", cid, build))
        self._activity.wrote(thread_id, self._clock())

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

    def _get(self, thread_id: str, ns: str, cid: str | None) -> CheckpointTuple | None:
        segments = self._segments.newest_first(thread_id, ns)
        seen: builtins.list[MapView] = []
        if cid is None:  # the newest segment's latest, reading no further back than it must
            for handle in segments:
                seen.append(handle.snapshot().state)  # immutable: no lock held while values are decoded
                cid = seen[-1].get(L.LATEST)
                if isinstance(cid, str):
                    break
            else:
                return None
        key = L.record_key(cid)
        for state in seen:
            if key in state:
                return self._tuple(thread_id, ns, cid, state)
        for handle in segments:
            state = handle.snapshot().state
            if key in state:
                return self._tuple(thread_id, ns, cid, state)
        return None

    def _was_read(self, thread_id: str) -> None:
        """With ``ttl["refresh_on_read"]``: a read of the thread is activity (in memory, no I/O)."""
        if self._refresh:
            self._activity.was_read(thread_id, self._clock())

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint named by ``config``, or the namespace's newest; None if there is none."""
        thread_id, ns, cid = _conf(config)
        self._was_read(thread_id)
        return self._get(thread_id, ns, cid)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        thread_id, ns, cid = _conf(config)
        self._was_read(thread_id)
        if self._segments.known(thread_id, ns):
            return self._get(thread_id, ns, cid)  # every handle known: no I/O, nothing to wait for
        return await asyncio.to_thread(self._get, thread_id, ns, cid)

    def _iter(
        self,
        targets: builtins.list[Target],
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> Iterator[CheckpointTuple]:
        before_id = get_checkpoint_id(before) if before else None
        remaining = limit
        for thread_id, ns, segments, only_id in targets:
            found_in: dict[str, MapView] = {}
            for handle in reversed(segments):  # oldest first: a newer segment's copy of an id wins
                state = handle.snapshot().state
                found_in.update((cid, state) for cid in L.checkpoint_ids(state))
            for cid in sorted(found_in, reverse=True):
                if remaining is not None and remaining <= 0:
                    return
                if (only_id is not None and cid != only_id) or (before_id is not None and cid >= before_id):
                    continue
                state = found_in[cid]
                if filter:
                    metadata = self._loads(L.record_of(state[L.record_key(cid)])["m"])
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

        Each segment is read from one immutable snapshot: no I/O, no lock.
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

    # -- deletes, copies, pruning (see _threadops) --------------------------------

    def delete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint, value and pending write of a thread, in all its namespaces.

        First a tombstone is written into the thread: from then on a late
        ``put`` or ``put_writes`` naming a checkpoint made before the deletion
        is refused with :class:`ThreadDeletedError` (a new run on the thread
        id, starting from no checkpoint, is accepted). Then each segment of
        each namespace is emptied in one commit, and its history is dropped
        from the store. The (now empty) scopes stay, as runtime scopes do. A
        namespace listed by an older saver whose scope could never be created
        (its id too long) is unlisted.

        Raises:
            TransitionValidationError: a thread id UTF-8 cannot encode; nothing was deleted.
        """
        thread = L.check_text(str(thread_id), "the thread id", "thread_id")
        self._ops.delete_thread(thread)
        self._activity.forget(thread)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (with their writes) whose metadata names one of ``run_ids``.

        A checkpoint of a listed run that a remaining checkpoint rebuilds a
        ``DeltaChannel`` through (its writes, or its stored value) is kept:
        deleting it would make that channel start empty. Reads every
        thread: its cost grows with the store.
        """
        runs = {str(r) for r in run_ids}
        if runs:
            self._ops.delete_for_runs(runs)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every namespace of a thread (checkpoints, values, writes) to another thread.

        One commit per source segment, into the target namespace's newest
        segment; a checkpoint the target already has is replaced. Every
        checkpoint is copied with its writes, so ``DeltaChannel`` values
        rebuild in the copy as in the source.
        """
        source = L.check_text(str(source_thread_id), "the thread id", "thread_id")
        target = L.check_text(str(target_thread_id), "the thread id", "thread_id")
        self._ops.copy_thread(source, target)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``"keep_latest"``: keep each namespace's newest checkpoint (with its writes); ``"delete"``: all.

        With ``keep_latest``, the ancestors the newest checkpoint rebuilds its
        ``DeltaChannel`` values through (back to the nearest stored value of
        each) are kept with it.
        """
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"unknown prune strategy {strategy!r}: use 'keep_latest' or 'delete'")
        for thread_id in self._ops.threads(thread_ids):
            if strategy == "delete":
                self._ops.delete_thread(thread_id)
                self._activity.forget(thread_id)
            else:
                self._ops.prune_keep_latest(thread_id)

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await asyncio.to_thread(self.prune, thread_ids, strategy=strategy)

    # -- DeltaChannel --------------------------------------------------------------

    def _history(self, thread_id: str, ns: str, cid: str | None, channels: Sequence[str]) -> Any:
        states = [handle.snapshot().state for handle in self._segments.newest_first(thread_id, ns)]
        return _delta.history(states, cid, channels, self._loads)

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """Per channel, the writes (oldest first) and seed LangGraph rebuilds a ``DeltaChannel`` from.

        Read from the stored records directly, in one walk up the parent
        chain for every channel: each ancestor's writes to the channels still
        walking (in ``writes_sort_key`` order), until each channel meets the
        nearest ancestor storing a value for it (its ``seed``, omitted if the
        walk reaches the root). The target's own writes are not included. No
        lock, no I/O beyond restoring the namespace's segments.
        """
        thread_id, ns, cid = _conf(config)
        self._was_read(thread_id)
        return cast("Mapping[str, DeltaChannelHistory]", self._history(thread_id, ns, cid, channels))

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        thread_id, ns, cid = _conf(config)
        self._was_read(thread_id)
        if self._segments.known(thread_id, ns):  # every handle known: no I/O, nothing to wait for
            found = self._history(thread_id, ns, cid, channels)
        else:
            found = await asyncio.to_thread(self._history, thread_id, ns, cid, channels)
        return cast("Mapping[str, DeltaChannelHistory]", found)

    # -- serialization -----------------------------------------------------------

    def _dumps(self, obj: Any) -> tuple[str, bytes]:
        """``obj`` serialized, or a typed error: nothing is written for a value that cannot be stored.

        Raises:
            DisallowedTypeError: a type outside the allowlist, or pickle.
            TransitionValidationError: anything else the serializer refuses (a
                type msgpack cannot hold, text UTF-8 cannot encode).
        """
        try:
            type_, data = self.serde.dumps_typed(obj)
        except VictorActorsError:
            raise
        except (TypeError, ValueError) as exc:
            raise TransitionValidationError(
                f"the serializer cannot store a {type(obj).__name__} ({exc}); nothing was written"
            ) from exc
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
        stored = state.get(L.record_key(cid))
        if stored is None:
            return None
        record = L.record_of(stored)
        checkpoint = L.checkpoint_of(record["c"])
        if checkpoint is None:
            checkpoint = self._loads(record["c"])
        versions = dict(record["v"])  # channel -> version: str, int or float, nothing to thaw
        values = {}
        for channel, version in versions.items():
            blob = state.get(L.blob_key(channel, version))
            if blob is not None:
                type_, data = L.untyped(blob)
                if type_ != "empty":
                    values[channel] = self._loads((type_, data))
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
        return [
            (task_id, channel, self._loads((type_, data)))
            for _path, task_id, _idx, channel, type_, data in L.write_rows(state, cid)
        ]

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
