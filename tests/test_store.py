"""The durable store: real LMDB in temporary directories, real child processes."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from helpers import wait_for as _wait_for

from victor_actors import (
    CheckpointCorruptError,
    CheckpointNotFoundError,
    GlobalStateManager,
    ScopeAccessError,
    ScopeRef,
    StoreLockedError,
    TransitionBatch,
)
from victor_actors.lowlevel import Codec
from victor_actors.store import versioned_key


def _fill(handle: object, n: int) -> None:
    for i in range(n):
        handle.apply(TransitionBatch().add_message({"role": "user", "content": f"m{i}"}).update_state("i", i))  # type: ignore[attr-defined]


def test_reopen_restores_every_scope_with_its_parents(tmp_path: Path) -> None:
    with GlobalStateManager.open(tmp_path, checkpoint_every=7) as m:
        m.get_global_state().set("g", 1)
        m.get_team_state("t").set("team_key", "team")
        conv = m.get_conversation_state("c", workflow_id="wf", team_id="t")
        _fill(conv, 30)
        expected = conv.snapshot()
    with GlobalStateManager.open(tmp_path) as m:
        assert set(m.scopes()) >= {
            ScopeRef("conversation", "c"),
            ScopeRef("team", "t"),
            ScopeRef("workflow", "wf"),
        }
        conv = m.get_conversation_state("c")
        snap = conv.snapshot()
        assert snap.version == 30 == expected.version
        assert snap.state == expected.state
        assert snap.messages == expected.messages
        assert snap.ancestors == expected.ancestors
        assert snap.get_state("team_key") == "team" and snap.get_state("g") == 1
        assert not m.recovery_reports
        with pytest.raises(ScopeAccessError):
            m.get_conversation_state("c", team_id="other")
        assert conv.set("after", 1).version == 31


def test_one_owner_and_read_only_inspection(tmp_path: Path) -> None:
    with GlobalStateManager.open(tmp_path) as m:
        m.get_team_state("t").set("k", 1)
        with pytest.raises(StoreLockedError):
            GlobalStateManager.open(tmp_path)
        script = textwrap.dedent(
            f"""
            from victor_actors import GlobalStateManager, StoreLockedError
            try:
                GlobalStateManager.open({str(tmp_path)!r})
            except StoreLockedError:
                print("locked")
            with GlobalStateManager.open({str(tmp_path)!r}, read_only=True) as r:
                print(r.get_team_state("t").get("k"))
            """
        )
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
        assert proc.stdout.split() == ["locked", "1"], proc.stderr
    with GlobalStateManager.open(tmp_path) as m:  # released on close
        assert m.get_team_state("t").get("k") == 1


def test_read_only_manager_writes_nothing(tmp_path: Path) -> None:
    with GlobalStateManager.open(tmp_path) as m:
        m.get_team_state("t").set("k", 1)
    with GlobalStateManager.open(tmp_path, read_only=True) as r:
        with pytest.raises(ScopeAccessError):
            r.get_team_state("new-team")
        assert r.get_team_state("t").version == 1


def test_checkpoints_restore_and_fork(tmp_path: Path) -> None:
    with GlobalStateManager.open(tmp_path, checkpoint_every=1000) as m:
        conv = m.get_conversation_state("c", team_id="t")
        _fill(conv, 5)
        cid = m.save_checkpoint(conv.ref, label="after five")
        assert cid == "conversation:c@5"
        _fill(conv, 3)
        assert [c.version for c in m.list_checkpoints(conv.ref)] == [5]
        assert m.list_checkpoints(conv.ref)[0].label == "after five"
        loaded = m.load_checkpoint(conv.ref)
        assert loaded.version == 5 and loaded.message_count == 5
        seen: list[int] = []
        conv.subscribe(lambda e: seen.append(e.new_version))
        restored = m.restore(conv.ref, cid)
        assert restored.version == 9 and restored.reset  # history kept: the version rises
        assert conv.get("i") == 4 and conv.snapshot().message_count == 5
        by_version = m.restore(conv.ref, 7)  # any stored version, rebuilt from the log
        assert by_version.version == 10 and conv.snapshot().message_count == 7
        assert m.state_at(conv.ref, 8).message_count == 8
        fork = m.fork(conv.ref, cid, "c-fork")
        assert fork.parent == ScopeRef("team", "t") and fork.version == 5
        fork.set("only_in_fork", True)
        assert conv.get("only_in_fork") is None
        with pytest.raises(ScopeAccessError):
            m.fork(conv.ref, cid, "c-fork")
        with pytest.raises(CheckpointNotFoundError):
            m.load_checkpoint(conv.ref, "conversation:c@77")
        with pytest.raises(CheckpointNotFoundError):
            m.restore(conv.ref, "team:t@5")
        m.quiesce()  # every event delivered
        assert seen == [9, 10]
    with GlobalStateManager.open(tmp_path) as m:
        assert m.get_conversation_state("c").snapshot().message_count == 7
        assert m.get_conversation_state("c-fork").get("only_in_fork") is True


def test_retention_keeps_the_newest_checkpoints_and_what_they_need(tmp_path: Path) -> None:
    with GlobalStateManager.open(tmp_path, checkpoint_every=10, keep_checkpoints=3) as m:
        conv = m.get_conversation_state("c")
        _fill(conv, 95)
        assert [c.version for c in m.list_checkpoints(conv.ref)] == [90, 80, 70]
        assert m.store is not None
        assert m.store.log_versions(conv.ref) == list(range(71, 96))
        assert m.state_at(conv.ref, 75).get_state("i") == 74
        with pytest.raises(CheckpointNotFoundError):
            m.state_at(conv.ref, 50)
        fork = m.fork(conv.ref, 72, "fork")
        _fill(conv, 40)  # retention moves on; the fork depends on none of it
    with GlobalStateManager.open(tmp_path) as m:
        assert m.get_conversation_state("fork").snapshot().message_count == 72
        assert m.get_conversation_state("c").version == 135
        del fork


def test_keep_checkpoints_1_drops_the_log_before_the_only_checkpoint(tmp_path: Path) -> None:
    """Issue 28, item 9. Old code: with keep_checkpoints=1 the log before the scope's only
    checkpoint stayed (v1..v7 beside the checkpoint at v5) until a second one was written."""
    with GlobalStateManager.open(tmp_path, checkpoint_every=5, keep_checkpoints=1) as m:
        conv = m.get_conversation_state("c")
        _fill(conv, 7)
        assert m.store is not None
        assert [c.version for c in m.list_checkpoints(conv.ref)] == [5]
        assert m.store.log_versions(conv.ref) == [6, 7]
        with pytest.raises(CheckpointNotFoundError, match="the oldest version it can rebuild is 5"):
            m.state_at(conv.ref, 3)
        with pytest.raises(CheckpointNotFoundError):
            m.restore(conv.ref, 4)
        assert conv.version == 7  # the refused restore changed nothing
        assert m.state_at(conv.ref, 5).get_state("i") == 4 and m.state_at(conv.ref, 6).get_state("i") == 5
        m.save_checkpoint(conv.ref)  # a checkpoint by hand is retained the same way
        assert m.store.log_versions(conv.ref) == []
        assert [c.version for c in m.list_checkpoints(conv.ref)] == [7]
    with GlobalStateManager.open(tmp_path) as m:
        assert m.get_conversation_state("c").snapshot().message_count == 7


def test_history_reaches_back_keep_checkpoints(tmp_path: Path) -> None:
    """With fewer than ``keep_checkpoints`` checkpoints the whole log stays; from the keep-th on,
    the log after the oldest kept one. Old code: with three checkpoints (5, 10, 15) and
    keep_checkpoints=3 the log still reached back to v1."""
    with GlobalStateManager.open(tmp_path, checkpoint_every=5, keep_checkpoints=3) as m:
        conv = m.get_conversation_state("c")
        assert m.store is not None
        _fill(conv, 12)
        assert m.store.log_versions(conv.ref) == list(range(1, 13))  # checkpoints at 5 and 10
        _fill(conv, 3)
        assert m.store.log_versions(conv.ref) == list(range(6, 16))  # at 5, 10 and 15
        _fill(conv, 5)
        assert [c.version for c in m.list_checkpoints(conv.ref)] == [20, 15, 10]
        assert m.store.log_versions(conv.ref) == list(range(11, 21))


def test_async_mode_flushes_within_its_interval_and_on_close(tmp_path: Path) -> None:
    with GlobalStateManager.open(tmp_path, durability="async", flush_interval=0.02) as m:
        conv = m.get_conversation_state("c")
        _fill(conv, 50)
        assert m.store is not None
        store = m.store
        # The background flush is the behaviour under test, and nothing signals it: poll for it.
        assert _wait_for(lambda: len(store.log_versions(conv.ref)) == 50)
        assert len(m.store.log_versions(conv.ref)) == 50
        _fill(conv, 10)
    with GlobalStateManager.open(tmp_path) as m:
        assert m.get_conversation_state("c").version == 60


def test_manual_mode_writes_only_checkpoints(tmp_path: Path) -> None:
    with GlobalStateManager.open(tmp_path, durability="manual") as m:
        conv = m.get_conversation_state("c")
        _fill(conv, 5)
        m.save_checkpoint(conv.ref)
        _fill(conv, 5)
        assert m.store is not None and m.store.log_versions(conv.ref) == []
    with GlobalStateManager.open(tmp_path) as m:
        conv = m.get_conversation_state("c")
        assert conv.version == 5  # what was checkpointed, nothing after
        m.set_durability(conv.ref, "sync")
        _fill(conv, 2)
    with GlobalStateManager.open(tmp_path) as m:
        assert m.get_conversation_state("c").version == 7


def test_group_commit_packs_many_commits_per_transaction(tmp_path: Path) -> None:
    with GlobalStateManager.open(tmp_path) as m:
        convs = [m.get_conversation_state(f"c{i}") for i in range(20)]
        assert m.store is not None
        m.flush()  # the scope records, queued at creation, are not counted below
        before_txn, before_commits = m.store.transactions, m.store.commits
        threads = [threading.Thread(target=_fill, args=(c, 25)) for c in convs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        txns = m.store.transactions - before_txn
        commits = m.store.commits - before_commits
        assert commits == 500
        assert txns < commits  # several scopes' commits shared transactions
    with GlobalStateManager.open(tmp_path) as m:
        assert all(m.get_conversation_state(f"c{i}").version == 25 for i in range(20))


def test_the_map_grows_without_failing_a_commit(tmp_path: Path) -> None:
    with GlobalStateManager.open(tmp_path, map_size=256 * 1024) as m:
        conv = m.get_conversation_state("c")
        blob = os.urandom(4096).hex()  # incompressible
        for i in range(200):
            conv.set(f"k{i}", blob)
    with GlobalStateManager.open(tmp_path) as m:
        assert m.get_conversation_state("c").version == 200


def _corrupt(path: Path, db: str, ref: ScopeRef, version: int) -> None:
    import lmdb

    env = lmdb.open(str(path / "data"), max_dbs=8)
    handle = env.open_db(db.encode())
    with env.begin(write=True, db=handle) as txn:
        key = versioned_key(ref, version)
        raw = bytearray(txn.get(key))
        raw[len(raw) // 2] ^= 0xFF
        txn.put(key, bytes(raw))
    env.close()


def test_corrupt_checkpoint_falls_back_to_an_older_one_plus_the_log(tmp_path: Path) -> None:
    ref = ScopeRef("conversation", "c")
    with GlobalStateManager.open(tmp_path, checkpoint_every=10) as m:
        _fill(m.get_conversation_state("c"), 25)
    _corrupt(tmp_path, "ckpt", ref, 20)
    with GlobalStateManager.open(tmp_path) as m:
        conv = m.get_conversation_state("c")
        assert conv.version == 25 and conv.get("i") == 24
        (report,) = m.recovery_reports
        assert report.checkpoint_version == 10 and report.version == 25
        assert "checkpoint v20" in report.skipped[0]
        with pytest.raises(CheckpointCorruptError) as info:
            m.load_checkpoint(ref, "conversation:c@20")
        assert info.value.version == 20 and "conversation:c" in str(info.value)


def test_corrupt_commit_stops_replay_and_says_so(tmp_path: Path) -> None:
    ref = ScopeRef("conversation", "c")
    with GlobalStateManager.open(tmp_path, checkpoint_every=10) as m:
        _fill(m.get_conversation_state("c"), 25)
    _corrupt(tmp_path, "log", ref, 23)
    with GlobalStateManager.open(tmp_path) as m:
        conv = m.get_conversation_state("c")
        assert conv.version == 22 and conv.get("i") == 21  # the last state it can prove
        (report,) = m.recovery_reports
        assert report.latest_stored_version == 25 and "commit v23" in report.skipped[0]
        assert conv.set("next", 1).version == 23  # the unreachable tail was set aside, not overwritten
    with GlobalStateManager.open(tmp_path) as m:
        assert m.get_conversation_state("c").get("next") == 1
        assert not m.recovery_reports


def test_migration_from_schema_one_to_two(tmp_path: Path) -> None:
    with GlobalStateManager.open(tmp_path, checkpoint_every=3) as m:
        _fill(m.get_conversation_state("c"), 4)

    def v1_to_v2(record: dict) -> dict:  # type: ignore[type-arg]
        # v2 stores a "schema_note" in every checkpoint's values: in a store of format 2 they are
        # the full values records ("base" None) each checkpoint's values chain starts from
        if record.get("form") == 2 and "set" in record and record.get("base") is None:
            record["set"]["schema_note"] = "migrated"
        return record

    codec = Codec(schema_version=2, migrations={1: v1_to_v2})
    with GlobalStateManager.open(tmp_path, codec=codec) as m:
        conv = m.get_conversation_state("c")
        assert conv.get("schema_note") == "migrated" and conv.version == 4
        conv.set("new", 1)  # written with schema 2
    with GlobalStateManager.open(tmp_path, codec=codec) as m:
        assert m.get_conversation_state("c").get("new") == 1
    with pytest.raises(CheckpointCorruptError, match="newer"):  # an old reader refuses v2 records
        with GlobalStateManager.open(tmp_path) as m:
            m.get_conversation_state("c")


def test_storage_grows_linearly_with_the_work(tmp_path: Path) -> None:
    with GlobalStateManager.open(tmp_path, durability="async") as m:
        conv = m.get_conversation_state("c")
        rng = random.Random(1)
        words = ["plan", "tool", "result", "agent", "search", "file", "error", "retry", "done", "next"]
        for i in range(1000):
            text = " ".join(rng.choice(words) + str(rng.randint(0, 999)) for _ in range(12))
            conv.add_message({"role": "user" if i % 2 else "assistant", "content": f"step {i}: {text}"})
        assert m.store is not None
        m.flush()
        stored = m.store.size_of(conv.ref)
        final = len(m.store.codec.encode_checkpoint(m.store.checkpoint(conv.ref, 1000)))
    # a full copy per step would be ~500x the final state; deltas plus the kept checkpoints stay small
    assert stored / final < 6


_CRASH_CHILD = """
import sys, threading
from victor_actors import GlobalStateManager, TransitionBatch
m = GlobalStateManager.open(sys.argv[1], checkpoint_every=7)
lock = threading.Lock()
def agent(n):
    c = m.get_conversation_state(f"c{n}", team_id="t")
    while True:
        v = c.version + 1
        rec = c.apply(TransitionBatch().add_message(f"{n}:{v}").update_state("last", v).update_state("n", n))
        with lock:
            print(f"c{n} {rec.version}", flush=True)
for n in range(4):
    threading.Thread(target=agent, args=(n,), daemon=True).start()
threading.Event().wait()
"""


def test_crash_keeps_every_acknowledged_commit(tmp_path: Path) -> None:
    rng = random.Random(7)
    acked: dict[str, int] = {}
    for _round in range(4):
        proc = subprocess.Popen(
            [sys.executable, "-c", _CRASH_CHILD, str(tmp_path)], stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None
        target = rng.randint(20, 150)
        lines = 0
        for line in proc.stdout:
            name, version = line.split()
            acked[name] = max(acked.get(name, 0), int(version))
            lines += 1
            if lines >= target:
                break
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        with GlobalStateManager.open(tmp_path) as m:
            for name, version in acked.items():
                snap = m.get_conversation_state(name).snapshot()
                assert snap.version >= version  # every acknowledged commit survived
                # gapless and never partial: one message and matching keys per version
                assert snap.message_count == snap.version
                assert snap.messages == tuple(f"{name[1:]}:{v}" for v in range(1, snap.version + 1))
                assert snap.get_state("last") == snap.version
            assert not m.recovery_reports
