"""Bad input and damaged stores: each test guards one broken promise found by attacking the runtime.

Every test whose docstring starts "Old code:" failed on the code before its fix
(checked against a clone of 4ce72e1, the last commit before this work, with the
imports adjusted to that version's names); the docstring says how it failed there.
The others pin behaviour the fixes must keep.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import threading
import uuid
from pathlib import Path
from typing import Any
from unittest import mock

import lmdb
import pytest

from victor_actors import (
    CheckpointCorruptError,
    GlobalStateManager,
    RunFailedError,
    ScopeAccessError,
    ScopeFailedError,
    ScopeRef,
    StoreLockedError,
    TransitionBatch,
    TransitionValidationError,
)
from victor_actors.lowlevel import Codec, FrozenDict, freeze
from victor_actors.store import ref_key, versioned_key
from victor_actors.testing import Recorder, assert_isolated

SURROGATE = json.loads('"\\ud800"')  # what a JSON config or a LangGraph payload can carry


# -- 1. one tenant cannot stop every team -----------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        lambda b: b.update_state("k", SURROGATE),
        lambda b: b.update_state("k", {"nested": ["ok", SURROGATE]}),
        lambda b: b.update_state("k", {SURROGATE: 1}),
        lambda b: b.add_message({"role": "user", "content": "hi " + SURROGATE}),
    ],
    ids=["value", "nested value", "mapping key", "message"],
)
def test_text_utf8_cannot_encode_is_refused_at_the_edge(bad: Any) -> None:
    """Old code: freeze() let a lone surrogate in; the codec then failed inside the actor."""
    with pytest.raises(TransitionValidationError, match="lone surrogate"):
        bad(TransitionBatch())


def test_a_tenant_writing_bad_data_cannot_make_supervision_give_up_on_global(tmp_path: Path) -> None:
    """Old code: 300 such writes were supervised as crashes and escalated until global gave up."""
    with GlobalStateManager.open(tmp_path) as manager:
        conv = manager.get_conversation_state("tenant", team_id="t")
        for _ in range(300):
            with pytest.raises(TransitionValidationError):
                conv.apply(TransitionBatch().update_state("k", SURROGATE))
        assert manager.stats()["failures"] == 0 and manager.stats()["restarts"] == 0
        assert manager.get_global_state().set("still", "writable").version == 1
        assert manager.get_team_state("other").set("k", 1).version == 1


def test_a_record_the_codec_cannot_write_is_the_callers_error_not_a_crash(tmp_path: Path) -> None:
    """Old code: an encoding failure inside the actor was a ScopeFailedError and a supervised crash."""
    with GlobalStateManager.open(tmp_path, codec=Codec(max_record_bytes=4096)) as manager:
        conv = manager.get_conversation_state("c")
        conv.set("small", 1)
        with pytest.raises(TransitionValidationError, match="at most 4096 bytes"):
            conv.set("big", "x" * 10_000)
        assert conv.version == 1 and "big" not in conv.to_dict()
        assert manager.stats()["failures"] == 0
        assert conv.set("after", 2).version == 2


# -- 2. ids that do not fit ----------------------------------------------------------------------------


@pytest.mark.parametrize("ident", ["x" * 401, "x" * 505, "x" * 520, "\u00e9" * 250, "x" * 70_000, SURROGATE])
def test_a_scope_id_that_cannot_be_a_store_key_is_refused_at_the_edge(tmp_path: Path, ident: str) -> None:
    """Old code: 505-508 byte ids were created and then every commit failed; 70,000 gave struct.error."""
    with GlobalStateManager.open(tmp_path) as manager:
        with pytest.raises(TransitionValidationError, match="scope id"):
            manager.get_conversation_state(ident)
        assert list(manager.scopes()) == [ScopeRef("global", "global")]


def test_the_longest_allowed_id_commits_and_reopens(tmp_path: Path) -> None:
    ident = "\u00e9" * 200  # 400 bytes in UTF-8
    with GlobalStateManager.open(tmp_path, checkpoint_every=2) as manager:
        conv = manager.get_conversation_state(ident)
        for i in range(5):
            conv.set("i", i)
    with GlobalStateManager.open(tmp_path) as manager:
        assert manager.scope(ScopeRef("conversation", ident)).get("i") == 4


# -- 3. the depth limit and immutability cannot be walked around ----------------------------------------


def _nested(levels: int) -> dict[str, Any]:
    root: dict[str, Any] = {}
    node = root
    for _ in range(levels - 1):
        node["a"] = {}
        node = node["a"]
    return root


def test_frozen_values_read_back_are_checked_for_depth_when_wrapped_again(tmp_path: Path) -> None:
    """Old code: a FrozenDict was trusted whatever its depth; 400 levels got in, the checkpoint failed."""
    with GlobalStateManager.open(tmp_path, checkpoint_every=3) as manager:
        conv = manager.get_conversation_state("c")
        conv.set("deep", _nested(60))
        conv.set("deep", {"w": {"w": conv.get("deep")}})  # 62 levels: fine
        assert conv.version == 2
        for _ in range(3):
            with pytest.raises(TransitionValidationError, match="deeper than"):
                conv.set("deep", {"w": {"w": {"w": conv.get("deep")}}})  # 65: refused, also via freeze
            with pytest.raises(TransitionValidationError, match="deeper than"):
                freeze([[[conv.get("deep")]]])
        conv.set("more", 1)  # version 3: a checkpoint of the whole state
    with GlobalStateManager.open(tmp_path) as manager:
        assert not manager.recovery_reports and manager.scope("conversation:c").version == 3


class Sneaky(str):
    """A str whose methods lie: what freeze() must never call."""

    def __radd__(self, other: object) -> Any:
        return ["a", "list"]

    def __str__(self) -> Any:
        return 42

    def __hash__(self) -> int:
        return str.__hash__(self)


def test_a_str_subclass_is_frozen_by_type_as_a_value_and_as_a_key(tmp_path: Path) -> None:
    """Old code: ``"" + value`` let __radd__ smuggle a list in, and a key became an int on reopen."""
    with GlobalStateManager.open(tmp_path) as manager:
        conv = manager.get_conversation_state("c")
        conv.update({"v": Sneaky("text"), "m": {Sneaky("key"): 1}})
        snap = conv.snapshot()
        assert snap.state["v"] == "text" and type(snap.state["v"]) is str
        (key,) = snap.state["m"].keys()
        assert type(key) is str and key == "key"
    with GlobalStateManager.open(tmp_path) as manager:
        assert not manager.recovery_reports
        assert manager.scope("conversation:c").to_dict() == {"v": "text", "m": {"key": 1}}


# -- 4. garbage in batch.transitions ---------------------------------------------------------------------


@pytest.mark.parametrize("junk", ["not a transition", 42, None, {"transition_type": "add_message"}])
def test_garbage_in_a_batchs_transition_list_is_refused_before_anything_applies(junk: object) -> None:
    """Old code: a bare AttributeError at apply."""
    with GlobalStateManager.open() as manager:
        conv = manager.get_conversation_state("c")
        batch = TransitionBatch().add_message("m")
        batch.transitions.append(junk)  # type: ignore[arg-type]
        with pytest.raises(TransitionValidationError, match="item 1 of the batch") as info:
            conv.apply(batch)
        assert info.value.index == 1
        batch.transitions = "abc"  # type: ignore[assignment]
        with pytest.raises(TransitionValidationError, match="must be a list"):
            conv.apply(batch)
        assert conv.version == 0


# -- 5. the map grows as promised ----------------------------------------------------------------------


def test_a_tiny_map_grows_to_take_a_large_value(tmp_path: Path) -> None:
    """Old code: "could not grow enough" after eight doublings, the last size never tried."""
    with GlobalStateManager.open(tmp_path, map_size=64 * 1024) as manager:
        conv = manager.get_conversation_state("c")
        conv.set("big", os.urandom(10 * 1024 * 1024))
        assert conv.version == 1
    with GlobalStateManager.open(tmp_path) as manager:
        assert len(manager.scope("conversation:c").get("big")) == 10 * 1024 * 1024


def test_the_map_does_not_grow_while_another_thread_has_a_read_transaction_open(tmp_path: Path) -> None:
    """Old code: set_mapsize ran while other threads had read transactions open, which LMDB forbids
    (raw lmdb errors by the thousand under load). Here a reader holds a transaction open, a commit
    that needs a bigger map waits for it, and both then finish cleanly."""
    with GlobalStateManager.open(tmp_path, map_size=64 * 1024) as manager:
        conv = manager.get_conversation_state("c")
        conv.set("seed", 0)
        store = manager.store
        assert store is not None
        inside, release = threading.Event(), threading.Event()
        seen: list[object] = []

        def reader() -> None:
            with store.gate.reading(), store.env.begin() as txn:  # a read transaction, held open
                inside.set()
                release.wait(10)
                seen.append(txn.stat(store.dbs["log"])["entries"])

        holder = threading.Thread(target=reader)
        holder.start()
        assert inside.wait(10)
        done = threading.Event()
        writer = threading.Thread(
            target=lambda: (conv.set("big", os.urandom(512 * 1024), timeout=30), done.set())
        )
        writer.start()
        assert not done.wait(0.5), "the map grew while a read transaction was open"
        release.set()
        holder.join()
        writer.join()
        assert done.is_set() and conv.version == 2 and len(seen) == 1  # the read finished cleanly
        assert store.env.info()["map_size"] > 64 * 1024


def test_readers_in_other_threads_see_no_lmdb_error_while_the_map_grows(tmp_path: Path) -> None:
    """Old code: raw lmdb errors in the readers. Readers keep reading while the map doubles nine times."""
    errors: list[BaseException] = []
    stop = threading.Event()
    with GlobalStateManager.open(tmp_path, map_size=64 * 1024, checkpoint_every=1) as manager:
        conv = manager.get_conversation_state("c")
        conv.set("seed", 0)
        store = manager.store
        assert store is not None

        def read() -> None:
            while not stop.wait(0.001):  # paced: a reader that spins would starve the writer of the GIL
                try:
                    store.scope_records()
                    store.checkpoints(conv.ref)
                    store.log_versions(conv.ref)
                except BaseException as exc:
                    errors.append(exc)
                    return

        readers = [threading.Thread(target=read) for _ in range(3)]
        for t in readers:
            t.start()
        try:
            for i in range(9):  # each write doubles the map or more
                conv.set("blob", os.urandom(64 * 1024 * (2**i) // 16), timeout=60)
        finally:
            stop.set()
            for t in readers:
                t.join()
    assert not errors, errors[:3]


# -- 6. damage on disk ---------------------------------------------------------------------------------


def _make_store(path: Path, conversations: int = 2, commits: int = 5) -> None:
    with GlobalStateManager.open(path, checkpoint_every=1000) as manager:
        for c in range(conversations):
            conv = manager.get_conversation_state(f"c{c}", team_id="t")
            for i in range(commits):
                conv.apply(TransitionBatch().add_message(f"c{c} m{i}").update_state("i", i))


def _env(path: Path) -> lmdb.Environment:
    return lmdb.open(str(path / "data"), max_dbs=10, map_size=1 << 30)


def _move(path: Path, db: str, old: bytes, new: bytes) -> None:
    env = _env(path)
    try:
        handle = env.open_db(db.encode())
        with env.begin(write=True, db=handle) as txn:
            raw = txn.get(old)
            assert raw is not None
            txn.delete(old)
            txn.put(new, raw)
    finally:
        env.close()


def _flip(key: bytes, at: int) -> bytes:
    return key[:at] + bytes([key[at] ^ 0x01]) + key[at + 1 :]


def test_a_truncated_data_file_is_refused_with_a_typed_error_not_sigbus(tmp_path: Path) -> None:
    """Old code: the process died of SIGBUS (here: the child's return code was -7)."""
    _make_store(tmp_path, conversations=20, commits=20)
    data = tmp_path / "data" / "data.mdb"
    size = data.stat().st_size
    with open(data, "r+b") as f:
        f.truncate(size // 2)
    script = textwrap.dedent(
        f"""
        from victor_actors import CheckpointCorruptError, GlobalStateManager
        for read_only in (True, False):
            try:
                GlobalStateManager.open({str(tmp_path)!r}, read_only=read_only)
            except CheckpointCorruptError as exc:
                assert "truncated" in str(exc), exc
            else:
                raise SystemExit("opened a truncated store")
        print("refused")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "refused" in done.stdout, (done.returncode, done.stderr[-2000:])


def test_a_flipped_byte_in_a_scope_records_key_does_not_bring_the_scope_back_empty(tmp_path: Path) -> None:
    """Old code: the scope came back empty at version 0 with no report, and its next commit
    overwrote acknowledged history."""
    _make_store(tmp_path)
    key = ref_key(ScopeRef("conversation", "c0"))
    _move(tmp_path, "scopes", key, _flip(key, 3))  # the id's first byte: "c0" becomes "b0"
    with GlobalStateManager.open(tmp_path) as manager:
        with pytest.raises(CheckpointCorruptError, match="no readable scope record"):
            manager.get_conversation_state("c0", team_id="t")
        assert manager.scope("conversation:c1").version == 5  # the other one is untouched


def test_a_flipped_byte_in_the_key_of_the_last_commit_is_reported(tmp_path: Path) -> None:
    """Old code: the scope loaded cleanly at version 4, without its acknowledged fifth commit."""
    _make_store(tmp_path)
    ref = ScopeRef("conversation", "c0")
    key = versioned_key(ref, 5)
    _move(tmp_path, "log", key, _flip(key, 4))  # into the id: the record leaves the scope's range
    with GlobalStateManager.open(tmp_path) as manager:
        conv = manager.scope(ref)
        assert conv.version == 4
        (report,) = [r for r in manager.recovery_reports if r.ref == ref]
        assert not report.clean and report.latest_stored_version == 5
        assert any("head version is 5" in s for s in report.skipped), report.skipped


def test_two_conversations_records_swapped_at_the_same_versions_are_caught(tmp_path: Path) -> None:
    """Old code: each conversation loaded the other's messages without complaint."""
    _make_store(tmp_path)
    a, b = versioned_key(ScopeRef("conversation", "c0"), 3), versioned_key(ScopeRef("conversation", "c1"), 3)
    env = _env(tmp_path)
    try:
        log = env.open_db(b"log")
        with env.begin(write=True, db=log) as txn:
            ra, rb = txn.get(a), txn.get(b)
            txn.put(a, rb)
            txn.put(b, ra)
    finally:
        env.close()
    with GlobalStateManager.open(tmp_path) as manager:
        for name in ("c0", "c1"):
            snap = manager.scope(f"conversation:{name}").snapshot()
            assert all(m.startswith(name) for m in snap.messages), snap.messages
            assert snap.version == 2
        assert {r.ref.id for r in manager.recovery_reports} == {"c0", "c1"}
        assert all("checksum mismatch" in " ".join(r.skipped) for r in manager.recovery_reports)


def test_random_damage_gives_typed_errors_or_reports_never_wrong_states_or_raw_errors(tmp_path: Path) -> None:
    """Old code: silently wrong states, raw lmdb.CorruptedError, and crashes. In a child process:
    each round flips bytes of a copy of the store and reads every scope."""
    _make_store(tmp_path, conversations=3, commits=12)
    script = textwrap.dedent(
        f"""
        import random, shutil, tempfile, os
        from victor_actors import GlobalStateManager, VictorActorsError, ScopeRef
        src = {str(tmp_path)!r}
        expected = {{f"c{{c}}": [f"c{{c}} m{{i}}" for i in range(12)] for c in range(3)}}
        rng = random.Random(7)
        outcomes = {{"typed": 0, "clean": 0, "reported": 0}}
        for round_ in range(25):
            dst = tempfile.mkdtemp()
            shutil.copytree(src, dst, dirs_exist_ok=True)
            data = os.path.join(dst, "data", "data.mdb")
            raw = bytearray(open(data, "rb").read())
            for _ in range(rng.randint(1, 6)):
                at = rng.randrange(2 * 4096, len(raw))  # past the meta pages
                raw[at] ^= 1 << rng.randrange(8)
            open(data, "wb").write(raw)
            try:
                with GlobalStateManager.open(dst, read_only=True) as m:
                    for name, messages in expected.items():
                        try:
                            snap = m.scope(ScopeRef("conversation", name)).snapshot()
                        except VictorActorsError:
                            outcomes["typed"] += 1
                            continue
                        got = list(snap.messages)
                        reported = any(r.ref.id == name for r in m.recovery_reports)
                        assert got == messages[: len(got)], (round_, name, got)
                        if len(got) < len(messages):
                            assert reported, (round_, name, len(got))
                        outcomes["reported" if reported else "clean"] += 1
            except VictorActorsError:
                outcomes["typed"] += 1
            shutil.rmtree(dst)
        print(outcomes)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (done.returncode, done.stdout[-1000:], done.stderr[-3000:])


# -- 7. the owner lock cannot be walked around ------------------------------------------------------------


def test_deleting_the_owner_lock_file_does_not_let_a_second_writer_in(tmp_path: Path) -> None:
    """Old code: after ``rm owner.lock`` a second manager opened the store for writing."""
    with GlobalStateManager.open(tmp_path) as owner:
        owner.get_team_state("t").set("k", 1)
        (tmp_path / "owner.lock").unlink()
        with pytest.raises(StoreLockedError):
            GlobalStateManager.open(tmp_path)
        script = f"from victor_actors import GlobalStateManager; GlobalStateManager.open({str(tmp_path)!r})"
        other = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
        assert other.returncode != 0 and "StoreLockedError" in other.stderr  # nor from another process
    with GlobalStateManager.open(tmp_path) as again:  # released on close
        assert again.scope("team:t").version == 1


# -- 8. run rollback and NaN ------------------------------------------------------------------------------


def test_a_failed_runs_nan_write_is_rolled_back_not_reported_as_another_writers() -> None:
    """Old code: rollback compared with ==, so the run's NaN looked changed and stayed."""
    with GlobalStateManager.open() as manager:
        conv = manager.get_conversation_state("c")
        conv.set("score", 1.0)
        with pytest.raises(RunFailedError) as info:
            with manager.run("c", timeout=10):
                conv.update({"score": math.nan, "nested": {"x": math.nan}})
                raise RuntimeError("the agent failed")
        assert conv.to_dict() == {"score": 1.0}
        assert info.value.rollback_report.conflicts == ()


# -- 10. smaller -----------------------------------------------------------------------------------------


def test_a_record_claiming_to_decompress_to_hundreds_of_mb_is_refused(tmp_path: Path) -> None:
    """Old code: it was decompressed in full (hundreds of MB) before anything was checked."""
    import zlib

    import zstandard

    _make_store(tmp_path, conversations=1, commits=3)
    ref = ScopeRef("conversation", "c0")
    key = versioned_key(ref, 3)
    body = zstandard.ZstdCompressor().compress(b"\0" * (300 * 1024 * 1024))
    head = b"VA" + bytes([1 | 2]) + (1).to_bytes(2, "big")
    place = b"log/" + key
    crc = zlib.crc32(body, zlib.crc32(head, zlib.crc32(place)))
    env = _env(tmp_path)
    try:
        with env.begin(write=True, db=env.open_db(b"log")) as txn:
            txn.put(key, head + crc.to_bytes(4, "big") + body)
    finally:
        env.close()
    with GlobalStateManager.open(tmp_path, read_only=True) as manager:
        assert manager.scope(ref).version == 2
        (report,) = manager.recovery_reports
        assert "decompress" in " ".join(report.skipped)


def test_read_only_managers_refuse_writes_with_scope_access_error(tmp_path: Path) -> None:
    """Old code: save_checkpoint raised ScopeFailedError, and restore and transact wrote to memory."""
    _make_store(tmp_path, conversations=1)
    with GlobalStateManager.open(tmp_path, read_only=True) as manager:
        conv = manager.scope("conversation:c0")
        with pytest.raises(ScopeAccessError, match="read-only"):
            manager.save_checkpoint(conv.ref)
        with pytest.raises(ScopeAccessError, match="read-only"):
            manager.restore(conv.ref, 2)
        with pytest.raises(ScopeAccessError, match="read-only"):
            conv.transact(lambda snap: TransitionBatch().update_state("k", 1))
        assert conv.version == 5


def test_scope_actors_draw_no_uuid4() -> None:
    """Old code: every pykka actor took a uuid4 for its name (LangGraph's tests patch uuid4)."""
    with mock.patch.object(uuid, "uuid4", side_effect=AssertionError("uuid4 was drawn")):
        with GlobalStateManager.open() as manager:
            conv = manager.get_conversation_state("c", workflow_id="wf", team_id="t")
            conv.set("k", 1)
            with manager.run("c", timeout=5):
                conv.set("k", 2)


def test_a_mistyped_parent_can_be_refused_instead_of_created() -> None:
    """Old code: a mistyped workflow id silently created a new workflow under global."""
    with GlobalStateManager.open() as manager:
        manager.get_conversation_state("s", workflow_id="wf-1", team_id="t")
        with pytest.raises(ScopeAccessError, match="create=False"):
            manager.get_conversation_state("s2", workflow_id="wf-l", create=False)
        assert ScopeRef("workflow", "wf-l") not in manager.scopes()
        found = manager.get_conversation_state("s", workflow_id="wf-1", team_id="t", create=False)
        assert found.parent == ScopeRef("workflow", "wf-1")


def test_short_reprs() -> None:
    with GlobalStateManager.open() as manager:
        conv = manager.get_conversation_state("c")
        record = conv.apply(
            TransitionBatch().add_message("m" * 10_000).update_state("k", list(range(10_000)))
        )
        assert repr(ScopeRef("team", "red")) == "ScopeRef('team', 'red')"
        assert len(repr(record)) < 200 and "conversation:c v0->v1" in repr(record)


def test_slow_subscribers_show_in_stats() -> None:
    with GlobalStateManager.open() as manager:
        conv = manager.get_conversation_state("c")
        gate = threading.Event()
        sub = conv.subscribe(lambda _e: gate.wait(5))
        for i in range(5):
            conv.set("k", i)
        assert manager.stats()["events_queued"] >= 3  # the first is being delivered, the rest wait
        gate.set()
        manager.quiesce(5)
        assert manager.stats()["events_queued"] == 0 and manager.stats()["events_published"] == 5
        sub.close()


# -- the testing kit's two modes agree ---------------------------------------------------------------------


def test_assert_isolated_with_a_recorder_catches_data_copied_through_a_request() -> None:
    """Old code: the recorder form passed a leak that the recorder-free form caught."""
    with GlobalStateManager.open() as manager, Recorder(manager) as recorder:
        a = manager.get_conversation_state("a")
        b = manager.get_conversation_state("b")
        a.add_message({"role": "user", "content": "my card number is 4242"})
        b.add_message({"role": "user", "content": "continue"})
        a.add_message({"role": "user", "content": "continue"})  # equal content, sent on its own: fine
        assert_isolated(recorder, a, b)
        secret = a.snapshot().messages[0]
        b.add_message(secret)  # an orchestrator bug: a's message copied into b's request
        with pytest.raises(AssertionError, match="4242"):
            assert_isolated(manager, a, b)  # by value
        with pytest.raises(AssertionError, match=r"4242.*copied"):
            assert_isolated(recorder, a, b)


def test_frozen_dicts_are_still_immutable_and_unpicklable() -> None:
    value = FrozenDict({"a": [1, 2]})
    with pytest.raises(AttributeError):
        value.x = 1  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="never pickled"):
        import pickle

        pickle.dumps(value)
    with pytest.raises(ScopeFailedError.__mro__[1]):  # VictorActorsError
        freeze(object())


# -- 9. the command line ----------------------------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "victor_actors", *args], capture_output=True, text=True, timeout=60
    )


def test_export_and_show_write_strict_json_with_nothing_ambiguous(tmp_path: Path) -> None:
    """Old code: NaN and Infinity in the output (strict parsers reject them), and a user's
    {"$bytes": ...} mapping read back as bytes."""
    with GlobalStateManager.open(tmp_path) as manager:
        manager.get_conversation_state("c").update(
            {"nan": math.nan, "inf": math.inf, "blob": b"\x00\x01", "fake": {"$bytes": "AAE="}}
        )
    for args in (("export", str(tmp_path), "conversation:c"), ("show", str(tmp_path), "conversation:c")):
        done = _cli(*args)
        assert done.returncode == 0, done.stderr

        def strict(token: str) -> None:
            raise ValueError(f"non-standard JSON token {token}")

        doc = json.loads(done.stdout, parse_constant=strict)
        state = doc["scopes"][0]["state"] if args[0] == "export" else doc["state"]
        assert state["nan"] == {"$float": "nan"} and state["inf"] == {"$float": "inf"}
        assert state["blob"] == {"$bytes": "AAE="}
        assert state["fake"] == {"$map": {"$bytes": "AAE="}}


def test_export_refuses_an_output_inside_the_store_and_writes_atomically(tmp_path: Path) -> None:
    """Old code: ``export --output`` pointed at data.mdb truncated it and destroyed the store."""
    store = tmp_path / "store"
    with GlobalStateManager.open(store) as manager:
        manager.get_conversation_state("c").set("k", 1)
    data = store / "data" / "data.mdb"
    before = data.read_bytes()
    link = tmp_path / "sneaky"
    link.symlink_to(store / "data")
    for target in (data, store / "new.json", link / "data.mdb"):
        done = _cli("export", str(store), "--output", str(target))
        assert done.returncode == 2 and "inside the store" in done.stderr, done.stderr
    assert data.read_bytes() == before and not (store / "new.json").exists()
    out = tmp_path / "export.json"
    assert _cli("export", str(store), "--output", str(out)).returncode == 0
    assert json.loads(out.read_text())["scopes"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".victor-actors-export-")]
    with GlobalStateManager.open(store) as manager:
        assert manager.scope("conversation:c").get("k") == 1


def test_the_cli_refuses_a_truncated_store_with_a_typed_error(tmp_path: Path) -> None:
    """Old code: ``victor-actors inspect`` died of SIGBUS."""
    _make_store(tmp_path, conversations=20, commits=20)
    data = tmp_path / "data" / "data.mdb"
    with open(data, "r+b") as f:
        f.truncate(data.stat().st_size // 2)
    done = _cli("inspect", str(tmp_path))
    assert done.returncode == 2 and "truncated" in done.stderr, (done.returncode, done.stderr)


def test_cli_help_names_what_writes_and_suggests_near_misses(tmp_path: Path) -> None:
    _make_store(tmp_path, conversations=1, commits=30)
    top = _cli("--help").stdout
    assert "never write" in top and "simulate writes" in top
    assert "the older version" in _cli("diff", "--help").stdout
    missed = _cli("history", str(tmp_path), "conversation:C0")
    assert missed.returncode == 2 and "did you mean conversation:c0" in missed.stderr
    limited = _cli("history", str(tmp_path), "conversation:c0", "--limit", "3")
    assert limited.returncode == 0 and "the newest 3 of 30" in limited.stdout
    assert len([line for line in limited.stdout.splitlines() if line.startswith("v")]) == 3


def test_the_retention_error_names_the_oldest_stored_version(tmp_path: Path) -> None:
    with GlobalStateManager.open(tmp_path, checkpoint_every=5, keep_checkpoints=1) as manager:
        conv = manager.get_conversation_state("c")
        for i in range(12):
            conv.set("i", i)
    done = _cli("show", str(tmp_path), "conversation:c", "--version", "2")
    assert done.returncode == 2 and "retention keeps v10 to v12" in done.stderr, done.stderr


# -- a newcomer's first hour ------------------------------------------------------------------------------


def test_simulate_says_what_it_will_do_and_keep_keeps_the_store(tmp_path: Path) -> None:
    """Old code: no plan before the run, "failures" for injected faults, and no store left to look at."""
    done = subprocess.run(
        [sys.executable, "-m", "victor_actors", "simulate", "--quick", "--keep", "--seconds", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "agents" in done.stderr and "temporary LMDB store at" in done.stderr
    assert "Injected faults" in done.stderr and "failures" not in done.stderr
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("victor-actors-simulate-")]
    assert len(kept) == 1 and f"the store is kept at {kept[0]}" in done.stdout
    assert _cli("inspect", str(kept[0])).returncode == 0


def test_an_async_tool_leaves_no_unclosed_event_loop_behind() -> None:
    """Old code: after "all checks passed" the example printed ``Exception ignored in: <function
    BaseEventLoop.__del__>``: the tools' event loop was stopped but never closed."""
    script = textwrap.dedent(
        """
        from victor_actors import GlobalStateManager, TransitionBatch

        async def lookup(call):
            return {"found": call.arguments["q"]}

        with GlobalStateManager.open() as manager:
            manager.register_tool("lookup", lookup)
            conv = manager.get_conversation_state("c")
            conv.apply(TransitionBatch().execute_tool("lookup", {"q": "x"}))
            manager.quiesce()
            assert not conv.snapshot().pending_tool_requests
        print("done")
        """
    )
    done = subprocess.run(
        [sys.executable, "-X", "dev", "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "done" in done.stdout, done.stderr
    assert "Exception ignored" not in done.stderr and "unclosed" not in done.stderr, done.stderr
