"""Many processes, one state: real owner processes, uvicorn workers, worker pools, SIGKILL, readers.

Everything here is a real process: ``victor-actors owner`` started by the
test, ``uvicorn --workers 4`` in front of it (examples/deploy_fastapi.py),
pools of Python worker processes with their own clients, and a read-only
manager beside a writing owner. Lines a child acknowledges are written in
one ``write`` each, so a SIGKILL never leaves half a line.
"""

from __future__ import annotations

import json
import os
import queue
import re
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import victor_actors
from victor_actors import GlobalStateManager, TransitionBatch

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(EXAMPLES))
import deploy_fastapi  # noqa: E402  (the example app's own HTTP-over-unix-socket helpers)


class Owner:
    """``victor-actors owner PATH --socket SOCK`` in a child process, restartable."""

    def __init__(self, store: Path, sock: Path, *extra: str) -> None:
        self.store, self.sock, self.extra = store, sock, extra
        self.url = f"unix://{sock}"
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> Owner:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "victor_actors", "owner", str(self.store), "--socket", str(self.sock),
             *self.extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith("victor-actors owner: serving"), line + (self.proc.stderr.read() if self.proc.stderr else "")
        return self

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.terminate()
        return self.proc.wait(30)


@pytest.fixture
def owner(tmp_path: Path) -> Iterator[Owner]:
    o = Owner(tmp_path / "store", tmp_path / "owner.sock").start()
    try:
        yield o
    finally:
        if o.proc is not None and o.proc.poll() is None:
            o.proc.kill()
            o.proc.wait(30)


def test_uvicorn_four_workers_in_front_of_one_owner(owner: Owner, tmp_path: Path) -> None:
    """400 appends over 40 sessions at concurrency 16: no error, every session complete and in order,
    and the worker that answers a read right after a write (whichever it is) sees that write."""
    uds = str(tmp_path / "web.sock")
    web = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "deploy_fastapi:app", "--workers", "4", "--uds", uds,
         "--log-level", "warning"],
        cwd=EXAMPLES,
        env={**os.environ, "VICTOR_ACTORS_URL": owner.url},
    )
    try:
        deploy_fastapi.wait_until_serving(uds)
        sessions: queue.SimpleQueue[int] = queue.SimpleQueue()
        for n in range(40):
            sessions.put(n)
        errors: list[str] = []
        pids: set[int] = set()

        def client() -> None:
            while True:
                try:
                    n = sessions.get_nowait()
                except queue.Empty:
                    return
                try:
                    for i in range(10):
                        wrote = deploy_fastapi.request(
                            uds, "POST", f"/sessions/s{n}/messages", {"role": "user", "content": i}
                        )
                        read = deploy_fastapi.request(uds, "GET", f"/sessions/s{n}")
                        pids.update((wrote["pid"], read["pid"]))
                        if read["version"] < wrote["version"] or read["messages"][-1]["content"] != i:
                            errors.append(f"s{n}: a read after write {i} saw {read['version']}")
                except Exception as exc:
                    errors.append(f"s{n}: {type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=client) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors[:5]
        assert len(pids) == 4, f"served by {len(pids)} workers"
        with victor_actors.connect(owner.url) as c:
            for n in range(40):
                messages = c.get_conversation_state(f"s{n}").snapshot().messages
                assert [m["content"] for m in messages] == list(range(10)), n
    finally:
        web.terminate()
        web.wait(30)
    assert owner.stop() == 0


POOL_WORKER = """
import os, sys
import victor_actors
from victor_actors import TransitionBatch
client = victor_actors.connect(sys.argv[1], wait=30, request_timeout=60)
me = int(sys.argv[2])
for i in range(int(sys.argv[3])):
    team = client.get_team_state(f"t{i % 4}")
    record = team.modify(lambda s: TransitionBatch().update_state("count", s.get_state("count", 0) + 1), retries=1000)
    conv = client.get_conversation_state(f"w{me}", team_id=f"t{i % 4}" if i == 0 else None)
    conv.add_message({"worker": me, "i": i})
    os.write(1, f"ACK {me} {i}\\n".encode())
client.close()
"""


def _pool(url: str, workers: int, steps: int) -> list[subprocess.Popen[str]]:
    return [
        subprocess.Popen(
            [sys.executable, "-c", POOL_WORKER, url, str(w), str(steps)], stdout=subprocess.PIPE, text=True
        )
        for w in range(workers)
    ]


def test_a_pool_of_four_workers_loses_no_update(owner: Owner) -> None:
    procs = _pool(owner.url, 4, 40)
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0 and out.count("ACK") == 40, out[-500:]
    with victor_actors.connect(owner.url) as c:
        assert [c.get_team_state(f"t{k}").get("count") for k in range(4)] == [40, 40, 40, 40]


def test_sigkill_the_owner_mid_load_every_acknowledged_commit_survives_once(owner: Owner) -> None:
    """The pool keeps going through a SIGKILL of the owner and its restart; its clients reconnect by
    themselves, every acknowledged commit is in the store, and none is there twice."""
    procs = _pool(owner.url, 4, 60)
    acked: dict[int, list[int]] = {w: [] for w in range(4)}
    assert procs[0].stdout is not None
    seen = 0
    for line in procs[0].stdout:
        seen += 1
        acked[0].append(int(line.split()[2]))
        if seen == 15:
            break
    owner.kill()  # mid-load: the pool's requests in flight are lost with the connection
    owner.start()  # a new owner at the same socket path takes the stale socket file over
    for w, p in enumerate(procs):
        out, _ = p.communicate(timeout=180)
        assert p.returncode == 0, out[-500:]
        acked[w] += [int(line.split()[2]) for line in out.splitlines() if line.startswith("ACK")]
    with victor_actors.connect(owner.url) as c:
        for w in range(4):
            assert acked[w] == list(range(60))
            messages = c.get_conversation_state(f"w{w}").snapshot().messages
            assert [m["i"] for m in messages] == list(range(60)), f"worker {w}: lost or doubled commits"
        counts = [c.get_team_state(f"t{k}").get("count") for k in range(4)]
        assert counts == [60, 60, 60, 60], counts


WRITER = """
import os, sys
from victor_actors import GlobalStateManager, TransitionBatch
m = GlobalStateManager.open(sys.argv[1])
conv = m.get_conversation_state("s", team_id="t")
os.write(1, b"READY\\n")
for i in range(1, 100000):
    conv.apply(TransitionBatch().update_state("i", i).update_state("i", i, scope="team"))
    os.write(1, f"ACK {i}\\n".encode())
"""


def test_read_only_snapshots_beside_a_writer_are_never_torn_or_stale(tmp_path: Path) -> None:
    """1,000 read-only snapshots while another process commits conversation+team batches: none shows
    half a batch, and each is at least as new as the last commit acknowledged before it was taken.
    Before the fix a read-only manager kept a scope at the version it first loaded, and 55% of fresh
    read-only snapshots showed a batch half applied."""
    store = tmp_path / "store"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(store)], stdout=subprocess.PIPE)
    try:
        assert writer.stdout is not None
        assert writer.stdout.readline() == b"READY\n"
        fd = writer.stdout.fileno()
        os.set_blocking(fd, False)
        buffered, last = b"", 0

        def acknowledged(block: bool = False) -> int:
            """The last version the writer acknowledged; with ``block``, wait for a newer one."""
            nonlocal buffered, last
            if block:
                select.select([fd], [], [], 30)
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                return last
            buffered += chunk
            *lines, buffered = buffered.split(b"\n")
            for line in lines:
                last = int(line.split()[1])
            return last

        while acknowledged() == 0:
            pass
        with GlobalStateManager.open(store, read_only=True) as reader:
            conv = reader.get_conversation_state("s")
            versions = set()
            for n in range(1000):
                floor = acknowledged(block=n % 10 == 0)  # now and then right after a new commit
                snap = conv.snapshot()
                own, team = snap._state.values.get("i"), snap._ancestors[0].values.get("i")
                assert own == team, f"a torn snapshot: the conversation at {own}, its team at {team}"
                assert own >= floor, f"a stale snapshot: {own} after {floor} was acknowledged"
                assert conv.version >= own
                versions.add(own)
            assert len(versions) > 10, "the writer did not move while we read"
    finally:
        writer.kill()
        writer.wait(30)


def test_owner_rolling_update_and_probe(tmp_path: Path) -> None:
    """A second owner waits for the lock (--lock-timeout), takes over the socket when the first is
    stopped with SIGTERM (which drains and exits 0), and a client carries on without a restart."""
    store, sock = tmp_path / "store", tmp_path / "o.sock"
    first = Owner(store, sock).start()
    second = Owner(store, sock, "--lock-timeout", "60")
    try:
        with victor_actors.connect(first.url, request_timeout=60) as c:
            c.get_team_state("t").set("n", 1)
            ping = subprocess.run(
                [sys.executable, "-m", "victor_actors", "ping", first.url], capture_output=True, text=True
            )
            assert ping.returncode == 0 and "owner pid" in ping.stdout
            starting = threading.Thread(target=second.start)
            starting.start()  # blocks in the child until the store's lock is free
            assert first.stop() == 0
            starting.join(60)
            assert second.proc is not None and second.proc.poll() is None
            c.get_team_state("t").modify(lambda s: TransitionBatch().update_state("n", s.get_state("n") + 1))
            assert c.get_team_state("t").get("n") == 2
            assert c.info()["pid"] == second.proc.pid
    finally:
        for o in (first, second):
            if o.proc is not None and o.proc.poll() is None:
                o.proc.kill()
                o.proc.wait(30)
    nobody = subprocess.run(
        [sys.executable, "-m", "victor_actors", "ping", f"unix://{sock}", "--timeout", "0.5"],
        capture_output=True,
        text=True,
    )
    assert nobody.returncode == 2 and "OwnerUnavailableError" in nobody.stderr


def test_owner_refuses_to_start_with_one_clear_line(tmp_path: Path) -> None:
    store, sock = tmp_path / "store", tmp_path / "o.sock"
    first = Owner(store, sock).start()
    try:
        second = subprocess.run(
            [sys.executable, "-m", "victor_actors", "owner", str(store), "--socket", str(tmp_path / "b.sock")],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 2 and second.stderr.startswith("victor-actors: StoreLockedError")
        assert "Traceback" not in second.stderr
        none = subprocess.run(
            [sys.executable, "-m", "victor_actors", "owner", str(tmp_path / "x")],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert none.returncode == 2 and "--socket" in none.stderr
    finally:
        assert first.stop() == 0


def _recipe_commands() -> list[list[str]]:
    """The commands of docs/deploying.md's Kubernetes recipe, as its YAML gives them."""
    text = (ROOT / "docs" / "deploying.md").read_text()
    yaml = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    found = re.findall(r"command: (\[.*?\])", yaml, re.S)
    return [json.loads(" ".join(block.split())) for block in found]


def test_the_kubernetes_recipe_runs_as_written(tmp_path: Path) -> None:
    """The owner on TCP with a token, its probes, and a client with the token: docs/deploying.md's YAML."""
    owner_cmd, ready, live = _recipe_commands()
    token = tmp_path / "token"
    token.write_text("a-shared-secret\n")
    places = {
        "/data/store": str(tmp_path / "store"),
        "/tmp/owner.sock": str(tmp_path / "owner.sock"),
        "/etc/agents/token": str(token),
        "0.0.0.0:7400": "0.0.0.0:0",
    }

    def local(cmd: list[str]) -> list[str]:
        out = []
        for arg in cmd:
            for old, new in places.items():
                arg = arg.replace(old, new)
            out.append(arg)
        assert out[0] == "victor-actors"
        return [sys.executable, "-m", "victor_actors", *out[1:]]

    proc = subprocess.Popen(local(owner_cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        tcp = re.search(r"tcp://[^ ]+", line)
        assert tcp is not None, line
        port = tcp.group(0).rsplit(":", 1)[1]
        for probe in (ready, live):
            assert subprocess.run(local(probe), capture_output=True, timeout=60).returncode == 0
        url = f"tcp://127.0.0.1:{port}"
        with victor_actors.connect(url, token_file=token, wait=30) as client:
            client.get_team_state("t").set("x", 1)
            assert client.get_team_state("t").get("x") == 1
        with victor_actors.connect(url, request_timeout=5) as stranger:
            with pytest.raises(victor_actors.ScopeAccessError, match="token"):
                stranger.get_team_state("t")
    finally:
        proc.terminate()
        assert proc.wait(30) == 0


def test_a_clients_subscription_resumes_across_an_owner_restart(owner: Owner) -> None:
    """Events reach a client's subscriber in commit order, each once, through a SIGKILL of the owner."""
    seen: list[int] = []
    twenty = threading.Event()

    def on_commit(event: victor_actors.StateChanged) -> None:
        seen.append(event.new_version)
        if event.new_version == 20:
            twenty.set()

    with victor_actors.connect(owner.url, request_timeout=60) as client:
        conv = client.get_conversation_state("s", team_id="t")
        sub = conv.subscribe(on_commit)
        for i in range(10):
            conv.add_message({"i": i})
        owner.kill()
        owner.start()
        for i in range(10, 20):
            conv.add_message({"i": i})
        assert twenty.wait(60)
        sub.close()
    assert seen == list(range(1, 21))
