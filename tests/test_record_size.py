"""The record limit can neither wedge a scope nor quarantine what a store holds (issue 28, item 7).

Most tests scale the limit down (``Codec(max_record_bytes=1 MiB)``) so that
they stay quick; the in-memory/store agreement and the reopen with the default
codec use the default 64 MiB. Each test whose docstring starts "Old code:"
failed on the code before this work (checked with PYTHONPATH pointing at a
checkout of aa8bb61, and again at main's 77cc008, run from outside this
checkout); the docstring says how.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import lmdb
import pytest
import zstandard

from victor_actors import (
    GlobalStateManager,
    ScopeRef,
    StateTransition,
    TransitionBatch,
    TransitionValidationError,
)
from victor_actors.lowlevel import Codec

MIB = 1 << 20
SMALL = Codec(max_record_bytes=MIB)


def _blob(n: int, seed: int) -> bytes:
    """``n`` bytes that do not compress (the limit counts bytes before compression anyway)."""
    return os.urandom(n - 8) + struct.pack(">Q", seed)


def _stored_sizes(path: Path) -> dict[str, int]:
    """The largest body (before compression) of any record in each database of the store."""
    env = lmdb.open(str(path / "data"), max_dbs=12, readonly=True, lock=False)
    out: dict[str, int] = {}
    try:
        for db in ("log", "ckpt", "chunks", "kv", "scopes"):
            with env.begin(db=env.open_db(db.encode())) as txn:
                for _key, raw in txn.cursor():
                    if len(raw) < 9 or raw[:2] != b"VA":
                        continue  # a head record
                    body = raw[9:]
                    size = zstandard.frame_content_size(body) if raw[2] & 1 else len(body)
                    out[db] = max(out.get(db, 0), size)
    finally:
        env.close()
    return out


def test_values_that_each_fit_never_wedge_the_scope_at_its_next_checkpoint(tmp_path: Path) -> None:
    """Old code: the fifth commit (a one-integer set) was refused, and every commit after it,
    because the checkpoint due with it held the four values in one record past the limit."""
    values = {f"big{i}": _blob(300 * 1024, i) for i in range(4)}
    with GlobalStateManager.open(tmp_path, codec=SMALL, checkpoint_every=5) as manager:
        conv = manager.get_conversation_state("c")
        for key, value in values.items():
            conv.set(key, value)
        assert conv.set("n", 1).version == 5
        assert [c.version for c in manager.list_checkpoints(conv.ref)] == [5]
        for i in range(6):
            conv.set("n", i)  # and the next checkpoint (at 10): a delta, then in full again
        assert manager.load_checkpoint(conv.ref).get_state("big3") == values["big3"]
    assert max(_stored_sizes(tmp_path).values()) <= MIB
    with GlobalStateManager.open(tmp_path, codec=SMALL) as manager:
        conv = manager.scope("conversation:c")
        assert conv.version == 11 and not manager.recovery_reports
        assert all(conv.get(k) == v for k, v in values.items())


def test_a_long_log_of_large_messages_is_cut_into_chunks_that_fit(tmp_path: Path) -> None:
    """Old code: the commit due a checkpoint was refused: 256 messages of 10 KiB in one chunk."""
    messages = [{"role": "user", "content": _blob(10 * 1024, i).hex()[: 10 * 1024]} for i in range(260)]
    with GlobalStateManager.open(tmp_path, codec=SMALL, checkpoint_every=26) as manager:
        conv = manager.get_conversation_state("c")
        for at in range(0, 260, 10):  # 26 commits of 10 messages
            conv.apply(TransitionBatch().add_messages(messages[at : at + 10]))
        assert [c.version for c in manager.list_checkpoints(conv.ref)] == [26]
    assert max(_stored_sizes(tmp_path).values()) <= MIB
    with GlobalStateManager.open(tmp_path, codec=SMALL) as manager:
        conv = manager.scope("conversation:c")
        assert list(conv.snapshot().messages) == messages
        (report,) = [manager.store.load(conv.ref, conv.snapshot().ancestors)[1]] if manager.store else []
        assert report.checkpoint_version == 26 and report.clean


def test_a_restore_of_a_state_larger_than_one_record_is_written(tmp_path: Path) -> None:
    """Old code: the restore was refused (the whole state in one reset record, past the limit)."""
    values = {f"big{i}": _blob(300 * 1024, i) for i in range(4)}
    with GlobalStateManager.open(tmp_path, codec=SMALL, checkpoint_every=1000) as manager:
        conv = manager.get_conversation_state("c")
        for key, value in values.items():
            conv.set(key, value)
        cid = manager.save_checkpoint(conv.ref, label="four blobs")
        for key in values:
            conv.delete(key)
        manager.restore(conv.ref, cid)
        assert conv.version == 9 and conv.get("big0") == values["big0"]
        conv.set("after", 1)
    assert max(_stored_sizes(tmp_path).values()) <= MIB
    with GlobalStateManager.open(tmp_path, codec=SMALL) as manager:
        conv = manager.scope("conversation:c")
        assert conv.version == 10 and not manager.recovery_reports
        assert all(conv.get(k) == v for k, v in values.items()) and conv.get("after") == 1
        assert manager.state_at(conv.ref, 8).get_state("big0") is None


def test_a_commit_is_never_refused_because_its_checkpoint_cannot_be_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Old code: the fifth commit was refused with the checkpoint's error, and so was every commit
    after it (the scope's small fields, here its capabilities, past the limit in one manifest)."""
    with GlobalStateManager.open(tmp_path, codec=SMALL, checkpoint_every=5) as manager:
        conv = manager.get_conversation_state("c")
        for i in range(3):
            conv.apply(
                TransitionBatch().update_capability(f"cap{i}", _blob(400 * 1024, i).hex()[: 400 * 1024])
            )
        conv.set("n", 0)
        assert conv.set("n", 1).version == 5  # the checkpoint due here does not fit: left out
        assert conv.set("n", 2).version == 6
        assert manager.list_checkpoints(conv.ref) == []
        assert any("no checkpoint at v5" in r.getMessage() for r in caplog.records)
        with pytest.raises(TransitionValidationError, match=f"at most {MIB} bytes"):
            manager.save_checkpoint(conv.ref)  # asked for by name: refused, with the reason
    with GlobalStateManager.open(tmp_path, codec=SMALL) as manager:
        conv = manager.scope("conversation:c")
        assert conv.version == 6 and conv.get("n") == 2 and not manager.recovery_reports


def test_a_store_keeps_the_record_limit_it_was_written_with(tmp_path: Path) -> None:
    """Old code: opened with a codec of a smaller limit, the store skipped the large commit as
    corrupt, reported it, and (writable) moved it to quarantine."""
    value = _blob(int(1.5 * MIB), 1)
    with GlobalStateManager.open(tmp_path, codec=Codec(max_record_bytes=2 * MIB)) as manager:
        conv = manager.get_conversation_state("c")
        conv.set("big", value)
        conv.set("n", 1)
    for read_only in (True, False):
        with GlobalStateManager.open(tmp_path, codec=SMALL, read_only=read_only) as manager:
            conv = manager.scope("conversation:c")
            assert conv.version == 2 and conv.get("big") == value and not manager.recovery_reports
            assert manager.store is not None and manager.store.codec.max_record_bytes == 2 * MIB
    with GlobalStateManager.open(tmp_path, codec=SMALL) as manager:
        conv = manager.scope("conversation:c")
        conv.set("big2", value)  # the store's limit, not the smaller codec's, applies
        assert conv.version == 3


def test_a_store_written_with_a_raised_limit_reopens_with_the_default_codec(tmp_path: Path) -> None:
    """Old code: the 65 MiB commit was skipped as corrupt ("claims to decompress to ... bytes"),
    reported, and moved to quarantine: data lost by configuration."""
    value = b"\x01" * (65 * MIB)
    with GlobalStateManager.open(tmp_path, codec=Codec(max_record_bytes=80 * MIB)) as manager:
        manager.get_conversation_state("c").set("big", value)
    with GlobalStateManager.open(tmp_path) as manager:
        conv = manager.scope("conversation:c")
        assert conv.version == 1 and conv.get("big") == value and not manager.recovery_reports


@pytest.fixture(scope="module")
def too_big() -> TransitionBatch:
    return TransitionBatch().update_state("k", b"\x00" * (64 * MIB))


def test_in_memory_and_durable_managers_refuse_the_same_batch(
    tmp_path: Path, too_big: TransitionBatch
) -> None:
    """Old code: the in-memory manager applied the batch the store refused (64 MiB and a little
    more as one commit record, past the default record limit)."""
    fits = TransitionBatch().update_state("k", b"\x00" * (64 * MIB - 1024))
    with GlobalStateManager.open() as memory, GlobalStateManager.open(tmp_path) as durable:
        for manager in (memory, durable):
            conv = manager.get_conversation_state("c", team_id="t")
            with pytest.raises(TransitionValidationError, match=f"at most {64 * MIB} bytes") as info:
                conv.apply(too_big)
            assert "nothing was applied" in str(info.value) and conv.version == 0
            assert conv.apply(fits).version == 1
            conv.delete("k")
            # a cross-scope batch: each scope's part is one commit record, held to the same limit
            team_part = StateTransition(
                "update_state", {"key": "k", "value": b"\x00" * (64 * MIB), "scope": "team"}
            )
            with pytest.raises(TransitionValidationError, match="at most"):
                conv.apply(TransitionBatch([team_part]).update_state("mine", 1))
            assert conv.version == 2 and manager.scope(ScopeRef("team", "t")).version == 0
