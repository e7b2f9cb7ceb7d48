"""The store's meta record is authenticated as a whole and records are bound to their store (issue 28,
item 4); stores from before store ids keep opening.

Real LMDB stores; the meta record and records are changed with LMDB itself, as
someone (or a flipped bit) could. ``tests/data/legacy-encrypted-store.tar.gz``
is a store written by the code before store ids (created under ``legacy-1``,
then a step-one rotation to ``legacy-2``: a commit and a scope under it).
"""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path
from typing import Any

import lmdb
import msgpack
import pytest

from victor_actors import (
    CheckpointCorruptError,
    EncryptionKeyError,
    GlobalStateManager,
    Keyring,
    ScopeRef,
    TransitionBatch,
    VictorActorsError,
)
from victor_actors.store import Store, encrypt_in_place, rekey

KEY_A, KEY_B = bytes(range(32)), bytes(range(40, 72))
RING = Keyring({"a": KEY_A, "b": KEY_B}, active="a")
NEW = Keyring({"n": bytes(range(120, 152))}, active="n")
LEGACY = Keyring({"legacy-2": bytes(range(100, 132)), "legacy-1": bytes(range(32))}, active="legacy-2")
FIXTURE = Path(__file__).parent / "data" / "legacy-encrypted-store.tar.gz"


def _fill(path: Path, keyring: Keyring | None, tag: str = "m") -> None:
    with GlobalStateManager.open(path, encryption=keyring, checkpoint_every=4) as manager:
        for c in range(3):
            conv = manager.get_conversation_state(f"c{c}", team_id="t")
            for i in range(6):
                conv.apply(TransitionBatch().add_message(f"{tag} c{c} {i}").update_state("i", i))


def _contents(path: Path, keyring: Keyring | None, *, read_only: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with GlobalStateManager.open(path, read_only=read_only, encryption=keyring) as manager:
        store = manager.store
        assert store is not None
        for record in store.scope_records():
            snap = manager.scope(record.ref).snapshot()
            out[str(record.ref)] = (snap.version, dict(snap.state), list(snap.messages))
        assert not manager.recovery_reports, manager.recovery_reports
    return out


def _digest(path: Path) -> str:
    return hashlib.sha256((path / "data" / "data.mdb").read_bytes()).hexdigest()


def _raw_meta(path: Path) -> bytes:
    env = lmdb.open(str(path / "data"), max_dbs=16, readonly=True)
    try:
        with env.begin(db=env.open_db(b"meta", create=False)) as txn:
            raw = txn.get(b"format")
            assert raw is not None
            return bytes(raw)
    finally:
        env.close()


def _meta(path: Path) -> dict[str, Any]:
    meta = msgpack.unpackb(_raw_meta(path), raw=False)
    assert isinstance(meta, dict)
    return meta


def _put_meta(path: Path, raw: bytes | None) -> None:
    env = lmdb.open(str(path / "data"), max_dbs=16)
    try:
        with env.begin(write=True, db=env.open_db(b"meta")) as txn:
            if raw is None:
                txn.delete(b"format")
            else:
                txn.put(b"format", raw)
    finally:
        env.close()


def _pack(meta: dict[str, Any]) -> bytes:
    return bytes(msgpack.packb(meta, use_bin_type=True))


def _legacy(tmp_path: Path) -> Path:
    path = tmp_path / "legacy"
    path.mkdir()
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(path, filter="data")
    return path


# -- the meta record's flags ----------------------------------------------------------------------------


def test_flipping_encrypted_to_false_is_refused_and_migrating_changes_nothing(tmp_path: Path) -> None:
    """Guards issue 28 item 4. Failed before the fix: with ``encrypted`` flipped to false, an open with
    ``encryption_migrate=True`` "migrated" the store as plaintext into an empty store and deleted the
    original."""
    _fill(tmp_path, RING)
    expected = _contents(tmp_path, RING)
    original = _raw_meta(tmp_path)
    _put_meta(tmp_path, _pack({**_meta(tmp_path), "encrypted": False}))
    digest = _digest(tmp_path)
    with pytest.raises(CheckpointCorruptError, match="altered"):
        GlobalStateManager.open(tmp_path, encryption=RING, encryption_migrate=True)
    with pytest.raises(CheckpointCorruptError, match="altered"):
        GlobalStateManager.open(tmp_path)
    with pytest.raises(CheckpointCorruptError, match="altered"):
        encrypt_in_place(tmp_path, RING)
    assert _digest(tmp_path) == digest and not (tmp_path / "rewrite.next").exists()
    _put_meta(tmp_path, original)
    assert _contents(tmp_path, RING, read_only=False) == expected


@pytest.mark.parametrize("how", ["replaced", "deleted"])
def test_a_meta_record_replaced_by_a_plaintext_one_or_deleted_refuses_to_read_sealed_records_as_plaintext(
    tmp_path: Path, how: str
) -> None:
    """A meta record that looks like a plaintext store's (rewritten whole, or gone) cannot make an open
    or a migration treat the sealed records as absent. Failed before the fix: the migration emptied
    the store and a plaintext open started every scope afresh."""
    _fill(tmp_path, RING)
    expected = _contents(tmp_path, RING)
    original = _raw_meta(tmp_path)
    _put_meta(tmp_path, _pack({"format": 2, "encrypted": False}) if how == "replaced" else None)
    digest = _digest(tmp_path)
    for attempt in (
        lambda: GlobalStateManager.open(tmp_path, encryption=RING, encryption_migrate=True),
        lambda: GlobalStateManager.open(tmp_path),
        lambda: GlobalStateManager.open(tmp_path, read_only=True),
        lambda: GlobalStateManager.open(tmp_path, encryption=RING),
    ):
        with pytest.raises(CheckpointCorruptError, match="records are sealed"):
            attempt()
    assert _digest(tmp_path) == digest
    _put_meta(tmp_path, original)
    assert _contents(tmp_path, RING) == expected


@pytest.mark.parametrize("store", ["new", "legacy"])
def test_changing_the_id_key_to_another_key_of_the_ring_is_refused(tmp_path: Path, store: str) -> None:
    """Guards issue 28 item 4. Failed before the fix: every scope opened empty at v0, with no report,
    and new commits created duplicates beside the old records."""
    if store == "new":
        path, ring, other = tmp_path, RING, "b"
        _fill(path, ring)
    else:
        path, ring, other = _legacy(tmp_path), LEGACY, "legacy-2"
    expected = _contents(path, ring)
    original = _raw_meta(path)
    assert _meta(path)["id_key"] != other
    _put_meta(path, _pack({**_meta(path), "id_key": other}))
    digest = _digest(path)
    for read_only in (True, False):
        with pytest.raises(CheckpointCorruptError, match="altered"):
            GlobalStateManager.open(path, encryption=ring, read_only=read_only)
    with pytest.raises(CheckpointCorruptError, match="altered"):
        rekey(path, NEW, ring)
    assert _digest(path) == digest
    _put_meta(path, original)
    assert _contents(path, ring) == expected


def test_every_flipped_bit_of_the_meta_record_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    """The whole record is under its check: a flip anywhere in it is a typed refusal, before anything
    is written (the open tried is a writable one)."""
    _fill(tmp_path, RING)
    original = _raw_meta(tmp_path)
    for at in range(len(original)):
        for bit in (0, 5):
            flipped = bytearray(original)
            flipped[at] ^= 1 << bit
            _put_meta(tmp_path, bytes(flipped))
            digest = _digest(tmp_path)
            with pytest.raises(VictorActorsError):
                GlobalStateManager.open(tmp_path, encryption=RING).close()
            assert _digest(tmp_path) == digest, (at, bit)
    _put_meta(tmp_path, original)
    GlobalStateManager.open(tmp_path, encryption=RING).close()


# -- records bound to their store ------------------------------------------------------------------------


def test_a_record_copied_from_another_store_under_the_same_keyring_fails_authentication(
    tmp_path: Path,
) -> None:
    """Guards issue 28 item 4. Failed before the fix: records were bound to their database and key
    only, two stores under one keyring spelled a scope's keys alike, and a commit copied from the other
    store was loaded as this store's own."""
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    _fill(mine, RING, tag="mine")
    _fill(theirs, RING, tag="theirs")
    ref = ScopeRef.parse("conversation:c1")
    keys = {}
    for path in (mine, theirs):
        store = Store(path, read_only=True, encryption=RING)
        keys[path] = store.layout.versioned_key(ref, 6)
        store.close()
    env = lmdb.open(str(theirs / "data"), max_dbs=16, readonly=True)
    with env.begin(db=env.open_db(b"log", create=False)) as txn:
        stolen = bytes(txn.get(keys[theirs]))
    env.close()
    env = lmdb.open(str(mine / "data"), max_dbs=16)
    with env.begin(write=True, db=env.open_db(b"log")) as txn:
        assert txn.get(keys[mine]) is not None
        txn.put(keys[mine], stolen)
    env.close()
    with GlobalStateManager.open(mine, read_only=True, encryption=RING) as manager:
        snap = manager.scope(ref).snapshot()
        assert all(m.startswith("mine") for m in snap.messages) and snap.version == 5
        (report,) = manager.recovery_reports
        assert "fails authentication" in " ".join(report.skipped)


def test_two_stores_under_one_keyring_spell_their_scope_keys_differently(tmp_path: Path) -> None:
    """The id key is salted with the store id: one key file for several stores (as
    ``$VICTOR_ACTORS_KEYS`` suggests) does not link their scopes by key."""
    keys = set()
    for name in ("one", "two"):
        GlobalStateManager.open(tmp_path / name, encryption=RING).close()
        store = Store(tmp_path / name, read_only=True, encryption=RING)
        keys.add(store.layout.ref_key(ScopeRef.parse("conversation:same-id")))
        assert store.sealer.store_id is not None
        store.close()
    assert len(keys) == 2


# -- stores from before store ids ----------------------------------------------------------------------


def test_a_store_from_before_store_ids_keeps_opening_and_a_rewrite_binds_it(tmp_path: Path) -> None:
    """The fixture, written by the code before store ids, opens, takes new commits in its own format,
    and a rekey (even to the same keys) gives it a store id, salted keys and bound records."""
    path = _legacy(tmp_path)
    assert "store" not in _meta(path)
    expected = _contents(path, LEGACY)
    conv = expected["conversation:legacy-conv"]
    assert conv[0] == 13 and conv[2][-1] == {"role": "user", "content": "after the rotation"}
    assert expected["conversation:legacy-step-one"][1] == {"made": "in step one"}
    with GlobalStateManager.open(path, encryption=LEGACY) as manager:
        manager.scope("conversation:legacy-conv").add_message("after the new code")
    expected = _contents(path, LEGACY)
    assert "store" not in _meta(path) and expected["conversation:legacy-conv"][0] == 14
    step_two = Keyring({"legacy-2": bytes(range(100, 132))}, active="legacy-2")
    rekey(path, step_two, Keyring({"legacy-1": bytes(range(32))}, active="legacy-1"))  # the old key only
    assert len(_meta(path)["store"]) == 16
    assert _contents(path, step_two) == expected
    with pytest.raises(EncryptionKeyError):
        GlobalStateManager.open(path, encryption=Keyring({"legacy-1": bytes(range(32))}, active="legacy-1"))


def test_a_record_of_a_store_from_before_store_ids_is_refused_in_a_store_with_one(tmp_path: Path) -> None:
    """A store with an id reads format 2 only: an unbound record (from a store before ids, under the
    same keyring, at the same key) does not pass."""
    from victor_actors.store._crypto import Sealer
    from victor_actors.store._keys import place

    _fill(tmp_path, RING)
    store = Store(tmp_path, read_only=True, encryption=RING)
    ref = ScopeRef.parse("conversation:c0")
    key = store.layout.versioned_key(ref, 5)  # after the checkpoint at 4
    where = place("log", key)
    plain = store.sealer.open(store._get("log", key) or b"", where, "commit v5")
    store.close()
    unbound = Sealer(RING).seal(plain, where)  # format 1: the place, but no store id
    env = lmdb.open(str(tmp_path / "data"), max_dbs=16)
    with env.begin(write=True, db=env.open_db(b"log")) as txn:
        txn.put(key, unbound)
    env.close()
    with GlobalStateManager.open(tmp_path, read_only=True, encryption=RING) as manager:
        assert manager.scope(ref).version == 4
        (report,) = manager.recovery_reports
        assert "not bound to this store" in " ".join(report.skipped)
