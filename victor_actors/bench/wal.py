"""The write-ahead log: one durable scope's sequential apply with the log on and off, against the floor.

    python -m victor_actors.bench.wal [--quick] [--json FILE]

Issue 30 item 4 (one flush per durable commit group), measured side by side in one process and run,
pinned to one CPU where the system allows it (the caller's and the actor's threads share it):

- ``apply, wal on``: one conversation on a store with ``durability="sync"`` (the default ``wal=True``),
  one ``apply`` of a one-message batch after another;
- ``apply, wal off``: the same with ``wal=False`` (a synced LMDB commit: data pages, then the meta page);
- ``store submit, wal on / off``: the store layer alone (``Store.submit`` of one put, waited for);
- ``fdatasync, preallocated``: ``pwrite`` of the same bytes as one apply's log record into a file
  written with zeros beforehand, then one ``fdatasync`` (the physical floor of one durable group);
- ``fdatasync, appending``: the same bytes appended to a growing file, then ``fdatasync`` (which
  then also flushes the new file size: why the log preallocates);
- ``LMDB synced txn``: a bare LMDB environment (``sync=True``), one put of those bytes per transaction.

Each subject runs in blocks of sequential calls; rounds alternate the subjects so drift on the
shared machine hits all of them alike. Latencies are per call (``perf_counter_ns``, gc off in a block);
the report gives p50 and p99 and the ratios of the p50s.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import lmdb

from victor_actors import GlobalStateManager, TransitionBatch
from victor_actors.bench._common import no_gc, ns, run_module
from victor_actors.store import Store
from victor_actors.store._walfile import RECORDS_START
from victor_actors.store._writer import WriteTxn

__all__ = ["main", "run"]

TITLE = "victor_actors write-ahead log benchmark"
MESSAGE = {"role": "user", "content": "x" * 200}


def _pin() -> int | None:
    """Pin this process (and the threads it starts) to its last allowed CPU; the CPU, or None."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    cpu = max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    return cpu


class _Apply:
    def __init__(self, root: str, wal: bool) -> None:
        self.path = os.path.join(root, f"apply-{'wal' if wal else 'lmdb'}")
        self.manager = GlobalStateManager.open(self.path, durability="sync", wal=wal)
        self.conv = self.manager.get_conversation_state("c")
        self.batch = TransitionBatch().add_message(MESSAGE)

    def __call__(self) -> None:
        self.conv.apply(self.batch)

    def record_bytes(self) -> int:
        """Bytes of log written per group so far (the size of one apply's record)."""
        store = self.manager.store
        assert store is not None and store._log is not None
        log = store._log
        return max(1, (log.offset - RECORDS_START) // max(1, log.groups))

    def close(self) -> None:
        self.manager.close()


class _Submit:
    def __init__(self, root: str, wal: bool, size: int) -> None:
        self.store = Store(os.path.join(root, f"submit-{'wal' if wal else 'lmdb'}"), wal=wal)
        value = os.urandom(size)
        self.i = 0

        def op(t: WriteTxn) -> None:
            t.put("quarantine", b"k%d" % (self.i % 64), value)

        self.op = op

    def __call__(self) -> None:
        self.i += 1
        self.store.submit([self.op], wait=True)

    def close(self) -> None:
        self.store.close()


class _Fdatasync:
    """One record's bytes written and flushed: into zeros written beforehand, or appended."""

    SPACE = 1 << 20

    def __init__(self, root: str, size: int, preallocated: bool) -> None:
        self.path = os.path.join(root, "prealloc.log" if preallocated else "append.log")
        self.data = os.urandom(size)
        self.preallocated = preallocated
        flags = os.O_RDWR | os.O_CREAT | (0 if preallocated else os.O_APPEND)
        self.fd = os.open(self.path, flags, 0o600)
        self.at = 0
        if preallocated:
            os.pwrite(self.fd, bytes(self.SPACE), 0)
            os.fsync(self.fd)

    def __call__(self) -> None:
        if self.preallocated:
            if self.at + len(self.data) > self.SPACE:
                self.at = 0
            os.pwrite(self.fd, self.data, self.at)
            self.at += len(self.data)
        else:
            os.write(self.fd, self.data)
        os.fdatasync(self.fd)

    def close(self) -> None:
        os.close(self.fd)


class _LmdbTxn:
    def __init__(self, root: str, size: int) -> None:
        self.env = lmdb.open(os.path.join(root, "bare-lmdb"), map_size=1 << 28, sync=True, metasync=True)
        self.value = os.urandom(size)
        self.i = 0

    def __call__(self) -> None:
        self.i += 1
        with self.env.begin(write=True) as txn:
            txn.put(b"k%d" % (self.i % 64), self.value)

    def close(self) -> None:
        self.env.close()


def _percentile(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] / 1000.0


def run(quick: bool) -> dict[str, Any]:
    """Measure every subject in alternating rounds; p50/p99 in microseconds and the ratios."""
    rounds, calls = (2, 150) if quick else (8, 1000)
    cpu = _pin()
    root = tempfile.mkdtemp(prefix="va-bench-wal-")
    subjects: dict[str, Any] = {}
    try:
        wal_apply = _Apply(root, True)
        for _ in range(50):
            wal_apply()
        size = wal_apply.record_bytes()
        subjects = {
            "apply, wal on": wal_apply,
            "apply, wal off": _Apply(root, False),
            "store submit, wal on": _Submit(root, True, size),
            "store submit, wal off": _Submit(root, False, size),
            "fdatasync, preallocated": _Fdatasync(root, size, True),
            "fdatasync, appending": _Fdatasync(root, size, False),
            "LMDB synced txn": _LmdbTxn(root, size),
        }
        times: dict[str, list[int]] = {name: [] for name in subjects}
        for subject in subjects.values():  # warm each up outside the timer
            for _ in range(20):
                subject()
        for r in range(rounds):
            order = list(subjects.items())
            if r % 2:
                order.reverse()
            for name, subject in order:
                times[name].extend(_block(subject, calls))
        checkpoints = None
        store = wal_apply.manager.store
        if store is not None and store._log is not None:
            checkpoints = store._log.checkpoints
    finally:
        for subject in subjects.values():
            subject.close()
        shutil.rmtree(root, ignore_errors=True)
    p50 = {name: _percentile(t, 0.5) for name, t in times.items()}
    p99 = {name: _percentile(t, 0.99) for name, t in times.items()}
    floor = p50["fdatasync, preallocated"]
    ratios = {
        "apply, wal on / fdatasync (target <= 1.5)": p50["apply, wal on"] / floor,
        "LMDB synced txn / apply, wal on (target >= 1.0)": p50["LMDB synced txn"] / p50["apply, wal on"],
        "apply, wal off / apply, wal on": p50["apply, wal off"] / p50["apply, wal on"],
        "store submit, wal on / fdatasync": p50["store submit, wal on"] / floor,
        "store submit, wal off / store submit, wal on": p50["store submit, wal off"]
        / p50["store submit, wal on"],
        "fdatasync appending / preallocated": p50["fdatasync, appending"] / floor,
        "LMDB synced txn / fdatasync": p50["LMDB synced txn"] / floor,
    }
    return {
        "record_bytes": size,
        "pinned_cpu": cpu,
        "rounds": rounds,
        "calls_per_block": calls,
        "checkpoints_during_apply_wal_on": checkpoints,
        "p50_us": p50,
        "p99_us": p99,
        "ratios": ratios,
    }


def _block(subject: Callable[[], None], calls: int) -> list[int]:
    out = []
    with no_gc():
        for _ in range(calls):
            start = ns()
            subject()
            out.append(ns() - start)
    return out


def print_report(res: dict[str, Any]) -> None:
    print(
        f"\none log record: {res['record_bytes']} bytes; pinned to CPU {res['pinned_cpu']}; "
        f"{res['rounds']} rounds of {res['calls_per_block']} calls per subject"
    )
    print(f"\n{'subject':<28}{'p50 us':>10}{'p99 us':>10}")
    for name, value in res["p50_us"].items():
        print(f"{name:<28}{value:>10.0f}{res['p99_us'][name]:>10.0f}")
    print("\nratios of p50s")
    for name, value in res["ratios"].items():
        print(f"  {name:<52}{value:>6.2f}x")


def main() -> int:
    return run_module(__doc__, TITLE, run, print_report, packages=("lmdb",))


if __name__ == "__main__":
    raise SystemExit(main())
