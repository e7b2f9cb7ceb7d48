"""The write path of the LangGraph saver: each namespace's lane, its rounds, and their commits.

A round (see ``_lanes``) places its jobs in the namespace's segments (see
``_segments``): a new checkpoint in the newest, rolling over to a new one
when it is full; a write for an existing checkpoint in the segment that holds
it. It then commits each segment's jobs as one commit, built on the
segment's current state with ``handle.modify`` (so a writer outside the lane
is never overwritten), and retries each job alone if a shared commit fails.
The rules and why they hold: docs/adr/0019.
"""

from __future__ import annotations

import asyncio
import builtins
import threading
from collections.abc import Callable, Iterable
from typing import Any

from victor_actors import ContextSnapshot, StateTransition, VersionConflictError
from victor_actors.langgraph import _layout as L
from victor_actors.langgraph._errors import ThreadDeletedError
from victor_actors.langgraph._lanes import WHOLE, Job, Lane, Lanes, View
from victor_actors.langgraph._segments import Handle, Segments
from victor_actors.lowlevel import MapView, Step, StepGen, drive

__all__ = ["Build", "Writer", "latest_of"]

# Optimistic attempts (handle.modify: snapshot, build, apply with the version read) before falling
# back to a locked read-modify-write. A lane never conflicts with itself: only another writer of the
# namespace (a whole-thread operation, another saver on the same manager) makes one retry.
_TRIES = 3
Build = Callable[[ContextSnapshot], "builtins.list[StateTransition] | None"]


class _NothingToWrite(Exception):
    """A build found the namespace already as wanted: no commit, and no round trip to its actor."""


def _in_thread(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The asyncio twin of a blocking ``fn``: run it in a worker thread."""

    async def run(*args: Any) -> Any:
        return await asyncio.to_thread(fn, *args)

    return run


def latest_of(states: Iterable[MapView]) -> str | None:
    """The namespace's newest checkpoint id: the ``latest`` of the newest segment that has one."""
    for state in states:
        latest = state.get(L.LATEST)
        if isinstance(latest, str):
            return latest
    return None


class Writer:
    """Every namespace's lane, and the rounds their leaders run."""

    def __init__(
        self, segments: Segments, *, segment_keys: int, linger: float, timeout: float | None
    ) -> None:
        self.segments = segments
        self.segment_keys = segment_keys
        self.writes_linger = linger
        self.timeout = timeout
        # one lane per namespace for every saver on the manager: one leader per namespace
        self.lanes = Lanes.of(segments.manager)

    def _lane(self, thread_id: str, ns: str) -> Lane:
        return self.lanes.lane((thread_id, ns))

    def whole(self, thread_id: str, ns: str, run: Callable[[], None]) -> None:
        """Run ``run()`` in the namespace's lane, alone: after every write queued before it, before any after.

        For the whole-thread operations (delete, prune): no write of the
        namespace, from any saver on the manager, runs beside them. Blocking:
        ``run`` runs on this thread, once the lane hands it the lead.
        """
        drive(self.enqueue(thread_id, ns, Job(WHOLE, "", run=run)))

    @staticmethod
    def _enter(lane: Lane, job: Job, _thread_id: str, _ns: str) -> bool:
        return lane.enter(job) or lane.wait(job)

    async def _aenter(self, lane: Lane, job: Job, thread_id: str, ns: str) -> bool:
        if lane.enter(job, asyncio.get_running_loop()):
            return True

        def lead_elsewhere() -> None:  # handed the lead, then cancelled: the lane must not stall
            run = lambda: drive(self._lead(lane, thread_id, ns, None))  # noqa: E731
            threading.Thread(target=run, name="victor-actors-langgraph-lane", daemon=True).start()

        return await lane.await_(job, lead_elsewhere)

    def enqueue(self, thread_id: str, ns: str, job: Job) -> StepGen[None]:
        """Queue ``job`` in the namespace's lane; lead the next round if the lane gives us the lead."""
        lane = self._lane(thread_id, ns)
        lead = yield Step(self._enter, self._aenter, lane, job, thread_id, ns)
        if lead:
            yield from self._lead(lane, thread_id, ns, job)
        if job.error is not None:
            raise job.error

    def _lead(self, lane: Lane, thread_id: str, ns: str, mine: Job | None) -> StepGen[None]:
        """Run rounds until the lane passes the lead to a waiting caller or goes idle."""
        while True:
            jobs = lane.take(mine)
            try:
                if jobs and jobs[0].kind == WHOLE:  # ours, alone: run on this (blocking) caller's thread
                    run = jobs[0].run
                    assert run is not None
                    run()
                    lane.segments = None  # the next round reads the chain again
                elif jobs:
                    if self.writes_linger and all(job.kind == "writes" for job in jobs):
                        yield Step(lane.linger, _in_thread(lane.linger), self.writes_linger)
                        jobs += lane.take(more=True)
                    yield from self._round(lane, thread_id, ns, jobs)
            except BaseException as exc:  # a bug or an interrupt: every job of the round hears of it
                for job in jobs:
                    if job.error is None:
                        job.error = exc
            finally:
                lane.finish(jobs, mine)
            if not lane.hand_off():
                return

    def _write_segments(
        self, lane: Lane, thread_id: str, ns: str, jobs: builtins.list[Job]
    ) -> tuple[builtins.list[Handle], builtins.list[Job], bool]:
        """The lane's segments, oldest first, opened if needed and checked against the team's count.

        And the jobs that are not late writes to a deleted thread: those are
        refused here, before the namespace is listed or its scope created.
        The last item says whether the segments were (re)opened, which may
        have listed the namespace just now: then the round checks again (see
        ``_threadops``). A lane that knew its segments before wrote to a
        namespace already listed, and the check here is enough.
        """
        tombstone = self.segments.tombstone(thread_id)
        if tombstone is not None:
            held = [h.snapshot().state for h in self.segments.newest_first(thread_id, ns)]
            jobs = self._refuse_late(jobs, thread_id, tombstone, held)
            if not jobs:
                return [], jobs, False
        segments = lane.segments
        fresh = segments is None or self.segments.count(thread_id, ns) != len(segments)
        if segments is None or fresh:
            segments = self.segments.for_write(thread_id, ns)
            lane.segments = segments
        return segments, jobs, fresh

    async def _awrite_segments(
        self, lane: Lane, thread_id: str, ns: str, jobs: builtins.list[Job]
    ) -> tuple[builtins.list[Handle], builtins.list[Job], bool]:
        segments = lane.segments
        if segments is not None and self.segments.known(thread_id, ns):  # no I/O: the team is known too
            if self.segments.count(thread_id, ns) == len(segments):
                return self._write_segments(lane, thread_id, ns, jobs)
        return await asyncio.to_thread(self._write_segments, lane, thread_id, ns, jobs)

    def _round(self, lane: Lane, thread_id: str, ns: str, jobs: builtins.list[Job]) -> StepGen[None]:
        """Place the jobs in their segments (rolling over a full newest one), then commit each group."""
        found = yield Step(self._write_segments, self._awrite_segments, lane, thread_id, ns, jobs)
        segments, jobs, fresh = found
        if not jobs:
            return
        cache: dict[int, MapView] = {}

        def state(i: int) -> MapView:  # older segments are read only when a job needs them
            if i not in cache:
                cache[i] = segments[i].snapshot().state
            return cache[i]

        newest = len(segments) - 1
        tombstone = self.segments.tombstone(thread_id) if fresh else None  # after listing: see _threadops
        if tombstone is not None:
            jobs = self._refuse_late(jobs, thread_id, tombstone, [state(i) for i in range(newest, -1, -1)])
            if not jobs:
                return
        latest = latest_of(state(i) for i in range(newest, -1, -1))
        places: builtins.list[int | None] = []
        for job in jobs:
            place: int | None = None
            if job.kind != "copy" and (job.kind != "put" or latest is None or job.cid <= latest):
                key = L.record_key(job.cid)
                place = next((i for i in range(newest, -1, -1) if key in state(i)), None)
            places.append(place)
        active = state(newest)
        waiting = {job.cid for job, p in zip(jobs, places, strict=True) if p is None and job.kind == "writes"}
        if (
            len(active) >= self.segment_keys
            and any(job.kind == "put" and p is None for job, p in zip(jobs, places, strict=True))
            and not any(
                job.kind == "put" and (job.cid in waiting or L.write_tasks_key(job.cid) in active)
                for job in jobs
            )  # writes stored ahead of their checkpoint stay with it
        ):
            segments = yield Step(self.segments.roll, _in_thread(self.segments.roll), thread_id, ns, segments)
            lane.segments = segments
        last = len(segments) - 1
        groups: dict[int, builtins.list[Job]] = {}
        for job, p in zip(jobs, places, strict=True):
            groups.setdefault(last if p is None else p, []).append(job)
        for index in sorted(groups, reverse=True):
            yield from self._commit_jobs(segments[index], groups[index], index == last, latest)

    @staticmethod
    def _refuse_late(
        jobs: builtins.list[Job], thread_id: str, tombstone: str, states: builtins.list[MapView]
    ) -> builtins.list[Job]:
        """The jobs that are not late writes to a deleted thread; the others get ``ThreadDeletedError``.

        Late: a ``put`` or ``put_writes`` naming a checkpoint (its own, or a
        put's parent) made before the deletion (its id sorts at or before the
        tombstone's) that the namespace does not hold.
        """
        kept = []
        for job in jobs:
            named = [job.cid, job.parent] if job.kind == "put" else [job.cid] if job.kind == "writes" else []
            late = next(
                (
                    cid
                    for cid in named
                    if cid and cid <= tombstone and not any(L.record_key(cid) in s for s in states)
                ),
                None,
            )
            if late is None:
                kept.append(job)
                continue
            job.error = ThreadDeletedError(
                f"LangGraph thread {thread_id[:80]!r} was deleted after checkpoint {late[:80]!r} was made, "
                f"and no longer holds it: this late {'put_writes' if job.kind == 'writes' else job.kind} was "
                "refused and nothing was written",
                thread_id=thread_id,
                checkpoint_id=late,
            )
        return kept

    def _commit_jobs(
        self, handle: Handle, jobs: builtins.list[Job], active: bool, latest: str | None
    ) -> StepGen[None]:
        """Commit one segment's jobs as one commit; if that fails, each alone (only a bad one fails)."""

        def build(which: builtins.list[Job]) -> Build:
            def run(snap: ContextSnapshot) -> builtins.list[StateTransition]:
                view = View(snap.state, active=active, fallback_latest=latest)
                out: builtins.list[StateTransition] = []
                for job in which:
                    assert job.build is not None
                    transitions = job.build(view)
                    if transitions:
                        view.note(transitions)
                        out.extend(transitions)
                return out

            return run

        try:
            yield from self.commit(handle, build(jobs))
        except Exception as exc:
            if len(jobs) == 1:
                jobs[0].error = exc
                return
            for job in jobs:
                try:
                    yield from self.commit(handle, build([job]))
                except Exception as one:
                    job.error = one

    def commit(self, handle: Handle, build: Build) -> StepGen[None]:
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
