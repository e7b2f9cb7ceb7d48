"""What only the owner of a store knows, sampled for the live view.

The counters come from ``manager.stats()`` (commits, live actors, the
deepest mailbox, supervision counts, events queued); commits per second is
the change of ``commits`` over the last couple of seconds of samples.
Supervision events arrive through ``manager.subscribe_supervision`` (on the
manager's event thread) and are kept, the newest :data:`KEEP` of them, with
a sequence number so a client can tell which it has already shown.

Runs in progress are read with ``manager.active_runs()`` by a sampler
thread every :data:`RUN_SAMPLE` seconds; a run that starts and ends between
two samples is not seen, so the finished runs listed (rolled back, or
succeeded) are those the sampler saw in progress.
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
from typing import Any

from victor_actors import GlobalStateManager
from victor_actors.cli._format import iso
from victor_actors.lowlevel import SupervisionEvent

__all__ = ["KEEP", "RUN_SAMPLE", "LiveFeed"]

KEEP = 50  # supervision events and finished runs kept for the page
RUN_SAMPLE = 0.05  # seconds between two looks at the runs in progress
RATE_WINDOW = 2.0  # seconds of samples behind commits per second


def _active_runs(manager: GlobalStateManager) -> list[Any]:
    """The runs in progress (``with manager.run(...)`` blocks not yet left)."""
    return list(manager.active_runs())


def _run_row(run: Any, now: float) -> dict[str, Any]:
    started = getattr(run, "started", now)
    report = getattr(run, "rollback_report", None)
    row: dict[str, Any] = {
        "id": run.id,
        "session_id": getattr(run, "session_id", None),
        "status": getattr(run, "status", "active"),
        "age_seconds": round(now - started, 3),
        "scopes": sorted(str(r) for r in run.refs()),
    }
    deadline = getattr(run, "deadline", None)
    if deadline is not None:
        row["remaining_seconds"] = round(deadline - now, 3)
    if report is not None:
        row["reason"] = report.reason
        row["rolled_back_scopes"] = [str(s.ref) for s in report.scopes]
    return row


class LiveFeed:
    """Samples of one running manager; thread-safe. ``close()`` stops the sampler and the subscription."""

    def __init__(self, manager: GlobalStateManager) -> None:
        self._manager = manager
        self._lock = threading.Lock()
        self._events: collections.deque[dict[str, Any]] = collections.deque(maxlen=KEEP)
        self._seq = itertools.count(1)
        self._event_counts: collections.Counter[str] = collections.Counter()
        self._samples: collections.deque[tuple[float, int]] = collections.deque()
        self._watched: dict[str, Any] = {}  # runs seen in progress, until they end
        self._finished: collections.deque[dict[str, Any]] = collections.deque(maxlen=KEEP)
        self._outcomes: collections.Counter[str] = collections.Counter()
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._subscription = manager.subscribe_supervision(self._on_supervision)
        self._sampler = threading.Thread(target=self._sample_runs, name="victor-actors-web-runs", daemon=True)
        self._sampler.start()

    def close(self) -> None:
        self._stop.set()
        self._subscription.close()
        if self._sampler is not threading.current_thread():
            self._sampler.join(5.0)

    def _on_supervision(self, event: SupervisionEvent) -> None:
        row: dict[str, Any] = {
            "kind": event.kind,
            "ref": str(event.ref),
            "supervisor": None if event.supervisor is None else str(event.supervisor),
            "reason": event.reason,
            "time": iso(event.timestamp),
        }
        with self._lock:
            row["seq"] = next(self._seq)
            self._events.append(row)
            self._event_counts[event.kind] += 1

    def _sample_runs(self) -> None:
        while not self._stop.wait(RUN_SAMPLE):
            self.look_at_runs()

    def look_at_runs(self) -> list[Any]:
        """Note the runs in progress now, and the end of those seen before; return those in progress."""
        active = _active_runs(self._manager)
        now = time.monotonic()
        with self._lock:
            in_progress = {run.id for run in active}
            for run in active:
                self._watched.setdefault(run.id, run)
            for run_id, run in list(self._watched.items()):
                status = getattr(run, "status", "active")
                if status == "active" and run_id not in in_progress:
                    status = "ended"  # left the registry without an outcome (its rollback raised)
                if status != "active":
                    del self._watched[run_id]
                    self._outcomes[status] += 1
                    row = _run_row(run, now)
                    row.pop("remaining_seconds", None)
                    row["seconds"] = row.pop("age_seconds")  # how long it ran, to within one sample
                    self._finished.append(row | {"status": status, "ended": iso(time.time())})
        return active

    def sample(self) -> dict[str, Any]:
        """Everything the live view shows, now."""
        stats = self._manager.stats()
        active = self.look_at_runs()
        now = time.monotonic()
        with self._lock:
            self._samples.append((now, stats["commits"]))
            while len(self._samples) > 2 and now - self._samples[1][0] >= RATE_WINDOW:
                self._samples.popleft()
            first_t, first_c = self._samples[0]
            rate = (stats["commits"] - first_c) / (now - first_t) if now > first_t else 0.0
            return {
                "time": iso(time.time()),
                "uptime_seconds": round(now - self._started, 3),
                "stats": stats,
                "commits_per_second": round(rate, 1),
                "supervision": {"counts": dict(self._event_counts), "recent": list(self._events)},
                "runs": {
                    "in_progress": [_run_row(r, now) for r in active],
                    "finished": list(self._finished),
                    "outcomes": dict(self._outcomes),
                },
            }
