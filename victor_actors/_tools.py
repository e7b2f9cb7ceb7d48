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

A request whose tool has no executor (a misspelt name, an executor not
registered yet) is not run and not answered: it stays pending, is listed in
``manager.tools.unhandled`` and is logged once per tool name at WARNING.
Registering an executor for that name later dispatches the listed requests.

Closing the manager cancels the tool work in flight: ``async`` executors are
cancelled on the tools' event loop, a sync executor's thread is abandoned
(it is a daemon thread: it cannot hold the process's exit), and no result is
recorded for either, so their requests stay pending and are redelivered
after a reopen. Close returns within about a second and prints nothing.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import functools
import inspect
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from victor_actors import _clock, _trace
from victor_actors._context import RUN_ID
from victor_actors._errors import VictorActorsError
from victor_actors._kernel import Kernel
from victor_actors._model import ScopeRef, TransitionBatch
from victor_actors._runs import CURRENT_RUN, Run
from victor_actors._threads import Workers
from victor_actors._trace import Carrier
from victor_actors._values import freeze, thaw

__all__ = ["ToolCall", "ToolDispatcher"]

logger = logging.getLogger("victor_actors")

CANCEL_GRACE = 1.0  # seconds close gives cancelled async executors to finish their cleanup


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


@attrs.frozen(slots=True)
class _Unhandled:
    name: str
    request: Any
    redelivery: bool
    run_id: str | None


class _Closing(Exception):
    """The dispatcher closed while a call was in flight: record nothing, leave the request pending."""


class ToolDispatcher:
    """Runs registered tool executors for committed EXECUTE_TOOL requests.

    ``manager.tools`` is this dispatcher: ``wait_idle()`` / ``await_idle()``
    wait for running executors, ``unhandled`` lists pending requests no
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
        self._pool: Workers | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._workers = workers
        self._here = threading.local()
        self._lock = threading.Lock()
        self._inflight: set[tuple[ScopeRef, str]] = set()
        # with hold(True) (a deterministic simulation): each scope's dispatched calls, in commit order,
        # waiting for run_held; they are in _inflight too (never dispatched twice) but not waited for
        self._held: dict[ScopeRef, collections.deque[tuple[ToolCall, Callable[[], None]]]] | None = None
        self._held_count = 0
        self._idle = threading.Condition(self._lock)
        self._unhandled: dict[tuple[ScopeRef, str], _Unhandled] = {}
        self._warned: set[str] = set()  # tool names already logged as having no executor
        self._closed = False
        self._closing: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.dispatched = 0
        self.redelivered = 0
        self.failed = 0

    @property
    def unhandled(self) -> list[tuple[ScopeRef, str, str]]:
        """Pending requests whose tool has no executor registered: (scope, request id, tool), once each.

        Both new requests and requests redelivered after a restart; an entry
        leaves the list when its request is dispatched (see :meth:`register`).
        """
        with self._lock:
            return [(ref, rid, u.name) for (ref, rid), u in self._unhandled.items()]

    def register(self, name: str, fn: Callable[..., Any], *, timeout: float = 30.0) -> None:
        """Run ``fn(call: ToolCall)`` (sync or ``async``) for requests to tool ``name``.

        Requests to ``name`` already listed in :attr:`unhandled` are
        dispatched now, if they are still pending.
        """
        if not callable(fn):
            raise TypeError("a tool executor must be callable")
        if not timeout > 0:
            raise ValueError("a tool's timeout must be positive")
        with self._lock:
            self._tools[name] = _Tool(fn, float(timeout), inspect.iscoroutinefunction(fn))
            waiting = [(key, u) for key, u in self._unhandled.items() if u.name == name]
        for (ref, rid), u in waiting:
            # Read the scope outside our lock (reading may restore it, and a restore dispatches its
            # pending requests through this dispatcher); a request answered by hand in between is
            # run once more at worst, and its result refused: a result is applied at most once.
            if not self._still_pending(ref, rid):
                with self._lock:
                    self._unhandled.pop((ref, rid), None)
                continue
            self._dispatch(
                ref, (u.request,), redelivery=u.redelivery, run_id=u.run_id, checked=False, listed=True
            )

    def dispatch(
        self, ref: ScopeRef, requests: tuple[Any, ...], *, redelivery: bool = False, run_id: str | None = None
    ) -> None:
        """Hand committed requests to their executors (called after the commit is published)."""
        self._dispatch(ref, requests, redelivery=redelivery, run_id=run_id, checked=redelivery)

    def _dispatch(
        self,
        ref: ScopeRef,
        requests: tuple[Any, ...],
        *,
        redelivery: bool,
        run_id: str | None,
        checked: bool,
        listed: bool = False,
    ) -> None:
        hooks = _trace.hooks  # traced: executors run in the committing request's context
        trace = None if hooks is None else hooks.capture(self._kernel.names)
        for request in requests:
            name = request["tool_name"]
            key = (ref, request["request_id"])
            with self._lock:
                if self._closed:
                    return  # the manager is closing: the request stays pending for a reopen
                tool = self._tools.get(name)
                if tool is None:
                    self._unhandled.setdefault(key, _Unhandled(name, request, redelivery, run_id))
                    warn = name not in self._warned
                    self._warned.add(name)
                else:
                    if self._unhandled.pop(key, None) is None and listed:
                        continue  # dispatched meanwhile (its scope was restored, or resumed)
                    if key in self._inflight:
                        continue
                    if checked and not self._still_pending(ref, request["request_id"]):
                        continue  # answered between the caller's read and now: never run it twice
                    self._inflight.add(key)
                    self.dispatched += 1
                    if redelivery:
                        self.redelivered += 1
            if tool is None:
                if warn:
                    logger.warning(
                        "tool request %s in %s names tool %r, which has no executor registered: it stays "
                        "pending and is listed in manager.tools.unhandled (register_tool(%r, fn) runs it); "
                        "further requests to %r are listed there without this warning",
                        request["request_id"],
                        ref,
                        name,
                        name,
                        name,
                    )
                continue
            call = ToolCall(request["request_id"], name, thaw(request["arguments"]), ref, redelivery, run_id)
            job = functools.partial(self._run, tool, call, trace)
            with self._lock:
                if self._held is not None:
                    self._held.setdefault(ref, collections.deque()).append((call, job))
                    self._held_count += 1
                    continue
            self._executor().submit(job)

    # -- holding calls for a seeded scheduler ------------------------------------------------

    def hold(self, on: bool) -> None:
        """Hold dispatched calls until :meth:`run_held` runs them (``on``), or stop holding.

        A deterministic simulation holds them, so that which tool completes
        when is a choice of its seeded scheduler, not of the worker threads.
        Each scope's held calls keep their commit order. Stopping hands the
        calls still held to the workers, scope by scope in the order of their
        names. Held calls are not waited for by :meth:`wait_idle` (nor so by
        ``quiesce``): they wait for the scheduler, not for a thread.
        """
        with self._lock:
            if on:
                if self._held is None:
                    self._held = {}
                return
            held, self._held = self._held or {}, None
            self._held_count = 0
            jobs = [job for ref in sorted(held, key=str) for _, job in held[ref]]
        for job in jobs:
            self._executor().submit(job)

    def held(self) -> list[tuple[ScopeRef, str]]:
        """The scopes with held calls, by name, each with the tool name of its next one."""
        with self._lock:
            return sorted(
                ((ref, q[0][0].tool_name) for ref, q in (self._held or {}).items() if q),
                key=lambda h: str(h[0]),
            )

    def run_held(self, ref: ScopeRef) -> ToolCall:
        """Run ``ref``'s oldest held call on the calling thread, its result recorded before it returns.

        Raises:
            ValueError: ``ref`` has no held call (nothing was run).
        """
        with self._lock:
            held = self._held or {}
            queue = held.get(ref)
            if not queue:
                raise ValueError(f"no tool call of {ref} is held; nothing was run")
            call, job = queue.popleft()
            if not queue:
                del held[ref]
            self._held_count -= 1
        job()
        return call

    def _still_pending(self, ref: ScopeRef, request_id: str) -> bool:
        # A result is published before its request leaves _inflight, so under our lock a
        # request that is neither in flight nor pending in the scope's current state is done.
        try:
            return request_id in self._pending(ref)
        except VictorActorsError:
            return False

    def _executor(self) -> Workers:
        with self._lock:
            if self._pool is None:
                self._pool = Workers(self._workers, "victor-actors-tool")
            return self._pool

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._closed:
                raise _Closing()
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="victor-actors-tools-loop", daemon=True
                )
                thread.start()
                self._loop, self._loop_thread = loop, thread
            return self._loop

    def _call_in_thread(self, fn: Callable[..., Any], call: ToolCall) -> concurrent.futures.Future[Any]:
        """Run a sync executor on a daemon thread of its own; its outcome in the future returned."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def work() -> None:
            if not future.set_running_or_notify_cancel():
                return
            self._here.executor = True
            try:
                future.set_result(fn(call))
            except BaseException as exc:
                future.set_exception(exc)

        threading.Thread(target=work, name="victor-actors-call", daemon=True).start()
        return future

    def _outcome(self, tool: _Tool, fn: Callable[..., Any], call: ToolCall) -> tuple[Any, str | None]:
        """The executor's (result, error); raises :class:`_Closing` if the dispatcher closes first."""
        future: concurrent.futures.Future[Any]
        if tool.is_async:
            future = asyncio.run_coroutine_threadsafe(fn(call), self._event_loop())
        else:
            future = self._call_in_thread(fn, call)
        done, _ = concurrent.futures.wait(
            (future, self._closing), timeout=tool.timeout, return_when=concurrent.futures.FIRST_COMPLETED
        )
        if future not in done:
            with self._lock:  # close() cancels what is left itself, and then closes the loop
                if self._closed:
                    raise _Closing()
                future.cancel()  # an async executor is cancelled; a thread cannot be, and is left to finish
            return None, f"TimeoutError: {call.tool_name} did not finish within {tool.timeout} s"
        if future.cancelled():
            if self._closing.done():
                raise _Closing()  # cancelled by close
            return None, f"CancelledError: {call.tool_name} was cancelled"
        exc = future.exception()
        if exc is not None:
            return None, f"{type(exc).__name__}: {exc}"
        return future.result(), None

    def _run(self, tool: _Tool, call: ToolCall, trace: Carrier | None = None) -> None:
        started = time.monotonic()
        fn = tool.fn if trace is None else trace.tool(tool.fn, call, tool.is_async)
        apply_result = self._apply_result if trace is None else trace.bind(self._apply_result)
        try:
            try:
                result, error = self._outcome(tool, fn, call)
            except _Closing:
                logger.debug("tool %s (%s) left pending: the manager closed", call.tool_name, call.request_id)
                return
            except BaseException as exc:
                result, error = None, f"{type(exc).__name__}: {exc}"
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
            self._record(apply_result, call, result, error)
        finally:
            with self._lock:
                self._inflight.discard((call.scope, call.request_id))
                self._idle.notify_all()

    def _record(
        self,
        apply_result: Callable[[ScopeRef, TransitionBatch], object],
        call: ToolCall,
        result: Any,
        error: str | None,
    ) -> None:
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

    def running_here(self) -> bool:
        """Whether the calling thread is running one of this dispatcher's executors."""
        return threading.current_thread() is self._loop_thread or getattr(self._here, "executor", False)

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Wait until no dispatched request is still running; False on timeout.

        Requests listed in :attr:`unhandled` are not running: they do not
        keep this waiting.
        """
        left = _clock.timer(_clock.monotonic() + timeout)
        with self._lock:
            while len(self._inflight) > self._held_count:
                remaining = left()
                if remaining <= 0:
                    return False
                self._idle.wait(remaining)
        return True

    async def await_idle(self, timeout: float = 10.0) -> bool:
        """The asyncio twin of :meth:`wait_idle`."""
        return await asyncio.to_thread(self.wait_idle, timeout)

    def close(self) -> None:
        """Cancel the tool work in flight and stop the dispatcher's threads; record no result.

        Requests in flight stay pending (a durable store redelivers them after
        a reopen). Returns within about ``CANCEL_GRACE`` + 1 seconds.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pool, loop, thread = self._pool, self._loop, self._loop_thread
            for queue in (self._held or {}).values():  # never run: they stay pending for a reopen
                self._inflight.difference_update((call.scope, call.request_id) for call, _ in queue)
            self._held, self._held_count = None, 0
            self._pool = None
            self._loop = self._loop_thread = None
        self._closing.set_result(None)  # wakes every _run still waiting for its executor
        if not self.running_here():
            end = time.monotonic() + 1.0
            with self._lock:  # they leave at once, recording nothing
                while self._inflight and (left := end - time.monotonic()) > 0:
                    self._idle.wait(left)
        if pool is not None:
            pool.close()
        if loop is None:
            return
        asyncio.run_coroutine_threadsafe(_cancel_all_and_stop(), loop)
        if thread is None or thread is threading.current_thread():
            return  # close called by an async executor: the loop stops once this task is done
        thread.join(timeout=CANCEL_GRACE + 1.0)
        if thread.is_alive() or asyncio.all_tasks(loop):
            _abandoned.append(loop)  # a task that would not end: never collected, so never reported
        else:
            loop.close()  # a stopped loop left open warns when it is collected


_abandoned: list[asyncio.AbstractEventLoop] = []


async def _cancel_all_and_stop() -> None:
    """Cancel every other task on this loop, give them CANCEL_GRACE seconds to end, stop the loop."""
    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not me]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=CANCEL_GRACE)
    asyncio.get_running_loop().stop()


def _storable(value: Any) -> Any:
    """Tool results are stored; anything that cannot be becomes its repr, with a note."""
    try:
        return freeze(value)
    except VictorActorsError:
        return {"unstorable_result": repr(value)}
