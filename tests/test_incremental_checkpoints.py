"""Incremental checkpoints (docs/adr/0018): a checkpoint writes what changed since the one before.

Real LMDB stores in temporary directories and real actors. The states every
stored checkpoint rebuilds are compared with the states the live scope
published at those versions, through histories that are not append-only
(restores, run rollbacks, forks, saves racing the actor, pipelined requests),
and after reopening the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from pathlib import Path
from typing import Any

import lmdb
import msgpack
import pytest

from victor_actors import (
    CheckpointCorruptError,
    GlobalStateManager,
    Keyring,
    RunFailedError,
    ScopeRef,
    TransitionBatch,
)
from victor_actors.store import CheckpointRecord, Store, rekey
from victor_actors.store._incremental import CHUNK_MESSAGES

Seen = dict[int, tuple[dict[str, Any], tuple[Any, ...]]]
LINEAGE = (ScopeRef("global", "global"),)


def _message(i: int) -> dict[str, str]:
    words = ("plan", "tool", "search", "result", "retry", "draft", "review", "merge", "deploy")
    rng = random.Random(i)
    return {"role": ("user", "assistant")[i % 2], "content": " ".join(rng.choice(words) for _ in range(30))}


def _seen(conv: Any, seen: Seen) -> None:
    """Record the scope's published state at its version."""
    snap = conv.snapshot()
    seen[snap.version] = (dict(snap.state.items()), tuple(snap.messages))


def _check_stored(store: Store, ref: ScopeRef, seen: Seen) -> int:
    """Every stored checkpoint rebuilds the state published at its version; returns how many."""
    infos = store.checkpoints(ref)
    for info in infos:
        state = store.checkpoint(ref, info.version).state
        assert info.readable
        assert (dict(state.values.items()), tuple(state.messages)) == seen[info.version], info.version
    return len(infos)


def _roots(store: Store) -> set[bytes]:
    """The distinct message roots in the chunks database (a store with one scope)."""
    return {key[-16:-8] for key, _raw in store._scan("chunks", b"")}


def _roots_at(path: Path, keys: Keyring | None = None) -> set[bytes]:
    store = Store(path, read_only=True, encryption=keys)
    try:
        return _roots(store)
    finally:
        store.close()


def test_checkpoints_write_the_new_messages_not_the_whole_log(tmp_path: Path) -> None:
    """The bytes the checkpoints hand to LMDB over 1,000 one-message commits stay near the final state.

    Measured as the difference from the same workload with no checkpoint at all. Fails on
    the code before incremental checkpoints: a full copy every 100 commits wrote 5.6x the final
    state's encoded size here (and that grows with the conversation).
    """
    written = {}
    for every in (100, 10_000):
        with GlobalStateManager.open(tmp_path / str(every), checkpoint_every=every) as m:
            conv = m.get_conversation_state("c")
            for i in range(1_000):
                conv.add_message(_message(i))
            assert m.store is not None
            written[every] = m.store.bytes_put
            if every == 100:
                final = len(m.store.codec.encode_checkpoint(m.store.checkpoint(conv.ref, 1_000)))
    by_checkpoints = written[100] - written[10_000]
    assert 0 < by_checkpoints < 1.5 * final


def test_a_long_history_of_restores_rollbacks_and_saves_rebuilds_every_checkpoint(tmp_path: Path) -> None:
    """A random history that is not append-only: each stored checkpoint is the state published then."""
    rng = random.Random(5)
    seen: Seen = {}
    with GlobalStateManager.open(tmp_path, checkpoint_every=3, keep_checkpoints=3) as m:
        conv = m.get_conversation_state("c")
        assert m.store is not None
        _seen(conv, seen)
        for step in range(300):
            roll = rng.random()
            if roll < 0.45:
                conv.add_message(_message(step))
            elif roll < 0.65:
                conv.set(f"k{rng.randrange(6)}", step)
            elif roll < 0.72 and conv.get("k0") is not None:
                conv.delete("k0")
            elif roll < 0.8 and m.list_checkpoints(conv.ref):
                target = rng.choice(m.list_checkpoints(conv.ref)).checkpoint_id
                m.restore(conv.ref, target)
            elif roll < 0.86:
                with contextlib.suppress(RunFailedError), m.run("c", timeout=10):
                    conv.apply(TransitionBatch().add_message(_message(-step)).update_state("k1", -step))
                    _seen(conv, seen)
                    raise RuntimeError("rolled back")
            elif roll < 0.92:
                m.save_checkpoint(conv.ref, label=f"s{step}")
            else:
                conv.apply(TransitionBatch().add_message(_message(step)).add_message(_message(step + 1)))
            _seen(conv, seen)
            if step % 50 == 49:
                assert _check_stored(m.store, conv.ref, seen) == 3
        final = (conv.version, conv.to_dict(), tuple(conv.snapshot().messages))
        assert len(_roots(m.store)) <= 3  # retention drops the roots no kept checkpoint uses
    with GlobalStateManager.open(tmp_path) as m:
        conv = m.get_conversation_state("c")
        assert (conv.version, conv.to_dict(), tuple(conv.snapshot().messages)) == final
        assert m.store is not None
        _check_stored(m.store, conv.ref, seen)
        assert not m.recovery_reports or all(r.clean for r in m.recovery_reports)


def test_a_fork_and_its_source_go_on_with_checkpoints_of_their_own(tmp_path: Path) -> None:
    seen: Seen = {}
    fork_seen: Seen = {}
    with GlobalStateManager.open(tmp_path, checkpoint_every=4) as m:
        conv = m.get_conversation_state("c")
        for i in range(10):
            conv.add_message(_message(i))
            _seen(conv, seen)
        fork = m.fork(conv.ref, "conversation:c@8", "f")
        _seen(fork, fork_seen)
        for i in range(10, 30):
            conv.add_message(_message(i))
            fork.set("i", i)
            fork.add_message(_message(-i))
            _seen(conv, seen)
            _seen(fork, fork_seen)
        assert m.store is not None
        _check_stored(m.store, conv.ref, seen)
        _check_stored(m.store, fork.ref, fork_seen)
    with GlobalStateManager.open(tmp_path) as m:
        assert tuple(m.get_conversation_state("f").snapshot().messages) == fork_seen[max(fork_seen)][1]


def test_saves_from_other_threads_racing_the_actor_rebuild_what_was_published(tmp_path: Path) -> None:
    """Checkpoints built on the caller's thread and on the actor's, at once, on one chain."""
    with GlobalStateManager.open(tmp_path, checkpoint_every=5, keep_checkpoints=50) as m:
        conv = m.get_conversation_state("c")
        stop = threading.Event()
        saved: list[str] = []

        def saver() -> None:
            while not stop.is_set():
                saved.append(m.save_checkpoint(conv.ref))

        threads = [threading.Thread(target=saver) for _ in range(2)]
        for t in threads:
            t.start()
        try:
            for i in range(300):  # commit i (version i + 1): message i, and key k<i % 7> = i
                conv.apply(TransitionBatch().add_message(_message(i)).update_state(f"k{i % 7}", i))
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert saved
        store = m.store
        assert store is not None
        for info in store.checkpoints(conv.ref):
            v = info.version
            state = store.checkpoint(conv.ref, v).state
            expected = {f"k{j % 7}": j for j in range(v)}
            assert dict(state.values.items()) == expected and len(state.messages) == v
            assert tuple(state.messages) == tuple(_message(j) for j in range(v))


def test_pipelined_requests_in_sync_mode_checkpoint_incrementally(tmp_path: Path) -> None:
    """Group commit: checkpoints of staged commits are built before their group is durable."""

    async def flood(conv: Any) -> None:
        await asyncio.gather(*(conv.aapply(TransitionBatch().add_message(_message(i))) for i in range(400)))

    with GlobalStateManager.open(tmp_path, checkpoint_every=7) as m:
        conv = m.get_conversation_state("c")
        asyncio.run(flood(conv))
        messages = tuple(conv.snapshot().messages)
        assert len(messages) == 400
        assert m.store is not None
        for info in m.store.checkpoints(conv.ref):
            stored = m.store.checkpoint(conv.ref, info.version).state.messages
            assert tuple(stored) == messages[: info.version]
        assert len(_roots(m.store)) == 1  # one chain: every checkpoint built on the one before
    with GlobalStateManager.open(tmp_path) as m:
        assert tuple(m.get_conversation_state("c").snapshot().messages) == messages


def test_a_checkpoint_whose_base_is_gone_is_written_in_full(tmp_path: Path) -> None:
    """The base chunk a checkpoint would build on was lost (as after a failed transaction).

    The check inside the write transaction finds it missing and writes the checkpoint in
    full (a new root) instead of one that refers to nothing.
    """
    with GlobalStateManager.open(tmp_path, checkpoint_every=10) as m:
        conv = m.get_conversation_state("c")
        for i in range(20):
            conv.add_message(_message(i))
        store = m.store
        assert store is not None
        prefix = store.layout.ref_key(conv.ref)

        def drop_chunks(t: Any) -> None:
            for key in t.keys_in("chunks", prefix):
                t.delete("chunks", key)

        store.submit([drop_chunks], wait=True)
        with pytest.raises(CheckpointCorruptError, match="reach"):
            store.checkpoint(conv.ref, 20)
        for i in range(20, 30):
            conv.add_message(_message(i))
        assert tuple(store.checkpoint(conv.ref, 30).state.messages) == tuple(_message(i) for i in range(30))
    with GlobalStateManager.open(tmp_path) as m:
        assert len(m.get_conversation_state("c").snapshot().messages) == 30


def test_a_long_log_is_chunked_and_a_huge_values_map_is_written_as_deltas(tmp_path: Path) -> None:
    with GlobalStateManager.open(tmp_path, checkpoint_every=50) as m:
        conv = m.get_conversation_state("c")
        conv.update({f"key{i}": "v" * 50 for i in range(2_000)})
        for i in range(2 * CHUNK_MESSAGES + 48):
            conv.apply(TransitionBatch().add_message(i).update_state(f"key{i % 2000}", i))
        store = m.store
        assert store is not None
        before = store.bytes_put
        for i in range(50):
            conv.set("key7", i)
        # one checkpoint in those 50 commits: its values record is a delta of one key, not 2,000
        assert store.bytes_put - before < 50 * 200 + 2_000
        newest = store.checkpoints(conv.ref)[0].version
        assert newest > conv.version - 50
        state = store.checkpoint(conv.ref, newest).state
        assert dict(state.values.items()) == {**conv.to_dict(), "key7": state.values["key7"]}
    with GlobalStateManager.open(tmp_path) as m:
        assert len(m.get_conversation_state("c").snapshot().messages) == 2 * CHUNK_MESSAGES + 48


def test_damaged_chunks_and_values_records_raise_typed_errors(tmp_path: Path) -> None:
    ref = ScopeRef("conversation", "c")
    with GlobalStateManager.open(tmp_path, checkpoint_every=10, keep_checkpoints=2) as m:
        conv = m.get_conversation_state("c")
        for i in range(45):
            conv.apply(TransitionBatch().add_message(_message(i)).update_state("i", i))
    env = lmdb.open(str(tmp_path / "data"), max_dbs=12)
    try:
        with env.begin(write=True, db=env.open_db(b"kv")) as txn:
            key, raw = next(iter(txn.cursor()))
            damaged = bytearray(raw)
            damaged[len(damaged) // 2] ^= 0xFF
            txn.put(key, bytes(damaged))
    finally:
        env.close()
    store = Store(tmp_path, read_only=True)
    try:
        with pytest.raises(CheckpointCorruptError, match="checksum"):
            store.checkpoint(ref, 30)
        with pytest.raises(CheckpointCorruptError, match="no readable checkpoint"):
            store.load(ref, LINEAGE)
    finally:
        store.close()
    env = lmdb.open(str(tmp_path / "data"), max_dbs=12)
    try:  # a chunk that claims another start than the one before it ends at
        with env.begin(write=True, db=env.open_db(b"chunks")) as txn:
            keys = [bytes(k) for k, _v in txn.cursor()]
            txn.put(keys[1], txn.get(keys[0]))
    finally:
        env.close()
    store = Store(tmp_path, read_only=True)
    try:
        with pytest.raises(CheckpointCorruptError):
            store.checkpoint(ref, 40)
    finally:
        store.close()


def test_a_store_with_full_checkpoints_from_before_format_2_opens_and_goes_on(tmp_path: Path) -> None:
    """Full CheckpointRecords (what the code before format 2 wrote) are read, restored and retained."""
    ref = ScopeRef("conversation", "c")
    with GlobalStateManager.open(tmp_path, checkpoint_every=1_000_000) as m:
        conv = m.get_conversation_state("c")
        for i in range(25):
            conv.apply(TransitionBatch().add_message(_message(i)).update_state("i", i))
        store = m.store
        assert store is not None
        states = {v: store.load(ref, LINEAGE, upto=v)[0] for v in (10, 20)}
        for v, state in states.items():
            key = store.layout.versioned_key(ref, v)
            full = CheckpointRecord(state, f"old {v}", 1.0)
            raw = store.codec.encode_checkpoint(full, place=b"ckpt/" + key)

            def put(t: Any, k: bytes = key, r: bytes = raw) -> None:
                t.put("ckpt", k, r)
                t.delete("meta", b"format")  # as a plaintext store of format 1 had no meta record

            store.submit([put], wait=True)
    with GlobalStateManager.open(tmp_path, checkpoint_every=10, keep_checkpoints=3) as m:
        assert m.store is not None
        assert msgpack.unpackb(m.store._get("meta", b"format"))["format"] == 3  # the newest format
        conv = m.get_conversation_state("c")
        _state, report = m.store.load(ref, LINEAGE)
        assert report.checkpoint_version == 20 and conv.version == 25 and report.clean
        assert conv.get("i") == 24 and len(conv.snapshot().messages) == 25
        assert [c.label for c in m.list_checkpoints(ref)] == ["old 20", "old 10"]
        m.restore(ref, "conversation:c@10")  # version 26
        for i in range(14):
            conv.add_message(_message(100 + i))  # checkpoints at 30 and 40 in format 2
        expected = (conv.to_dict(), tuple(conv.snapshot().messages))
        assert [c.version for c in m.list_checkpoints(ref)] == [40, 30, 20]
        assert m.load_checkpoint(ref, "conversation:c@20").get_state("i") == 19
    with GlobalStateManager.open(tmp_path) as m:
        conv = m.get_conversation_state("c")
        assert (conv.to_dict(), tuple(conv.snapshot().messages)) == expected


def test_rekey_copies_the_chain_sealed_under_the_new_key(tmp_path: Path) -> None:
    ring_a = Keyring({"a": b"a" * 32}, active="a")
    ring_b = Keyring({"b": b"b" * 32}, active="b")
    seen: Seen = {}
    with GlobalStateManager.open(tmp_path, encryption=ring_a, checkpoint_every=5) as m:
        conv = m.get_conversation_state("secret-conv")
        for i in range(33):
            conv.apply(TransitionBatch().add_message({"text": f"secret-message-{i}"}).update_state("i", i))
            _seen(conv, seen)
    rekey(tmp_path, ring_b, ring_a)
    raw = (tmp_path / "data" / "data.mdb").read_bytes()
    assert b"secret-message" not in raw and b"secret-conv" not in raw
    with GlobalStateManager.open(tmp_path, encryption=ring_b) as m:
        conv = m.get_conversation_state("secret-conv")
        assert conv.version == 33 and conv.get("i") == 32
        assert m.store is not None
        assert _check_stored(m.store, conv.ref, seen) == 3
    assert len(_roots_at(tmp_path, ring_b)) == 1  # the copy shares chunks as the source did


# -- the compact commit record -------------------------------------------------------------------


def _commit_at(store: Store, ref: ScopeRef, version: int) -> tuple[bytes, bytes]:
    key = store.layout.versioned_key(ref, version)
    return key, b"log/" + key


def test_commit_records_of_the_dict_form_still_replay(tmp_path: Path) -> None:
    """A batch commit written in the form before the compact one (cattrs' dict) decodes and replays."""
    ref = ScopeRef("conversation", "c")
    with GlobalStateManager.open(tmp_path) as m:
        conv = m.get_conversation_state("c")
        conv.apply(TransitionBatch().add_message("a").update_state("k", {"x": [1, 2]}))
        conv.apply(TransitionBatch().add_message("b").delete_state("k"))
        store = m.store
        assert store is not None
        for v in (1, 2):
            record = store.commit_record(ref, v)
            key, where = _commit_at(store, ref, v)
            old = store.codec.pack(store.codec.unstructure(record), where)
            assert "c" not in store.codec.unpack(old, place=where)
            assert store.codec.decode_commit(old, place=where) == record

            def put(t: Any, k: bytes = key, r: bytes = old) -> None:
                t.put("log", k, r)

            store.submit([put], wait=True)
    with GlobalStateManager.open(tmp_path) as m:
        conv = m.get_conversation_state("c")
        assert conv.version == 2 and tuple(conv.snapshot().messages) == ("a", "b") and conv.to_dict() == {}


@pytest.mark.parametrize(
    "body",
    [
        ("batch", "2", "c-1", 1.0, None, ()),
        ("reset", 2, "c-1", 1.0, None, ()),
        ("batch", 2, "c-1", 1.0, None, (("no such type", {}, {}),)),
        ("batch", 2, "c-1", 1.0, None, (("add_message", "not a mapping", {}),)),
        ("batch", 2, "c-1"),
    ],
    ids=["version", "kind", "transition type", "data", "short"],
)
def test_a_compact_commit_that_does_not_hold_a_batch_is_a_typed_error(tmp_path: Path, body: Any) -> None:
    """Checksum-valid but malformed: decoding raises CheckpointCorruptError and replay stops there."""
    ref = ScopeRef("conversation", "c")
    with GlobalStateManager.open(tmp_path) as m:
        conv = m.get_conversation_state("c")
        conv.add_message("a")
        conv.add_message("b")
        store = m.store
        assert store is not None
        key, where = _commit_at(store, ref, 2)
        raw = store.codec.pack({"c": body}, where)
        with pytest.raises(CheckpointCorruptError, match="valid CommitRecord"):
            store.codec.decode_commit(raw, place=where)

        def put(t: Any) -> None:
            t.put("log", key, raw)

        store.submit([put], wait=True)
        state, report = store.load(ref, LINEAGE)
        assert state.version == 1 and "commit v2" in report.skipped[0]


def test_a_save_of_an_older_state_never_becomes_a_base_past_unrecorded_commits(tmp_path: Path) -> None:
    """The race, made deterministic: a save reads the state at v, the actor commits v + 1, the save
    then writes v. Before the tracker noted every commit, that save became the chain's base while
    v + 1's change was recorded nowhere, and the next checkpoint's delta lost it (failed here with
    "k": 1 instead of 2 at v + 2)."""
    with GlobalStateManager.open(tmp_path, checkpoint_every=1_000) as m:
        conv = m.get_conversation_state("c")
        filler = {f"f{i}": "x" * 40 for i in range(50)}  # so the next values record is a delta
        conv.update({**filler, "k": 1})
        durability, cell = m._durability, m._cell(conv.ref)  # the race's two sides
        state_v = cell.state
        conv.set("k", 2)  # v + 1, committed after the save read its state
        op = durability._checkpoint_op(cell, CheckpointRecord(state_v, "late save", 0.0), None)
        assert m.store is not None
        m.store.submit([op], wait=True)
        conv.set("other", 3)
        m.save_checkpoint(conv.ref)
        state = m.store.checkpoint(conv.ref, conv.version).state
        assert dict(state.values.items()) == {**filler, "k": 2, "other": 3}


def test_a_scope_reloaded_from_the_store_goes_on_with_the_same_chunks(tmp_path: Path) -> None:
    """After a reopen, the next checkpoint writes only the new messages, on the loaded root.

    Without the load's hint it would start a new root and write the whole log again:
    checked as the roots (1) and the bytes the checkpoint put (well under the log's size).
    """
    seen: Seen = {}
    with GlobalStateManager.open(tmp_path, checkpoint_every=100) as m:
        conv = m.get_conversation_state("c")
        for i in range(250):
            conv.apply(TransitionBatch().add_message(_message(i)).update_state(f"k{i % 5}", i))
            _seen(conv, seen)
    for round_ in range(2):
        with GlobalStateManager.open(tmp_path, checkpoint_every=100) as m:
            conv = m.get_conversation_state("c")
            store = m.store
            assert store is not None
            before = store.bytes_put
            for i in range(100):
                conv.apply(TransitionBatch().add_message(_message(1000 * round_ + i)).update_state("r", i))
                _seen(conv, seen)
            # the 100 commit records and heads take 31,588 B; the checkpoint's chunk of 100 messages
            # about 3.8 KB more (the whole log of 350 again: 10.5 KB)
            assert store.bytes_put - before < 32_000 + 6_000
            assert len(_roots(store)) == 1
            _check_stored(store, conv.ref, seen)
    with GlobalStateManager.open(tmp_path) as m:
        conv = m.get_conversation_state("c")
        assert (conv.to_dict(), tuple(conv.snapshot().messages)) == seen[450]


def test_a_reload_whose_replay_holds_a_reset_starts_a_new_root(tmp_path: Path) -> None:
    """The log replayed on top of the checkpoint holds a restore: the state does not extend the
    checkpoint's messages, so the next checkpoint must not build on its root."""
    seen: Seen = {}
    with GlobalStateManager.open(tmp_path, checkpoint_every=100) as m:
        conv = m.get_conversation_state("c")
        for i in range(150):
            conv.add_message(_message(i))
            _seen(conv, seen)
        m.restore(conv.ref, 50)  # version 151: 50 messages, then different ones
        _seen(conv, seen)
        for i in range(10):
            conv.add_message(_message(-i))
            _seen(conv, seen)
    with GlobalStateManager.open(tmp_path, checkpoint_every=100) as m:
        conv = m.get_conversation_state("c")
        for i in range(40):
            conv.add_message(_message(-100 - i))  # versions 162-201: the checkpoint at 200
            _seen(conv, seen)
        assert m.store is not None
        assert len(_roots(m.store)) == 2
        assert _check_stored(m.store, conv.ref, seen) == 2
    with GlobalStateManager.open(tmp_path) as m:
        assert tuple(m.get_conversation_state("c").snapshot().messages) == seen[max(seen)][1]


def test_a_conversation_evicted_between_its_turns_keeps_one_root(tmp_path: Path) -> None:
    """Idle eviction between turns (virtual scopes): each reactivation loads from the store, and
    its next checkpoint builds on the chunks already there instead of writing the log again."""
    seen: Seen = {}
    with GlobalStateManager.open(tmp_path, checkpoint_every=10, max_live_actors=None) as m:
        for turn in range(12):
            conv = m.get_conversation_state("c")
            for i in range(7):
                conv.add_message(_message(100 * turn + i))
                _seen(conv, seen)
            assert m.passivate_idle(0) >= 1
            assert m.stats()["resident_scopes"] == 0
        assert m.store is not None
        assert len(_roots(m.store)) == 1
        _check_stored(m.store, ScopeRef("conversation", "c"), seen)
        conv = m.get_conversation_state("c")
        assert tuple(conv.snapshot().messages) == seen[84][1]
