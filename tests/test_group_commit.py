"""One scope's requests share a transaction: asyncio callers' commits in sync durability.

While one group's transaction syncs, the scope's next requests wait in its
mailbox and become the next group. A commit is published and answered only
once its group is durable, in order; a failed group fails whole and the
scope stays at its last durable version. Before this, one scope never shared
a transaction with itself: 10,000 requests in flight took 10,000 synced
transactions.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from victor_actors import GlobalStateManager, ScopeFailedError, StateChanged, TransitionBatch
from victor_actors.testing import set_observer


async def _flood(handle: Any, n: int, start: int = 0) -> list[StateChanged]:
    return list(
        await asyncio.gather(
            *(handle.aapply(TransitionBatch().add_message({"i": start + i})) for i in range(n))
        )
    )


def test_requests_in_flight_share_transactions_and_commit_in_order(tmp_path: Path) -> None:
    """Guards the batching: on the code before it, 1,000 commits took 1,000 transactions."""
    with GlobalStateManager.open(tmp_path / "db", durability="sync") as m:
        conv = m.get_conversation_state("c")
        assert m.store is not None
        m.flush()
        before = m.store.transactions
        records = asyncio.run(_flood(conv, 1000))
        transactions = m.store.transactions - before
        assert sorted(r.new_version for r in records) == list(range(1, 1001))
        assert all(r.new_version == r.old_version + 1 for r in records)
        assert transactions < 200, f"{transactions} transactions for 1,000 commits"
        assert [msg["i"] for msg in conv.snapshot().messages] == list(range(1000))  # mailbox order
    with GlobalStateManager.open(tmp_path / "db") as m:
        assert m.get_conversation_state("c").version == 1000


def test_a_commit_is_published_only_once_it_is_durable(tmp_path: Path) -> None:
    """Every commit's state is in the store (its head at least at its version) when it is published."""
    with GlobalStateManager.open(tmp_path / "db", durability="sync") as m:
        store = m.store
        assert store is not None
        late: list[tuple[int, int | None]] = []

        def observe(kind: str, ref: Any, obj: Any) -> None:
            if kind == "published":
                head = store.head(ref)
                if head is None or head < obj.new_version:
                    late.append((obj.new_version, head))

        set_observer(m, observe)
        conv = m.get_conversation_state("c")
        asyncio.run(_flood(conv, 500))
        set_observer(m, None)
        assert late == [], f"published before durable: {late[:5]}"


def test_a_failed_group_fails_whole_and_the_scope_stays_at_its_durable_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from victor_actors import _durability

    with GlobalStateManager.open(tmp_path / "db", durability="sync") as m:
        conv = m.get_conversation_state("c")
        conv.set("k", "durable")
        real = _durability._GroupStager.commit
        calls = {"n": 0}

        def failing_once(self: Any, ops: list[Any]) -> None:
            calls["n"] += 1
            if calls["n"] == 1:
                raise OSError("the disk is full (injected)")
            real(self, ops)

        monkeypatch.setattr(_durability._GroupStager, "commit", failing_once)

        async def main() -> list[Any]:
            return await asyncio.gather(
                *(conv.aapply(TransitionBatch().update_state("k", i)) for i in range(50)),
                return_exceptions=True,
            )

        results = asyncio.run(main())
        failed = [r for r in results if isinstance(r, BaseException)]
        assert failed and all(isinstance(r, ScopeFailedError) for r in failed)
        assert "stays at version 1" in str(failed[0])
        ok = [r for r in results if not isinstance(r, BaseException)]
        # the first group failed whole; what followed committed on top of the durable version 1
        assert sorted(r.new_version for r in ok) == list(range(2, 2 + len(ok)))
        assert conv.version == 1 + len(ok)
    with GlobalStateManager.open(tmp_path / "db") as m:
        assert m.get_conversation_state("c").version == 1 + len(ok)


_CHILD = """
import asyncio, sys
from victor_actors import GlobalStateManager, TransitionBatch
m = GlobalStateManager.open(sys.argv[1], durability="sync")
conv = m.get_conversation_state("c")

async def one(i):
    record = await conv.aapply(TransitionBatch().add_message({"i": i}))
    print(record.new_version, flush=True)

async def main():
    await asyncio.gather(*(one(i) for i in range(20_000)))

asyncio.run(main())
"""


def test_sigkill_during_a_flood_loses_no_acknowledged_commit(tmp_path: Path) -> None:
    """Acknowledged means durable: after SIGKILL the store holds every version a caller was told of."""
    path = tmp_path / "db"
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    acked = 0
    for line in proc.stdout:
        acked = max(acked, int(line))
        if acked >= 2000:
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    with GlobalStateManager.open(path) as m:
        conv = m.get_conversation_state("c", create=False)
        assert conv.version >= acked
        assert not m.recovery_reports
        messages = conv.snapshot().messages
        assert len(messages) == conv.version  # every durable version is whole, none torn
