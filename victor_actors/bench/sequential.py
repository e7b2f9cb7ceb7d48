"""One durable scope, sequential ``apply``, pinned to one CPU: against the disk's own floor.

    python -m victor_actors.bench.sequential [--quick] [--json FILE]

One caller thread, one conversation, one ``add_message`` (~200 characters, the store
benchmark's messages) per call, ``durability="sync"`` (durable before the call returns), in a
store in a temporary directory (``$TMPDIR`` chooses the disk). The whole process, the caller and
every thread the runtime starts, is pinned to one CPU (``_pin.pinned``) from before the store
opens: this is the latency of one request, without the scheduler moving threads between cores.

The subjects, each call timed alone (``time.perf_counter_ns``, gc off while timed), in
interleaved rounds (odd rounds reversed) so drift on a shared machine hits all of them:

- ``ours``: ``handle.add_message(msg)``, a new conversation every 100 messages (a checkpoint
  every 100 commits, as by default);
- ``fdatasync``: ``os.pwrite`` of as many bytes as one of our commits hands the store, then one
  ``os.fdatasync``, on a file in the same directory, preallocated (written with zeros and synced
  before the rounds, so no write extends it): the physical floor of a durable commit;
- ``lmdb``: one bare synced LMDB write transaction putting one value of the same size, in an
  environment in the same directory (``sync=True``, as the store opens its own);
- ``memory``: the same ``add_message`` on an in-memory manager (no store): the CPU path alone.

The bytes per commit are measured before the rounds: the store's ``bytes_put`` over 50 commits of
a fresh conversation (no checkpoint among them), divided by 50 (if the store counted none, the
messages' own msgpack size, and ``record_bytes_from`` says so).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from functools import partial
from itertools import count
from typing import Any

import lmdb
import msgpack

from victor_actors import GlobalStateManager, ScopeHandle
from victor_actors.bench._common import no_gc, ns, run_module
from victor_actors.bench._pin import pinned
from victor_actors.bench.store import make_messages

MSGS = make_messages(1_000)
CONV = 100  # messages per conversation, as in the store benchmark
CALIBRATE = 50  # commits whose bytes give the record size
SUBJECTS = ("ours", "fdatasync", "lmdb", "memory")


def pct_us(sorted_ns: list[int], q: float) -> float:
    """Nearest-rank percentile, in microseconds."""
    idx = min(len(sorted_ns) - 1, max(0, round(q * len(sorted_ns)) - 1))
    return sorted_ns[idx] / 1000.0


def summary(samples: list[int]) -> dict[str, float]:
    s = sorted(samples)
    total = sum(s)
    return {
        "n": len(s),
        "median_us": pct_us(s, 0.5),
        "p99_us": pct_us(s, 0.99),
        "per_s": len(s) / (total / 1e9) if total else 0.0,
    }


class Conversations:
    """Messages into a manager's conversations, a fresh one every ``CONV`` messages."""

    def __init__(self, manager: GlobalStateManager, tag: str) -> None:
        self.manager, self.tag, self.ids, self.i = manager, tag, count(), 0
        self.handle: ScopeHandle = manager.get_conversation_state(f"{tag}-{next(self.ids)}")

    def step(self) -> None:
        if self.i == CONV:
            self.handle = self.manager.get_conversation_state(f"{self.tag}-{next(self.ids)}")
            self.i = 0
        self.handle.add_message(MSGS[self.i])
        self.i += 1


def record_bytes(manager: GlobalStateManager) -> tuple[int, str]:
    """Bytes the store is handed per commit: ``bytes_put`` over ``CALIBRATE`` commits of a fresh scope,
    and where the figure comes from (the messages' own msgpack size if the store counted none)."""
    store = manager.store
    assert store is not None
    handle = manager.get_conversation_state("calibrate")
    handle.add_message(MSGS[0])  # the scope's creation is not a commit's bytes
    before = store.bytes_put
    for i in range(1, CALIBRATE + 1):
        handle.add_message(MSGS[i])
    size = (store.bytes_put - before) // CALIBRATE
    if size > 0:
        return size, "Store.bytes_put per commit"
    plain = sum(len(msgpack.packb(MSGS[i])) for i in range(1, CALIBRATE + 1)) // CALIBRATE
    return plain, "the message's msgpack size (the store counted no bytes for these commits)"


class SyncedFile:
    """``pwrite`` + ``fdatasync`` of ``size`` bytes at a time, over a preallocated, zero-filled file."""

    def __init__(self, path: str, size: int, slots: int) -> None:
        self.size, self.slots, self.slot = size, slots, 0
        self.payload = (bytes(range(256)) * (size // 256 + 1))[:size]
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        os.write(self.fd, bytes(size * slots))  # allocated and written: no write below extends the file
        os.fsync(self.fd)

    def step(self) -> None:
        os.pwrite(self.fd, self.payload, self.slot * self.size)
        os.fdatasync(self.fd)
        self.slot = (self.slot + 1) % self.slots

    def close(self) -> None:
        os.close(self.fd)


class BareLmdb:
    """One synced LMDB write transaction of one ``size``-byte value per step."""

    def __init__(self, path: str, size: int) -> None:
        self.env = lmdb.open(path, map_size=1 << 28, sync=True)
        self.value = b"v" * size
        self.keys = count()

    def step(self) -> None:
        with self.env.begin(write=True) as txn:
            txn.put(next(self.keys).to_bytes(8, "big"), self.value)

    def close(self) -> None:
        self.env.close()


def timed(step: Callable[[], None], n: int, out: list[int]) -> None:
    with no_gc():
        for _ in range(n):
            t0 = ns()
            step()
            out.append(ns() - t0)


def run(quick: bool) -> dict[str, Any]:
    rounds, calls, warm = (2, 60, 20) if quick else (10, 300, 100)
    root = tempfile.mkdtemp(prefix="va-bench-sequential-")
    samples: dict[str, list[int]] = {name: [] for name in SUBJECTS}
    closers: list[Callable[[], None]] = []
    try:
        with pinned() as pin:  # before the store opens: every thread it starts inherits the pin
            ours_mgr = GlobalStateManager.open(os.path.join(root, "ours"), request_timeout=60.0)
            closers.append(ours_mgr.close)
            mem_mgr = GlobalStateManager.open(None, request_timeout=60.0)
            closers.append(mem_mgr.close)
            size, source = record_bytes(ours_mgr)
            synced = SyncedFile(os.path.join(root, "floor.bin"), size, 4096)
            closers.append(synced.close)
            bare = BareLmdb(os.path.join(root, "raw"), size)
            closers.append(bare.close)
            steps: dict[str, Callable[[], None]] = {
                "ours": Conversations(ours_mgr, "seq").step,
                "fdatasync": synced.step,
                "lmdb": bare.step,
                "memory": Conversations(mem_mgr, "mem").step,
            }
            for step in steps.values():
                timed(step, warm, [])
            blocks: list[Callable[[], None]] = [
                partial(timed, steps[name], calls, samples[name]) for name in SUBJECTS
            ]
            for r in range(rounds):
                for block in _order(blocks, r):
                    block()
    finally:
        for close in reversed(closers):
            close()
        shutil.rmtree(root, ignore_errors=True)
    stats = {name: summary(s) for name, s in samples.items()}
    return {
        "pinned": pin.as_json(),
        "record_bytes": size,
        "record_bytes_from": source,
        "rounds": rounds,
        "calls_per_block": calls,
        "latency": stats,
        "ratios": {
            "ours/fdatasync p50": stats["ours"]["median_us"] / stats["fdatasync"]["median_us"],
            "ours/lmdb p50": stats["ours"]["median_us"] / stats["lmdb"]["median_us"],
            "ours/lmdb rate": stats["ours"]["per_s"] / stats["lmdb"]["per_s"],
        },
    }


def _order(blocks: list[Callable[[], None]], r: int) -> Iterator[Callable[[], None]]:
    return iter(blocks) if r % 2 == 0 else reversed(blocks)


def print_report(res: dict[str, Any]) -> None:
    lt = res["latency"]
    print(f"\n{res['pinned']['how']}")
    rounds, calls = res["rounds"], res["calls_per_block"]
    print(f"{rounds} interleaved rounds x {calls} calls; {res['record_bytes']} B a commit")
    print(f"{'subject':<58}{'p50 us':>10}{'p99 us':>10}{'ops/s':>10}")
    labels = {
        "ours": "ours: add_message, durability sync",
        "fdatasync": f"pwrite {res['record_bytes']} B + fdatasync, preallocated file",
        "lmdb": f"bare synced LMDB txn, one {res['record_bytes']} B value",
        "memory": "ours in memory (no store)",
    }
    for name, label in labels.items():
        s = lt[name]
        print(f"{label:<58}{s['median_us']:>10.1f}{s['p99_us']:>10.1f}{s['per_s']:>10,.0f}")
    print("\nratios")
    for name, value in res["ratios"].items():
        print(f"    {name:<50}{value:>10.2f}x")


def main() -> int:
    title = "victor_actors sequential durable benchmark (one scope, pinned)"
    return run_module(__doc__, title, run, print_report, ("lmdb",))


if __name__ == "__main__":
    raise SystemExit(main())
