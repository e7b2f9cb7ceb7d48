"""One writer per namespace inside the saver: a lane, its queued jobs, and the hand-off of the lead.

LangGraph calls ``put_writes`` and ``put`` of one namespace from two
background threads at once. Built from the same snapshot and applied with a
version check, the second always met a version conflict and was rebuilt.
Here every write of a namespace joins its lane's queue; the caller that
finds the lane idle leads: it takes every queued job, builds them in order
on the namespace's current state (each seeing the ones before it), commits
them as one commit, and wakes their callers. Jobs that arrive while that
commit syncs queue up, and the first of them leads the next round with all
the others. So a lane never conflicts with itself, and a step's
``put_writes`` and ``put`` that overlap share one synced transaction.

Why it is safe:

- One leader per lane at a time: ``busy`` is set and cleared under the
  lane's lock, and the lead passes only by ``hand_off`` (to the first job
  still waiting) or ends with the queue empty.
- A job is answered once the round that holds it is durable (the commit
  returns only then) or has failed; nothing is answered early.
- An asyncio caller cancelled while it waits leaves its job queued (it is
  still written, as a cancelled ``aapply`` already sent is) and is never
  handed the lead; one handed the lead when cancelled leads in a worker
  thread, so the lane never stalls.

- A whole-namespace job (``kind == WHOLE``: a delete, a prune) runs alone,
  in a round of its own, between the rounds before and after it: a write
  queued before it is committed before it starts, one queued after it
  waits until it is done. So every write of a namespace and every
  whole-thread operation on it are in one order. It is led by its own
  (blocking) caller, never by another leader: the lead reaches it the way it
  reaches any waiting job, as the first one waiting, and no asyncio
  leader's cancellation can cut it short.

Lanes are per manager, not per saver (:class:`Lanes`): two savers on one
manager write a namespace through one lane, so a namespace has one leader.

Nothing here knows LangGraph: jobs are functions from a view of the state to
transitions, or (whole-namespace jobs) functions of nothing.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

from victor_actors import StateTransition, TransitionType

__all__ = ["WHOLE", "Job", "Lane", "Lanes", "View"]

PENDING, DONE, LEAD, ABANDONED = range(4)
WHOLE = "whole"  # the kind of a job that runs alone (see Lane.take)
_GONE = object()


class View:
    """A segment's state with the writes of the jobs built before this one laid over it.

    ``active``: the segment is the namespace's newest. ``fallback_latest``:
    the namespace's newest checkpoint id as older segments hold it, for a
    newest segment that has no ``latest`` of its own yet.
    """

    __slots__ = ("active", "base", "fallback_latest", "over")

    def __init__(self, base: Any, *, active: bool = True, fallback_latest: str | None = None) -> None:
        self.base = base
        self.over: dict[str, Any] = {}
        self.active = active
        self.fallback_latest = fallback_latest

    def get(self, key: str, default: Any = None) -> Any:
        value = self.over.get(key, _GONE)
        if value is _GONE:
            if key in self.over:  # deleted by an earlier job
                return default
            return self.base.get(key, default)
        return value

    def __contains__(self, key: str) -> bool:
        if key in self.over:
            return self.over[key] is not _GONE
        return key in self.base

    def __len__(self) -> int:
        return len(self.base) + sum(1 for k, v in self.over.items() if v is not _GONE and k not in self.base)

    def note(self, transitions: Iterable[StateTransition]) -> None:
        for t in transitions:
            if t.transition_type is TransitionType.UPDATE_STATE:
                self.over[t.data["key"]] = t.data["value"]
            else:
                self.over[t.data["key"]] = _GONE


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Job:
    """One write waiting in a lane: what it targets, how to build it, and how its caller waits.

    A ``WHOLE`` job has no ``build``: its leader calls ``run()``, alone.
    """

    __slots__ = ("_event", "_future", "_loop", "build", "cid", "error", "kind", "parent", "run", "state")

    def __init__(
        self,
        kind: str,
        cid: str,
        build: Callable[[View], list[StateTransition] | None] | None = None,
        run: Callable[[], None] | None = None,
        parent: str | None = None,
    ) -> None:
        self.kind = kind  # "put", "writes", "copy" or WHOLE
        self.cid = cid
        self.parent = parent  # a put's parent checkpoint id
        self.build = build
        self.run = run
        self.error: BaseException | None = None
        self.state = PENDING
        self._event: threading.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._future: asyncio.Future[None] | None = None

    def _wake(self) -> None:
        """Tell the waiting caller its state changed (called under the lane's lock)."""
        if self._loop is not None:
            future = self._future
            assert future is not None
            try:
                self._loop.call_soon_threadsafe(_resolve, future)
            except RuntimeError:  # the caller's loop is closed: nobody waits any more
                pass
        elif self._event is not None:
            self._event.set()


class Lane:
    """The queue of one namespace's writes and who leads them."""

    __slots__ = ("arrived", "busy", "lock", "queue", "segments")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.arrived = threading.Condition(self.lock)  # notified whenever a job is queued
        self.queue: list[Job] = []
        self.busy = False
        self.segments: list[Any] | None = None  # the namespace's segment handles, known to the leader

    def enter(self, job: Job, loop: asyncio.AbstractEventLoop | None = None) -> bool:
        """Queue ``job``; True if its caller leads now (the lane was idle).

        A job that waits gets its event (or future) here, under the lock, so
        no wake can come before it; a leader's job is never woken and needs
        none (most jobs of a sequential caller).
        """
        with self.lock:
            self.queue.append(job)
            self.arrived.notify_all()
            if self.busy:
                if loop is None:
                    job._event = threading.Event()
                else:
                    job._loop, job._future = loop, loop.create_future()
                return False
            self.busy = True
            job.state = LEAD
            return True

    def wait(self, job: Job) -> bool:
        """Block until ``job`` is done (False) or handed the lead (True)."""
        assert job._event is not None
        job._event.wait()
        return job.state == LEAD

    async def await_(self, job: Job, lead_elsewhere: Callable[[], None]) -> bool:
        """:meth:`wait` for asyncio; a caller cancelled with the lead has it run by ``lead_elsewhere``."""
        assert job._future is not None
        try:
            await asyncio.shield(job._future)
        except asyncio.CancelledError:
            with self.lock:
                if job.state == PENDING:
                    job.state = ABANDONED
                    raise
                handed = job.state == LEAD
            if handed:
                lead_elsewhere()
            raise
        return job.state == LEAD

    def linger(self, seconds: float) -> None:
        """Wait up to ``seconds`` for a ``put`` to be queued (the leader's round holds only writes).

        LangGraph issues a step's ``put`` about 0.1 ms after its ``put_writes``;
        waiting that long lets both share one commit instead of syncing twice.
        """
        deadline = time.monotonic() + seconds
        with self.lock:
            while not any(job.kind == "put" for job in self.queue):
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self.arrived.wait(left)

    def take(self, mine: Job | None = None, *, more: bool = False) -> list[Job]:
        """The jobs of the leader's next round, in queue order.

        A ``WHOLE`` job at the head of the queue is a round alone, led by its
        own caller (``mine``): another leader takes nothing then, and passes
        the lead on (``hand_off`` gives it to that job, the first waiting).
        Otherwise the round takes every job before the first ``WHOLE`` one.
        ``more``: jobs to add to a round already taken (never a ``WHOLE`` one).
        """
        with self.lock:
            queue = self.queue
            if queue and queue[0].kind == WHOLE:
                if more or queue[0] is not mine:
                    return []
                jobs, self.queue = queue[:1], queue[1:]
                return jobs
            cut = next((i for i, job in enumerate(queue) if job.kind == WHOLE), len(queue))
            jobs, self.queue = queue[:cut], queue[cut:]
            return jobs

    def finish(self, jobs: Iterable[Job], leader: Job | None) -> None:
        """Answer the jobs of a finished round (their ``error`` is set or None).

        ``leader`` is the leading caller's own job: done if it was in the round.
        """
        with self.lock:
            for job in jobs:
                if job is leader:
                    job.state = DONE
                elif job.state in (PENDING, ABANDONED):
                    job.state = DONE
                    job._wake()

    def hand_off(self) -> bool:
        """After a round: pass the lead to the first waiting job; True if the caller must lead again.

        True when the leader's own job is still queued (a round stops before a
        ``WHOLE`` job, so it may not have been in this one), or when every
        queued job was abandoned by its (cancelled) caller. A leader's own job
        is never behind a waiting one (it found the lane idle, or was handed
        the lead as the first waiting job), so the first job found in the
        queue that leads or waits is the one that leads next.
        """
        with self.lock:
            for job in self.queue:
                if job.state == LEAD:
                    return True
                if job.state == PENDING:
                    job.state = LEAD
                    job._wake()
                    return False
            if self.queue:
                return True
            self.busy = False
            return False


class Lanes:
    """The lanes of one manager, by (thread, namespace): every saver on the manager shares them.

    ``Lanes.of(manager)`` is the manager's table, made on first use and
    dropped with the manager (a weak map).
    """

    _tables: ClassVar[weakref.WeakKeyDictionary[Any, Lanes]] = weakref.WeakKeyDictionary()
    _tables_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        self._lanes: dict[tuple[str, str], Lane] = {}
        self._lock = threading.Lock()

    @classmethod
    def of(cls, owner: Any) -> Lanes:
        """The table of ``owner`` (a manager: anything that can be weakly referenced)."""
        with cls._tables_lock:
            table = cls._tables.get(owner)
            if table is None:
                table = cls._tables[owner] = cls()
            return table

    def get(self, key: tuple[str, str]) -> Lane | None:
        return self._lanes.get(key)

    def lane(self, key: tuple[str, str]) -> Lane:
        """The lane of ``key`` (thread, namespace), made on first use."""
        lane = self._lanes.get(key)
        if lane is None:
            with self._lock:
                lane = self._lanes.setdefault(key, Lane())
        return lane
