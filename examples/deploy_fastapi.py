"""A FastAPI app under ``uvicorn --workers 4``, every worker a client of one owner process.

The app (``app`` below) is what you deploy: each uvicorn worker connects to
the owner named by ``$VICTOR_ACTORS_URL`` when it starts, and every request
is a call to the owner, so all four workers see one state, read their own
writes, and never lose an update. Run it with::

    victor-actors owner /var/lib/agents --socket /run/agents.sock &
    VICTOR_ACTORS_URL=unix:///run/agents.sock uvicorn deploy_fastapi:app --workers 4

Run as a program (``python examples/deploy_fastapi.py``), it does exactly
that in a temporary directory: starts an owner and ``uvicorn --workers 4``,
sends requests, checks that every worker saw the same state, and stops both.
See docs/deploying.md.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

import victor_actors
from victor_actors import TransitionBatch
from victor_actors.lowlevel import thaw

state: dict[str, Any] = {}


@asynccontextmanager
async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
    # One client per worker process, made after uvicorn started the worker; wait=30: a worker that
    # starts before its owner waits for it instead of failing.
    state["client"] = victor_actors.connect(os.environ["VICTOR_ACTORS_URL"], wait=30)
    yield
    state.pop("client").close()


app = FastAPI(lifespan=lifespan)


@app.post("/sessions/{session_id}/messages")
async def append(session_id: str, message: dict[str, Any]) -> dict[str, Any]:
    conv = await state["client"].aget_conversation_state(session_id, team_id="support")
    record = await conv.aapply(
        TransitionBatch()
        .add_message(message)
        .update_state("last_session", session_id, scope="team")
    )
    return {"version": record.new_version, "pid": os.getpid()}


@app.get("/sessions/{session_id}")
async def read(session_id: str) -> dict[str, Any]:
    conv = await state["client"].aget_conversation_state(session_id, team_id="support")
    snapshot = await conv.asnapshot()
    messages = [thaw(m) for m in snapshot.messages]
    return {"version": snapshot.version, "messages": messages, "pid": os.getpid()}


@app.post("/teams/{team_id}/count")
async def count(team_id: str) -> dict[str, Any]:
    team = await state["client"].aget_team_state(team_id)
    record = await team.amodify(
        lambda s: TransitionBatch().update_state("count", s.get_state("count", 0) + 1), retries=100
    )
    return {"version": record.new_version, "pid": os.getpid()}


# -- the demo: an owner, uvicorn --workers 4, and requests through a unix socket ----------------------


class _UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=30)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(self._path)


def request(uds: str, method: str, path: str, body: Any = None) -> Any:
    """One HTTP request to the app over its unix socket; the JSON reply."""
    conn = _UnixHTTP(uds)
    try:
        headers = {"content-type": "application/json"} if body is not None else {}
        conn.request(method, path, None if body is None else json.dumps(body), headers)
        response = conn.getresponse()
        data = response.read()
        if response.status != 200:
            raise RuntimeError(f"{method} {path}: {response.status} {data[:300]!r}")
        return json.loads(data)
    finally:
        conn.close()


def wait_until_serving(uds: str, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while True:
        try:
            request(uds, "GET", "/sessions/probe")
            return
        except (OSError, RuntimeError):
            if time.monotonic() > end:
                raise
            time.sleep(0.1)  # polling another process's start-up


def main() -> int:
    from _checks import check, verdict

    with tempfile.TemporaryDirectory() as tmp:
        sock, uds = os.path.join(tmp, "owner.sock"), os.path.join(tmp, "web.sock")
        env = {**os.environ, "VICTOR_ACTORS_URL": f"unix://{sock}"}
        here = os.path.dirname(os.path.abspath(__file__))
        owner = subprocess.Popen(
            [sys.executable, "-m", "victor_actors", "owner", os.path.join(tmp, "store"), "--socket", sock],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert owner.stdout is not None
        print(owner.stdout.readline().strip())
        web = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "deploy_fastapi:app", "--workers", "4", "--uds", uds,
             "--log-level", "warning"],
            cwd=here,
            env=env,
        )
        try:
            wait_until_serving(uds)
            pids = set()
            for n in range(20):
                reply = request(uds, "POST", f"/sessions/s{n % 4}/messages", {"role": "user", "content": n})
                pids.add(reply["pid"])
                after = request(uds, "GET", f"/sessions/s{n % 4}")  # any worker: it sees the write
                check(after["version"] >= reply["version"], f"a worker read an older state after write {n}")
                pids.add(after["pid"])
            for _ in range(12):
                pids.add(request(uds, "POST", "/teams/red/count")["pid"])
            sessions = [request(uds, "GET", f"/sessions/s{k}") for k in range(4)]
            check([len(s["messages"]) for s in sessions] == [5, 5, 5, 5], "every session holds its 5 messages")
            check(
                [m["content"] for m in sessions[0]["messages"]] == [0, 4, 8, 12, 16], "in the order written"
            )
            print(f"served by {len(pids)} worker processes; every read after a write saw it")
        finally:
            web.terminate()
            web.wait(30)
            owner.terminate()  # SIGTERM: the owner drains, flushes and exits 0
            check(owner.wait(30) == 0, "the owner exited 0 on SIGTERM")
    return verdict()


if __name__ == "__main__":
    raise SystemExit(main())
