"""Encryption at rest: sealed records bound to their place, no plaintext ids, refusals, rotation.

Real LMDB stores in temporary directories, real child processes for the SIGKILL
rounds, and LangGraph's own conformance suite on an encrypted saver.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
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
    TransitionBatch,
)
from victor_actors.store import Store, encrypt_in_place, is_encrypted, rekey

SECRETS = [b"secret-session-7f3a", b"team-zebra-omega", b"hunter2-passphrase", b"TOKEN-abcdef-123456"]
KEY_A, KEY_B = Keyring.generate_key(), Keyring.generate_key()
RING_A = Keyring({"2026-06": KEY_A}, active="2026-06")
RING_B = Keyring({"2026-12": KEY_B}, active="2026-12")
BOTH = Keyring({"2026-12": KEY_B, "2026-06": KEY_A}, active="2026-12")


def _fill(path: Path, keyring: Keyring | None, *, commits: int = 12, **options: Any) -> None:
    with GlobalStateManager.open(path, encryption=keyring, checkpoint_every=5, **options) as manager:
        conv = manager.get_conversation_state("secret-session-7f3a", team_id="team-zebra-omega")
        for i in range(commits):
            conv.apply(
                TransitionBatch()
                .add_message({"role": "user", "content": f"hunter2-passphrase {i}"})
                .update_state("token", "TOKEN-abcdef-123456")
            )
        manager.save_checkpoint(conv.ref, label="a label with TOKEN-abcdef-123456")
        manager.get_team_state("team-zebra-omega").set("shared", "hunter2-passphrase")


def _raw_files(path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in path.rglob("*") if p.is_file())


def _data(path: Path) -> bytes:
    return (path / "data" / "data.mdb").read_bytes()


def _check_contents(manager: GlobalStateManager, commits: int = 12) -> None:
    conv = manager.scope("conversation:secret-session-7f3a")
    snap = conv.snapshot()
    assert snap.version == commits and snap.state["token"] == "TOKEN-abcdef-123456"
    assert [m["content"] for m in snap.messages] == [f"hunter2-passphrase {i}" for i in range(commits)]
    assert snap.get_state("shared") == "hunter2-passphrase"
    assert manager.list_checkpoints(conv.ref)[0].label == "a label with TOKEN-abcdef-123456"
    assert manager.state_at(conv.ref, commits - 2).version == commits - 2
    assert not manager.recovery_reports


# -- round trips and what the file shows -----------------------------------------------------------


def test_every_record_kind_round_trips_and_the_files_hold_no_value_and_no_id(tmp_path: Path) -> None:
    _fill(tmp_path, RING_A)
    raw = _raw_files(tmp_path)
    for needle in SECRETS:
        assert needle not in raw, needle
    with GlobalStateManager.open(tmp_path, encryption=RING_A) as manager:
        _check_contents(manager)
        assert manager.store is not None and manager.store.encrypted
    with GlobalStateManager.open(tmp_path, encryption=RING_A, read_only=True) as manager:
        _check_contents(manager)


def test_quarantined_copies_stay_sealed(tmp_path: Path) -> None:
    _fill(tmp_path, RING_A)
    ref = ScopeRef("conversation", "secret-session-7f3a")
    store = Store(tmp_path, encryption=RING_A)
    ckpt12, log11 = store.layout.versioned_key(ref, 12), store.layout.versioned_key(ref, 11)
    store.close()
    env = lmdb.open(str(tmp_path / "data"), max_dbs=10)
    try:  # damage the newest checkpoint and commit 11: recovery goes back to v10, quarantines the rest
        for db, key in ((b"ckpt", ckpt12), (b"log", log11)):
            with env.begin(write=True, db=env.open_db(db)) as txn:
                value = bytearray(txn.get(key))
                value[-1] ^= 1
                txn.put(key, bytes(value))
    finally:
        env.close()
    with GlobalStateManager.open(tmp_path, encryption=RING_A) as manager:
        conv = manager.scope(ref)
        assert conv.version == 10
        (report,) = [r for r in manager.recovery_reports if r.ref == conv.ref]
        assert "fails authentication" in " ".join(report.skipped)
        quarantined = list(manager.store._scan("quarantine", b""))  # type: ignore[union-attr]
        assert len(quarantined) >= 2
    raw = _raw_files(tmp_path)
    assert not any(needle in raw for needle in SECRETS)


# -- refusals --------------------------------------------------------------------------------------


def test_an_encrypted_store_without_a_key_says_so_and_how_many_scopes_it_holds(tmp_path: Path) -> None:
    _fill(tmp_path, RING_A)
    before = _data(tmp_path)
    with pytest.raises(EncryptionKeyError, match=r"is encrypted \(it holds 3 scopes\)"):
        GlobalStateManager.open(tmp_path)
    with pytest.raises(EncryptionKeyError, match="is encrypted"):
        GlobalStateManager.open(tmp_path, read_only=True)
    assert is_encrypted(tmp_path)
    assert _data(tmp_path) == before  # nothing changed


@pytest.mark.parametrize(
    "keyring",
    [
        Keyring({"2026-06": KEY_B}, active="2026-06"),  # the right id, the wrong key
        Keyring({"other": KEY_A}, active="other"),  # the right key under another id
    ],
    ids=["wrong key", "missing id"],
)
def test_keys_that_do_not_match_are_refused_and_change_nothing(tmp_path: Path, keyring: Keyring) -> None:
    _fill(tmp_path, RING_A)
    before = _data(tmp_path)
    with pytest.raises(EncryptionKeyError) as info:
        GlobalStateManager.open(tmp_path, encryption=keyring)
    message = str(info.value)
    for key in (KEY_A, KEY_B):
        assert base64.b64encode(key).decode() not in message and key.hex() not in message
    assert _data(tmp_path) == before


def test_a_plaintext_store_opened_with_a_keyring_is_refused_unless_migrating(tmp_path: Path) -> None:
    _fill(tmp_path, None)
    assert not is_encrypted(tmp_path)
    with pytest.raises(EncryptionKeyError, match="not encrypted"):
        GlobalStateManager.open(tmp_path, encryption=RING_A)
    with GlobalStateManager.open(tmp_path, encryption=RING_A, encryption_migrate=True) as manager:
        _check_contents(manager)
    assert is_encrypted(tmp_path)
    raw = _raw_files(tmp_path)
    assert not any(needle in raw for needle in SECRETS)
    with GlobalStateManager.open(tmp_path, encryption=RING_A, encryption_migrate=True) as manager:
        _check_contents(manager)  # migrating an encrypted store again does nothing


def test_a_plaintext_record_in_an_encrypted_store_is_corrupt_never_trusted(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    _fill(plain, None)
    _fill(tmp_path / "enc", RING_A)
    # copy the plaintext commit 12 over the encrypted one, at the same key under each layout
    plain_store = Store(plain, read_only=True)
    ref = ScopeRef("conversation", "secret-session-7f3a")
    raw_plain = plain_store._get("log", plain_store.layout.versioned_key(ref, 12))
    plain_store.close()
    enc = Store(tmp_path / "enc", encryption=RING_A)
    enc.submit([lambda t: t.put("log", enc.layout.versioned_key(ref, 12), raw_plain)], wait=True)
    with pytest.raises(CheckpointCorruptError, match="not encrypted in an encrypted store"):
        enc.commit_record(ref, 12)
    enc.close()


def test_a_record_moved_to_another_key_or_version_fails_authentication(tmp_path: Path) -> None:
    with GlobalStateManager.open(tmp_path, encryption=RING_A) as manager:
        for name in ("a", "b"):
            conv = manager.get_conversation_state(name)
            for i in range(4):
                conv.add_message(f"{name} {i}")
    store = Store(tmp_path, encryption=RING_A)
    a, b = ScopeRef("conversation", "a"), ScopeRef("conversation", "b")
    key_a3, key_b3, key_a2 = (store.layout.versioned_key(r, v) for r, v in ((a, 3), (b, 3), (a, 2)))
    raw_a3, raw_b3 = store._get("log", key_a3), store._get("log", key_b3)
    assert raw_a3 is not None and raw_b3 is not None

    def swap(t: Any) -> None:
        t.put("log", key_a3, raw_b3)  # b's v3 under a's key
        t.put("log", key_b3, raw_a3)

    store.submit([swap], wait=True)
    with pytest.raises(CheckpointCorruptError, match="fails authentication"):
        store.commit_record(a, 3)
    store.submit([lambda t: t.put("log", key_a2, raw_a3)], wait=True)  # a's v3 as its v2
    with pytest.raises(CheckpointCorruptError, match="fails authentication"):
        store.commit_record(a, 2)
    store.close()


def test_a_tampered_byte_anywhere_in_a_sealed_record_is_detected(tmp_path: Path) -> None:
    with GlobalStateManager.open(tmp_path, encryption=RING_A) as manager:
        manager.get_conversation_state("c").add_message("hello")
    store = Store(tmp_path, encryption=RING_A)
    ref = ScopeRef("conversation", "c")
    key = store.layout.versioned_key(ref, 1)
    raw = store._get("log", key)
    assert raw is not None
    rng = random.Random(3)
    for at in [*sorted(rng.sample(range(len(raw)), 12)), 0, 2, 3, len(raw) - 1]:
        damaged = bytearray(raw)
        damaged[at] ^= 1 << rng.randrange(8)
        store.submit([lambda t, v=bytes(damaged): t.put("log", key, v)], wait=True)
        with pytest.raises(CheckpointCorruptError):
            store.commit_record(ref, 1)
    store.close()


# -- keyrings and key files ------------------------------------------------------------------------


def test_keyring_validation_and_reprs_never_show_keys(tmp_path: Path) -> None:
    with pytest.raises(EncryptionKeyError, match="32 bytes"):
        Keyring({"k": b"short"}, active="k")
    with pytest.raises(EncryptionKeyError, match="not in the keyring"):
        Keyring({"k": KEY_A}, active="other")
    with pytest.raises(EncryptionKeyError, match="at least one key"):
        Keyring({}, active="k")
    text = repr(BOTH)
    assert "2026-12" in text and base64.b64encode(KEY_A).decode() not in text and KEY_A.hex() not in text
    with pytest.raises(TypeError):
        import pickle

        pickle.dumps(BOTH)


def test_key_files_must_be_private_and_well_formed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good = tmp_path / "keys.json"
    BOTH.write_file(good)
    assert (good.stat().st_mode & 0o777) == 0o600
    loaded = Keyring.from_file(good)
    assert loaded.active == "2026-12" and set(loaded.key_ids) == {"2026-12", "2026-06"}
    good.chmod(0o644)
    with pytest.raises(EncryptionKeyError, match="chmod 600"):
        Keyring.from_file(good)
    good.chmod(0o600)
    truncated = tmp_path / "truncated.json"
    truncated.write_text(good.read_text()[:40])
    truncated.chmod(0o600)
    with pytest.raises(EncryptionKeyError, match="not a victor_actors key file"):
        Keyring.from_file(truncated)
    with pytest.raises(EncryptionKeyError, match="cannot read"):
        Keyring.from_file(tmp_path / "missing.json")
    monkeypatch.setenv("VICTOR_ACTORS_KEYS", BOTH.to_json())
    assert Keyring.from_env("VICTOR_ACTORS_KEYS").active == "2026-12"
    monkeypatch.delenv("VICTOR_ACTORS_KEYS")
    with pytest.raises(EncryptionKeyError, match="is not set"):
        Keyring.from_env("VICTOR_ACTORS_KEYS")


# -- rotation ----------------------------------------------------------------------------------------


def test_rotation_with_two_keys_live_then_rekey_so_the_old_key_is_not_needed(tmp_path: Path) -> None:
    _fill(tmp_path, RING_A)
    with GlobalStateManager.open(tmp_path, encryption=BOTH) as manager:  # new key active, old still there
        conv = manager.scope("conversation:secret-session-7f3a")
        conv.add_message({"role": "user", "content": "after the rotation"})
        assert conv.snapshot().messages[0]["content"] == "hunter2-passphrase 0"  # sealed with the old key
    with pytest.raises(EncryptionKeyError):
        GlobalStateManager.open(tmp_path, encryption=RING_B)  # old records still need the old key
    written = rekey(tmp_path, RING_B, BOTH)
    assert written > 15  # with three checkpoints, retention keeps the log after the oldest (v5)
    with GlobalStateManager.open(tmp_path, encryption=RING_B) as manager:
        conv = manager.scope("conversation:secret-session-7f3a")
        assert conv.version == 13 and conv.snapshot().messages[-1]["content"] == "after the rotation"
        assert manager.list_checkpoints(conv.ref)[0].label == "a label with TOKEN-abcdef-123456"
    with pytest.raises(EncryptionKeyError):
        GlobalStateManager.open(tmp_path, encryption=RING_A)
    assert not any(needle in _raw_files(tmp_path) for needle in SECRETS)


def test_encrypting_a_store_in_place_is_a_no_op_the_second_time(tmp_path: Path) -> None:
    _fill(tmp_path, None)
    assert encrypt_in_place(tmp_path, RING_A) is True
    assert encrypt_in_place(tmp_path, RING_A) is False
    with GlobalStateManager.open(tmp_path, encryption=RING_A) as manager:
        _check_contents(manager)


_CHILD = """
import sys
from victor_actors import Keyring
from victor_actors.store import rekey, encrypt_in_place
new = Keyring.from_json(sys.argv[2])
old = Keyring.from_json(sys.argv[3]) if sys.argv[3] != "-" else None
print("start", flush=True)
if old is None:
    encrypt_in_place(sys.argv[1], new)
else:
    rekey(sys.argv[1], new, old)
print("done", flush=True)
"""


def _fill_many(path: Path, keyring: Keyring | None) -> None:
    """150 conversations of 20 commits: a rewrite of it takes long enough to be killed midway."""
    with GlobalStateManager.open(path, encryption=keyring, durability="async") as manager:
        for c in range(150):
            conv = manager.get_conversation_state(f"c{c}", team_id="team-zebra-omega")
            for i in range(20):
                conv.add_message(f"hunter2-passphrase {c} {i}")


def _check_many(manager: GlobalStateManager) -> None:
    for c in range(150):
        snap = manager.scope(f"conversation:c{c}").snapshot()
        assert list(snap.messages) == [f"hunter2-passphrase {c} {i}" for i in range(20)]
    assert not manager.recovery_reports


@pytest.mark.parametrize("mode", ["rekey", "migrate"])
def test_sigkill_at_any_point_of_a_rewrite_leaves_the_old_or_the_new_store_whole(
    tmp_path: Path, mode: str
) -> None:
    """Kill the rewrite at staggered moments; each time the store opens whole under one of the keys,
    with every acknowledged commit. Some kills must land before the rewrite finished."""
    rng = random.Random(11)
    outcomes = {"old": 0, "new": 0, "killed_midway": 0}
    old = RING_A.to_json() if mode == "rekey" else "-"

    def start_rewrite(path: Path) -> subprocess.Popen[bytes]:
        _fill_many(path, RING_A if mode == "rekey" else None)
        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(path), RING_B.to_json(), old],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert child.stdout is not None
        assert child.stdout.readline().strip() == b"start"
        return child

    # How long one whole rewrite takes on this machine now: the kills land at fractions of it. (A
    # fixed window of 0.2 s let every rewrite finish first on a faster machine: 80 ms here.)
    timed = start_rewrite(tmp_path / "timed")
    began = time.monotonic()
    assert b"done" in timed.communicate()[0]
    whole = time.monotonic() - began
    for round_ in range(6):
        path = tmp_path / f"store-{round_}"
        child = start_rewrite(path)
        time.sleep(rng.uniform(0.02, 0.6) * whole)  # the kill's moment is the variable under test
        child.send_signal(signal.SIGKILL)
        rest, _err = child.communicate()
        outcomes["killed_midway"] += b"done" not in rest
        try:
            manager = GlobalStateManager.open(path, encryption=RING_B)
            outcomes["new"] += 1
        except EncryptionKeyError:
            manager = GlobalStateManager.open(path, encryption=RING_A if mode == "rekey" else None)
            outcomes["old"] += 1
        with manager:
            _check_many(manager)
        assert not any((path / name).exists() for name in ("rewrite.next", "rewrite.previous"))
    assert outcomes["killed_midway"] >= 2, outcomes


# -- the command line ----------------------------------------------------------------------------------


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "victor_actors", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def test_the_command_line_reads_an_encrypted_store_with_a_key_file_or_the_environment(tmp_path: Path) -> None:
    store, keys, new_keys = tmp_path / "store", tmp_path / "keys.json", tmp_path / "new.json"
    _fill(store, RING_A)
    RING_A.write_file(keys)
    RING_B.write_file(new_keys)
    refused = _cli("inspect", str(store))
    assert refused.returncode == 2 and "is encrypted (it holds 3 scopes)" in refused.stderr
    assert "secret-session" not in refused.stdout + refused.stderr
    shown = _cli("show", str(store), "conversation:secret-session-7f3a", "--key-file", str(keys))
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["state"]["token"] == "TOKEN-abcdef-123456"
    for command in (("inspect",), ("history",), ("export",), ("diff",)):
        args = [command[0], str(store)]
        if command[0] != "inspect":
            args.append("conversation:secret-session-7f3a")
        if command[0] == "diff":
            args += ["5", "8"]  # retention keeps the checkpoint at v5 and the log after it
        done = _cli(*args, env={"VICTOR_ACTORS_KEYS": RING_A.to_json()})
        assert done.returncode == 0, (command, done.stderr)
    rekeyed = _cli("rekey", str(store), "--key-file", str(new_keys), "--old-key-file", str(keys))
    assert rekeyed.returncode == 0 and "old key is no longer needed" in rekeyed.stdout, rekeyed.stderr
    assert _cli("inspect", str(store), "--key-file", str(new_keys)).returncode == 0
    assert _cli("inspect", str(store), "--key-file", str(keys)).returncode == 2


# -- LangGraph on an encrypted store ------------------------------------------------------------------


def test_langgraph_conformance_on_an_encrypted_saver(tmp_path: Path) -> None:
    from langgraph.checkpoint.conformance import checkpointer_test, validate
    from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES

    from victor_actors.langgraph import VictorActorsSaver

    counter = iter(range(1_000))

    @checkpointer_test(name="VictorActorsSaver-encrypted")
    async def factory() -> AsyncIterator[VictorActorsSaver]:
        saver = VictorActorsSaver.open(tmp_path / f"store-{next(counter)}", encryption=RING_A)
        async with saver:
            yield saver

    report = asyncio.run(validate(factory))
    assert {c.value for c in ALL_CAPABILITIES} == set(report.results)
    assert report.passed_all() and report.conformance_level() == "FULL"


def test_a_langgraph_thread_on_an_encrypted_store_leaves_no_id_and_no_value_in_the_file(
    tmp_path: Path,
) -> None:
    from typing import TypedDict

    from langgraph.graph import END, START, StateGraph

    from victor_actors.langgraph import VictorActorsSaver

    class State(TypedDict):
        note: str

    builder = StateGraph(State)
    builder.add_node("write", lambda state: {"note": state["note"] + " TOKEN-abcdef-123456"})
    builder.add_edge(START, "write")
    builder.add_edge("write", END)
    config = {"configurable": {"thread_id": "secret-session-7f3a"}}
    with VictorActorsSaver.open(tmp_path, encryption=RING_A) as saver:
        graph = builder.compile(checkpointer=saver)
        assert graph.invoke({"note": "hunter2-passphrase"}, config)["note"].endswith("TOKEN-abcdef-123456")
    raw = _raw_files(tmp_path)
    assert not any(needle in raw for needle in SECRETS)
    with VictorActorsSaver.open(tmp_path, encryption=RING_A) as saver:
        assert saver.get_tuple(config).checkpoint["channel_values"]["note"].startswith("hunter2")


def test_the_package_imports_without_touching_keys() -> None:
    code = textwrap.dedent(
        """
        import victor_actors, sys
        assert "victor_actors.store._crypto" in sys.modules  # part of the store, always available
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr
