"""The hooks of ``victor_actors._trace``, implemented with the OpenTelemetry API.

How a trace follows a request across threads:

- ``apply``/``aapply`` start the caller's span (:class:`CallSpan`) in the
  caller's context (a thread's, or an asyncio task's) and make it current
  until the call returns; the request message carries it.
- The scope's actor runs the request's work in a child span
  (``victor_actors.commit``, or ``victor_actors.prepare`` for a part of a
  cross-scope batch), current on the actor's thread while it works.
- Whatever that work hands to other threads captures the current context
  (:class:`Carrier`): the event thread delivers each event in a child span
  of it, a tool executor runs in one, and a tool's result is applied in it.

Attaching and detaching always happen in pairs on one thread (or in one
task), so a context never leaks into whatever the thread does next.

Every scope id, and every id or error text that may quote one, goes through
the manager's :class:`~victor_actors._trace.Names`: in the clear, or hashed
for a manager whose store is encrypted (see ``docs/security.md``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from typing import Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, Status, StatusCode, Tracer

from victor_actors._messages import ApplyRequest, PrepareRequest
from victor_actors._model import StateTransition
from victor_actors._state import StateChanged
from victor_actors._supervision import SupervisionEvent
from victor_actors._trace import Names
from victor_actors.otel import _names as n
from victor_actors.otel._metrics import Instruments, level

__all__ = ["CallSpan", "Carrier", "OtelHooks", "RunSpan"]

T = TypeVar("T")

# The span a store wait on this thread (or task) belongs to: the group-commit size goes on it.
# Only our own work spans set it, so a user's span never gets our attribute.
_WORK: ContextVar[Span | None] = ContextVar("victor_actors_otel_work", default=None)


def _types(transitions: tuple[StateTransition, ...]) -> list[str]:
    return list(dict.fromkeys(t.transition_type.name for t in transitions))


def _failed(span: Span, exc: BaseException, names: Names) -> None:
    """Record ``exc`` on ``span``: the error status, its type and, for an Exception, the exception event.

    With hidden names the message and the traceback (which quote scope ids) stay out: the status
    and the event say the error's type only.
    """
    span.set_attribute(n.ERROR_TYPE, type(exc).__qualname__)
    if names.hidden:
        if isinstance(exc, Exception):
            span.add_event("exception", {"exception.type": type(exc).__qualname__})
        span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
        return
    if isinstance(exc, Exception):
        span.record_exception(exc)
    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))


def _committed(span: Span, record: StateChanged) -> None:
    span.set_attributes(
        {
            n.OLD_VERSION: record.old_version,
            n.NEW_VERSION: record.new_version,
            n.COMMITTED: record.committed,
            n.COMMIT_ID: record.commit_id,
        }
    )


class Carrier:
    """A captured context (see ``victor_actors._trace.Carrier``)."""

    __slots__ = ("_ctx", "_hooks", "_names")

    def __init__(self, hooks: OtelHooks, ctx: Context, names: Names) -> None:
        self._hooks = hooks
        self._ctx = ctx
        self._names = names

    def actor(self, work: Callable[[Any], T], cell: Any) -> Callable[[Any], T]:
        hooks, parent = self._hooks, self._ctx

        def traced(message: Any) -> T:
            return hooks.on_actor(parent, work, cell, message)

        return traced

    def bind(self, fn: Callable[..., T]) -> Callable[..., T]:
        ctx = self._ctx

        def bound(*args: Any, **kwargs: Any) -> T:
            token = otel_context.attach(ctx)
            try:
                return fn(*args, **kwargs)
            finally:
                otel_context.detach(token)

        return bound

    def deliver(self, subscribers: tuple[Any, ...], event: Any) -> None:
        tracer, parent, names = self._hooks.tracer, self._ctx, self._names
        if isinstance(event, StateChanged):
            attributes: dict[str, Any] = {
                n.EVENT_KIND: "commit",
                n.SCOPE: names.scope(event.ref),
                n.NEW_VERSION: event.new_version,
                n.COMMIT_ID: event.commit_id,
            }
            if event.run_id is not None:
                attributes[n.RUN_ID] = names.text(event.run_id)
        elif isinstance(event, SupervisionEvent):
            attributes = {n.EVENT_KIND: f"supervision.{event.kind}", n.SCOPE: names.scope(event.ref)}
        else:
            attributes = {n.EVENT_KIND: type(event).__name__}
        for sub in subscribers:
            span = tracer.start_span(n.SPAN_DELIVER, context=parent, attributes=attributes)
            token = otel_context.attach(trace.set_span_in_context(span, parent))
            try:
                sub.deliver(event)  # logs and swallows what the callback raises
            finally:
                otel_context.detach(token)
                span.end()

    def tool(self, fn: Callable[[Any], Any], call: Any, is_async: bool) -> Callable[[Any], Any]:
        tracer, parent, names = self._hooks.tracer, self._ctx, self._names
        attributes: dict[str, Any] = {
            n.TOOL_NAME: call.tool_name,
            n.TOOL_REQUEST_ID: names.text(call.request_id),  # generated ones hold the scope id
            n.TOOL_REDELIVERY: call.redelivery,
            n.SCOPE: names.scope(call.scope),
        }
        if call.run_id is not None:
            attributes[n.RUN_ID] = names.text(call.run_id)

        def begin() -> tuple[Span, Token[Context]]:
            span = tracer.start_span(n.SPAN_TOOL, context=parent, attributes=attributes)
            return span, otel_context.attach(trace.set_span_in_context(span, parent))

        def finish(span: Span, token: Token[Context], error: BaseException | None) -> None:
            if error is not None:
                _failed(span, error, names)
            otel_context.detach(token)
            span.end()

        if is_async:

            async def traced_async(arg: Any) -> Any:
                span, token = begin()
                try:
                    result = await fn(arg)
                except BaseException as exc:  # a timeout cancels the coroutine: recorded too
                    finish(span, token, exc)
                    raise
                finish(span, token, None)
                return result

            return traced_async

        def traced(arg: Any) -> Any:
            span, token = begin()
            try:
                result = fn(arg)
            except BaseException as exc:
                finish(span, token, exc)
                raise
            finish(span, token, None)
            return result

        return traced


class CallSpan(Carrier):
    """The caller's span of one ``apply``/``aapply``, current on the caller's side until :meth:`end`."""

    __slots__ = ("_level", "_name", "_span", "_started", "_token", "_work")

    def __init__(
        self, hooks: OtelHooks, name: str, ref: Any, request: ApplyRequest, cross_scope: bool, names: Names
    ) -> None:
        parent = otel_context.get_current()
        transitions = request.transitions
        attributes: dict[str, Any] = {
            n.SCOPE: names.scope(ref),
            n.SCOPE_LEVEL: level(ref),
            n.TRANSITION_COUNT: len(transitions),
            n.TRANSITION_TYPES: _types(transitions),
            n.CROSS_SCOPE: cross_scope,
        }
        if request.run_id is not None:
            attributes[n.RUN_ID] = names.text(request.run_id)
        if request.expected_version.__class__ is int:
            attributes[n.EXPECTED_VERSION] = request.expected_version
        span = hooks.tracer.start_span(
            n.SPAN_AAPPLY if name == "aapply" else n.SPAN_APPLY, context=parent, attributes=attributes
        )
        ctx = trace.set_span_in_context(span, parent)
        super().__init__(hooks, ctx, names)
        self._name = name
        self._level = attributes[n.SCOPE_LEVEL]
        self._span = span
        self._token = otel_context.attach(ctx)
        self._work = _WORK.set(span)
        self._started = time.perf_counter()

    def end(self, record: Any, error: BaseException | None) -> None:
        span = self._span
        cross = False
        if error is not None:
            _failed(span, error, self._names)
        elif isinstance(record, StateChanged):
            _committed(span, record)
            if record.involved:
                cross = True
                span.set_attribute(n.INVOLVED, [self._names.scope(r) for r in record.involved])
        _WORK.reset(self._work)
        otel_context.detach(self._token)
        span.end()
        if error is None and isinstance(record, StateChanged) and record.committed:
            self._hooks.instruments.commit_duration.record(
                time.perf_counter() - self._started,
                {n.OPERATION: self._name, n.SCOPE_LEVEL: self._level, n.CROSS_SCOPE: cross},
            )


class RunSpan:
    """The span of one run, current in its body (see ``victor_actors._trace.RunTrace``)."""

    __slots__ = ("_hooks", "_names", "_reason", "_span", "_token")

    def __init__(self, hooks: OtelHooks, run: Any, names: Names) -> None:
        self._hooks = hooks
        self._names = names
        self._span = hooks.tracer.start_span(
            n.SPAN_RUN,
            attributes={
                n.RUN_ID: names.text(run.id),  # "<session id>:<token>"
                n.SESSION_ID: names.text(run.session_id),
                n.RUN_TIMEOUT: float(run.timeout),
            },
        )
        self._token = otel_context.attach(trace.set_span_in_context(self._span))
        self._reason: str | None = None

    def rolled_back(self, report: Any) -> None:
        names = self._names
        self._reason = names.error(report.reason)
        self._span.add_event(
            n.EVENT_ROLLBACK,
            {
                n.REASON: self._reason,
                "victor_actors.rollback.scopes": [names.scope(s.ref) for s in report.scopes],
                "victor_actors.rollback.keys_restored": sum(len(s.keys_restored) for s in report.scopes),
                "victor_actors.rollback.messages_removed": sum(s.messages_removed for s in report.scopes),
                "victor_actors.rollback.conflicts": len(report.conflicts),
            },
        )
        self._hooks.instruments.rollbacks.add(1)

    def end(self, status: str) -> None:
        span = self._span
        span.set_attribute(n.RUN_STATUS, status)
        if self._reason is not None:
            span.set_status(Status(StatusCode.ERROR, f"rolled back: {self._reason}"))
        otel_context.detach(self._token)
        span.end()


class OtelHooks:
    """``victor_actors._trace.Hooks`` over one tracer and one set of instruments."""

    def __init__(self, tracer: Tracer, instruments: Instruments) -> None:
        self.tracer = tracer
        self.instruments = instruments

    def call(self, name: str, ref: Any, request: Any, cross_scope: bool, names: Names) -> CallSpan:
        return CallSpan(self, name, ref, request, cross_scope, names)

    def capture(self, names: Names) -> Carrier:
        return Carrier(self, otel_context.get_current(), names)

    def run(self, run: Any, names: Names) -> RunSpan:
        return RunSpan(self, run, names)

    @contextmanager
    def restart(self, cell: Any, reason: str) -> Iterator[None]:
        state = cell.state
        names: Names = cell.names
        span = self.tracer.start_span(
            n.SPAN_RESTART,
            attributes={
                n.SCOPE: names.scope(state.ref),
                n.SCOPE_LEVEL: level(state.ref),
                n.REASON: names.error(reason),
                n.OLD_VERSION: state.version,
                n.DURABILITY: cell.durability,
            },
        )
        token = otel_context.attach(trace.set_span_in_context(span))
        try:
            yield
        except BaseException as exc:
            _failed(span, exc, names)
            raise
        finally:
            span.set_attribute(n.NEW_VERSION, cell.state.version)
            otel_context.detach(token)
            span.end()
            self.instruments.restarts.add(1, {n.SCOPE_LEVEL: level(state.ref)})

    def group_commit(self, size: int) -> None:
        span = _WORK.get()
        if span is not None:
            span.set_attribute(n.GROUP_COMMIT_SIZE, size)

    def store_transaction(self, size: int) -> None:
        self.instruments.store_transactions.add(1)
        self.instruments.commits_per_transaction.record(size)

    def backpressure(self, ref: Any) -> None:
        self.instruments.refusals.add(1, {n.SCOPE_LEVEL: level(ref)})

    def on_actor(self, parent: Context, work: Callable[[Any], T], cell: Any, message: Any) -> T:
        """Run ``work(message)`` on the actor's thread in a child span of ``parent``."""
        state = cell.state
        names: Names = cell.names
        prepare = message.__class__ is PrepareRequest
        attributes: dict[str, Any] = {
            n.SCOPE: names.scope(state.ref),
            n.SCOPE_LEVEL: level(state.ref),
            n.OLD_VERSION: state.version,
            n.DURABILITY: cell.durability,
        }
        if message.run_id is not None:
            attributes[n.RUN_ID] = names.text(message.run_id)
        transitions = message.transitions
        if transitions is not None:  # a transact's participant learns its part later
            attributes[n.TRANSITION_COUNT] = len(transitions)
            attributes[n.TRANSITION_TYPES] = _types(transitions)
        span = self.tracer.start_span(
            n.SPAN_PREPARE if prepare else n.SPAN_COMMIT, context=parent, attributes=attributes
        )
        token = otel_context.attach(trace.set_span_in_context(span, parent))
        work_token = _WORK.set(span)
        try:
            result = work(message)
        except BaseException as exc:
            _failed(span, exc, names)
            raise
        else:
            if prepare:
                outcome = message.txn.state
                span.set_attribute(n.OUTCOME, "rejected" if outcome == "pending" else outcome)
                span.set_attribute(n.NEW_VERSION, cell.state.version)
            elif isinstance(result, StateChanged):
                _committed(span, result)
            return result
        finally:
            _WORK.reset(work_token)
            otel_context.detach(token)
            span.end()
