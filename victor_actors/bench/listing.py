"""Listing at scale: a page of the scope listing against the full scan it replaced.

    python -m victor_actors.bench.listing [--quick] [--json FILE]

One store of 1,000,000 conversation scope records (50,000 with ``--quick``)
under 1,000 teams and 1,000 workflows (a workflow per team; half of the
conversations directly under a team, half under its workflow), plaintext
and encrypted, written with ``Store.op_put_scope`` in transactions of
20,000 through ``store.submit(ops, wait=True)``. Then, on the store opened
read-only, each of:

- children: a page of 50 under one team (``children_page``; a team has 26
  children with ``--quick``, so that page is short);
- level: a page of 50 conversations from a cursor in the middle (``level_page``);
- prefix: a page of 50 ids starting with a prefix that 100 ids have
  (``prefix_page``; an encrypted store's keys hold no ids, so there it is a
  scan that opens records until 50 match);
- open: opening the store read-only (and closing it);

is timed as the median of several runs, beside the full scan a page cost
before the index (``scope_records()``, timed once per store, best of two
with ``--quick``), and the ratio of the two.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from victor_actors import Keyring, ScopeRef, StateScope
from victor_actors.bench._common import quick_and_json, version_of
from victor_actors.store._codec import ScopeRecord
from victor_actors.store._store import Store

TEAMS = 1000
BATCH = 20_000
PAGE = 50
KEYRING = Keyring({"bench": Keyring.generate_key()}, active="bench")
GLOBAL = ScopeRef(StateScope.GLOBAL, "global")


def team(t: int) -> ScopeRef:
    return ScopeRef(StateScope.TEAM, f"team-{t:04d}")


def flow(t: int) -> ScopeRef:
    return ScopeRef(StateScope.WORKFLOW, f"team-{t:04d}-flow")


def conversation(i: int) -> ScopeRecord:
    t = i % TEAMS
    ref = ScopeRef(StateScope.CONVERSATION, f"c{i:07d}")
    lineage = (team(t), GLOBAL) if (i // TEAMS) % 2 == 0 else (flow(t), team(t), GLOBAL)
    return ScopeRecord(ref, lineage, 1_700_000_000.0 + i)


def build(path: str, keyring: Keyring | None, n: int) -> float:
    """Write the tree and ``n`` conversations; return the seconds it took."""
    start = time.perf_counter()
    store = Store(path, encryption=keyring, map_size=4 * 1024**3)
    try:
        tops = [ScopeRecord(GLOBAL, (), 1.0)]
        for t in range(TEAMS):
            tops += [ScopeRecord(team(t), (GLOBAL,), 1.0), ScopeRecord(flow(t), (team(t), GLOBAL), 1.0)]
        store.submit([store.op_put_scope(r) for r in tops], wait=True)
        for lo in range(0, n, BATCH):
            store.submit(
                [store.op_put_scope(conversation(i)) for i in range(lo, min(n, lo + BATCH))], wait=True
            )
    finally:
        store.close()
    return time.perf_counter() - start


def median_of(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(path: str, keyring: Keyring | None, n: int, quick: bool) -> dict[str, Any]:
    runs = 5
    store = Store(path, read_only=True, encryption=keyring, map_size=4 * 1024**3)
    try:
        assert store.indexed and store.scope_count() == n + 1 + 2 * TEAMS
        middle = ScopeRef(StateScope.CONVERSATION, f"c{n // 2:07d}")
        prefix = f"c{n // 200:05d}"  # c + 7 digits: a 6-character prefix is shared by 100 ids
        pages: dict[str, Callable[[], list[ScopeRecord]]] = {
            "children": lambda: store.children_page(team(7), None, PAGE),
            "level": lambda: store.level_page(StateScope.CONVERSATION, middle, PAGE),
            "prefix": lambda: store.prefix_page(prefix, StateScope.CONVERSATION, None, PAGE),
        }
        rows = {name: len(page()) for name, page in pages.items()}  # with --quick a team has 26 children
        assert all(rows.values()), rows
        scan = min(median_of(store.scope_records, 1) for _ in range(2 if quick else 1))
        out: dict[str, Any] = {"full_scan_seconds": scan}
        for name, page in pages.items():
            # the encrypted prefix page is a scan itself: fewer runs
            seconds = median_of(page, 1 if (name == "prefix" and keyring is not None) else runs)
            out[name] = {
                "seconds": seconds,
                "baseline_seconds": scan,
                "ratio": scan / seconds,
                "rows": rows[name],
            }
    finally:
        store.close()

    def reopen() -> None:
        Store(path, read_only=True, encryption=keyring, map_size=4 * 1024**3).close()

    seconds = median_of(reopen, runs)
    out["open"] = {"seconds": seconds, "baseline_seconds": scan, "ratio": scan / seconds}
    return out


def main() -> int:
    args = quick_and_json(__doc__)
    n = 50_000 if args.quick else 1_000_000
    print("victor_actors listing benchmark")
    when = datetime.now(UTC).isoformat(timespec="seconds")
    print(f"date: {when}  python: {platform.python_version()}  lmdb: {version_of('lmdb')}")
    print(f"victor_actors: {version_of('victor-actors')}  conversations: {n:,}  page: {PAGE}")
    subjects: dict[str, Keyring | None] = {"plain": None, "encrypted": KEYRING}
    result: dict[str, Any] = {"conversations": n, "page": PAGE, "subjects": {}}
    with tempfile.TemporaryDirectory(prefix="va-bench-listing-") as tmp:
        for s, keyring in subjects.items():
            path = os.path.join(tmp, s)
            built = build(path, keyring, n)
            gc.collect()
            gc.disable()
            try:
                doc = measure(path, keyring, n, args.quick)
            finally:
                gc.enable()
            doc["build_seconds"] = built
            doc["bytes"] = os.path.getsize(os.path.join(path, "data", "data.mdb"))
            result["subjects"][s] = doc
    print(f"\n{'what':34} {'subject':>10} {'page (ms)':>12} {'full scan (ms)':>15} {'ratio':>10}")
    for s, doc in result["subjects"].items():
        for what in ("children", "level", "prefix", "open"):
            row = doc[what]
            print(
                f"{what:34} {s:>10} {row['seconds'] * 1e3:12.3f} {row['baseline_seconds'] * 1e3:15.1f} "
                f"{row['ratio']:9.0f}x"
            )
        print(f"{'(build, data.mdb bytes)':34} {s:>10} {doc['build_seconds']:11.1f}s {doc['bytes']:15,}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(result, fh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
