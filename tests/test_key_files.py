"""Key files and key variables that are not key files get a typed error, and every command answers them
with one line and exit 2 (issue 28, item 10, for keys and the command line).

Real files of every wrong kind (not UTF-8, a directory, a FIFO, JSON nested
100,000 deep, fields of the wrong type), through ``Keyring`` and through the
``victor-actors`` commands in this process and in a child process.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from victor_actors import EncryptionKeyError, GlobalStateManager, Keyring
from victor_actors.cli import main

GOOD = Keyring({"k": bytes(range(32))}, active="k")
B64 = base64.b64encode(bytes(range(32))).decode()
DEEP = "[" * 100_000 + "]" * 100_000


def _text(text: str) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        path.write_text(text)
        path.chmod(0o600)

    return make


def _bytes(raw: bytes) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        path.write_bytes(raw)
        path.chmod(0o600)

    return make


def _directory(path: Path) -> None:
    path.mkdir(mode=0o700)


def _fifo(path: Path) -> None:
    os.mkfifo(path, 0o600)


BAD: dict[str, Callable[[Path], None]] = {
    "not UTF-8": _bytes(b'{"active": "k", "keys": {"k": "\xff\xfe"}}'),
    "a directory": _directory,
    "a FIFO": _fifo,
    "JSON nested 100,000 deep": _text(DEEP),
    "an object nested 100,000 deep": _text('{"a":' * 100_000 + "1" + "}" * 100_000),
    "empty": _text(""),
    "a JSON list": _text("[1, 2]"),
    "keys a list": _text('{"active": "k", "keys": ["k"]}'),
    "active a list": _text(f'{{"active": ["k"], "keys": {{"k": "{B64}"}}}}'),
    "active a number": _text(f'{{"active": 1, "keys": {{"k": "{B64}"}}}}'),
    "a key a number": _text('{"active": "k", "keys": {"k": 5}}'),
    "a key not base64": _text('{"active": "k", "keys": {"k": "not base64!"}}'),
    "a key not ASCII": _text('{"active": "k", "keys": {"k": "\u00e9\u00e9\u00e9\u00e9"}}'),
    "a key too short": _text(f'{{"active": "k", "keys": {{"k": "{base64.b64encode(b"short").decode()}"}}}}'),
    "an empty key id": _text(f'{{"active": "", "keys": {{"": "{B64}"}}}}'),
    "no keys": _text('{"active": "k", "keys": {}}'),
    "larger than a key file": _text(" " * (2 << 20) + "{}"),
}


@pytest.mark.parametrize("kind", sorted(BAD))
def test_a_key_file_that_is_not_one_is_an_encryption_key_error(tmp_path: Path, kind: str) -> None:
    """Guards issue 28 item 10. Failed before the fix for the first four kinds at least: a key file
    with invalid UTF-8, a directory, or JSON nested 100,000 deep raised UnicodeDecodeError,
    IsADirectoryError or RecursionError (a FIFO blocked the open)."""
    path = tmp_path / "keys.json"
    BAD[kind](path)
    with pytest.raises(EncryptionKeyError) as caught:
        Keyring.from_file(path)
    message = str(caught.value)
    assert "keys.json" in message and B64 not in message


@pytest.mark.parametrize("text", [DEEP, "[1, 2]", '{"active": ["k"], "keys": {}}', "\udcff"])
def test_a_key_variable_that_is_not_a_key_file_is_an_encryption_key_error(
    monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    monkeypatch.setenv("VICTOR_ACTORS_KEYS", text)
    with pytest.raises(EncryptionKeyError, match="VICTOR_ACTORS_KEYS"):
        Keyring.from_env("VICTOR_ACTORS_KEYS")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("store")
    with GlobalStateManager.open(path, encryption=GOOD) as manager:
        manager.get_conversation_state("c").set("k", 1)
        manager.scope("conversation:c").set("k", 2)
    return path


COMMANDS = {
    "inspect": ["inspect", "{store}", "--key-file", "{bad}"],
    "history": ["history", "{store}", "conversation:c", "--key-file", "{bad}"],
    "show": ["show", "{store}", "conversation:c", "--key-file", "{bad}"],
    "diff": ["diff", "{store}", "conversation:c", "1", "2", "--key-file", "{bad}"],
    "export": ["export", "{store}", "--key-file", "{bad}"],
    "serve": ["serve", "{store}", "--port", "0", "--key-file", "{bad}"],
    "rekey NEW": ["rekey", "{store}", "--key-file", "{bad}", "--old-key-file", "{good}"],
    "rekey OLD": ["rekey", "{store}", "--key-file", "{good}", "--old-key-file", "{bad}"],
}


@pytest.mark.parametrize("kind", ["not UTF-8", "a directory", "JSON nested 100,000 deep", "active a list"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_answers_a_bad_key_file_with_one_line_and_exit_2(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, kind: str
) -> None:
    """Guards issue 28 item 10. Failed before the fix: inspect, serve and rekey (and the other views)
    let UnicodeDecodeError, IsADirectoryError or RecursionError out as a traceback."""
    bad, good = tmp_path / "bad.json", tmp_path / "good.json"
    BAD[kind](bad)
    GOOD.write_file(good)
    before = (store / "data" / "data.mdb").read_bytes()
    argv = [a.format(store=store, bad=bad, good=good) for a in COMMANDS[command]]
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2 and out == "", (out, err)
    assert err.count("\n") == 1 and err.startswith("victor-actors: error: ") and "bad.json" in err
    assert (store / "data" / "data.mdb").read_bytes() == before


def test_the_variable_too_and_in_a_child_process_no_traceback(store: Path, tmp_path: Path) -> None:
    bad = tmp_path / "dir"
    bad.mkdir()
    runs = [
        (["inspect", str(store)], {"VICTOR_ACTORS_KEYS": "[" * 30_000 + "]" * 30_000}),
        (["serve", str(store), "--port", "0"], {"VICTOR_ACTORS_KEYS": "[1, 2]"}),
        (["rekey", str(store), "--key-file", str(bad)], {}),
        (["inspect", str(tmp_path / "no-store")], {}),
    ]
    for argv, env in runs:
        done = subprocess.run(
            [sys.executable, "-m", "victor_actors", *argv],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, **env},
        )
        assert done.returncode == 2, (argv, done.stderr)
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, (argv, done.stderr)
