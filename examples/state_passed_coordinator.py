"""The state-passed document's ExampleCoordinator, made real.

A coordinator is a pure decision: ``process(snapshot, user_message)`` reads an
immutable ContextSnapshot and returns a CoordinatorResult (transitions, why,
and what comes next). A CoordinatorRunner does the rest: it takes the
snapshot, calls the coordinator, applies the transitions with the versions
the snapshot saw, retries on a version conflict, and follows handoffs.

This script shows, each in its own conversation:

1. a simple query answered directly (one message, ``should_continue=False``);
2. a request that needs a tool: the coordinator returns an EXECUTE_TOOL
   transition (``list_files`` with ``{"path": "."}``), the runtime commits it
   and only then runs the registered executor (a deterministic fake); once the
   TOOL_RESULT is in (``manager.tools.wait_idle()``) a second run answers from
   the tool message in the snapshot;
3. a complex request: the coordinator writes a plan (``plan_steps``, stage
   ``planning``) and hands off to an "executor" coordinator, which works
   through the steps, one commit each, inside ``with manager.run(...)``;
4. an ``async`` coordinator (and an async tool) through ``runner.arun``;
5. nested coordinators (``runner.nested``) deciding on one snapshot, their
   results merged and applied as one batch;
6. a version conflict: another writer commits while the coordinator decides,
   and the runner retries with a fresh snapshot;
7. a run that fails half-way through a coordinator loop and is rolled back.

No model calls and no network. The store is LMDB in a temporary directory.
Run it with ``python examples/state_passed_coordinator.py``; it exits 0 when
every check holds.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from collections.abc import Mapping
from typing import Any

from _checks import check, verdict

from victor_actors import (
    ContextSnapshot,
    CoordinatorResult,
    CoordinatorRunner,
    GlobalStateManager,
    RunFailedError,
    ScopeHandle,
    ToolCall,
    TransitionBatch,
)

LISTING = ("README.md", "docs", "examples", "pyproject.toml", "victor_actors")


def list_files(call: ToolCall) -> dict[str, Any]:
    """A deterministic stand-in for a real tool: the same listing for any path."""
    return {"path": call.arguments["path"], "entries": list(LISTING)}


async def word_count(call: ToolCall) -> int:
    """An async tool executor; it runs on the dispatcher's own event loop."""
    await asyncio.sleep(0)
    return len(str(call.arguments["text"]).split())


def assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def role(message: Any) -> str | None:
    return message.get("role") if isinstance(message, Mapping) else None


# -- coordinators: pure functions of (snapshot, user message) -------------------------------------


class ExampleCoordinator:
    """Routes a request: answer it, ask for a tool, or plan it and hand off to the executor."""

    def process(self, snapshot: ContextSnapshot, user_message: str) -> CoordinatorResult:
        if snapshot.pending_tool_requests:
            return CoordinatorResult.no_op("a tool request is still pending", should_continue=False)
        last = snapshot.messages[-1] if snapshot.message_count else None
        if isinstance(last, Mapping) and last.get("role") == "tool":
            return self._answer_from_tool(last)
        batch = TransitionBatch().add_message({"role": "user", "content": user_message})
        if "files" in user_message.lower():
            batch.execute_tool("list_files", {"path": "."}).update_stage("awaiting_tool")
            return CoordinatorResult(batch, reasoning="needs a directory listing", should_continue=False)
        if " and then " in user_message:
            steps = [part.strip() for part in user_message.split(" and then ")]
            batch.update_state("plan_steps", steps).update_state("plan_cursor", 0).update_stage("planning")
            return CoordinatorResult(batch, reasoning=f"planned {len(steps)} steps", handoff_to="executor")
        batch.add_message(assistant(f"Short answer to {user_message!r}: 42.")).update_stage("complete")
        return CoordinatorResult(batch, reasoning="simple query: answered directly", should_continue=False)

    @staticmethod
    def _answer_from_tool(message: Mapping[str, Any]) -> CoordinatorResult:
        if message["error"] is not None:
            text = f"I could not list the files: {message['error']}"
        else:
            entries = message["content"]["entries"]
            text = f"{len(entries)} entries in {message['content']['path']!r}: {', '.join(entries)}"
        batch = TransitionBatch().add_message(assistant(text)).update_stage("complete")
        return CoordinatorResult(batch, reasoning="answered from the tool result", should_continue=False)


class ExecutorCoordinator:
    """Works through ``plan_steps``: one step per call, handing off to itself until the last."""

    def process(self, snapshot: ContextSnapshot, user_message: str) -> CoordinatorResult:
        steps = snapshot.get_state("plan_steps", ())
        cursor = snapshot.get_state("plan_cursor", 0)
        if cursor >= len(steps):
            return CoordinatorResult.no_op("the plan is done", should_continue=False)
        batch = (
            TransitionBatch()
            .add_message(assistant(f"step {cursor + 1}/{len(steps)} done: {steps[cursor]}"))
            .update_state("plan_cursor", cursor + 1)
        )
        if cursor + 1 == len(steps):
            batch.update_stage("complete")
            return CoordinatorResult(batch, reasoning="last step done", should_continue=False)
        batch.update_stage("executing")
        return CoordinatorResult(batch, reasoning=f"step {cursor + 1} done", handoff_to="executor")


class AsyncExampleCoordinator:
    """The document's "After" example as written there: ``async def process``."""

    async def process(self, context: ContextSnapshot, user_message: str) -> CoordinatorResult:
        await asyncio.sleep(0)  # stands for an awaited, side-effect-free lookup
        messages = context.messages  # read from the immutable snapshot
        if any(role(m) == "tool" for m in messages):
            count = next(m["content"] for m in messages if role(m) == "tool")
            batch = TransitionBatch().add_message(assistant(f"{count} words")).update_stage("complete")
            return CoordinatorResult(batch, reasoning="reported the count", should_continue=False)
        batch = TransitionBatch()
        batch.update_state("key", "value", scope="conversation")
        batch.execute_tool("word_count", {"text": user_message})
        return CoordinatorResult(
            transitions=batch, reasoning="Updated state and executed tool", should_continue=False
        )


class SafetyCoordinator:
    def process(self, snapshot: ContextSnapshot, user_message: str) -> CoordinatorResult:
        verdict = "blocked" if "rm -rf" in user_message else "ok"
        return CoordinatorResult(
            TransitionBatch().update_state("safety", verdict), reasoning=f"safety: {verdict}", confidence=0.9
        )


class PromptCoordinator:
    def process(self, snapshot: ContextSnapshot, user_message: str) -> CoordinatorResult:
        prompt = f"You are a careful assistant. Turn {snapshot.message_count // 2 + 1}."
        return CoordinatorResult(
            TransitionBatch().update_state("system_prompt", prompt), reasoning="prompt set", confidence=0.8
        )


class InterruptedOnce:
    """Wraps a coordinator; on the first call another writer commits while it decides.

    Only a way to make a version conflict happen on cue: a real coordinator
    never writes anything itself.
    """

    def __init__(self, inner: ExampleCoordinator, other_writer: ScopeHandle) -> None:
        self.inner = inner
        self.other_writer = other_writer
        self.calls = 0

    def process(self, snapshot: ContextSnapshot, user_message: str) -> CoordinatorResult:
        self.calls += 1
        if self.calls == 1:
            self.other_writer.add_message({"role": "user", "content": "(typed meanwhile) Hello?"})
        return self.inner.process(snapshot, user_message)


class FailsOnStep:
    """The executor, except that it raises on one step (say, the model provider went away)."""

    def __init__(self, failing_cursor: int) -> None:
        self.failing_cursor = failing_cursor

    def process(self, snapshot: ContextSnapshot, user_message: str) -> CoordinatorResult:
        if snapshot.get_state("plan_cursor", 0) == self.failing_cursor:
            raise ConnectionError("the model provider went away")
        return ExecutorCoordinator().process(snapshot, user_message)


# -- the walkthrough ------------------------------------------------------------------------------


def texts(snapshot: ContextSnapshot) -> list[str]:
    return [str(m["content"]) if isinstance(m, Mapping) else str(m) for m in snapshot.messages]


def simple_query(manager: GlobalStateManager, runner: CoordinatorRunner) -> None:
    conv = manager.get_conversation_state("simple")
    loop = runner.run(conv, "router", "What is six times seven?")
    snap = loop.snapshot
    print(f"1. simple: {len(loop.steps)} step, stopped on {loop.stopped_because}; said {texts(snap)[-1]!r}")
    check(len(loop.steps) == 1 and loop.stopped_because == "should_continue=False", "one step, then stop")
    check(snap.message_count == 2 and snap.conversation_stage == "complete", "answered directly")


def tool_request(manager: GlobalStateManager, runner: CoordinatorRunner) -> None:
    conv = manager.get_conversation_state("tool")
    question = "Which files are in the project?"
    first = runner.run(conv, "router", question)
    commit = first.steps[0].commit
    request_ids = [r["request_id"] for r in commit.tool_requests] if commit else []
    print(f"2. tool: run 1 committed v{conv.version} with tool request {request_ids}")
    check(len(request_ids) == 1, "the EXECUTE_TOOL transition committed as one request")
    check(manager.tools.wait_idle(5.0), "the tool finished")
    snap = conv.snapshot()
    tool_message = snap.messages[-1]
    print(
        f"   the executor ran after the commit; its TOOL_RESULT arrived as v{snap.version}: "
        f"role={tool_message['role']!r}, content={dict(tool_message['content'])}, "
        f"error={tool_message['error']}"
    )
    check(role(tool_message) == "tool" and tool_message["error"] is None, "a TOOL_RESULT message")
    check(tool_message["request_id"] == request_ids[0], "the result names its request")
    check(not snap.pending_tool_requests, "no request left pending")
    second = runner.run(conv, "router", question)
    answer = texts(second.snapshot)[-1]
    print(f"   run 2 read the tool message from the snapshot and answered: {answer!r}")
    check(answer.startswith("5 entries in '.'"), "the second run answers from the tool result")
    check(second.snapshot.conversation_stage == "complete", "and completes")


def plan_and_execute(manager: GlobalStateManager, runner: CoordinatorRunner) -> None:
    conv = manager.get_conversation_state("plan")
    request = "collect the figures and then draft the summary and then check the numbers"
    with manager.run("plan", timeout=10.0) as run:
        loop = runner.run(conv, "router", request)
    flow = " -> ".join(f"{s.coordinator}(v{s.commit.version})" for s in loop.steps if s.commit)
    print(f"3. plan: {flow}; stopped on {loop.stopped_because}; run {run.status}")
    for line in texts(loop.snapshot)[1:]:
        print(f"   {line}")
    check([s.coordinator for s in loop.steps] == ["router", "executor", "executor", "executor"], "handoffs")
    check(loop.snapshot.get_state("plan_cursor") == 3, "every step done")
    check(loop.snapshot.conversation_stage == "complete", "complete")
    check(run.status == "succeeded" and len(run.commits) == 4, "the run recorded its four commits")


async def async_coordinator(manager: GlobalStateManager, runner: CoordinatorRunner) -> None:
    conv = manager.get_conversation_state("async")
    first = await runner.arun(conv, AsyncExampleCoordinator(), "count the words in this sentence")
    idle = await asyncio.to_thread(manager.tools.wait_idle, 5.0)  # wait_idle blocks: keep it off the loop
    second = await runner.arun(conv, AsyncExampleCoordinator(), "")
    print(
        f"4. async: arun stopped on {first.stopped_because} with key={first.snapshot.get_state('key')!r}; "
        f"after the async tool: {texts(second.snapshot)[-1]!r}"
    )
    check(idle and first.snapshot.get_state("key") == "value", "the async coordinator's batch applied")
    check(texts(second.snapshot)[-1] == "6 words", "the async tool's result was used")


def nested(manager: GlobalStateManager, runner: CoordinatorRunner) -> None:
    conv = manager.get_conversation_state("nested")
    snapshot = conv.snapshot()
    merged = runner.nested(snapshot, "What is the capital of France?", "safety", "prompt", "router")
    record = conv.apply(merged, expected_version=snapshot.versions())
    snap = conv.snapshot()
    print(
        f"5. nested: 3 coordinators on v{snapshot.version}, merged into one commit v{record.version} "
        f"({len(merged.transitions)} transitions, confidence {merged.confidence}); "
        f"reasoning: {merged.reasoning}"
    )
    check(record.version == snapshot.version + 1, "one commit for all three")
    check(snap.get_state("safety") == "ok" and snap.get_state("system_prompt") is not None, "all applied")
    check(merged.confidence == 0.8 and not merged.should_continue, "merge: min confidence, all continue")


def conflict(manager: GlobalStateManager, runner: CoordinatorRunner) -> None:
    conv = manager.get_conversation_state("conflict")
    coordinator = InterruptedOnce(ExampleCoordinator(), conv)
    record = runner.step(conv, coordinator, "What is the answer?")
    snap = conv.snapshot()
    print(
        f"6. conflict: another writer committed while the coordinator decided; the runner retried "
        f"and applied on attempt {record.attempts}: {texts(snap)}"
    )
    check(record.attempts == 2 and coordinator.calls == 2, "a conflict, then a retry on a fresh snapshot")
    check(snap.message_count == 3 and texts(snap)[0] == "(typed meanwhile) Hello?", "nothing was lost")


def failed_run(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("fails")
    conv.add_message({"role": "system", "content": "before the run"})
    before = conv.snapshot()
    runner = CoordinatorRunner({"router": ExampleCoordinator(), "executor": FailsOnStep(failing_cursor=1)})
    try:
        with manager.run("fails", timeout=10.0):
            runner.run(conv, "router", "fetch the data and then chart it and then publish it")
    except RunFailedError as exc:  # the body's ConnectionError is exc.error
        report = exc.rollback_report
        after = conv.snapshot()
        undone = report.scopes[0]
        print(
            f"7. failed run: {exc}; rolled back {undone.messages_removed} messages and keys "
            f"{sorted(undone.keys_restored)} as commit v{after.version}"
        )
        check(after.messages == before.messages and after.state == before.state, "back to before the run")
        check(after.conversation_stage == before.conversation_stage, "stage restored too")
        check(after.version > before.version, "the rollback is a new commit; history is kept")
    else:
        check(False, "the failing executor raised")


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="victor-actors-coordinator-") as path:
        with GlobalStateManager.open(path) as manager:
            manager.register_tool("list_files", list_files, timeout=5.0)
            manager.register_tool("word_count", word_count, timeout=5.0)
            runner = CoordinatorRunner(
                {
                    "router": ExampleCoordinator(),
                    "executor": ExecutorCoordinator(),
                    "safety": SafetyCoordinator(),
                    "prompt": PromptCoordinator(),
                }
            )
            simple_query(manager, runner)
            tool_request(manager, runner)
            plan_and_execute(manager, runner)
            asyncio.run(async_coordinator(manager, runner))
            nested(manager, runner)
            conflict(manager, runner)
            failed_run(manager)
    return verdict()


if __name__ == "__main__":
    sys.exit(main())
