"""Rewrites of a whole store (rekey, encryption in place) lose nothing (issue 28, items 3 and 5).

The rewrite copies every record of every database by key range; anything it
cannot open with the old keys (or the new ones) makes it refuse before the
swap, leaving the store untouched; it counts the records of the source and
the copy before the swap; and it holds the owner lock from start to end, so an
open beside it is refused (a writer) or only reads (read-only), and neither
touches the copy. Real LMDB stores, real child processes killed with SIGKILL
at every step of the rewrite.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import lmdb
import pytest

from victor_actors import (
    CheckpointCorruptError,
    EncryptionKeyError,
    GlobalStateManager,
    Keyring,
    ScopeRef,
    StoreLockedError,
    TransitionBatch,
    VictorActorsError,
)
from victor_actors.store import Store, encrypt_in_place, rekey

KEY_A, KEY_B, KEY_C = bytes(range(32)), bytes(range(40, 72)), bytes(range(80, 112))
RING_A = Keyring({"a": KEY_A}, active="a")
RING_B = Keyring({"b": KEY_B}, active="b")
BOTH = Keyring({"b": KEY_B, "a": KEY_A}, active="b")
CONVERSATIONS = 6
COMMITS = 9


def _fill(path: Path, keyring: Keyring | None, *, conversations: int = CONVERSATIONS) -> None:
    """Conversations under two teams, a checkpoint every 4 commits, and a global value."""
    with GlobalStateManager.open(path, encryption=keyring, checkpoint_every=4) as manager:
        manager.get_global_state().set("model", "m1")
        for c in range(conversations):
            conv = manager.get_conversation_state(f"c{c}", team_id=f"t{c % 2}")
            for i in range(COMMITS):
                conv.apply(TransitionBatch().add_message(f"c{c} m{i}").update_state("i", i))


def _contents(path: Path, keyring: Keyring | None) -> dict[str, Any]:
    """Every scope's version, values and messages, read through a read-only manager."""
    out: dict[str, Any] = {}
    with GlobalStateManager.open(path, read_only=True, encryption=keyring) as manager:
        store = manager.store
        assert store is not None
        for record in store.scope_records():
            snap = manager.scope(record.ref).snapshot()
            out[str(record.ref)] = (snap.version, dict(snap.state), list(snap.messages))
        assert not manager.recovery_reports, manager.recovery_reports
    return out


def _digest(path: Path) -> str:
    return hashlib.sha256((path / "data" / "data.mdb").read_bytes()).hexdigest()


def _key_of(path: Path, keyring: Keyring | None, ref: str) -> bytes:
    store = Store(path, read_only=True, encryption=keyring)
    try:
        return store.layout.ref_key(ScopeRef.parse(ref))
    finally:
        store.close()


def _flip(path: Path, db: str, key: bytes, at: float = 0.5, bit: int = 0) -> None:
    """Flip one bit of the value stored at ``key`` of ``db`` (at that fraction of its length)."""
    env = lmdb.open(str(path / "data"), max_dbs=16)
    try:
        with env.begin(write=True, db=env.open_db(db.encode())) as txn:
            stored = txn.get(key)
            assert stored is not None, (db, key)
            raw = bytearray(stored)
            raw[min(int(len(raw) * at), len(raw) - 1)] ^= 1 << bit
            txn.put(key, bytes(raw))
    finally:
        env.close()


def _keys(path: Path, db: str) -> list[bytes]:
    env = lmdb.open(str(path / "data"), max_dbs=16, readonly=True)
    try:
        with env.begin(db=env.open_db(db.encode(), create=False)) as txn:
            return [bytes(k) for k, _ in txn.cursor()]
    finally:
        env.close()


def _rewrite(mode: str, path: Path, **options: Any) -> int:
    if mode == "rekey":
        return rekey(path, RING_B, RING_A, **options)
    assert encrypt_in_place(path, RING_B, **options)
    return 1


OLD = {"rekey": RING_A, "migrate": None}


# -- item 3: a rewrite refuses before the swap when anything fails to open --------------------------


@pytest.mark.parametrize("mode", ["rekey", "migrate"])
def test_a_flipped_bit_in_one_scope_record_refuses_the_rewrite_and_changes_nothing(
    tmp_path: Path, mode: str
) -> None:
    """Guards issue 28 item 3. Failed before the fix: the rewrite listed scopes through the readable
    scope records, skipped the damaged one, reported success and the swap deleted that scope's
    intact commits."""
    _fill(tmp_path, OLD[mode])
    before = _contents(tmp_path, OLD[mode])
    _flip(tmp_path, "scopes", _key_of(tmp_path, OLD[mode], "conversation:c3"))
    digest = _digest(tmp_path)
    with pytest.raises(CheckpointCorruptError, match="scopes") as caught:
        _rewrite(mode, tmp_path)
    assert "unchanged" in str(caught.value)
    assert _digest(tmp_path) == digest and not (tmp_path / "rewrite.next").exists()
    # the store is as it was: the other scopes read whole, the damaged scope's commits are still there
    with GlobalStateManager.open(tmp_path, encryption=OLD[mode]) as manager:
        for c in (0, 1, 2, 4, 5):
            ref = f"conversation:c{c}"
            snap = manager.scope(ref).snapshot()
            assert (snap.version, list(snap.messages)) == (before[ref][0], before[ref][2])
        store = manager.store
        assert store is not None and store.has_records(ScopeRef.parse("conversation:c3"))


@pytest.mark.parametrize("mode", ["rekey", "migrate"])
def test_dropping_damaged_records_is_an_explicit_choice_and_a_scope_record_is_rebuilt_from_its_index(
    tmp_path: Path, mode: str
) -> None:
    """With ``drop_damaged=True`` the rewrite goes on past damage; a damaged scope record is taken
    from its ``children`` index entry, so the scope keeps every intact commit. Failed before the fix
    (there was no such option, and the scope was dropped with its commits)."""
    _fill(tmp_path, OLD[mode])
    before = _contents(tmp_path, OLD[mode])
    _flip(tmp_path, "scopes", _key_of(tmp_path, OLD[mode], "conversation:c3"))
    _rewrite(mode, tmp_path, drop_damaged=True)
    assert _contents(tmp_path, RING_B) == before


def test_the_documented_two_step_rotation_with_the_cli_keeps_the_scopes_created_in_step_one(
    tmp_path: Path,
) -> None:
    """Guards issue 28 item 3. Failed before the fix: ``rekey --key-file NEW --old-key-file OLD``
    with OLD holding the old key only dropped every scope created during step one (sealed under the
    new key), exited 0 and said the old key was no longer needed; here, where an older scope also
    got a commit in step one, it stopped on that commit instead (exit 2)."""
    store, old_file, new_file = tmp_path / "store", tmp_path / "old.json", tmp_path / "new.json"
    _fill(store, RING_A)
    with GlobalStateManager.open(store, encryption=BOTH) as manager:  # step one: the new key active
        manager.get_conversation_state("made-in-step-one", team_id="t0").set("k", "v")
        manager.scope("conversation:c0").add_message("after step one")
    expected = _contents(store, BOTH)
    RING_A.write_file(old_file)
    RING_B.write_file(new_file)
    done = subprocess.run(
        [sys.executable, "-m", "victor_actors", "rekey", str(store), "--key-file", str(new_file),
         "--old-key-file", str(old_file)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "old key is no longer needed" in done.stdout
    assert _contents(store, RING_B) == expected
    assert expected["conversation:made-in-step-one"][1] == {"k": "v"}


def test_a_record_neither_keyring_opens_refuses_with_an_encryption_key_error(tmp_path: Path) -> None:
    """A scope sealed under a third key (in neither key file): refused, naming that key id, and the
    store still opens with every key it needs. Failed before the fix (the scope was dropped)."""
    _fill(tmp_path, RING_A)
    third = Keyring({"c": KEY_C, "a": KEY_A}, active="c")
    with GlobalStateManager.open(tmp_path, encryption=third) as manager:
        manager.get_conversation_state("under-c").set("k", 1)
    expected = _contents(tmp_path, third)
    digest = _digest(tmp_path)
    with pytest.raises(EncryptionKeyError, match="'c'") as caught:
        rekey(tmp_path, RING_B, RING_A)
    assert "unchanged" in str(caught.value)
    assert _digest(tmp_path) == digest and _contents(tmp_path, third) == expected
    rekey(tmp_path, RING_B, third)  # with the third key it goes through
    assert _contents(tmp_path, RING_B) == expected


def test_a_database_the_copy_would_not_hold_is_never_swapped_away(tmp_path: Path) -> None:
    """A named database this version does not know (a newer version's, or someone's own) is never
    deleted by a rewrite: refused before the swap. Failed before the fix (it was dropped)."""
    _fill(tmp_path, RING_A)
    env = lmdb.open(str(tmp_path / "data"), max_dbs=16)
    with env.begin(write=True, db=env.open_db(b"future")) as txn:
        txn.put(b"k", b"v")
    env.close()
    digest = _digest(tmp_path)
    with pytest.raises(CheckpointCorruptError, match="future"):
        rekey(tmp_path, RING_B, RING_A)
    assert _digest(tmp_path) == digest


def test_the_swap_is_refused_when_the_copy_holds_fewer_records_than_the_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last check before the swap counts each database in the source and the copy: a copy that
    lost a record, for whatever reason, is never swapped in."""
    from victor_actors.store import _rewrite

    _fill(tmp_path, RING_A)
    before = _contents(tmp_path, RING_A)
    real = _rewrite.Copier._put
    skipped: list[bytes] = []

    def lossy(self: Any, db: str, key: bytes, value: bytes) -> None:
        if db == "log" and not skipped:
            skipped.append(key)  # a bug that loses one record
            return
        real(self, db, key, value)

    monkeypatch.setattr(_rewrite.Copier, "_put", lossy)
    with pytest.raises(CheckpointCorruptError, match="log"):
        rekey(tmp_path, RING_B, RING_A)
    assert skipped and _contents(tmp_path, RING_A) == before


def test_random_damage_never_loses_a_record_the_rewrite_could_read(tmp_path: Path) -> None:
    """Many seeds, each flipping bits in 1 to 3 random records of any database of a copy of the
    store. Without ``drop_damaged`` every rewrite refuses and leaves the store byte for byte as it
    was; with it, every scope the damage did not touch is copied whole, and a damaged scope reads as
    a prefix of what it was (with a report) or a typed error, never as a wrong state."""
    pristine = tmp_path / "pristine"
    _fill(pristine, RING_A, conversations=4)
    before = _contents(pristine, RING_A)
    store = Store(pristine, read_only=True, encryption=RING_A)
    owners = {store.layout.ref_key(ScopeRef.parse(ref)): ref for ref in before}
    store.close()
    records = [(db, key) for db in ("scopes", "children", "log", "ckpt", "chunks", "kv")
               for key in _keys(pristine, db)]  # fmt: skip
    rng = random.Random(2028)
    for seed in range(40):
        path = tmp_path / f"seed-{seed}"
        shutil.copytree(pristine, path)
        touched = set()
        for db, key in rng.sample(records, rng.randint(1, 3)):
            _flip(path, db, key, at=rng.random(), bit=rng.randrange(8))
            own = key if db == "scopes" else key[-17:] if db == "children" else key[:17]
            touched.add(owners[own])
        digest = _digest(path)
        with pytest.raises((CheckpointCorruptError, EncryptionKeyError)):
            rekey(path, RING_B, RING_A)
        assert _digest(path) == digest, seed
        assert not (path / "rewrite.next").exists()
        rekey(path, RING_B, RING_A, drop_damaged=True)
        with GlobalStateManager.open(path, read_only=True, encryption=RING_B) as manager:
            for ref, (version, values, messages) in before.items():
                try:
                    snap = manager.scope(ref).snapshot()
                except VictorActorsError:
                    assert ref in touched, (seed, ref)
                    continue
                if ref not in touched:
                    assert (snap.version, dict(snap.state), list(snap.messages)) == (
                        version, values, messages), (seed, ref)  # fmt: skip
                else:
                    assert list(snap.messages) == messages[: len(snap.messages)], (seed, ref)
            untouched_reports = [r for r in manager.recovery_reports if str(r.ref) not in touched]
            assert not untouched_reports, (seed, untouched_reports)
        shutil.rmtree(path)


# -- item 5: only the lock holder touches a rewrite in progress -------------------------------------


_PAUSED = """
import sys
from victor_actors import Keyring
from victor_actors.store import Store, rekey

submit = Store.submit
batches = [0]

def paused(self, ops, *, wait):
    submit(self, ops, wait=wait)
    if self.path.endswith("rewrite.next"):
        batches[0] += 1
        if batches[0] == 1:
            sys.stdout.write("copying\\n")
            sys.stdout.flush()
            sys.stdin.readline()

Store.submit = paused
written = rekey(sys.argv[1], Keyring.from_json(sys.argv[2]), Keyring.from_json(sys.argv[3]))
sys.stdout.write(f"done {written}\\n")
"""


def _tree(path: Path) -> dict[str, int]:
    return {str(p.relative_to(path)): p.stat().st_size for p in sorted(path.rglob("*")) if p.is_file()}


def test_a_refused_writer_or_a_read_only_open_never_touches_a_rewrite_in_progress(tmp_path: Path) -> None:
    """Guards issue 28 item 5. Failed before the fix: the open finished or dropped an interrupted
    rewrite before it took the owner lock, so a refused second writer (or inspect, or serve) deleted
    the copy being written, and the rekey then died with a bare FileNotFoundError."""
    from victor_actors.web import open_read_only

    store = tmp_path / "store"
    _fill(store, RING_A, conversations=60)
    expected = _contents(store, RING_A)
    keys = tmp_path / "old.json"
    RING_A.write_file(keys)
    child = subprocess.Popen(
        [sys.executable, "-c", _PAUSED, str(store), RING_B.to_json(), RING_A.to_json()],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert child.stdin is not None and child.stdout is not None
    try:
        assert child.stdout.readline().strip() == "copying"
        copy = _tree(store / "rewrite.next")
        assert copy
        with pytest.raises(StoreLockedError):
            GlobalStateManager.open(store, encryption=RING_A)
        with pytest.raises(StoreLockedError):
            GlobalStateManager.open(store, encryption=RING_B)
        with pytest.raises(StoreLockedError):
            rekey(store, RING_A, RING_B)  # a second rewrite
        with pytest.raises(StoreLockedError):
            GlobalStateManager.open(store, encryption=RING_B, encryption_migrate=True)
        assert _contents(store, RING_A) == expected  # a read-only open reads the old store
        with open_read_only(str(store), encryption=RING_A) as manager:  # what `serve` opens
            assert manager.scope("conversation:c1").version == COMMITS
        inspect = subprocess.run(
            [sys.executable, "-m", "victor_actors", "inspect", str(store), "--key-file", str(keys)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert inspect.returncode == 0, inspect.stderr
        assert _tree(store / "rewrite.next") == copy  # nobody touched the copy
        child.stdin.write("go\n")
        child.stdin.flush()
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0 and out.startswith("done"), err
    assert _contents(store, RING_B) == expected


def test_the_owner_lock_waits_for_its_timeout_and_is_taken_once_released(tmp_path: Path) -> None:
    """``OwnerLock(timeout=)`` polls both locks: refused after the timeout, taken once the owner
    closes (what an open with a lock timeout relies on)."""
    import threading

    from victor_actors.store._files import OwnerLock

    store = Store(tmp_path)
    with pytest.raises(StoreLockedError, match=r"waited for 0\.1 s"):
        OwnerLock(str(tmp_path), timeout=0.1)
    taken: list[OwnerLock] = []
    waiter = threading.Thread(target=lambda: taken.append(OwnerLock(str(tmp_path), timeout=60.0)))
    waiter.start()
    store.close()
    waiter.join()
    (lock,) = taken
    with pytest.raises(StoreLockedError):
        Store(tmp_path)
    lock.release()
    Store(tmp_path).close()


# -- SIGKILL at every step of the rewrite ------------------------------------------------------------

_DRIVER = """
import json, os, shutil, signal, sys, threading
from victor_actors import Keyring
from victor_actors.store import Store, encrypt_in_place, rekey

pristine, workdir, mode, new_json, old_json = sys.argv[1:6]
new = Keyring.from_json(new_json)
old = None if old_json == "-" else Keyring.from_json(old_json)
assert threading.active_count() == 1  # forking below is safe


def install(kill_at):
    count = [0]

    def step(name, fn):
        def wrapped(*args, **kwargs):
            count[0] += 1
            if count[0] == kill_at:
                sys.stdout.write(json.dumps({"step": kill_at, "at": name}) + "\\n")
                sys.stdout.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            return fn(*args, **kwargs)
        return wrapped

    os.rename = step("rename", os.rename)
    os.replace = step("replace", os.replace)
    os.fsync = step("fsync", os.fsync)
    shutil.rmtree = step("rmtree", shutil.rmtree)
    submit = Store.submit
    Store.submit = step("submit", submit)


k = 0
while True:
    k += 1
    path = os.path.join(workdir, f"step-{k}")
    shutil.copytree(pristine, path)
    pid = os.fork()
    if pid == 0:
        install(k)
        if old is None:
            encrypt_in_place(path, new)
        else:
            rekey(path, new, old)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        assert os.WTERMSIG(status) == signal.SIGKILL
        continue
    assert os.WEXITSTATUS(status) == 0, status
    sys.stdout.write(json.dumps({"step": k, "at": "finished"}) + "\\n")
    break
"""


@pytest.mark.parametrize("mode", ["rekey", "migrate"])
def test_sigkill_at_every_step_of_a_rewrite_leaves_the_old_or_the_new_store_whole(
    tmp_path: Path, mode: str
) -> None:
    """Each step of the rewrite that changes the disk (a batch of the copy, an fsync, a rename, a
    removal) is the last one of a run killed with SIGKILL just before it, for every step in turn.
    After each kill: a read-only open reads the old or the new store whole and changes nothing on
    disk; a writable open agrees with it, finishes or drops the rewrite, and reads it whole."""
    pristine = tmp_path / "pristine"
    _fill(pristine, OLD[mode], conversations=40)
    expected = _contents(pristine, OLD[mode])
    work = tmp_path / "runs"
    work.mkdir()
    old = "-" if OLD[mode] is None else RING_A.to_json()
    done = subprocess.run(
        [sys.executable, "-c", _DRIVER, str(pristine), str(work), mode, RING_B.to_json(), old],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [json.loads(line) for line in done.stdout.splitlines()]
    assert steps[-1]["at"] == "finished"
    kinds = {s["at"] for s in steps[:-1]}
    assert {"submit", "fsync", "rename", "rmtree"} <= kinds, steps
    outcomes = {"old": 0, "new": 0}
    for s in steps:
        path = work / f"step-{s['step']}"
        tree = sorted(str(p.relative_to(path)) for p in path.rglob("*"))
        try:
            seen, which = _contents(path, RING_B), "new"
        except EncryptionKeyError:
            seen, which = _contents(path, OLD[mode]), "old"
        assert seen == expected, s
        after = sorted(str(p.relative_to(path)) for p in path.rglob("*"))
        assert [p for p in after if "rewrite" in p] == [p for p in tree if "rewrite" in p], s
        keyring = RING_B if which == "new" else OLD[mode]
        with GlobalStateManager.open(path, encryption=keyring):
            pass
        assert not any((path / name).exists() for name in ("rewrite.next", "rewrite.previous")), s
        assert _contents(path, keyring) == expected, s
        outcomes[which] += 1
    assert outcomes["old"] >= 3 and outcomes["new"] >= 3, outcomes
