"""Bytes written by a long conversation: what the store hands to LMDB, and what stays on disk.

    python -m victor_actors.bench.checkpoints [--quick] [--json FILE]

One conversation, one ``add_message`` (~200 characters, the store benchmark's messages) per
commit, ``durability="sync"``, default checkpoints (every 100 commits, 3 kept), in a store in a
temporary directory, for 1,000 steps and for 10,000 (``--quick``: 2,000):

- ``bytes_put``: the sum of the encoded values put by every committed write transaction
  (``Store.bytes_put``), over the whole run;
- ``data.mdb`` after the run (the file's size once the manager is closed);
- the same workload with no checkpoint at all (``checkpoint_every`` past the run), so the
  bytes the commit log takes and the bytes the checkpoints take are told apart;
- the reload: a fresh manager on the store reading the conversation back, against decoding
  the same state from one full checkpoint record.

The baseline of each is the final state's encoded size (the store's codec: msgpack, zstd above
2 KiB), measured in the same run; the plain msgpack size of the messages is shown beside it.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import tempfile
import time
from datetime import UTC, datetime
from typing import Any

import msgpack

from victor_actors import GlobalStateManager
from victor_actors.bench._common import quick_and_json, version_of
from victor_actors.bench.store import make_messages
from victor_actors.store import CheckpointRecord

NEVER = 10**12  # checkpoint_every for the run without checkpoints


def _run(steps: int, checkpoint_every: int | None, messages: list[dict[str, str]]) -> dict[str, Any]:
    root = tempfile.mkdtemp(prefix="va-bench-checkpoints-")
    try:
        every = 100 if checkpoint_every is None else checkpoint_every  # 100: the default
        start = time.perf_counter()
        with GlobalStateManager.open(root, request_timeout=60.0, checkpoint_every=every) as manager:
            store = manager.store
            assert store is not None
            conv = manager.get_conversation_state("long")
            for i in range(steps):
                conv.add_message(messages[i])
            wall = time.perf_counter() - start
            bytes_put = store.bytes_put
            state, _report = store.load(conv.ref, conv.snapshot().ancestors)
            full = store.codec.encode_checkpoint(CheckpointRecord(state, None, 0.0))
            checkpoints = len(store.checkpoints(conv.ref))
            log_records = len(store.log_versions(conv.ref))
        data_mdb = os.path.getsize(os.path.join(root, "data", "data.mdb"))
        out: dict[str, Any] = {
            "steps": steps,
            "seconds": wall,
            "bytes_put": bytes_put,
            "data_mdb": data_mdb,
            "final_state_bytes": len(full),
            "final_plain_bytes": len(msgpack.packb(messages[:steps])),
            "kept": f"{checkpoints} ckpts + {log_records} log records",
        }
        if checkpoint_every is None:
            out |= _reload(root, full)
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _reload(root: str, full: bytes) -> dict[str, Any]:
    """Reopen and read the conversation back (best of 3) vs decoding one full checkpoint record."""
    best = best_full = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        with GlobalStateManager.open(root) as manager:
            n = len(manager.get_conversation_state("long").snapshot().messages)
            best = min(best, time.perf_counter() - start)
            codec = manager.store.codec if manager.store is not None else None
        assert codec is not None
        start = time.perf_counter()
        state = codec.decode_checkpoint(full).state
        best_full = min(best_full, time.perf_counter() - start)
        assert len(state.messages) == n
    start = time.perf_counter()
    with GlobalStateManager.open(root) as manager:
        pass
    empty_open = time.perf_counter() - start
    return {"reload_seconds": best, "decode_full_seconds": best_full, "open_seconds": empty_open}


def main() -> None:
    args = quick_and_json(__doc__)
    long = 2_000 if args.quick else 10_000
    messages = make_messages(long)
    meta: dict[str, Any] = {"date": datetime.now(UTC).isoformat(timespec="seconds")}
    meta |= {"python": platform.python_version(), "cpus": os.cpu_count()}
    meta |= {n: version_of(n) for n in ("victor-actors", "lmdb")}
    meta["mode"] = "quick" if args.quick else "default"
    print("victor_actors checkpoints benchmark\n" + "  ".join(f"{k}: {v}" for k, v in meta.items()))
    wall0 = time.perf_counter()
    runs = {str(n): _run(n, None, messages) for n in (1_000, long)}
    log_only = {str(n): _run(n, NEVER, messages) for n in (1_000, long)}
    for key, run in runs.items():
        run["log_bytes_put"] = log_only[key]["bytes_put"]
        run["checkpoint_bytes_put"] = run["bytes_put"] - run["log_bytes_put"]
    head = f"\n{'steps':>7}{'bytes put':>13}{'/final':>8}{'of it: log':>13}{'checkpoints':>13}"
    head += f"{'data.mdb':>11}{'/final':>8}{'final':>9}{'plain':>11}"
    print(head + f"{'reload ms':>11}{'full dec ms':>12}")
    for run in runs.values():
        final = run["final_state_bytes"]
        print(
            f"{run['steps']:>7,}{run['bytes_put']:>13,}{run['bytes_put'] / final:>7.2f}x"
            f"{run['log_bytes_put']:>13,}{run['checkpoint_bytes_put']:>13,}"
            f"{run['data_mdb']:>11,}{run['data_mdb'] / final:>7.2f}x"
            f"{final:>9,}{run['final_plain_bytes']:>11,}"
            f"{run['reload_seconds'] * 1e3:>11.1f}{run['decode_full_seconds'] * 1e3:>12.1f}"
        )
    print("    bytes put: every value put by a committed transaction; log: the same run without checkpoints")
    wall = time.perf_counter() - wall0
    print(f"\nwall time {wall:.1f} s")
    if args.json:
        out = {"meta": meta, "wall_seconds": wall, "long": long, "runs": runs, "log_only": log_only}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=2)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
