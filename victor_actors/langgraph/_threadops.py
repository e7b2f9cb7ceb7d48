"""The saver's whole-thread operations: delete (with a tombstone), delete runs, copy, prune.

Each runs, per namespace, as a ``WHOLE`` job in the namespace's lane (see
``_lanes``): after every write queued before it, before every write queued
after it. Each segment it changes is committed through ``handle.modify`` and
then compacted through the segment's actor (``manager.compact``), so what was
deleted leaves the store, and nothing is written beside a scope's owner
(docs/adr/0022).

**Tombstones.** ``delete_thread`` first writes a tombstone into the thread's
team (``deleted``: a cut-off id sorting after every LangGraph checkpoint id
made before it), then empties each namespace. A writer's round reads the
tombstone after its namespace is listed in the team and refuses a late write
(one naming a checkpoint from before the cut-off that the namespace does not
hold) with ``ThreadDeletedError``. Why no late write slips through: a write
to a namespace the delete found listed is in that namespace's lane, before
the delete's job (it is deleted with the rest) or after it (it sees the
tombstone); a write to a namespace the delete did not find listed listed it
after the delete read the listing, so after the tombstone was committed (both
go through the team's actor, one after the other), and it reads the
tombstone after listing. See docs/adr/0029.

**DeltaChannel.** ``prune`` (keep_latest) keeps, with the newest checkpoint,
the ancestors its delta channels are rebuilt through, and ``delete_for_runs``
keeps a listed run's checkpoint that a remaining checkpoint rebuilds its delta
channels through (see ``_delta``); ``copy_thread`` copies every checkpoint
with its writes, so the copy rebuilds as the source does.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence
from typing import Any

from langgraph.checkpoint.base.id import uuid6  # type: ignore[import-not-found, unused-ignore]

from victor_actors import ContextSnapshot, StateTransition
from victor_actors.langgraph import _delta
from victor_actors.langgraph import _layout as L
from victor_actors.langgraph._lanes import Job, View
from victor_actors.langgraph._segments import Handle, Manager, Segments
from victor_actors.langgraph._writes import Writer, latest_of
from victor_actors.lowlevel import MapView, drive

__all__ = ["ThreadOps", "cutoff"]

Plan = Callable[[builtins.list[MapView]], builtins.list[builtins.list[StateTransition]]]


def cutoff() -> str:
    """A tombstone's cut-off: sorts after every LangGraph checkpoint id (a uuid6) made before now.

    A uuid6's first three groups are its timestamp; the rest (clock sequence,
    node) is set to its highest value so that an id of the same tick sorts
    before it too.
    """
    return str(uuid6())[:18] + "-ffff-ffffffffffff"


class ThreadOps:
    """Whole-thread operations over a saver's segments and lanes (``loads`` decodes one stored value)."""

    def __init__(
        self,
        manager: Manager,
        segments: Segments,
        writer: Writer,
        loads: Callable[[Any], Any],
        timeout: float | None,
    ) -> None:
        self.manager = manager
        self.segments = segments
        self.writer = writer
        self.loads = loads
        self.timeout = timeout

    def rewrite(self, thread_id: str, plan: Plan) -> None:
        """For each namespace: ``plan`` (segment states, newest first) gives each segment's batch.

        Runs in the namespace's lane, alone: a write of the namespace (from
        any saver on the manager) queued before it is committed before it
        reads anything, one queued after it waits until it returns. Each
        segment that changed is committed, then compacted (through the
        segment's actor), so what was deleted leaves the store too.
        """
        for ns in self.segments.namespaces(thread_id):

            def run(ns: str = ns) -> None:
                segments = list(self.segments.newest_first(thread_id, ns))
                for i, handle in enumerate(segments):

                    def build(
                        s: ContextSnapshot, i: int = i, segments: builtins.list[Handle] = segments
                    ) -> builtins.list[StateTransition]:
                        states = [s.state if j == i else h.snapshot().state for j, h in enumerate(segments)]
                        return plan(states)[i]

                    before = handle.version
                    drive(self.writer.commit(handle, build))
                    if handle.version != before:
                        self.segments.compact(handle)

            self.writer.whole(thread_id, ns, run)

    def delete_thread(self, thread: str) -> None:
        """Tombstone the thread, then empty every segment of every namespace (see the module)."""
        team = self.segments.team(thread)
        if team is not None:  # a thread never written has no checkpoint a late write could name
            team.apply([L.update(L.DELETED, cutoff())], timeout=self.timeout)
        self.rewrite(thread, lambda states: [L.empty(s) for s in states])
        dead = [ns for ns in self.segments.listed(thread) if not self.segments.openable(thread, ns)]
        if dead and team is not None:
            team.apply([L.delete(L.NS_PREFIX + ns) for ns in dead], timeout=self.timeout)

    def delete_for_runs(self, runs: set[str]) -> None:
        loads = self.loads

        def plan(states: builtins.list[MapView]) -> builtins.list[builtins.list[StateTransition]]:
            records: dict[str, Any] = {}
            for state in reversed(states):  # oldest first: a newer segment's copy of an id wins
                records.update((cid, state[L.record_key(cid)]) for cid in L.checkpoint_ids(state))
            victims = {cid for cid, stored in records.items() if L.record_of(stored)["r"] in runs}
            if not victims:
                return [[] for _ in states]
            keep = set(records) - victims
            deltas = _delta.snapshot_channels(states)
            work = list(keep)
            while work:  # a victim a kept checkpoint rebuilds its delta channels through is kept too
                for ancestor in _delta.needed(states, work.pop(), deltas, loads, stop=keep.__contains__):
                    if ancestor not in keep:
                        keep.add(ancestor)
                        work.append(ancestor)
            victims -= keep
            out = []
            for state in states:
                mine = victims.intersection(L.checkpoint_ids(state))
                out.append(L.drop_checkpoints(state, mine, keep_latest_key=True) if mine else [])
            if victims:  # the newest segment names the newest checkpoint left; older ones name none
                newest = max(keep, default=None)
                out[0].append(L.update(L.LATEST, newest) if newest is not None else L.delete(L.LATEST))
                for state, batch in zip(states[1:], out[1:], strict=True):
                    if newest is None and L.LATEST in state:
                        batch.append(L.delete(L.LATEST))
            return out

        for thread_id in self.segments.threads():
            self.rewrite(thread_id, plan)

    def copy_thread(self, source: str, target: str) -> None:
        namespaces = self.segments.namespaces(source)
        for ns in namespaces:  # every target name checked before anything is copied
            L.check_names(target, ns)
        for ns in namespaces:
            for handle in reversed(list(self.segments.newest_first(source, ns))):
                items = {k: v for k, v in handle.snapshot().state.items() if k != L.COMPACTED}
                if not items:
                    continue

                def build(view: View, items: dict[str, Any] = items) -> builtins.list[StateTransition]:
                    out = [L.update(k, v) for k, v in items.items() if k != L.LATEST]
                    ids = [c for c in (items.get(L.LATEST), view.get(L.LATEST, view.fallback_latest)) if c]
                    if ids:
                        out.append(L.update(L.LATEST, max(ids)))
                    return out

                drive(self.writer.enqueue(target, ns, Job("copy", "", build)))

    def prune_keep_latest(self, thread: str) -> None:
        loads = self.loads

        def plan(states: builtins.list[MapView]) -> builtins.list[builtins.list[StateTransition]]:
            latest = latest_of(states)
            kept: builtins.list[str] = []
            if latest is not None:
                kept = [latest, *_delta.needed(states, latest, _delta.snapshot_channels(states), loads)]
            return [L.keep_only(s, kept, keep_latest_key=i == 0) for i, s in enumerate(states)]

        self.rewrite(thread, plan)

    def threads(self, thread_ids: Sequence[str]) -> builtins.list[str]:
        return [L.check_text(str(t), "the thread id", "thread_id") for t in thread_ids]
