"""A tool-using agent whose tool fails once, a tool that times out, and a redelivery.

Tool requests are an outbox: an EXECUTE_TOOL transition commits with its
batch, and only then does the runtime hand the request to the executor
registered with ``manager.register_tool(name, fn, timeout=...)``. Whatever
happens, the outcome comes back as a TOOL_RESULT message in the requesting
scope, and the request stops being pending:

1. **An error is a result.** The search tool raises on its first call. The
   coordinator sees the TOOL_RESULT carrying the error in its next snapshot
   and asks again with a new EXECUTE_TOOL; the second call succeeds.
2. **A timeout is a result.** A slow tool registered with a 0.2 s timeout
   yields a TOOL_RESULT whose error starts with ``TimeoutError``.
3. **Redelivery after a restart.** A request whose executor was cut off (the
   process "dies" after the side effect, before the result is committed) is
   still pending in the LMDB store; when the store is reopened it is
   dispatched again with ``redelivery=True`` and the same idempotency key,
   which the executor uses to avoid sending the e-mail twice.

No network: the tools are deterministic fakes. The store is LMDB in a
temporary directory. Run it with ``python examples/flaky_tool.py``; it exits 0
when every check holds.
"""

from __future__ import annotations

import sys
import tempfile
import threading
from collections.abc import Mapping
from typing import Any

from _checks import check, verdict

from victor_actors import (
    ContextSnapshot,
    CoordinatorResult,
    CoordinatorRunner,
    GlobalStateManager,
    ToolCall,
    TransitionBatch,
)

MAX_ATTEMPTS = 3


class FlakySearch:
    """A search executor that fails on its first call, then works."""

    def __init__(self) -> None:
        self.calls: list[str] = []  # request ids, in call order

    def __call__(self, call: ToolCall) -> dict[str, Any]:
        self.calls.append(call.request_id)
        if len(self.calls) == 1:
            raise ConnectionError("search backend reset the connection")
        return {"query": call.arguments["query"], "hits": ["pykka.readthedocs.io", "lmdb.readthedocs.io"]}


class SearchAgent:
    """Asks for a search; retries on an error result; answers from a good one. Pure."""

    def process(self, snapshot: ContextSnapshot, user_message: str) -> CoordinatorResult:
        if snapshot.pending_tool_requests:
            return CoordinatorResult.no_op("waiting for the search", should_continue=False)
        last = snapshot.messages[-1] if snapshot.message_count else None
        attempts = snapshot.get_state("search_attempts", 0)
        batch = TransitionBatch()
        if not (isinstance(last, Mapping) and last.get("role") == "tool"):  # a new question
            batch.add_message({"role": "user", "content": user_message})
            batch.execute_tool("search", {"query": user_message}).update_state("search_attempts", 1)
            return CoordinatorResult(batch, reasoning="searching", should_continue=False)
        if last["error"] is None:
            hits = ", ".join(last["content"]["hits"])
            batch.add_message({"role": "assistant", "content": f"Found: {hits}"}).update_stage("complete")
            return CoordinatorResult(batch, reasoning="answered from the search", should_continue=False)
        if attempts >= MAX_ATTEMPTS:
            batch.add_message({"role": "assistant", "content": f"Search failed: {last['error']}"})
            batch.update_stage("failed")
            return CoordinatorResult(batch, reasoning="giving up", should_continue=False)
        note = f"search failed ({last['error']}); retrying, attempt {attempts + 1} of {MAX_ATTEMPTS}"
        batch.add_message({"role": "assistant", "content": note})
        batch.execute_tool("search", {"query": user_message}).update_state("search_attempts", attempts + 1)
        return CoordinatorResult(batch, reasoning="retrying after a tool error", should_continue=False)


def describe(message: Any) -> str:
    if isinstance(message, Mapping) and message.get("role") == "tool":
        outcome = f"error {message['error']!r}" if message["error"] else f"result {dict(message['content'])}"
        return f"tool {message['tool_name']} ({message['request_id']}): {outcome}"
    return f"{message['role']}: {message['content']}" if isinstance(message, Mapping) else str(message)


def retry_after_error(manager: GlobalStateManager) -> None:
    search = FlakySearch()
    manager.register_tool("search", search, timeout=2.0)
    conv = manager.get_conversation_state("searcher")
    runner = CoordinatorRunner({"agent": SearchAgent()})
    question = "Where are the pykka and lmdb docs?"
    turns = 0
    while not conv.snapshot().is_complete and turns < 5:
        turns += 1
        runner.run(conv, "agent", question)
        check(manager.tools.wait_idle(5.0), "the tool finished")
    snap = conv.snapshot()
    print(f"1. flaky search: {turns} coordinator turns, {len(search.calls)} tool calls")
    for message in snap.messages:
        print(f"   {describe(message)}")
    roles = [m["role"] for m in snap.messages]
    tool_messages = [m for m in snap.messages if m["role"] == "tool"]
    check(roles == ["user", "tool", "assistant", "tool", "assistant"], "error, retry, result, answer")
    check(str(tool_messages[0]["error"]).startswith("ConnectionError"), "the first result carries the error")
    check(tool_messages[1]["error"] is None, "the second call succeeded")
    check(search.calls == [m["request_id"] for m in tool_messages], "one result per request")
    check(len(set(search.calls)) == 2, "the retry is a new request with its own idempotency key")
    check(not snap.pending_tool_requests and snap.conversation_stage == "complete", "nothing left pending")


def timeout(manager: GlobalStateManager) -> None:
    release = threading.Event()

    def slow_report(call: ToolCall) -> str:
        release.wait(5.0)  # far longer than the 0.2 s the tool is allowed
        return "a report nobody waited for"

    manager.register_tool("slow_report", slow_report, timeout=0.2)
    conv = manager.get_conversation_state("reporter")
    conv.apply(TransitionBatch().execute_tool("slow_report", {"quarter": "Q3"}))
    idle = manager.tools.wait_idle(5.0)
    release.set()  # a thread cannot be killed: let the abandoned call end now
    snap = conv.snapshot()
    result = snap.messages[-1]
    print(f"2. timeout: {describe(result)}")
    check(idle and str(result["error"]).startswith("TimeoutError"), "a timeout comes back as a TOOL_RESULT")
    check(not snap.pending_tool_requests, "the timed-out request is no longer pending")


def redelivery(path: str) -> None:
    sent: dict[str, str] = {}  # the outside world: e-mails actually sent, by idempotency key
    calls: list[ToolCall] = []
    side_effect_done = threading.Event()
    release = threading.Event()

    def send_email(call: ToolCall) -> dict[str, str]:
        calls.append(call)
        if call.request_id in sent:  # seen this key before: do not send twice
            return {"status": "already sent", "to": sent[call.request_id]}
        sent[call.request_id] = call.arguments["to"]
        if not call.redelivery:
            side_effect_done.set()
            release.wait(5.0)  # the process "dies" here: the result is never committed
        return {"status": "sent", "to": call.arguments["to"]}

    with GlobalStateManager.open(path) as first:
        first.register_tool("send_email", send_email, timeout=10.0)
        mailer = first.get_conversation_state("mailer")
        record = mailer.apply(TransitionBatch().execute_tool("send_email", {"to": "ops@example.com"}))
        request_id = record.tool_requests[0]["request_id"]
        check(side_effect_done.wait(5.0), "the first delivery sent the e-mail")
    release.set()  # the first manager is closed: this call's result has nowhere to go
    print(f"3. redelivery: {request_id} was committed and its e-mail sent, then the process stopped")

    with GlobalStateManager.open(path) as second:
        second.register_tool("send_email", send_email, timeout=10.0)  # before the scope is restored
        mailer = second.get_conversation_state("mailer")  # restoring it redelivers what is pending
        check(second.tools.wait_idle(5.0), "the redelivery finished")
        snap = mailer.snapshot()
        again = calls[-1]
        print(
            f"   after reopening: redelivered {again.request_id} (redelivery={again.redelivery}); "
            f"{describe(snap.messages[-1])}; e-mails sent: {len(sent)}"
        )
        check(again.redelivery and again.request_id == request_id, "same idempotency key, marked redelivery")
        check(len(calls) == 2 and len(sent) == 1, "delivered twice, sent once")
        check(snap.messages[-1]["content"]["status"] == "already sent", "the executor used the key")
        check(not snap.pending_tool_requests and second.tools.redelivered == 1, "nothing left pending")


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="victor-actors-tools-") as path:
        with GlobalStateManager.open(path) as manager:
            retry_after_error(manager)
            timeout(manager)
        with tempfile.TemporaryDirectory(prefix="victor-actors-outbox-") as outbox_path:
            redelivery(outbox_path)
    return verdict()


if __name__ == "__main__":
    sys.exit(main())
