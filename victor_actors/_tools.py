"""Tool requests as a transactional outbox.

An EXECUTE_TOOL transition is stored with the rest of its batch as a pending
request with an idempotency key (its request id): it commits, and becomes
durable, exactly when the batch does. Only after the commit does the
dispatcher hand it to the executor registered for the tool, with a deadline.
The outcome comes back as a TOOL_RESULT transition in the same scope, which
clears the pending request; a tool that raises or runs past its deadline
yields a TOOL_RESULT carrying the error. A TOOL_RESULT for a request that is
no longer pending is refused by the reducer, so a result is applied at most
once.

With a durable store, pending requests survive a restart. When a scope with
pending requests is restored, each is dispatched again with the same
idempotency key and ``redelivery=True`` (executors that have side effects use
the key to avoid doing them twice), or, if no executor is registered for it,
reported in ``manager.tools.unhandled``. A request is never lost and never
run twice silently.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import attrs

from victor_actors import _trace
from victor_actors._context import RUN_ID
from victor_actors._errors import VictorActorsError
from victor_actors._kernel import Kernel
from victor_actors._model import ScopeRef, TransitionBatch
from victor_actors._runs import CURRENT_RUN, Run
from victor_actors._trace import Carrier
from victor_actors._values import freeze, thaw

__all__ = ["ToolCall", "ToolDispatcher"]

logger = logging.getLogger("victor_actors")


@attrs.frozen(slots=True)
class ToolCall:
    """What an executor receives: the request and where it came from."""

    request_id: str  # the idempotency key
    tool_name: str
    arguments: dict[str, Any]
    scope: ScopeRef
    redelivery: bool = False  # dispatched again after a restart: it may have run before
    run_id: str | None = None  # the run whose commit requested it, if any


@attrs.frozen(slots=True)
class _Tool:
    fn: Callable[..., Any]
    timeout: float
    is_async: bool


class ToolDispatcher:
    """Runs registered tool executors for committed EXECUTE_TOOL requests.

    ``manager.tools`` is this dispatcher: ``wait_idle()`` / ``await_idle()``
    wait for running executors, ``unhandled`` lists redelivered requests no
    executor is registered for, and the counters ``dispatched``,
    ``redelivered`` and ``failed`` say what it did. ``apply_result(ref,
    batch)`` applies a result batch to a scope (as the run that requested it,
    when it is still going); ``pending(ref)`` reads a scope's pending requests.
    """

    def __init__(
        self,
        kernel: Kernel,
        apply_result: Callable[[ScopeRef, TransitionBatch], object],
        pending: Callable[[ScopeRef], Mapping[str, Any]],
        *,
        workers: int = 8,
    ) -> None:
        self._kernel = kernel
        self._apply_result = apply_result
        self._pending = pending
        self._tools: dict[str, _Tool] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._calls: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._workers = workers
        self._here = threading.local()
        self._lock = threading.Lock()
        self._inflight: set[tuple[ScopeRef, str]] = set()
        self._idle = threading.Condition(self._lock)
        self._unhandled: dict[tuple[ScopeRef, str], str] = {}
        self.dispatched = 0
        self.redelivered = 0
        self.failed = 0

    @property
    def unhandled(self) -> list[tuple[ScopeRef, str, str]]:
        """Redelivered requests with no executor registered: (scope, request id, tool), once each."""
        with self._lock:
            return [(ref, rid, name) for (ref, rid), name in self._unhandled.items()]

    def register(self, name: str, fn: Callable[..., Any], *, timeout: float = 30.0) -> None:
        """Run ``fn(call: ToolCall)`` (sync or ``async``) for requests to tool ``name``."""
        if not callable(fn):
            raise TypeError("a tool executor must be callable")
        if not timeout > 0:
            raise ValueError("a tool's timeout must be positive")
        self._tools[name] = _Tool(fn, float(timeout), inspect.iscoroutinefunction(fn))

    def dispatch(
        self, ref: ScopeRef, requests: tuple[Any, ...], *, redelivery: bool = False, run_id: str | None = None
    ) -> None:
        """Hand committed requests to their executors (called after the commit is published)."""
        hooks = _trace.hooks  # traced: executors run in the committing request's context
        trace = None if hooks is None else hooks.capture()
        for request in requests:
            name = request["tool_name"]
            tool = self._tools.get(name)
            if tool is None:
                if redelivery:
                    with self._lock:
                        self._unhandled[(ref, request["request_id"])] = name
                continue
            key = (ref, request["request_id"])
            with self._lock:
                self._unhandled.pop(key, None)
                if key in self._inflight:
                    continue
                if redelivery and not self._still_pending(ref, request["request_id"]):
                    continue  # answered between the caller's read and now: never run it twice
                self._inflight.add(key)
                self.dispatched += 1
                if redelivery:
                    self.redelivered += 1
            call = ToolCall(request["request_id"], name, thaw(request["arguments"]), ref, redelivery, run_id)
            self._executor().submit(self._run, tool, call, trace)

    def _still_pending(self, ref: ScopeRef, request_id: str) -> bool:
        # A result is published before its request leaves _inflight, so under our lock a
        # request that is neither in flight nor pending in the scope's current state is done.
        try:
            return request_id in self._pending(ref)
        except VictorActorsError:
            return False

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="victor-actors-tool")
                self._calls = ThreadPoolExecutor(self._workers, thread_name_prefix="victor-actors-call")
            return self._pool

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="victor-actors-tools-loop", daemon=True
                )
                thread.start()
                self._loop, self._loop_thread = loop, thread
            return self._loop

    def _run(self, tool: _Tool, call: ToolCall, trace: Carrier | None = None) -> None:
        result: Any = None
        error: str | None = None
        started = time.monotonic()
        fn = tool.fn if trace is None else trace.tool(tool.fn, call, tool.is_async)
        apply_result = self._apply_result if trace is None else trace.bind(self._apply_result)
        try:
            future: Any
            if tool.is_async:
                future = asyncio.run_coroutine_threadsafe(fn(call), self._event_loop())
            else:
                assert self._calls is not None
                future = self._calls.submit(self._call, fn, call)
            try:
                result = future.result(timeout=tool.timeout)
            except (FutureTimeout, TimeoutError):
                future.cancel()
                error = f"TimeoutError: {call.tool_name} did not finish within {tool.timeout} s"
        except BaseException as exc:
            error = f"{type(exc).__name__}: {exc}"
        if error is not None:
            with self._lock:
                self.failed += 1
            logger.info(
                "tool %s (%s) failed after %.3f s: %s",
                call.tool_name,
                call.request_id,
                time.monotonic() - started,
                error,
            )
        # A result for a run that is still going belongs to that run (and goes if it rolls back).
        run = None if call.run_id is None else self._kernel.runs.get(call.run_id)
        tokens = None if not isinstance(run, Run) else (CURRENT_RUN.set(run), RUN_ID.set(run.id))
        try:
            batch = TransitionBatch().tool_result(
                call.tool_name, _storable(result), request_id=call.request_id, error=error
            )
            apply_result(call.scope, batch)
        except VictorActorsError as exc:
            # rolled back, answered by someone else, scope closed or the manager closing: nothing to record
            logger.info("result of %s (%s) not recorded: %s", call.tool_name, call.request_id, exc)
        finally:
            if tokens is not None:
                CURRENT_RUN.reset(tokens[0])
                RUN_ID.reset(tokens[1])
            with self._lock:
                self._inflight.discard((call.scope, call.request_id))
                self._idle.notify_all()

    def running_here(self) -> bool:
        """Whether the calling thread is running one of this dispatcher's executors."""
        return threading.current_thread() is self._loop_thread or getattr(self._here, "executor", False)

    def _call(self, fn: Callable[..., Any], call: ToolCall) -> Any:
        self._here.executor = True
        try:
            return fn(call)
        finally:
            self._here.executor = False

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Wait until no dispatched request is still running; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._inflight:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._idle.wait(remaining)
        return True

    async def await_idle(self, timeout: float = 10.0) -> bool:
        """The asyncio twin of :meth:`wait_idle`."""
        return await asyncio.to_thread(self.wait_idle, timeout)

    def close(self) -> None:
        with self._lock:
            pool, calls, loop, thread = self._pool, self._calls, self._loop, self._loop_thread
            self._pool = self._calls = None
            self._loop = self._loop_thread = None
        for executor in (pool, calls):
            if executor is not None:
                executor.shutdown(wait=False, cancel_futures=True)
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=2.0)
                if not thread.is_alive():
                    loop.close()  # a stopped loop left open warns when it is collected


def _storable(value: Any) -> Any:
    """Tool results are stored; anything that cannot be becomes its repr, with a note."""
    try:
        return freeze(value)
    except VictorActorsError:
        return {"unstorable_result": repr(value)}
