"""Checkpoint TTL: when a LangGraph thread expires, the sweeper that expires it, and what refreshes it.

``VictorActorsSaver(manager, ttl={...})`` takes the keys LangGraph's Agent
Server takes for its checkpointer: ``default_ttl`` (minutes a thread lives
after its last activity), ``sweep_interval_minutes`` (how often a background
sweeper runs; without it, call ``saver.sweep()`` yourself), ``strategy``
(``"delete"``: the thread is deleted, with its tombstone; ``"keep_latest"``:
it is pruned to each namespace's newest checkpoint, a retention policy) and
``refresh_on_read`` (a ``get_tuple``, ``list`` or delta history read of a
thread counts as activity; default True).

Activity is a write (``put``, ``put_writes``) or, with ``refresh_on_read``, a
read. It is kept in memory, in one table per manager (every saver on the
manager writes it: a dict assignment on the put path, no I/O). What survives
a restart: every checkpoint record carries the time it was put (``"t"``), and
each sweep writes the time of the reads since the last one into the thread's
team (``touched``), one commit per thread read. The first sweep of a process
learns the activity of the threads it has not seen from those (a thread with
neither, written before this field existed, starts its clock then).

Several processes (clients of one owner, each with its own table) agree
through the store: before a thread its table finds idle is expired, the sweep
reads the thread's newest put time and the read time a sweep wrote, and a
newer one keeps it (a read in another process counts once that process's
sweep has written it).

The sweep never holds a lock a put needs: it reads the table, and expires
each idle thread through the whole-thread operations (per namespace, in the
namespace's lane), so only a put to the thread being expired waits for it. A
write that races its thread's expiry is ordered with it by the lane and the
tombstone: it lands before (and is deleted) or is refused as late.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from victor_actors import TransitionValidationError
from victor_actors.langgraph import _delta
from victor_actors.langgraph import _layout as L
from victor_actors.langgraph._segments import Segments
from victor_actors.langgraph._threadops import ThreadOps

__all__ = ["Activity", "Retention", "check_ttl"]

logger = logging.getLogger("victor_actors")
TTL_KEYS = frozenset({"default_ttl", "refresh_on_read", "sweep_interval_minutes", "strategy"})
STRATEGIES = ("delete", "keep_latest")


def _minutes(value: Any, key: str) -> float | None:
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not value > 0
        or value == float("inf")
    ):
        raise TransitionValidationError(
            f"ttl[{key!r}] must be a positive number of minutes or None, not {value!r}; nothing was opened",
            field="ttl",
        )
    return float(value)


def check_ttl(ttl: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The TTL config, checked: every key known, every value of its type.

    Raises:
        TransitionValidationError: an unknown key or a bad value (a ``ValueError``).
    """
    if ttl is None:
        return None
    if not isinstance(ttl, Mapping):
        raise TransitionValidationError(f"ttl must be a mapping, not {type(ttl).__name__}", field="ttl")
    unknown = sorted(str(k) for k in ttl if k not in TTL_KEYS)
    if unknown:
        raise TransitionValidationError(
            f"unknown ttl key(s) {unknown}; known: {sorted(TTL_KEYS)}; nothing was opened", field="ttl"
        )
    refresh = ttl.get("refresh_on_read", True)
    if not isinstance(refresh, bool):
        raise TransitionValidationError(
            f"ttl['refresh_on_read'] must be a bool, not {refresh!r}", field="ttl"
        )
    strategy = ttl.get("strategy", "delete")
    if strategy not in STRATEGIES:
        raise TransitionValidationError(
            f"ttl['strategy'] must be one of {STRATEGIES}, not {strategy!r}; nothing was opened", field="ttl"
        )
    return {
        "default_ttl": _minutes(ttl.get("default_ttl"), "default_ttl"),
        "sweep_interval_minutes": _minutes(ttl.get("sweep_interval_minutes"), "sweep_interval_minutes"),
        "refresh_on_read": refresh,
        "strategy": strategy,
    }


class Activity:
    """The time of each thread's last activity, for every saver on one manager (``Activity.of``)."""

    _tables: ClassVar[weakref.WeakKeyDictionary[Any, Activity]] = weakref.WeakKeyDictionary()
    _tables_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.at: dict[str, float] = {}
        self.read: set[str] = set()  # threads refreshed by a read since the last sweep persisted them
        self.scanned = False  # the threads in the store were learned (by the first sweep)

    @classmethod
    def of(cls, owner: Any) -> Activity:
        with cls._tables_lock:
            table = cls._tables.get(owner)
            if table is None:
                table = cls._tables[owner] = cls()
            return table

    def wrote(self, thread_id: str, now: float) -> None:
        self.at[thread_id] = now  # one assignment: atomic under the GIL, nothing else on the put path

    def forget(self, thread_id: str) -> None:
        """A thread deleted: nothing left to expire until it is written again."""
        with self.lock:
            self.at.pop(thread_id, None)
            self.read.discard(thread_id)

    def was_read(self, thread_id: str, now: float) -> None:
        with self.lock:
            if thread_id in self.at or not self.scanned:
                self.at[thread_id] = now
                self.read.add(thread_id)


class Retention:
    """The sweeps of one saver: which threads are idle past ``default_ttl``, and expiring them."""

    def __init__(
        self,
        config: dict[str, Any],
        segments: Segments,
        ops: ThreadOps,
        activity: Activity,
        clock: Callable[[], float],
        timeout: float | None,
    ) -> None:
        self.config = config
        self.segments = segments
        self.ops = ops
        self.activity = activity
        self.clock = clock
        self.timeout = timeout
        self._sweep_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the background sweeper ----------------------------------------------------

    def start(self) -> None:
        """Start the background sweeper if ``sweep_interval_minutes`` is set."""
        interval = self.config["sweep_interval_minutes"]
        if interval is None or self.config["default_ttl"] is None:
            return
        self._thread = threading.Thread(
            target=self._loop, args=(interval * 60,), name="victor-actors-langgraph-sweeper", daemon=True
        )
        self._thread.start()

    def _loop(self, seconds: float) -> None:
        while not self._stop.wait(seconds):
            if self.segments.manager.closed:
                return
            try:
                self.sweep()
            except Exception:  # a sweep that fails is retried at the next interval; puts are unaffected
                logger.exception("the LangGraph checkpoint TTL sweep failed; it runs again next interval")

    def stop(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    # -- one sweep --------------------------------------------------------------------

    def sweep(self) -> int:
        """Expire every thread idle for ``default_ttl`` minutes; the number expired.

        One sweep at a time per saver. Reads refreshed since the last sweep
        are written into their threads first (so they survive a restart).
        """
        ttl = self.config["default_ttl"]
        with self._sweep_lock:
            if not self.activity.scanned:
                self._scan()
            self._persist_reads()
            if ttl is None:
                return 0
            now = self.clock()
            with self.activity.lock:
                idle = sorted(t for t, at in self.activity.at.items() if at + ttl * 60 <= now)
            expired = 0
            for thread_id in idle:
                # Another process's saver (a client of the same owner) may have written the thread
                # since this one learned of it: its newest put, or a read its sweep wrote, keeps it.
                stored = self._stored_activity(thread_id, 0.0)
                if stored + ttl * 60 > now:
                    with self.activity.lock:
                        if thread_id in self.activity.at:
                            self.activity.at[thread_id] = max(self.activity.at[thread_id], stored)
                    continue
                with self.activity.lock:  # a write since the list was made keeps the thread
                    at = self.activity.at.get(thread_id)
                    if at is None or at + ttl * 60 > now:
                        continue
                    del self.activity.at[thread_id]
                    self.activity.read.discard(thread_id)
                if self.config["strategy"] == "delete":
                    self.ops.delete_thread(thread_id)
                else:
                    self.ops.prune_keep_latest(thread_id)
                expired += 1
            return expired

    def _scan(self) -> None:
        """Learn the last activity of every thread in the store this process has not seen yet."""
        now = self.clock()
        found: dict[str, float] = {}
        for thread_id in self.segments.threads():
            if thread_id in self.activity.at:
                continue
            team = self.segments.team(thread_id)
            if team is not None and L.DELETED in team.snapshot().state and self._empty(thread_id):
                continue  # deleted, nothing left to expire
            found[thread_id] = self._stored_activity(thread_id, now)
        with self.activity.lock:
            for thread_id, at in found.items():
                self.activity.at.setdefault(thread_id, at)
            self.activity.scanned = True

    def _empty(self, thread_id: str) -> bool:
        return not any(
            L.checkpoint_ids(h.snapshot().state)
            for ns in self.segments.namespaces(thread_id)
            for h in self.segments.newest_first(thread_id, ns)
        )

    def _stored_activity(self, thread_id: str, now: float) -> float:
        """The newest put time of the thread's namespaces, or read time written by a sweep; else ``now``."""
        times: list[float] = []
        team = self.segments.team(thread_id)
        if team is not None:
            touched = team.snapshot().state.get(L.TOUCHED)
            if isinstance(touched, (int, float)):
                times.append(float(touched))
        for ns in self.segments.namespaces(thread_id):
            states = [h.snapshot().state for h in self.segments.newest_first(thread_id, ns)]
            latest = next((s.get(L.LATEST) for s in states if isinstance(s.get(L.LATEST), str)), None)
            found = _delta.locate(states, latest) if latest is not None else None
            if found is not None and isinstance(found[1].get("t"), (int, float)):
                times.append(float(found[1]["t"]))
        return max(times, default=now)

    def _persist_reads(self) -> None:
        with self.activity.lock:
            read = {t: self.activity.at[t] for t in self.activity.read if t in self.activity.at}
            self.activity.read.clear()
        for thread_id, at in sorted(read.items()):
            team = self.segments.team(thread_id)
            if team is not None:
                team.apply([L.update(L.TOUCHED, at)], timeout=self.timeout)
