"""Encryption at rest against plaintext: durable commits/s, reopen time, bytes on disk.

    python -m victor_actors.bench.security [--quick] [--json FILE]

Two stores in one temporary directory, one plaintext and one encrypted
(AES-256-GCM per record, keyed hashes for scope ids). The same workload runs
on each, in interleaved rounds (plain, encrypted, encrypted, plain, ...) so
the machine's drift hits both:

- commits/s: one conversation, sequential durable (``sync``) applies of one
  message each, from a 100-message state;
- reopen: close the manager, open the store again and read every
  conversation (restoring each from its checkpoint and log);
- bytes: the ``data.mdb`` file after the same writes.

Goals (issue 16): commits/s and reopen time encrypted at least 0.9x plain,
bytes at most 1.05x.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import tempfile
import time
from datetime import UTC, datetime
from typing import Any

from victor_actors import GlobalStateManager, Keyring, TransitionBatch
from victor_actors.bench._common import quick_and_json, version_of

START_MESSAGES = 100
KEYRING = Keyring({"bench": Keyring.generate_key()}, active="bench")


def message(i: int) -> dict[str, str]:
    role = "assistant" if i % 2 else "user"
    return {"role": role, "content": f"turn {i}: checked the quarterly figures and drafted the next part"}


def commits(path: str, keyring: Keyring | None, name: str, n: int) -> float:
    """Seconds for ``n`` sequential durable commits on a fresh conversation of ``path``'s store."""
    with GlobalStateManager.open(path, encryption=keyring) as manager:
        conv = manager.get_conversation_state(name)
        conv.apply(TransitionBatch().add_messages([message(i) for i in range(START_MESSAGES)]))
        start = time.perf_counter()
        for i in range(n):
            conv.apply(TransitionBatch().add_message(message(START_MESSAGES + i)))
        return time.perf_counter() - start


def reopen(path: str, keyring: Keyring | None) -> float:
    """Seconds to open the store and read every conversation in it."""
    start = time.perf_counter()
    with GlobalStateManager.open(path, encryption=keyring, read_only=True) as manager:
        for ref in manager.scopes():
            manager.scope(ref).snapshot()
    return time.perf_counter() - start


def main() -> int:
    args = quick_and_json(__doc__)
    rounds, n = (2, 100) if args.quick else (6, 400)
    print("victor_actors encryption-at-rest benchmark")
    when = datetime.now(UTC).isoformat(timespec="seconds")
    print(f"date: {when}  python: {platform.python_version()}  lmdb: {version_of('lmdb')}")
    print(f"cryptography: {version_of('cryptography')}  victor_actors: {version_of('victor-actors')}")
    subjects: dict[str, Keyring | None] = {"plain": None, "encrypted": KEYRING}
    spent = {s: 0.0 for s in subjects}
    reopened = {s: 0.0 for s in subjects}
    with tempfile.TemporaryDirectory(prefix="va-bench-security-") as tmp:
        paths = {s: os.path.join(tmp, s) for s in subjects}
        for s, keyring in subjects.items():
            commits(paths[s], keyring, "warm", 10)
        gc.disable()
        try:
            for r in range(rounds):
                order = list(subjects) if r % 2 == 0 else list(reversed(subjects))
                for s in order:
                    spent[s] += commits(paths[s], subjects[s], f"c{r}", n)
                for s in order:
                    reopened[s] += reopen(paths[s], subjects[s])
        finally:
            gc.enable()
        sizes = {s: os.path.getsize(os.path.join(paths[s], "data", "data.mdb")) for s in subjects}
    rates = {s: rounds * n / spent[s] for s in subjects}
    reopen_s = {s: reopened[s] / rounds for s in subjects}
    result: dict[str, Any] = {
        "rounds": rounds,
        "commits_per_round": n,
        "rates": rates,
        "reopen_seconds": reopen_s,
        "bytes": sizes,
        "ratio_commits": rates["encrypted"] / rates["plain"],
        "ratio_reopen": reopen_s["plain"] / reopen_s["encrypted"],  # higher is better, like a rate
        "ratio_bytes": sizes["encrypted"] / sizes["plain"],
    }
    print(f"\n{rounds} interleaved rounds x {n} durable commits, each from a {START_MESSAGES}-message state")
    print(f"{'what':44} {'plain':>12} {'encrypted':>12} {'ratio':>8}")
    print(f"{'durable commits/s, 1 conversation':44} {rates['plain']:12.0f} {rates['encrypted']:12.0f} "
          f"{result['ratio_commits']:7.2f}x")  # fmt: skip
    print(f"{'reopen and read every conversation (s)':44} {reopen_s['plain']:12.3f} "
          f"{reopen_s['encrypted']:12.3f} {result['ratio_reopen']:7.2f}x")  # fmt: skip
    print(
        f"{'data.mdb bytes':44} {sizes['plain']:12,} {sizes['encrypted']:12,} {result['ratio_bytes']:7.2f}x"
    )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(result, fh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
