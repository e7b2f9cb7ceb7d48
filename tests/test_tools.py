"""The tool outbox: EXECUTE_TOOL commits with its batch, is dispatched after the commit, answered once.

Real managers, real actors, real LMDB in temporary directories, and a real child process killed
with SIGKILL for the crash-and-reopen tests.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from victor_actors import (
    ContextSnapshot,
    DeadlineExceededError,
    GlobalStateManager,
    RunFailedError,
    ScopeAccessError,
    ScopeHandle,
    ScopeRef,
    ToolCall,
    ToolRequestNotFoundError,
    TransitionBatch,
    TransitionValidationError,
    VersionConflictError,
)


class Recorder:
    """An executor that records every call it gets (thread-safe) and returns ``answer(call)``."""

    def __init__(self, answer: Callable[[ToolCall], Any] = lambda call: {"echo": call.arguments}) -> None:
        self.answer = answer
        self.calls: list[ToolCall] = []
        self.lock = threading.Lock()

    def __call__(self, call: ToolCall) -> Any:
        with self.lock:
            self.calls.append(call)
        return self.answer(call)

    def per_request(self) -> Counter[str]:
        with self.lock:
            return Counter(c.request_id for c in self.calls)


def _results(snap: ContextSnapshot) -> dict[str, Any]:
    """request id -> the tool message answering it."""
    return {m["request_id"]: m for m in snap.messages if isinstance(m, Mapping) and m.get("role") == "tool"}


def _settled(handle: ScopeHandle) -> bool:
    return len(handle.snapshot().pending_tool_requests) == 0


# -- the outbox -------------------------------------------------------------------


def test_a_request_is_stored_with_its_batch_as_pending(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c")
    commit = conv.apply(
        TransitionBatch()
        .update_state("a", 1)
        .execute_tool("search", {"q": "llamas", "opts": [1, 2]}, request_id="r1")
        .execute_tool("ls", {})
        .add_message("m")
    )
    generated = f"{conv.ref}@1#2"  # scope, version, position in the batch
    assert [r["request_id"] for r in commit.tool_requests] == ["r1", generated]
    snap = conv.snapshot()
    assert snap.version == 1 and snap.get_state("a") == 1 and snap.messages == ("m",)
    assert snap.pending_tool_requests == {
        "r1": {
            "request_id": "r1",
            "tool_name": "search",
            "arguments": {"q": "llamas", "opts": (1, 2)},
            "version": 1,
        },
        generated: {"request_id": generated, "tool_name": "ls", "arguments": {}, "version": 1},
    }
    assert snap.to_dict()["pending_tool_requests"]["r1"]["arguments"] == {"q": "llamas", "opts": [1, 2]}
    # no executor: nothing ran, both are listed as unhandled, the requests wait
    assert manager.tools.dispatched == 0
    assert manager.tools.unhandled == [(conv.ref, "r1", "search"), (conv.ref, generated, "ls")]


def test_the_executor_runs_after_the_commit_and_sees_it(tmp_path: Path) -> None:
    with GlobalStateManager.open(tmp_path) as manager:
        team = manager.get_team_state("t")
        conv = manager.get_conversation_state("c", team_id="t")
        seen: dict[str, Any] = {}

        def search(call: ToolCall) -> dict[str, Any]:
            scope = manager.scope(call.scope)
            snap = scope.snapshot()
            stored = manager.state_at(call.scope, snap.version)  # read back from LMDB
            seen.update(
                pending=call.request_id in snap.pending_tool_requests,
                own_write=snap.get_state("draft"),
                team_write=snap.get_state("team_note"),
                message=tuple(snap.messages),
                stored_pending=call.request_id in stored.pending_tool_requests,
                stored_write=stored.get_state("draft"),
                thread=threading.current_thread().name,
            )
            return {"hits": 3}

        manager.register_tool("search", search)
        commit = conv.apply(
            TransitionBatch()
            .update_state("draft", "v1")
            .add_message("looking it up")
            .update_state("team_note", "searching", scope="team")
            .execute_tool("search", {"q": "x"}, request_id="req-1")
        )
        assert set(commit.involved) == {conv.ref, team.ref}  # a cross-scope commit, dispatched after it
        manager.quiesce()
        assert _settled(conv)
        assert seen["pending"] and seen["own_write"] == "v1" and seen["team_write"] == "searching"
        assert seen["message"] == ("looking it up",)
        assert seen["stored_pending"] and seen["stored_write"] == "v1"  # durable before it was dispatched
        assert seen["thread"].startswith("victor-actors-call")
        result = _results(conv.snapshot())["req-1"]
        assert result == {
            "role": "tool",
            "tool_name": "search",
            "content": {"hits": 3},
            "request_id": "req-1",
            "error": None,
        }
        assert conv.version == 2  # the TOOL_RESULT is one more commit in the requesting scope


def test_a_rejected_batch_dispatches_nothing(manager: GlobalStateManager) -> None:
    team = manager.get_team_state("t")
    conv = manager.get_conversation_state("c", team_id="t")
    rec = Recorder()
    manager.register_tool("search", rec)
    conv.apply(TransitionBatch().execute_tool("search", {"n": 0}, request_id="first"))
    manager.quiesce()
    assert _settled(conv)
    release = threading.Event()
    manager.register_tool("search", Recorder(lambda call: release.wait(5)))  # keeps "held" pending
    conv.apply(TransitionBatch().execute_tool("search", {"n": 1}, request_id="held"))
    assert manager.tools.dispatched == 2
    before = conv.snapshot()

    rejected: list[tuple[type[BaseException], TransitionBatch, dict[str, Any]]] = [
        # the workflow level is not an ancestor of this conversation
        (
            ScopeAccessError,
            TransitionBatch()
            .execute_tool("search", {}, request_id="a")
            .update_state("k", 1, scope="workflow"),
            {},
        ),
        # two requests with one id in one batch
        (
            TransitionValidationError,
            TransitionBatch()
            .execute_tool("search", {}, request_id="b")
            .execute_tool("search", {}, request_id="b"),
            {},
        ),
        # the conversation moved
        (
            VersionConflictError,
            TransitionBatch().execute_tool("search", {}, request_id="c"),
            {"expected_version": before.version - 1},
        ),
        # the team moved: the cross-scope batch aborts in both scopes
        (
            VersionConflictError,
            TransitionBatch().execute_tool("search", {}, request_id="d").update_state("x", 1, scope="team"),
            {"expected_version": {"team": team.version + 7}},
        ),
        # a request id that is still pending
        (
            TransitionValidationError,
            TransitionBatch().add_message("m").execute_tool("search", {}, request_id="held"),
            {},
        ),
    ]
    for error, batch, kwargs in rejected:
        with pytest.raises(error):
            conv.apply(batch, **kwargs)
        # a commit dispatches on the actor before apply returns: these batches dispatched nothing
        assert manager.tools.dispatched == 2
    after = conv.snapshot()
    assert after.version == before.version and after.messages == before.messages
    assert set(after.pending_tool_requests) == {"held"}
    assert team.version == 0
    release.set()
    assert manager.tools.wait_idle(5)
    manager.quiesce()
    assert _settled(conv)
    assert manager.tools.dispatched == 2
    assert rec.per_request() == Counter({"first": 1})
    assert set(_results(conv.snapshot())) == {"first", "held"}


def test_sync_and_async_executors(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c")
    loops: list[bool] = []

    def add(call: ToolCall) -> int:
        return int(call.arguments["a"]) + int(call.arguments["b"])

    async def fetch(call: ToolCall) -> dict[str, Any]:
        loops.append(asyncio.get_running_loop().is_running())
        await asyncio.sleep(0)  # it really awaits: the executor runs on an event loop
        return {"url": call.arguments["url"], "status": 200}

    manager.register_tool("add", add)
    manager.register_tool("fetch", fetch)
    conv.apply(
        TransitionBatch()
        .execute_tool("add", {"a": 2, "b": 3}, request_id="sum")
        .execute_tool("fetch", {"url": "https://example.org"}, request_id="get")
    )
    manager.quiesce()
    assert _settled(conv)
    results = _results(conv.snapshot())
    assert results["sum"]["content"] == 5 and results["sum"]["error"] is None
    assert results["get"]["content"] == {"url": "https://example.org", "status": 200}
    assert loops == [True]
    assert manager.tools.dispatched == 2 and manager.tools.failed == 0


def test_the_executor_gets_a_tool_call(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c", workflow_id="wf")
    rec = Recorder(lambda call: None)
    manager.register_tool("t", rec)
    conv.apply(TransitionBatch().execute_tool("t", {"nested": {"list": [1, 2]}}, request_id="k"))
    manager.quiesce()
    assert _settled(conv)
    (call,) = rec.calls
    assert call.request_id == "k" and call.tool_name == "t" and call.scope == conv.ref
    assert call.redelivery is False
    assert call.arguments == {"nested": {"list": [1, 2]}}
    call.arguments["nested"]["list"].append(3)  # plain, mutable, and not the stored value
    assert conv.snapshot().messages[0]["content"] is None
    assert conv.snapshot().messages[0]["request_id"] == "k"


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_tool_that_raises_yields_a_result_carrying_the_error(
    manager: GlobalStateManager, kind: str
) -> None:
    conv = manager.get_conversation_state("c")

    def broken(call: ToolCall) -> None:
        raise ValueError(f"bad input {call.arguments['x']}")

    async def abroken(call: ToolCall) -> None:
        await asyncio.sleep(0)
        raise ValueError(f"bad input {call.arguments['x']}")

    manager.register_tool("broken", broken if kind == "sync" else abroken)
    conv.apply(TransitionBatch().execute_tool("broken", {"x": 7}, request_id="r"))
    manager.quiesce()
    assert _settled(conv)
    result = _results(conv.snapshot())["r"]
    assert result["error"] == "ValueError: bad input 7"
    assert result["content"] is None
    assert manager.tools.failed == 1
    assert conv.set("still", "serving").committed


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_tool_past_its_timeout_yields_a_timeout_error(manager: GlobalStateManager, kind: str) -> None:
    conv = manager.get_conversation_state("c")
    release = threading.Event()
    cancelled = threading.Event()

    def hangs(call: ToolCall) -> str:
        release.wait(5)
        return "too late"

    async def ahangs(call: ToolCall) -> str:
        try:
            await asyncio.Event().wait()  # hangs until it is cancelled
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "too late"

    manager.register_tool("slow", hangs if kind == "sync" else ahangs, timeout=0.1)
    conv.apply(TransitionBatch().execute_tool("slow", {}, request_id="r"))
    manager.quiesce()
    assert _settled(conv)
    result = _results(conv.snapshot())["r"]
    assert result["error"].startswith("TimeoutError: ")
    assert "slow did not finish within 0.1 s" in result["error"]
    assert result["content"] is None
    if kind == "async":
        assert cancelled.wait(2)  # the coroutine was cancelled, not left running
    release.set()
    assert manager.tools.wait_idle(5)
    # the late return changes nothing: one result, the timeout's
    assert [m["request_id"] for m in conv.snapshot().messages] == ["r"]


def test_a_result_clears_its_request_and_a_second_result_is_refused(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c")
    conv.apply(TransitionBatch().execute_tool("manual", {"q": 1}, request_id="r1").execute_tool("manual", {}))
    assert len(conv.snapshot().pending_tool_requests) == 2
    done = conv.apply(TransitionBatch().tool_result("manual", "answer", request_id="r1"))
    assert done.added_messages[0]["request_id"] == "r1"
    assert "r1" not in conv.snapshot().pending_tool_requests
    before = conv.snapshot()
    with pytest.raises(TransitionValidationError, match="no pending tool request 'r1'") as info:
        conv.apply(TransitionBatch().add_message("x").tool_result("manual", "again", request_id="r1"))
    assert info.value.index == 1 and info.value.transition_type == "TOOL_RESULT"
    with pytest.raises(TransitionValidationError, match="never-asked"):
        conv.apply(TransitionBatch().tool_result("manual", "?", request_id="never-asked"))
    after = conv.snapshot()
    assert after.version == before.version and after.messages == before.messages


def test_a_result_races_with_the_executor_and_applies_once(
    manager: GlobalStateManager, caplog: pytest.LogCaptureFixture
) -> None:
    conv = manager.get_conversation_state("c")
    started = threading.Event()
    release = threading.Event()

    def slow(call: ToolCall) -> str:
        started.set()
        release.wait(5)
        return "from the executor"

    manager.register_tool("slow", slow)
    conv.apply(TransitionBatch().execute_tool("slow", {}, request_id="r"))
    assert started.wait(5)
    conv.apply(TransitionBatch().tool_result("slow", "from elsewhere", request_id="r"))  # answered first
    with caplog.at_level(logging.INFO, logger="victor_actors"):
        release.set()
        assert manager.tools.wait_idle(5)
    results = [m for m in conv.snapshot().messages if m["request_id"] == "r"]
    assert [m["content"] for m in results] == ["from elsewhere"]
    assert "not recorded" in caplog.text


def test_an_unstorable_result_is_stored_as_its_repr(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c")

    class Opaque:
        def __repr__(self) -> str:
            return "<opaque thing>"

    manager.register_tool("opaque", lambda call: Opaque())
    conv.apply(TransitionBatch().execute_tool("opaque", {}, request_id="r"))
    manager.quiesce()
    assert _settled(conv)
    assert _results(conv.snapshot())["r"]["content"] == {"unstorable_result": "<opaque thing>"}


def test_an_executor_may_write_to_its_scope(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c")

    def progress(call: ToolCall) -> str:
        manager.scope(call.scope).set("progress", "half way")  # a write while its request is pending
        return "done"

    manager.register_tool("progress", progress)
    conv.apply(TransitionBatch().execute_tool("progress", {}, request_id="r"))
    manager.quiesce()
    assert _settled(conv)
    snap = conv.snapshot()
    assert snap.get_state("progress") == "half way" and _results(snap)["r"]["content"] == "done"
    assert snap.version == 3


def test_many_requests_each_run_once(manager: GlobalStateManager) -> None:
    convs = [manager.get_conversation_state(f"c{i}") for i in range(5)]
    rec = Recorder(lambda call: call.arguments["n"] * 2)
    manager.register_tool("double", rec)

    def agent(conv: ScopeHandle) -> None:
        for n in range(20):
            conv.apply(TransitionBatch().execute_tool("double", {"n": n}, request_id=f"{conv.ref.id}-{n}"))

    threads = [threading.Thread(target=agent, args=(c,)) for c in convs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert manager.tools.wait_idle(10)
    manager.quiesce()
    assert all(_settled(c) for c in convs)
    assert rec.per_request() == Counter({f"c{i}-{n}": 1 for i in range(5) for n in range(20)})
    for c in convs:
        results = _results(c.snapshot())
        assert {k: v["content"] for k, v in results.items()} == {f"{c.ref.id}-{n}": n * 2 for n in range(20)}


def test_a_request_to_a_tool_with_no_executor_is_listed_and_logged_once(
    manager: GlobalStateManager, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression (issue 29, item 3): a request naming a tool with no executor committed, and then
    nothing: not run, not listed in ``unhandled`` (only redeliveries were), not logged, while
    ``wait_idle()`` said all was done and the agent waited forever. It failed before the fix (the
    list was empty and nothing was logged). Now it is listed at once, logged once per tool name at
    WARNING, stays pending, and registering the executor later runs it."""
    conv = manager.get_conversation_state("c")
    with caplog.at_level(logging.WARNING, logger="victor_actors"):
        conv.apply(TransitionBatch().execute_tool("serach", {"q": 1}, request_id="a"))  # misspelt
        conv.apply(TransitionBatch().execute_tool("serach", {"q": 2}, request_id="b"))
        conv.apply(TransitionBatch().execute_tool("other", {}, request_id="c"))
    assert manager.tools.unhandled == [
        (conv.ref, "a", "serach"),
        (conv.ref, "b", "serach"),
        (conv.ref, "c", "other"),
    ]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, [r.getMessage() for r in warnings]
    assert "names tool 'serach', which has no executor registered" in warnings[0].getMessage()
    assert "manager.tools.unhandled" in warnings[0].getMessage()
    assert "names tool 'other'" in warnings[1].getMessage()
    assert set(conv.snapshot().pending_tool_requests) == {"a", "b", "c"}  # not lost, not answered
    assert manager.tools.wait_idle(5) and manager.tools.dispatched == 0  # nothing runs

    rec = Recorder(lambda call: call.arguments["q"] * 10)
    manager.register_tool("serach", rec)  # the listed requests are dispatched now
    manager.quiesce()
    assert sorted(c.request_id for c in rec.calls) == ["a", "b"]
    assert not any(c.redelivery for c in rec.calls)  # first deliveries: they never ran before
    assert {k: v["content"] for k, v in _results(conv.snapshot()).items()} == {"a": 10, "b": 20}
    assert manager.tools.unhandled == [(conv.ref, "c", "other")]


def test_registering_an_executor_runs_a_listed_request_of_a_passivated_scope_once(tmp_path: Path) -> None:
    with GlobalStateManager.open(tmp_path, max_live_actors=1) as manager:
        conv = manager.get_conversation_state("c")
        conv.apply(TransitionBatch().execute_tool("later", {"q": 3}, request_id="r"))
        for i in range(3):  # other scopes take the only live actor: c is passivated, then evicted
            manager.get_conversation_state(f"other-{i}").set("k", i)
        manager.passivate_idle(0)
        rec = Recorder(lambda call: call.arguments["q"])
        manager.register_tool("later", rec)  # reading c brings it back, which redelivers it too
        manager.quiesce()
        assert [c.request_id for c in rec.calls] == ["r"]
        assert _results(conv.snapshot())["r"]["content"] == 3 and manager.tools.unhandled == []


def test_registering_an_executor_skips_a_listed_request_answered_meanwhile(
    manager: GlobalStateManager,
) -> None:
    conv = manager.get_conversation_state("c")
    conv.apply(TransitionBatch().execute_tool("late", {}, request_id="r"))
    conv.apply(TransitionBatch().tool_result("late", "by hand", request_id="r"))
    rec = Recorder()
    manager.register_tool("late", rec)
    manager.quiesce()
    assert rec.calls == [] and manager.tools.unhandled == []
    assert [m["content"] for m in conv.snapshot().messages] == ["by hand"]


_CLOSE_CHILD = """
import asyncio, sys, threading, time
from victor_actors import GlobalStateManager, TransitionBatch

started = threading.Event()

async def atool(call):
    started.set()
    try:
        await asyncio.Event().wait()  # never set: only close ends this
    except asyncio.CancelledError:
        print("cancelled", flush=True)
        raise

def tool(call):
    started.set()
    threading.Event().wait()  # never set: a thread cannot be cancelled

m = GlobalStateManager.open(sys.argv[1])
m.register_tool("slow", atool if sys.argv[2] == "async" else tool)  # the default timeout: 30 s
m.get_conversation_state("c").apply(
    TransitionBatch().execute_tool("slow", {}, request_id="r1").execute_tool("slow", {}, request_id="r2")
)
started.wait(10)
m.close()
print("closed", flush=True)
"""


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_closing_the_manager_with_a_tool_in_flight_exits_at_once_quietly(tmp_path: Path, kind: str) -> None:
    """Regression (issue 29, item 2): closing a manager (Ctrl-C in an asyncio app) while a tool ran held
    the process's exit for the tool's whole timeout (30 s by default; a sync tool that never returns
    held it forever) and printed ``RuntimeError: Event loop is closed`` and ``Task was destroyed but
    it is pending!`` once per call. Failed before the fix: the child outlived the bound below, with
    those tracebacks. Now close cancels the async calls, abandons the sync one on a daemon thread,
    records no result (the requests stay pending) and the process exits, printing nothing."""
    proc = subprocess.run(
        [sys.executable, "-c", _CLOSE_CHILD, str(tmp_path), kind],
        capture_output=True,
        text=True,
        timeout=20,  # a hang bound, far below the tool's 30 s timeout; the child needs about 1 s
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    expected = ["cancelled", "cancelled", "closed"] if kind == "async" else ["closed"]
    assert proc.stdout.split() == expected
    # the requests were left pending, not answered with an error: a reopen delivers them again
    rec = Recorder(lambda call: "done")
    with GlobalStateManager.open(tmp_path) as manager:
        manager.register_tool("slow", rec)
        conv = manager.get_conversation_state("c")
        manager.quiesce()
        assert sorted(c.request_id for c in rec.calls) == ["r1", "r2"]
        assert all(c.redelivery for c in rec.calls)
        assert {k: v["content"] for k, v in _results(conv.snapshot()).items()} == {"r1": "done", "r2": "done"}


def test_close_keeps_a_request_whose_tool_is_still_running_pending(tmp_path: Path) -> None:
    started = threading.Event()
    finish = threading.Event()

    def tool(call: ToolCall) -> str:
        started.set()
        finish.wait(10)
        return "after close"

    manager = GlobalStateManager.open(tmp_path)
    manager.register_tool("t", tool)
    manager.get_conversation_state("c").apply(TransitionBatch().execute_tool("t", {}, request_id="r"))
    assert started.wait(5)
    manager.close()
    assert manager.tools.wait_idle(0)  # nothing is waited for once closed
    finish.set()  # the abandoned thread returns: its result is dropped, the manager being closed
    with GlobalStateManager.open(tmp_path) as again:
        assert set(again.get_conversation_state("c").snapshot().pending_tool_requests) == {"r"}


# -- waiting for one result ---------------------------------------------------------


def test_wait_tool_result_returns_the_result_message(manager: GlobalStateManager) -> None:
    release = threading.Event()

    def lookup(call: ToolCall) -> dict[str, Any]:
        release.wait(10)
        return {"hits": call.arguments["q"] * 2}

    manager.register_tool("lookup", lookup)
    conv = manager.get_conversation_state("c")
    commit = conv.apply(TransitionBatch().execute_tool("lookup", {"q": 21}))
    request = commit.tool_requests[0]
    releaser = threading.Thread(target=release.set)
    releaser.start()  # the result lands while the wait starts: before it or during it, both count
    message = conv.wait_tool_result(request, timeout=10)  # by the request itself
    releaser.join()
    assert message["role"] == "tool" and message["request_id"] == request["request_id"]
    assert message["content"] == {"hits": 42} and message["error"] is None
    # asked again once answered: the same message, at once, by the id
    assert conv.wait_tool_result(request["request_id"], timeout=0.001) == message


def test_wait_tool_result_returns_a_failed_call_as_its_result(manager: GlobalStateManager) -> None:
    def broken(call: ToolCall) -> None:
        raise ConnectionError("backend reset")

    manager.register_tool("broken", broken)
    conv = manager.get_conversation_state("c")
    conv.apply(TransitionBatch().execute_tool("broken", {}, request_id="r"))
    message = conv.wait_tool_result("r", timeout=10)
    assert message["content"] is None and message["error"] == "ConnectionError: backend reset"


def test_await_tool_result_is_the_asyncio_twin(manager: GlobalStateManager) -> None:
    async def search(call: ToolCall) -> list[str]:
        await asyncio.sleep(0)
        return [call.arguments["q"]]

    manager.register_tool("search", search)
    conv = manager.get_conversation_state("c")

    async def agent() -> tuple[Any, int]:
        ticks = 0

        async def ticker() -> None:  # the loop stays free while the result is awaited
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        beat = asyncio.create_task(ticker())
        commit = await conv.aapply(TransitionBatch().execute_tool("search", {"q": "llamas"}))
        message = await conv.await_tool_result(commit.tool_requests[0]["request_id"], timeout=10)
        beat.cancel()
        return message, ticks

    message, ticks = asyncio.run(agent())
    assert message["content"] == ("llamas",) and message["error"] is None
    assert ticks > 0


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_waiting_for_an_unknown_or_released_request_is_a_typed_error(
    manager: GlobalStateManager, kind: str
) -> None:
    conv = manager.get_conversation_state("c")

    def wait(request: str, timeout: float) -> Any:
        if kind == "sync":
            return conv.wait_tool_result(request, timeout=timeout)
        return asyncio.run(conv.await_tool_result(request, timeout=timeout))

    with pytest.raises(ToolRequestNotFoundError, match="no pending tool request 'never'"):
        wait("never", 5)
    # a run's request, released by its rollback: no result will ever come
    with pytest.raises(RunFailedError), manager.run("s"):
        conv.apply(TransitionBatch().execute_tool("nobody", {}, request_id="in-run"))
        raise RuntimeError("the agent failed")
    with pytest.raises(ToolRequestNotFoundError):
        wait("in-run", 5)
    # no executor: the wait ends at its timeout, and the request stays pending
    conv.apply(TransitionBatch().execute_tool("nobody", {}, request_id="stuck"))
    with pytest.raises(DeadlineExceededError, match=r"'stuck' within 0\.2 s; it is still pending"):
        wait("stuck", 0.2)
    assert "stuck" in conv.snapshot().pending_tool_requests
    with pytest.raises(TypeError, match="request id"):
        wait({"no": "id"}, 1)  # type: ignore[arg-type]


def test_executor_registration_is_checked(manager: GlobalStateManager) -> None:
    with pytest.raises(TypeError):
        manager.register_tool("x", "not callable")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        manager.register_tool("x", lambda call: None, timeout=0)


# -- crash and reopen ----------------------------------------------------------------

_CHILD = """
import sys, threading
from victor_actors import GlobalStateManager, TransitionBatch
m = GlobalStateManager.open(sys.argv[1])
conv = m.get_conversation_state("c", team_id="t")
for b in range(3):
    conv.apply(
        TransitionBatch()
        .add_message(f"batch {b}")
        .execute_tool("search", {"q": b * 2}, request_id=f"r{b * 2}")
        .execute_tool("search", {"q": b * 2 + 1}, request_id=f"r{b * 2 + 1}")
    )
m.get_team_state("t").apply(TransitionBatch().execute_tool("search", {"q": 100}, request_id="team-r"))
m.get_conversation_state("other").apply(TransitionBatch().execute_tool("nobody", {"x": 1}, request_id="u1"))
# answered before the crash: must not run again
conv.apply(TransitionBatch().execute_tool("search", {"q": -1}, request_id="answered"))
conv.apply(TransitionBatch().tool_result("search", "old", request_id="answered"))
print("ready", flush=True)
threading.Event().wait()
"""

_SEARCH_IDS = {f"r{i}" for i in range(6)} | {"team-r"}


def _crash_child(path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    assert proc.returncode == -signal.SIGKILL


def _check_redelivered(manager: GlobalStateManager, rec: Recorder) -> None:
    conv = manager.get_conversation_state("c")
    team = manager.get_team_state("t")
    assert manager.tools.wait_idle(10)
    manager.quiesce()
    assert _settled(conv) and _settled(team)
    assert rec.per_request() == Counter(dict.fromkeys(_SEARCH_IDS, 1))  # each exactly once
    assert all(c.redelivery for c in rec.calls)
    assert {c.request_id: c.arguments["q"] for c in rec.calls} == {
        **{f"r{i}": i for i in range(6)},
        "team-r": 100,
    }
    assert {c.scope for c in rec.calls} == {conv.ref, team.ref}
    results = _results(conv.snapshot())
    assert {k: v["content"] for k, v in results.items()} == {
        "answered": "old",
        **{f"r{i}": i * 10 for i in range(6)},
    }
    assert _results(team.snapshot())["team-r"]["content"] == 1000
    assert manager.tools.redelivered == 7


def test_pending_requests_are_redelivered_once_after_a_crash(tmp_path: Path) -> None:
    _crash_child(tmp_path)
    rec = Recorder(lambda call: call.arguments["q"] * 10)
    other = ScopeRef("conversation", "other")
    with GlobalStateManager.open(tmp_path) as manager:
        manager.register_tool("search", rec)
        # how many are still pending when it counts them: restoring a scope already redelivers its own
        assert 1 <= manager.resume_tools() <= 8
        _check_redelivered(manager, rec)
        assert (other, "u1", "nobody") in manager.tools.unhandled
        assert set(manager.get_conversation_state("other").snapshot().pending_tool_requests) == {"u1"}
        # asking again runs nothing that was answered
        manager.resume_tools()
        assert manager.tools.wait_idle(5)
        assert rec.per_request() == Counter(dict.fromkeys(_SEARCH_IDS, 1))
    # the answers are durable: a further reopen redelivers nothing but the unhandled request
    again = Recorder()
    with GlobalStateManager.open(tmp_path) as manager:
        manager.register_tool("search", again)
        assert manager.resume_tools() == 1
        assert manager.tools.wait_idle(5)
        assert again.calls == []
        assert len(_results(manager.get_conversation_state("c").snapshot())) == 7


def test_accessing_a_restored_scope_redelivers_its_requests(tmp_path: Path) -> None:
    _crash_child(tmp_path)
    rec = Recorder(lambda call: call.arguments["q"] * 10)
    with GlobalStateManager.open(tmp_path) as manager:
        manager.register_tool("search", rec)
        manager.get_conversation_state("c")  # restores c and its team: both redeliver
        _check_redelivered(manager, rec)
        assert manager.tools.unhandled == []  # "other" was never restored
        other = manager.get_conversation_state("other")
        assert manager.tools.unhandled == [(other.ref, "u1", "nobody")]
        assert rec.per_request() == Counter(dict.fromkeys(_SEARCH_IDS, 1))


def test_an_executor_registered_after_the_restore_runs_on_resume(tmp_path: Path) -> None:
    _crash_child(tmp_path)
    rec = Recorder(lambda call: call.arguments["q"] * 10)
    with GlobalStateManager.open(tmp_path) as manager:
        conv = manager.get_conversation_state("c")
        team = manager.get_team_state("t")
        unhandled = {(ref, rid) for ref, rid, _tool in manager.tools.unhandled}
        assert unhandled == {(conv.ref, f"r{i}") for i in range(6)} | {(team.ref, "team-r")}
        assert len(conv.snapshot().pending_tool_requests) == 6  # listed, not lost
        manager.register_tool("search", rec)
        manager.resume_tools()
        _check_redelivered(manager, rec)


def test_one_resume_lists_each_unhandled_request_once(tmp_path: Path) -> None:
    """resume_tools restores the scope (which redelivers) and then redelivers again itself.

    For executed requests the in-flight set keeps that to one run; an unhandled request must be listed
    once too, however many times it is redelivered, and leave the list once it is dispatched.
    """
    _crash_child(tmp_path)
    with GlobalStateManager.open(tmp_path) as manager:
        manager.register_tool("search", Recorder(lambda call: 0))
        manager.resume_tools()
        assert manager.tools.wait_idle(10)
        other = ScopeRef("conversation", "other")
        assert manager.tools.unhandled == [(other, "u1", "nobody")], manager.tools.unhandled
        manager.resume_tools()
        assert manager.tools.unhandled == [(other, "u1", "nobody")], manager.tools.unhandled
        nobody = Recorder(lambda call: "finally")
        manager.register_tool("nobody", nobody)
        manager.resume_tools()
        assert manager.tools.wait_idle(10)
        assert manager.tools.unhandled == []
        assert [c.request_id for c in nobody.calls] == ["u1"] and nobody.calls[0].redelivery
        assert _results(manager.scope(other).snapshot())["u1"]["content"] == "finally"
