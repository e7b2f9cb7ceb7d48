"""An owner in another process, for the agent-SDK session-store tests (tests/test_adk.py and its peers).

``victor-actors owner STORE --socket SOCK --key-file KEYS`` started by the test, as
tests/test_deploy.py starts it: the store is encrypted at rest and every session-store call
reaches it through a ``victor_actors.connect`` client, so one fixture covers the remote and
the encrypted cases together. Clients in forked children (``fork_clients``) are the "many
worker processes" of a deployment: forking the test process costs no import, where a spawned
child would import the SDK again (seconds apiece).
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from victor_actors import Keyring

ROOT = Path(__file__).resolve().parents[1]
KEYS = Keyring({"k1": bytes(range(32))}, active="k1")


@contextmanager
def owner_process(where: Path) -> Iterator[str]:
    """Serve an encrypted store under ``where`` from a child process; yield its url; stop it at the end."""
    key_file = where / "keys.json"
    KEYS.write_file(key_file)
    os.chmod(key_file, 0o600)
    sock = where / "owner.sock"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    log = where / "owner.log"  # its stderr: a file, so a chatty owner never blocks on a full pipe
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "victor_actors", "owner", str(where / "store"), "--socket", str(sock),
             "--key-file", str(key_file)],
            stdout=subprocess.PIPE, stderr=err, text=True, env=env,
        )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("victor-actors owner: serving"), line + log.read_text()
        yield f"unix://{sock}"
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:  # pragma: no cover - a stuck owner is killed, not left behind
            proc.kill()
            proc.wait(30)


def fork_clients(target: Callable[..., None], args: list[tuple[Any, ...]], timeout: float = 120) -> None:
    """Run ``target(start, *a)`` for each ``a`` in its own forked child; all wait on ``start``, then go.

    Each child makes its own client of the owner (a client is per process). Raises if a child
    fails or does not finish.
    """
    ctx = multiprocessing.get_context("fork")
    start = ctx.Event()
    procs = [ctx.Process(target=target, args=(start, *a)) for a in args]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(timeout)
    codes = [p.exitcode for p in procs]
    for p in procs:
        if p.exitcode is None:  # pragma: no cover - reported below
            p.kill()
            p.join()
    assert codes == [0] * len(procs), f"child exit codes: {codes}"
