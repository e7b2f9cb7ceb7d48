"""OpenTelemetry traces and metrics (``victor_actors.otel``), through the real SDK.

Spans go to the SDK's ``InMemorySpanExporter`` through a ``SimpleSpanProcessor``
(exported as each span ends) and metrics to an ``InMemoryMetricReader``. Work on
other threads is waited for with ``manager.quiesce()``, joins and events, never
with sleeps. The cost of the hooks is measured by ``victor-actors bench --only
otel``, not here.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode, Tracer

from victor_actors import (
    BackpressureError,
    GlobalStateManager,
    RunFailedError,
    ScopeFailedError,
    StateChanged,
    ToolCall,
    TransitionBatch,
    VersionConflictError,
    _trace,
)
from victor_actors.bench._probes import send_nowait
from victor_actors.otel import VictorActorsInstrumentor
from victor_actors.otel import names as n
from victor_actors.otel._metrics import _label
from victor_actors.testing import inject_fault, set_observer


class Otel:
    def __init__(self, exporter: InMemorySpanExporter, tracer: Tracer, reader: InMemoryMetricReader) -> None:
        self.exporter = exporter
        self.tracer = tracer
        self.reader = reader

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if name is None or s.name == name]

    def one(self, name: str, **attributes: Any) -> ReadableSpan:
        found = [s for s in self.spans(name) if all(_attr(s, k) == v for k, v in attributes.items())]
        assert len(found) == 1, (name, attributes, [(s.name, dict(s.attributes or {})) for s in self.spans()])
        return found[0]

    def points(self, metric: str) -> list[Any]:
        """The data points of ``metric`` in a fresh collection (empty if it has none)."""
        data = self.reader.get_metrics_data()
        out: list[Any] = []
        for rm in data.resource_metrics if data is not None else ():
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name == metric:
                        out.extend(m.data.data_points)
        return out

    def total(self, metric: str, **attributes: Any) -> float:
        """The sum of ``metric``'s points (a histogram's: their counts) carrying ``attributes``."""
        out = 0.0
        for p in self.points(metric):
            if all(p.attributes.get(k) == v for k, v in attributes.items()):
                out += p.count if hasattr(p, "count") else p.value
        return out


def _attr(span: ReadableSpan, key: str) -> Any:
    return (span.attributes or {}).get(key)


def _parent(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def _id(span: ReadableSpan | trace.Span) -> int:
    context = span.get_span_context()
    assert context is not None
    return context.span_id


@pytest.fixture(scope="module")
def providers() -> Iterator[tuple[InMemorySpanExporter, TracerProvider, InMemoryMetricReader, MeterProvider]]:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    yield exporter, tracer_provider, reader, meter_provider
    tracer_provider.shutdown()
    meter_provider.shutdown()


@pytest.fixture
def otel(
    providers: tuple[InMemorySpanExporter, TracerProvider, InMemoryMetricReader, MeterProvider],
) -> Iterator[Otel]:
    exporter, tracer_provider, reader, meter_provider = providers
    exporter.clear()
    instrumentor = VictorActorsInstrumentor()
    instrumentor.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)
    try:
        yield Otel(exporter, tracer_provider.get_tracer("tests"), reader)
    finally:
        instrumentor.uninstrument()
    assert _trace.hooks is None


# -- parentage -------------------------------------------------------------------------------


def test_apply_from_threads_the_actor_span_is_the_callers_child(
    otel: Otel, manager: GlobalStateManager
) -> None:
    handles = [manager.get_conversation_state(f"c{i}") for i in range(4)]
    start = threading.Barrier(len(handles))
    outer: dict[int, int] = {}

    def work(i: int) -> None:
        start.wait()  # the four threads apply at the same time
        with otel.tracer.start_as_current_span(f"thread-{i}") as span:
            outer[i] = _id(span)
            for k in range(3):
                handles[i].set("k", k)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(handles))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    applies = otel.spans(n.SPAN_APPLY)
    commits = {_parent(s): s for s in otel.spans(n.SPAN_COMMIT)}
    assert len(applies) == 12 and len(commits) == 12
    for span in applies:
        i = int(str(_attr(span, n.SCOPE)).split(":c")[1])
        assert _parent(span) == outer[i]  # never another thread's span
        commit = commits[_id(span)]
        assert _attr(commit, n.SCOPE) == f"conversation:c{i}"
        assert commit.context.trace_id == span.context.trace_id
    assert trace.get_current_span() is trace.INVALID_SPAN  # nothing was left attached here


def test_aapply_from_asyncio_tasks_each_task_keeps_its_own_parent(
    otel: Otel, manager: GlobalStateManager
) -> None:
    handle = manager.get_conversation_state("async")
    outer: dict[str, int] = {}

    async def task(name: str) -> None:
        with otel.tracer.start_as_current_span(name) as span:
            outer[name] = _id(span)
            for i in range(3):
                await handle.aset(name, i)

    async def main() -> None:
        await asyncio.gather(*(task(f"task-{i}") for i in range(4)))

    asyncio.run(main())
    aapplies = otel.spans(n.SPAN_AAPPLY)
    assert len(aapplies) == 12
    commits = {_parent(s): s for s in otel.spans(n.SPAN_COMMIT)}
    by_id = {_id(s): s for s in otel.spans()}
    for span in aapplies:
        assert by_id[_parent(span) or 0].name.startswith("task-")
        assert _parent(commits[_id(span)]) == _id(span)
    assert {by_id[_parent(s) or 0].name for s in aapplies} == set(outer)


def test_a_subscriber_runs_in_the_committing_requests_trace(otel: Otel, manager: GlobalStateManager) -> None:
    handle = manager.get_conversation_state("subscribed")
    seen: list[tuple[int, int, str]] = []

    def callback(event: StateChanged) -> None:
        with otel.tracer.start_as_current_span("in-subscriber") as mine:
            current = trace.get_current_span()
            seen.append((mine.get_span_context().trace_id, _id(current), threading.current_thread().name))

    handle.subscribe(callback)
    with otel.tracer.start_as_current_span("caller") as caller:
        handle.set("k", 1)
    manager.quiesce()
    apply = otel.one(n.SPAN_APPLY)
    commit = otel.one(n.SPAN_COMMIT)
    deliver = otel.one(n.SPAN_DELIVER)
    mine = otel.one("in-subscriber")
    assert _parent(apply) == _id(caller) and _parent(commit) == _id(apply)
    assert _parent(deliver) == _id(commit) and _parent(mine) == _id(deliver)
    assert seen[0][0] == caller.get_span_context().trace_id
    assert seen[0][2].endswith("-events")  # on the event thread, yet in the caller's trace
    assert _attr(deliver, n.EVENT_KIND) == "commit" and _attr(deliver, n.NEW_VERSION) == 1


def test_tool_executors_run_in_the_committing_requests_trace(otel: Otel, manager: GlobalStateManager) -> None:
    def lookup(call: ToolCall) -> str:
        with otel.tracer.start_as_current_span("in-sync-tool"):
            return "found"

    async def fetch(call: ToolCall) -> str:
        await asyncio.sleep(0)  # a real suspension inside the executor
        with otel.tracer.start_as_current_span("in-async-tool"):
            return "fetched"

    manager.register_tool("lookup", lookup)
    manager.register_tool("fetch", fetch)
    handle = manager.get_conversation_state("tools")
    with otel.tracer.start_as_current_span("caller"):
        handle.apply(TransitionBatch().execute_tool("lookup", {"q": 1}).execute_tool("fetch", {"q": 2}))
    manager.quiesce()
    requesting = next(s for s in otel.spans(n.SPAN_COMMIT) if _attr(s, n.NEW_VERSION) == 1)
    for tool_name, inner in (("lookup", "in-sync-tool"), ("fetch", "in-async-tool")):
        tool = otel.one(n.SPAN_TOOL, **{n.TOOL_NAME: tool_name})
        assert _parent(tool) == _id(requesting)
        assert _attr(tool, n.SCOPE) == "conversation:tools" and _attr(tool, n.TOOL_REDELIVERY) is False
        assert _parent(otel.one(inner)) == _id(tool)
    # each result is applied in the same trace, as a child of the commit that asked for it
    results = [s for s in otel.spans(n.SPAN_APPLY) if _attr(s, n.TRANSITION_TYPES) == ("TOOL_RESULT",)]
    assert len(results) == 2 and all(_parent(s) == _id(requesting) for s in results)


def test_a_failing_tool_marks_its_span(otel: Otel, manager: GlobalStateManager) -> None:
    def broken(call: ToolCall) -> None:
        raise OSError("no network")

    manager.register_tool("broken", broken)
    manager.get_conversation_state("t").apply(TransitionBatch().execute_tool("broken"))
    manager.quiesce()
    tool = otel.one(n.SPAN_TOOL)
    assert tool.status.status_code is StatusCode.ERROR and _attr(tool, n.ERROR_TYPE) == "OSError"
    assert [e.name for e in tool.events] == ["exception"]


# -- cross-scope batches ---------------------------------------------------------------------------


def test_a_cross_scope_batch_has_one_span_per_participant(otel: Otel, manager: GlobalStateManager) -> None:
    handle = manager.get_conversation_state("c", workflow_id="wf", team_id="t")
    batch = TransitionBatch().update_state("k", 1).update_state("t", 1, scope="team")
    batch.update_state("g", 1, scope="global")
    with otel.tracer.start_as_current_span("caller"):
        record = handle.apply(batch)
    apply = otel.one(n.SPAN_APPLY)
    prepares = otel.spans(n.SPAN_PREPARE)
    assert sorted(str(_attr(s, n.SCOPE)) for s in prepares) == ["conversation:c", "global:global", "team:t"]
    assert all(_parent(s) == _id(apply) for s in prepares)
    assert all(_attr(s, n.OUTCOME) == "committed" and _attr(s, n.TRANSITION_COUNT) == 1 for s in prepares)
    assert _attr(apply, n.CROSS_SCOPE) is True and _attr(apply, n.TRANSITION_COUNT) == 3
    assert set(_attr(apply, n.INVOLVED)) == {str(r) for r in record.involved}
    assert otel.total(n.COMMIT_DURATION, **{n.CROSS_SCOPE: True}) >= 1


def test_transact_participants_are_children_of_the_callers_span(
    otel: Otel, manager: GlobalStateManager
) -> None:
    handle = manager.get_conversation_state("c", team_id="t")
    with otel.tracer.start_as_current_span("caller") as caller:
        handle.transact(lambda s: TransitionBatch().update_state("t", 1, scope="team"), lock=["team"])
    prepares = otel.spans(n.SPAN_PREPARE)
    assert len(prepares) == 2 and all(_parent(s) == _id(caller) for s in prepares)
    assert {_attr(s, n.OUTCOME) for s in prepares} == {"committed"}


def test_a_refused_apply_is_an_error_span(otel: Otel, manager: GlobalStateManager) -> None:
    handle = manager.get_conversation_state("c", team_id="t")
    handle.set("k", 1)
    otel.exporter.clear()
    with pytest.raises(VersionConflictError):
        handle.apply(TransitionBatch().update_state("t", 1, scope="team"), expected_version={"team": 7})
    span = otel.one(n.SPAN_APPLY)
    assert span.status.status_code is StatusCode.ERROR
    assert _attr(span, n.ERROR_TYPE) == "VersionConflictError" and _attr(span, n.CROSS_SCOPE) is True
    assert not otel.spans(n.SPAN_PREPARE)  # refused before any participant was asked


# -- runs and restarts -----------------------------------------------------------------------------


def test_a_run_is_a_span_and_its_rollback_an_event(otel: Otel, manager: GlobalStateManager) -> None:
    handle = manager.get_conversation_state("r")
    before = otel.total(n.ROLLBACKS)
    with pytest.raises(RunFailedError), manager.run("session-1") as run:
        handle.set("k", 1)
        handle.add_message("hello")
        raise ValueError("the agent gave up")
    span = otel.one(n.SPAN_RUN)
    assert _attr(span, n.RUN_ID) == run.id and _attr(span, n.SESSION_ID) == "session-1"
    assert _attr(span, n.RUN_STATUS) == "rolled_back" and span.status.status_code is StatusCode.ERROR
    (event,) = span.events
    assert event.name == n.EVENT_ROLLBACK
    attributes = dict(event.attributes or {})
    assert attributes[n.REASON] == "ValueError: the agent gave up"
    assert attributes["victor_actors.rollback.scopes"] == ("conversation:r",)
    assert attributes["victor_actors.rollback.keys_restored"] == 1
    assert attributes["victor_actors.rollback.messages_removed"] == 1
    applies = otel.spans(n.SPAN_APPLY)
    assert len(applies) == 2 and all(_parent(s) == _id(span) for s in applies)
    assert all(_attr(s, n.RUN_ID) == run.id for s in applies + otel.spans(n.SPAN_COMMIT))
    assert otel.total(n.ROLLBACKS) == before + 1
    assert handle.get("k") is None


def test_an_async_run_that_succeeds(otel: Otel, manager: GlobalStateManager) -> None:
    handle = manager.get_conversation_state("ar")

    async def main() -> str:
        async with manager.arun("session-2") as run:
            await handle.aset("k", 1)
        return run.id

    run_id = asyncio.run(main())
    span = otel.one(n.SPAN_RUN)
    assert _attr(span, n.RUN_STATUS) == "succeeded" and span.status.status_code is StatusCode.UNSET
    assert not span.events and _attr(otel.one(n.SPAN_COMMIT), n.RUN_ID) == run_id
    assert _parent(otel.one(n.SPAN_AAPPLY)) == _id(span)


def test_a_restart_is_a_span_under_the_failed_request(otel: Otel, manager: GlobalStateManager) -> None:
    handle = manager.get_conversation_state("fragile")
    handle.set("k", 1)
    before = otel.total(n.RESTARTS, **{n.SCOPE_LEVEL: "conversation"})
    inject_fault(manager, handle.ref, RuntimeError("disk on fire"))
    with pytest.raises(ScopeFailedError):
        handle.set("k", 2)
    manager.quiesce()
    failed = next(s for s in otel.spans(n.SPAN_COMMIT) if s.status.status_code is StatusCode.ERROR)
    assert _attr(failed, n.ERROR_TYPE) == "ScopeFailedError"
    restart = otel.one(n.SPAN_RESTART)
    assert _parent(restart) == _id(failed)  # the failing actor restarted itself, inside that request
    assert _attr(restart, n.SCOPE) == "conversation:fragile"
    assert _attr(restart, n.OLD_VERSION) == 1 and _attr(restart, n.NEW_VERSION) == 1
    assert "RuntimeError: disk on fire" in str(_attr(restart, n.REASON))
    assert otel.total(n.RESTARTS, **{n.SCOPE_LEVEL: "conversation"}) == before + 1
    assert otel.one(n.SPAN_APPLY, **{n.ERROR_TYPE: "ScopeFailedError"}).status.status_code is StatusCode.ERROR


# -- attributes with a store -----------------------------------------------------------------------


def test_attributes_of_a_durable_commit(otel: Otel, tmp_path: Path) -> None:
    with GlobalStateManager.open(tmp_path / "db", durability="sync") as manager:
        handle = manager.get_conversation_state("alice")
        handle.set("k", 0)
        before = (otel.total(n.STORE_TRANSACTIONS), otel.total(n.COMMITS_PER_TRANSACTION))
        otel.exporter.clear()
        with manager.run("s") as run:
            handle.apply(TransitionBatch().update_state("k", 1).add_message("hi").update_state("j", 2))
        after = (otel.total(n.STORE_TRANSACTIONS), otel.total(n.COMMITS_PER_TRANSACTION))
    commit = otel.one(n.SPAN_COMMIT)
    expected = {
        n.SCOPE: "conversation:alice",
        n.SCOPE_LEVEL: "conversation",
        n.OLD_VERSION: 1,
        n.NEW_VERSION: 2,
        n.COMMITTED: True,
        n.TRANSITION_COUNT: 3,
        n.TRANSITION_TYPES: ("UPDATE_STATE", "ADD_MESSAGE"),
        n.RUN_ID: run.id,
        n.DURABILITY: "sync",
        n.GROUP_COMMIT_SIZE: 1,  # alone in its LMDB transaction
    }
    assert {k: _attr(commit, k) for k in expected} == expected
    assert _attr(commit, n.COMMIT_ID) == _attr(otel.one(n.SPAN_APPLY), n.COMMIT_ID)
    apply = otel.one(n.SPAN_APPLY)
    assert _attr(apply, n.OLD_VERSION) == 1 and _attr(apply, n.NEW_VERSION) == 2
    assert _attr(apply, n.GROUP_COMMIT_SIZE) is None  # the caller did not wait on the store itself
    assert after[0] >= before[0] + 1 and after[0] - before[0] == after[1] - before[1]


SECRET_IDS = ("alice-7f3e", "ops-team-91c2", "wf-launch-55ab", "child-0d9e")


def _everything_exported(otel: Otel) -> str:
    """Every span's name, attributes, status and events (names and attributes) as one text."""
    parts: list[str] = []
    for span in otel.spans():
        parts.append(span.name)
        parts.extend(f"{k}={v!r}" for k, v in (span.attributes or {}).items())
        parts.append(str(span.status.description))
        for event in span.events:
            parts.append(event.name)
            parts.extend(f"{k}={v!r}" for k, v in (event.attributes or {}).items())
    return "\n".join(parts)


def test_an_encrypted_store_keeps_scope_ids_out_of_every_span(otel: Otel, tmp_path: Path) -> None:
    """Issue 28, item 11: spans carried scope ids in the clear (``victor_actors.scope``, run and tool
    request ids made from them, error messages quoting them) for a store whose keys hold none. Failed
    before the fix (the ids were in the attributes and in error texts). Now a manager on an encrypted
    store names each scope ``level:~<keyed hash>`` (the same hash in every span) and reduces error
    texts to their type; a plain store's spans are unchanged (the tests above)."""
    from victor_actors import Keyring

    alice, team, wf, child = SECRET_IDS
    keys = Keyring({"k1": Keyring.generate_key()}, active="k1")
    with GlobalStateManager.open(tmp_path / "sealed", encryption=keys) as manager:

        def lookup(call: ToolCall) -> None:
            raise LookupError(f"nothing for {call.scope} in {call.request_id}")

        manager.register_tool("lookup", lookup)
        conv = manager.get_conversation_state(alice, workflow_id=wf, team_id=team)
        conv.subscribe(lambda event: None)
        conv.apply(TransitionBatch().add_message("hi").update_state("n", 1, scope="team"))  # cross-scope
        conv.apply(TransitionBatch().execute_tool("lookup", {}))  # generated id: "conversation:alice-...@2#0"
        conv.apply(TransitionBatch().create_session(child))
        with pytest.raises(VersionConflictError):
            conv.apply(TransitionBatch().add_message("late"), expected_version=0)
        with pytest.raises(RunFailedError), manager.run(alice):
            conv.add_message("in the run")
            raise RuntimeError(f"the agent of {alice} in {team} gave up")
        inject_fault(manager, conv.ref, RuntimeError(f"disk on fire under {conv.ref}"))
        with pytest.raises(ScopeFailedError):
            conv.set("k", 2)
        manager.get_conversation_state(child).set("k", 1)
        manager.quiesce()
    exported = _everything_exported(otel)
    names = {s.name for s in otel.spans()}
    assert {n.SPAN_APPLY, n.SPAN_COMMIT, n.SPAN_PREPARE, n.SPAN_DELIVER, n.SPAN_TOOL, n.SPAN_RUN} <= names
    assert n.SPAN_RESTART in names
    for secret in SECRET_IDS:
        assert secret not in exported, [line for line in exported.splitlines() if secret in line]
    scopes = {_attr(s, n.SCOPE) for s in otel.spans() if _attr(s, n.SCOPE) is not None}
    hashed = {x for x in scopes if x.startswith("conversation:~")}
    assert len(hashed) == 2 and all(len(x) == len("conversation:~") + 32 for x in hashed)  # alice, child
    assert any(x.startswith("team:~") for x in scopes)
    restarts = otel.spans(n.SPAN_RESTART)  # the conversation, and its child session with it
    assert {_attr(r, n.SCOPE) for r in restarts} == hashed
    assert _attr(otel.one(n.SPAN_TOOL), n.SCOPE) in hashed  # one name per scope, in every span
    reasons = sorted(_attr(r, n.REASON) for r in restarts)
    assert reasons == ["(hidden)", "RuntimeError"], reasons  # the child's: "its supervisor <ref> ..."
    failed = otel.one(n.SPAN_TOOL)
    assert failed.status.status_code is StatusCode.ERROR and failed.status.description == "LookupError"
    assert [e.name for e in failed.events] == ["exception"]
    (rollback,) = otel.one(n.SPAN_RUN).events
    assert dict(rollback.attributes or {})[n.REASON] == "RuntimeError"


def test_the_group_commit_size_counts_the_commits_sharing_a_transaction(otel: Otel, tmp_path: Path) -> None:
    # a's commit (async durability) waits in the writer's queue for up to flush_interval; b's synced
    # commit, made right after it, leads a transaction that takes a's with it.
    with GlobalStateManager.open(tmp_path / "db", durability="sync", flush_interval=1.0) as manager:
        a, b = manager.get_conversation_state("a"), manager.get_conversation_state("b")
        manager.set_durability(a.ref, "async")
        manager.flush()  # the scope records queued at creation do not ride along below
        otel.exporter.clear()
        a.set("k", 1)
        b.set("k", 1)
    assert _attr(otel.one(n.SPAN_COMMIT, **{n.SCOPE: "conversation:b"}), n.GROUP_COMMIT_SIZE) == 2
    async_commit = otel.one(n.SPAN_COMMIT, **{n.SCOPE: "conversation:a"})
    assert _attr(async_commit, n.DURABILITY) == "async"
    assert _attr(async_commit, n.GROUP_COMMIT_SIZE) is None  # nobody waited for it


# -- metrics ---------------------------------------------------------------------------------------


def test_metrics_are_present_and_count(otel: Otel) -> None:
    manager = GlobalStateManager.open(mailbox_size=1, backpressure="reject", max_live_actors=None)
    try:
        handle = manager.get_conversation_state("m")
        handle.set("k", 0)
        me = {n.MANAGER: _label(manager)}
        refused_before = otel.total(n.REFUSALS, **{n.SCOPE_LEVEL: "conversation"})
        entered, release = threading.Event(), threading.Event()

        def hold() -> None:
            entered.set()
            release.wait(10.0)

        inject_fault(manager, handle.ref, hold)
        first = threading.Thread(target=handle.set, args=("k", 1))
        first.start()
        entered.wait(10.0)  # the actor is busy with the first request
        queued = send_nowait(handle, TransitionBatch().update_state("k", 2))  # in the mailbox: 1 of 1
        with pytest.raises(BackpressureError):
            handle.set("k", 3)
        assert otel.total(n.MAILBOX_DEPTH, **me) == 1
        release.set()
        first.join()
        queued.get(timeout=10.0)
        assert otel.total(n.REFUSALS, **{n.SCOPE_LEVEL: "conversation"}) == refused_before + 1
        assert otel.total(n.MAILBOX_DEPTH, **me) == 0
        stats = manager.stats()
        assert otel.total(n.COMMITS, **me) == stats["commits"] == 3
        # the conversation is live; global, which took no request, has no actor (actors start lazily)
        assert otel.total(n.SCOPES, **me, **{n.STATE: "live"}) == stats["live_actors"] == 1
        assert otel.total(n.SCOPES, **me, **{n.STATE: "passivated"}) == stats["passivated_scopes"] == 1
        for name, count in ((n.ACTIVATIONS, 1), (n.PASSIVATIONS, 0), (n.EVICTIONS, 0)):
            # one activation: the conversation's first request started its actor
            assert [p.value for p in otel.points(name) if p.attributes == me] == [count]
        assert otel.total(n.COMMIT_DURATION, **{n.OPERATION: "apply"}) >= 2
    finally:
        manager.close()
    assert not [p for p in otel.points(n.COMMITS) if p.attributes == me]  # a closed manager is not observed


# -- switching it on and off ---------------------------------------------------------------------


def test_uninstrument_stops_the_spans_and_empties_the_slot(
    otel: Otel, providers: tuple[Any, ...], manager: GlobalStateManager
) -> None:
    handle = manager.get_conversation_state("off")
    handle.subscribe(lambda e: None)
    handle.set("k", 1)
    manager.quiesce()
    assert otel.spans(n.SPAN_APPLY)
    VictorActorsInstrumentor().uninstrument()
    VictorActorsInstrumentor().uninstrument()  # twice: harmless
    assert _trace.hooks is None and not VictorActorsInstrumentor().is_instrumented_by_opentelemetry
    otel.exporter.clear()
    messages: list[Any] = []
    set_observer(manager, lambda kind, ref, obj: messages.append(obj) if kind == "received" else None)
    handle.set("k", 2)
    manager.quiesce()
    assert otel.spans() == []
    assert [m.trace for m in messages] == [None]  # the request carried nothing
    assert otel.points(n.COMMITS) == []  # the observed metrics stop reporting too


def test_instrumenting_twice_is_harmless(
    otel: Otel, manager: GlobalStateManager, caplog: pytest.LogCaptureFixture
) -> None:
    other = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(other))
    hooks = _trace.hooks
    with caplog.at_level(logging.WARNING, logger="victor_actors"):
        VictorActorsInstrumentor().instrument(tracer_provider=provider)
    assert _trace.hooks is hooks and "already instrumented" in caplog.text
    assert VictorActorsInstrumentor() is VictorActorsInstrumentor()
    manager.get_conversation_state("twice").set("k", 1)
    assert len(otel.spans(n.SPAN_APPLY)) == 1 and other.get_finished_spans() == ()


def test_instrument_again_after_uninstrument(
    otel: Otel, providers: tuple[Any, ...], manager: GlobalStateManager
) -> None:
    _exporter, tracer_provider, _reader, meter_provider = providers
    handle = manager.get_conversation_state("again")
    VictorActorsInstrumentor().uninstrument()
    VictorActorsInstrumentor().instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)
    handle.set("k", 1)
    assert len(otel.spans(n.SPAN_APPLY)) == 1
    assert otel.total(n.COMMITS, **{n.MANAGER: _label(manager)}) == 1  # the same meter's instruments


def test_nothing_is_imported_or_enabled_until_instrument_is_called(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "import victor_actors\n"
        "from victor_actors import _trace\n"
        "m = victor_actors.GlobalStateManager.open()\n"
        "m.get_conversation_state('a').set('k', 1)\n"
        "print(sorted({k.split('.')[0] for k in sys.modules} & {'opentelemetry'}))\n"
        "import victor_actors.otel\n"
        "m.get_conversation_state('a').set('k', 2)\n"
        "print(_trace.hooks)\n"
        "m.close()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["[]", "None"]
