"""victor_actors.connect: a client in another process (here: over a real socket) with the local API.

The owner is a real manager on a real LMDB store, serving a real unix socket
(``GlobalStateManager.open(path, listen=...)``); clients connect to it as
another process would. Tests that need other processes (uvicorn workers, a
pool, SIGKILL) are in test_deploy.py. Each API test runs twice, through the
sync calls and through their asyncio twins (the ``api`` fixture).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_for

import victor_actors
from victor_actors import (
    GlobalStateManager,
    OwnerUnavailableError,
    RunFailedError,
    RunTimeoutError,
    RuntimeClosedError,
    ScopeAccessError,
    StoreLockedError,
    TransitionBatch,
    VersionConflictError,
)
from victor_actors.remote import _wire as w
from victor_actors.remote._frames import HEADER, PROTOCOL


@pytest.fixture
def owner(tmp_path: Path) -> Iterator[tuple[GlobalStateManager, str]]:
    url = f"unix://{tmp_path}/owner.sock"
    manager = GlobalStateManager.open(tmp_path / "store", listen=url)
    try:
        yield manager, url
    finally:
        manager.close()


@pytest.fixture
def client(owner: tuple[GlobalStateManager, str]) -> Iterator[victor_actors.RemoteStateManager]:
    c = victor_actors.connect(owner[1])
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(params=["sync", "asyncio"])
def api(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """``api(obj, "apply", ...)``: the sync method, or its ``a`` twin run on a fresh event loop."""

    def call(obj: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        if request.param == "sync":
            return getattr(obj, name)(*args, **kwargs)
        return asyncio.run(getattr(obj, "a" + name)(*args, **kwargs))

    return call


def test_reads_writes_and_errors_as_locally(owner, client, api) -> None:
    manager, _ = owner
    conv = client.get_conversation_state("s1", workflow_id="wf", team_id="t1")
    assert conv.parent == victor_actors.ScopeRef("workflow", "wf")
    record = api(
        conv,
        "apply",
        TransitionBatch().add_message({"role": "user", "content": "hi"}).update_state("n", 1, scope="team"),
    )
    assert record.new_version == 1 and {r.ref.scope.value for r in record.related} == {"team"}
    # the owner sees it, and a fresh client reads its own writes at once
    local = manager.get_conversation_state("s1")
    assert local.snapshot().messages[-1]["content"] == "hi"
    snap = api(conv, "snapshot")
    assert snap.version == 1 and snap.get_state("n") == 1
    assert conv.version == 1 and conv.get("n") == 1 and conv.to_dict() == {}
    # a stale expected_version: the typed error with its fields, nothing applied
    with pytest.raises(VersionConflictError) as info:
        api(conv, "apply", TransitionBatch().update_state("k", 1), expected_version=0)
    assert (info.value.expected_version, info.value.current_version) == (0, 1)
    assert local.version == 1
    with pytest.raises(VersionConflictError):
        api(conv, "update", {"n": 2}, expected_version={"team": 0})
    # the same scope under another parent, and create=False, are refused as locally
    with pytest.raises(ScopeAccessError):
        client.get_conversation_state("s1", team_id="other")
    with pytest.raises(ScopeAccessError):
        client.get_team_state("nobody", create=False)
    with pytest.raises(ScopeAccessError):
        client.scope("conversation:missing")
    assert {str(r) for r in client.scopes()} >= {"global:global", "team:t1", "workflow:wf", "conversation:s1"}


def test_modify_loses_no_update_from_threads_of_two_clients(owner) -> None:
    """8 threads over two client connections bump one team counter with modify: none is lost."""
    _, url = owner
    clients = [victor_actors.connect(url) for _ in range(2)]
    try:
        start = threading.Barrier(8)
        errors: list[BaseException] = []

        def agent(n: int) -> None:
            conv = clients[n % 2].get_conversation_state(f"a{n}", team_id="t")
            start.wait()
            try:
                for _ in range(15):
                    conv.modify(
                        lambda s: TransitionBatch().update_state("count", s.get_state("count", 0) + 1, scope="team"),
                        retries=100,
                    )
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=agent, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert clients[0].get_team_state("t").get("count") == 120
    finally:
        for c in clients:
            c.close()


def test_amodify_and_atransact_lose_no_update_from_asyncio(client) -> None:
    async def main() -> None:
        convs = [await client.aget_conversation_state(f"c{n}", team_id="t") for n in range(10)]

        async def bump(conv: Any, how: str) -> None:
            def fn(s: Any) -> TransitionBatch:
                return TransitionBatch().update_state(how, s.get_state(how, 0) + 1, scope="team")

            for _ in range(4):
                if how == "optimistic":
                    await conv.amodify(fn, retries=100)
                else:
                    await conv.atransact(fn)

        await asyncio.gather(*(bump(c, "optimistic") for c in convs), *(bump(c, "locked") for c in convs))
        team = await client.aget_team_state("t")
        assert await team.aget("optimistic") == 40
        assert await team.aget("locked") == 40

    asyncio.run(main())


def test_transact_that_raises_applies_nothing_and_unlocks(client) -> None:
    conv = client.get_conversation_state("s", team_id="t")
    conv.set("x", 1)

    def boom(_snapshot: Any) -> TransitionBatch:
        raise RuntimeError("the agent changed its mind")

    with pytest.raises(RuntimeError):
        conv.transact(boom)
    assert conv.version == 1
    # the scope is not held: a write goes through at once
    conv.transact(lambda s: TransitionBatch().update_state("x", s.get_state("x") + 1))
    assert conv.get("x") == 2


def test_events_reach_a_client_in_commit_order(owner, client) -> None:
    manager, _ = owner
    conv = client.get_conversation_state("s", team_id="t")
    seen: list[int] = []
    done = threading.Event()

    def on_commit(event: Any) -> None:
        seen.append(event.new_version)
        if event.new_version == 40:
            done.set()

    sub = conv.subscribe(on_commit)
    local = manager.get_conversation_state("s")
    for n in range(20):  # commits from the owner's own process and from the client, interleaved
        local.set("k", n)
        conv.set("k", -n)
    assert done.wait(10)
    assert seen == list(range(1, 41))
    sub.close()


@pytest.mark.parametrize("how", ["raises", "times out"])
def test_a_client_run_rolls_back_at_the_owner(owner, client, how) -> None:
    manager, _ = owner
    conv = client.get_conversation_state("s", team_id="t")
    conv.update({"keep": 1})
    other = manager.get_team_state("t")

    def body(run: Any) -> None:
        conv.set("x", "the run's")
        conv.apply(TransitionBatch().update_state("y", 1, scope="team"))
        other.set("z", "another writer's")  # not the run's: a rollback must leave it
        if how == "raises":
            raise RuntimeError("the agent failed")

    expected = RunFailedError if how == "raises" else RunTimeoutError
    with pytest.raises(expected) as info:
        if how == "raises":
            with client.run("s", timeout=30) as run:
                body(run)
        else:
            with client.run("s", timeout=0.5) as run:
                body(run)
                assert wait_for(lambda: run.remaining <= 0)
                with pytest.raises(victor_actors.DeadlineExceededError):
                    conv.set("late", 1)  # past the run's deadline: refused before it is sent
    report = info.value.rollback_report
    assert {str(s.ref) for s in report.scopes} == {"conversation:s", "team:t"}
    assert conv.to_dict() == {"keep": 1}
    assert manager.get_team_state("t").to_dict() == {"z": "another writer's"}
    assert run.status == "rolled_back" and run.rollback_report is report


def test_arun_rolls_back_when_its_body_raises(client) -> None:
    async def main() -> None:
        conv = await client.aget_conversation_state("s")
        with pytest.raises(RunFailedError):
            async with client.arun("s", timeout=10):
                await conv.aset("x", 1)
                raise ValueError("no")
        assert await conv.ato_dict() == {}
        async with client.arun("s", timeout=10) as run:
            await conv.aset("x", 2)
        assert run.status == "succeeded" and await conv.ato_dict() == {"x": 2}

    asyncio.run(main())


def test_a_run_its_client_abandons_is_rolled_back_after_its_deadline(owner, client) -> None:
    """A client that dies inside a run never ends it: the owner rolls it back once the deadline passed."""
    manager, _ = owner
    conv = client.get_conversation_state("s")
    run = client._sync(client._begin("s", 0.3))
    token = victor_actors.remote._handle.CURRENT_REMOTE_RUN.set(run)
    try:
        conv.set("x", "written by a run nobody ends")
    finally:
        victor_actors.remote._handle.CURRENT_REMOTE_RUN.reset(token)
    assert manager.get_conversation_state("s").to_dict() == {"x": "written by a run nobody ends"}
    assert wait_for(lambda: manager.get_conversation_state("s").to_dict() == {}, timeout=10)


def test_tools_run_in_the_client_that_registered_them(owner) -> None:
    """Two clients; only one executes ``search``: every call goes to it, none fails with a lookup error."""
    manager, url = owner
    with victor_actors.connect(url) as worker, victor_actors.connect(url) as web:
        ran: list[str] = []
        worker.register_tool("search", lambda call: ran.append(call.request_id) or {"hits": call.arguments["q"]})
        web.register_tool("other", lambda call: "unused")
        conv = web.get_conversation_state("s")
        for n in range(5):
            conv.apply(TransitionBatch().execute_tool("search", {"q": n}))
        assert wait_for(lambda: not manager.get_conversation_state("s").snapshot().pending_tool_requests, timeout=20)
        results = [m for m in conv.snapshot().messages if m.get("role") == "tool"]
        assert len(ran) == 5 and len(results) == 5
        assert all(m["error"] is None for m in results)
        assert sorted(m["content"]["hits"] for m in results) == list(range(5))


def test_checkpoints_restore_and_fork(client, api) -> None:
    conv = client.get_conversation_state("s", team_id="t")
    conv.set("x", 1)
    cid = api(client, "save_checkpoint", conv.ref, label="one")
    conv.set("x", 2)
    infos = api(client, "list_checkpoints", "conversation:s")
    assert [i.checkpoint_id for i in infos] == [cid] and infos[0].label == "one"
    assert api(client, "load_checkpoint", conv.ref).get_state("x") == 1
    assert client.state_at(conv.ref, 2).get_state("x") == 2
    api(client, "restore", conv.ref, cid)
    assert conv.get("x") == 1
    compacted = api(client, "compact", conv.ref)
    assert [i.checkpoint_id for i in client.list_checkpoints(conv.ref)] == [compacted]
    fork = api(client, "fork", conv.ref, compacted, "s-fork")
    assert fork.ref == victor_actors.ScopeRef("conversation", "s-fork") and fork.get("x") == 1
    assert fork.parent == conv.parent


def _raw(url: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(url[len("unix://") :])
    return s


def _send(s: socket.socket, rid: int, payload: bytes) -> None:
    s.sendall(HEADER.pack(len(payload), rid) + payload)


def _recv(s: socket.socket) -> tuple[int, Any]:
    head = b""
    while len(head) < HEADER.size:
        chunk = s.recv(HEADER.size - len(head))
        if not chunk:
            raise ConnectionError("closed")
        head += chunk
    size, rid = HEADER.unpack(head)
    body = b""
    while len(body) < size:
        chunk = s.recv(size - len(body))
        if not chunk:
            raise ConnectionError("closed")
        body += chunk
    return rid, w.decode(body)


def _hello(s: socket.socket, token: Any = None) -> Any:
    _send(s, 0, w.encode({"hello": PROTOCOL, "token": token, "pid": 1, "client": "raw"}))
    return _recv(s)[1]


def _closed(s: socket.socket) -> bool:
    try:
        return s.recv(1) == b""
    except ConnectionError:
        return True


def test_garbage_at_the_socket_gets_typed_errors_and_changes_nothing(owner, client) -> None:
    manager, url = owner
    conv = client.get_conversation_state("s")
    conv.set("x", 1)
    # garbage frames, an unknown op, a malformed op: a typed error each, the connection stays usable
    s = _raw(url)
    assert _hello(s)["ok"] is True
    _send(s, 7, b"\x00not a frame at all")
    rid, reply = _recv(s)
    assert rid == 7 and reply["e"]["e"] == "ScopeFailedError"
    _send(s, 8, w.encode({"ops": ({"k": "drop_everything"}, {"k": "apply", "s": 5}, {"k": "apply"}, 5, None)}))
    rid, reply = _recv(s)
    assert rid == 8 and [ok for ok, _ in reply["r"]] == [False] * 5
    assert reply["r"][0][1]["e"] == "ScopeAccessError"
    _send(s, 9, w.encode({"ops": 5}))
    assert _recv(s)[1]["e"]["e"] == "ScopeFailedError"
    bad_steps = {"k": "apply", "s": "conversation:s", "t": (("update_state", {"nokey": 1}, {}),)}
    _send(s, 10, w.encode({"ops": (bad_steps,)}))
    ok, err = _recv(s)[1]["r"][0]
    assert not ok and err["e"] == "TransitionValidationError"
    # a frame declaring 1 GiB: a typed error for it, then that connection is closed
    s.sendall(HEADER.pack(1 << 30, 11))
    rid, reply = _recv(s)
    assert rid == 11 and "exceeds the limit" in reply["e"]["m"]
    assert _closed(s)
    s.close()
    # a truncated frame, then the client goes away: nothing to answer, nothing applied
    t = _raw(url)
    _hello(t)
    t.sendall(HEADER.pack(1000, 12) + b"partial")
    t.close()
    # a wrong token (this owner wants none: a token it did not ask for is fine); a wrong protocol
    u = _raw(url)
    _send(u, 0, w.encode({"hello": 999, "token": None}))
    assert _recv(u)[1]["e"]["e"] == "ScopeAccessError"
    assert _closed(u)
    u.close()
    # the owner kept serving everyone, and nothing was applied
    assert conv.version == 1 and manager.get_conversation_state("s").version == 1
    conv.set("x", 2)
    assert conv.get("x") == 2


def test_a_wrong_token_is_refused_with_a_typed_error(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    url = f"unix://{tmp_path}/o.sock"
    with GlobalStateManager.open(tmp_path / "store", listen=url, token_file=token) as manager:
        manager.get_team_state("t").set("x", 1)
        wrong = tmp_path / "wrong"
        wrong.write_text("guess")
        with victor_actors.connect(url, token_file=wrong) as c, pytest.raises(ScopeAccessError, match="token"):
            c.get_team_state("t")
        with victor_actors.connect(url) as c, pytest.raises(ScopeAccessError, match="token"):
            c.get_team_state("t")
        with victor_actors.connect(url, token_file=token) as c:
            assert c.get_team_state("t").get("x") == 1
        s = _raw(url)
        assert _hello(s, "guess")["e"]["e"] == "ScopeAccessError"
        assert _closed(s)
        s.close()


def test_tcp_beyond_loopback_needs_a_token(tmp_path: Path) -> None:
    with pytest.raises(ScopeAccessError, match="token"):
        GlobalStateManager.open(tmp_path / "store", listen="tcp://0.0.0.0:0")
    with GlobalStateManager.open(tmp_path / "store", listen="tcp://127.0.0.1:0") as manager:
        url = manager.listening[0]
        with victor_actors.connect(url) as c:
            c.get_team_state("t").set("x", 1)
        assert manager.get_team_state("t").get("x") == 1


def test_no_owner_is_a_typed_error_that_says_nothing_was_applied(tmp_path: Path) -> None:
    with victor_actors.connect(f"unix://{tmp_path}/nobody.sock", request_timeout=0.5) as c:
        with pytest.raises(OwnerUnavailableError) as info:
            c.get_team_state("t")
        assert info.value.may_have_applied is False


def test_a_stale_socket_file_is_taken_over_and_a_live_one_is_not(tmp_path: Path) -> None:
    path = tmp_path / "o.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()  # the file stays, nobody listens: what a SIGKILLed owner leaves
    url = f"unix://{path}"
    with GlobalStateManager.open(tmp_path / "a", listen=url):
        with pytest.raises(StoreLockedError, match="listens"):
            GlobalStateManager.open(tmp_path / "b", listen=url)
        with victor_actors.connect(url) as c:
            assert c.ping()


def _apply_in_forked_child(manager: GlobalStateManager, out: Any) -> None:
    try:
        manager.get_team_state("t").set("x", 2)
        out.put("applied")
    except RuntimeClosedError as exc:
        out.put(f"refused: {exc}")
    except BaseException as exc:  # pragma: no cover - reported to the parent
        out.put(f"other: {type(exc).__name__}: {exc}")


def test_a_manager_inherited_by_a_forked_child_refuses_with_a_typed_error(tmp_path: Path) -> None:
    """Before the fix, the child's apply waited out its timeout and raised DeadlineExceededError."""
    ctx = multiprocessing.get_context("fork")
    with GlobalStateManager.open(tmp_path / "store", request_timeout=30) as manager:
        manager.get_team_state("t").set("x", 1)
        out = ctx.Queue()
        child = ctx.Process(target=_apply_in_forked_child, args=(manager, out))
        child.start()
        answer = out.get(timeout=20)
        child.join(20)
        assert answer.startswith("refused:") and "fork" in answer and "connect" in answer, answer
        assert manager.get_team_state("t").get("x") == 1
        manager.get_team_state("t").set("x", 3)  # the parent is unaffected


def _use_client_in_forked_child(client: Any, out: Any) -> None:
    try:
        client.get_team_state("t").modify(lambda s: TransitionBatch().update_state("n", s.get_state("n", 0) + 1))
        out.put("ok")
    except BaseException as exc:  # pragma: no cover - reported to the parent
        out.put(f"{type(exc).__name__}: {exc}")


def test_a_client_inherited_by_forked_children_reconnects_in_each(owner, client) -> None:
    """gunicorn --preload: the client made before the fork works in every worker, on its own connection."""
    manager, _ = owner
    client.get_team_state("t").set("n", 0)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    children = [ctx.Process(target=_use_client_in_forked_child, args=(client, out)) for _ in range(3)]
    for c in children:
        c.start()
    answers = [out.get(timeout=30) for _ in children]
    for c in children:
        c.join(20)
    assert answers == ["ok"] * 3
    assert manager.get_team_state("t").get("n") == 3
    assert client.get_team_state("t").get("n") == 3  # and the parent's connection still works


HOLDER = """
import sys
from victor_actors import GlobalStateManager
m = GlobalStateManager.open(sys.argv[1])
m.get_team_state("t").set("holder", 1)
print("HOLDING", flush=True)
sys.stdin.readline()
m.close()
"""


def test_lock_timeout_waits_for_the_previous_owner_then_takes_over(tmp_path: Path) -> None:
    store = tmp_path / "store"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(store)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "HOLDING"
        with pytest.raises(StoreLockedError, match="waited for 0.2 s"):
            GlobalStateManager.open(store, lock_timeout=0.2)
        opened: list[Any] = []
        waiter = threading.Thread(target=lambda: opened.append(GlobalStateManager.open(store, lock_timeout=60)))
        waiter.start()
        holder.stdin.write("\n")  # the previous owner exits (a rolling update): the waiter takes over
        holder.stdin.flush()
        waiter.join(60)
        assert opened, "the waiting open did not take the store over"
        with opened[0] as manager:
            assert manager.get_team_state("t").get("holder") == 1
    finally:
        holder.kill()
        holder.wait()


def test_open_refuses_a_bad_lock_timeout(tmp_path: Path) -> None:
    for bad in (-1, "5", True):
        with pytest.raises(ValueError):
            GlobalStateManager.open(tmp_path / "s", lock_timeout=bad)
    assert not os.path.exists(tmp_path / "s")


def test_frames_header_is_big_endian_length_then_request_id() -> None:
    assert HEADER.pack(5, 1) == struct.pack(">IQ", 5, 1)
