"""The store's flusher thread wakes only when there is work nobody waits for.

A profile of 3,000 durable applies found the flusher woke 2,905 times with
nothing to do: every leader that let the lead go called ``notify_all`` on the
one condition the flusher slept on. It now sleeps on a condition of its own,
notified only when a job nobody waits for (``async`` durability) is queued,
and on close.
"""

from __future__ import annotations

import threading
from pathlib import Path
from types import FrameType
from typing import Any

from victor_actors.store import Store
from victor_actors.store._writer import WriteTxn


def _put(i: int) -> Any:
    def op(t: WriteTxn) -> None:
        t.put("quarantine", b"k%d" % i, b"v")

    return op


def _count_flusher_waits() -> tuple[list[int], Any]:
    """A profile hook counting ``Condition.wait`` calls made on the flusher thread (any code version)."""
    calls = [0]

    def profile(frame: FrameType, event: str, _arg: object) -> None:
        if (
            event == "call"
            and frame.f_code.co_name == "wait"
            and threading.current_thread().name == "victor-actors-flusher"
        ):
            calls[0] += 1

    return calls, profile


def test_sync_commits_never_wake_the_flusher(tmp_path: Path) -> None:
    """Guards the separate flusher condition: before it, 200 sync commits made the flusher wait
    (so wake) about 200 times; this failed on the code before the fix (about 200 waits)."""
    calls, profile = _count_flusher_waits()
    threading.setprofile(profile)  # applies to threads started from here on: the store's flusher
    try:
        store = Store(tmp_path / "db")
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]
    try:
        n = 200
        for i in range(n):
            store.submit([_put(i)], wait=True)
        assert store.commits == n
        # one wait: the flusher went to sleep once and was never woken by a sync commit
        assert calls[0] <= 2, f"the flusher waited {calls[0]} times over {n} sync commits"
        writer = store._writer
        assert writer is not None
        assert writer.flusher_wakeups == 0
    finally:
        store.close()


def test_async_commits_still_reach_the_store_through_the_flusher(tmp_path: Path) -> None:
    """Jobs nobody waits for are committed by the flusher within its interval (no flush call)."""
    store = Store(tmp_path / "db", flush_interval=0.001)
    try:
        done = threading.Event()
        seen: list[int] = []

        def last(t: WriteTxn) -> None:
            seen.append(1)
            done.set()

        for i in range(50):
            store.submit([_put(i)], wait=False)
        store.submit([last], wait=False)
        assert done.wait(10), "the flusher never committed the async jobs"
        writer = store._writer
        assert writer is not None
        assert writer.flusher_wakeups >= 1
    finally:
        store.close()
    reopened = Store(tmp_path / "db", read_only=True)
    try:
        assert all(reopened._get("quarantine", b"k%d" % i) == b"v" for i in range(50))
    finally:
        reopened.close()
