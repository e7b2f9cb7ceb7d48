"""The client's engine: one event loop, a lane per owner, retries, events and tool calls by long poll.

Every request goes to its owner through that owner's *lane*, a coroutine on
the client's private event loop (thread ``victor-actors-client``). A lane
keeps at most :data:`IN_FLIGHT` calls outstanding; requests that arrive
meanwhile wait and leave together in the next call (up to
:data:`MAX_OPS`). A lone caller pays one call per request; a thousand
callers share a call per few hundred microseconds.

A call whose owner could not be reached (the connection dropped, the owner
restarting) is sent again once the owner is back, each write marked as a
retry so the owner applies it at most once (by batch id); when the
request's deadline passes first, it fails with
:class:`OwnerUnavailableError`, which says whether it may have been
applied. Long polls (events, tool calls) bypass the lanes: they wait at the
owner and must never hold a lane's slot.

A client made before ``os.fork()`` (gunicorn ``--preload``) starts its loop
and its connections afresh in the child on first use: threads and sockets
do not survive a fork, and two processes must never share one connection.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import itertools
import os
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any, TypeVar

from victor_actors._errors import (
    DeadlineExceededError,
    OwnerUnavailableError,
    RuntimeClosedError,
    ScopeFailedError,
    VictorActorsError,
)
from victor_actors._model import ScopeRef
from victor_actors._state import StateChanged
from victor_actors._tools import ToolCall
from victor_actors._values import thaw
from victor_actors.remote import _wire as w
from victor_actors.remote._transport import Transport

T = TypeVar("T")

__all__ = ["IN_FLIGHT", "MAX_OPS", "RETRY_PAUSE", "Client", "Subscription", "batch_id"]

IN_FLIGHT = 2  # calls outstanding per owner
MAX_OPS = 1000  # operations per call
RETRY_PAUSE = 0.2  # seconds between attempts to reach an owner that went away
BYE_WAIT = 2.0  # seconds a closing client gives each owner to hear that its tools are gone
WRITES = frozenset({"apply", "commit", "restore", "checkpoint", "compact", "rollback", "fork", "run_end"})
NOT_RETRIED = frozenset({"fork"})  # not idempotent: a second attempt would find the first one's fork

_clients: weakref.WeakSet[Client] = weakref.WeakSet()
# What forked children inherited from their parent's clients: held, never finalized (see _after_fork)
_INHERITED: list[Any] = []
_Pairs = list[tuple[asyncio.Future[Any], asyncio.Future[Any]]]  # (the client's future, the caller's)
_batch_prefix = os.urandom(10).hex()  # this process's own; a forked child draws another
_batch_seq = itertools.count(1)


def batch_id() -> str:
    """A new id for a batch, unique among every process's (a random per-process prefix and a count).

    Cheaper than ``uuid4()``, which asks the kernel for randomness on every request.
    """
    return f"{_batch_prefix}{next(_batch_seq):x}"


Outcome = Callable[["bool | None", Any], None]  # (committed: True, False or unknown; the reply's value)


class _Item:
    __slots__ = ("attempts", "deadline", "future", "op", "outcome", "reached")

    def __init__(
        self, op: dict[str, Any], deadline: float, future: asyncio.Future[Any], outcome: Outcome | None
    ) -> None:
        self.op = op
        self.deadline = deadline
        self.future = future
        self.attempts = 0
        self.reached = False  # some attempt may have reached the owner
        self.outcome = outcome  # told how the request ended, however late (a driver-side run's write)

    def settle(self, committed: bool | None, value: Any = None) -> None:
        if self.outcome is not None:
            outcome, self.outcome = self.outcome, None
            outcome(committed, value)


class _Queue:
    """Requests waiting for one of a lane's call streams, and that stream's calls in flight."""

    __slots__ = ("inflight", "items")

    def __init__(self) -> None:
        self.items: list[_Item] = []
        self.inflight = 0


class Lane:
    """One owner's queues and their outstanding calls (runs on the client's loop).

    Requests share calls in the lane's main stream, except the client's
    ``GROUPED`` kinds: each group has a stream of its own (its own queue and
    its own calls in flight), so that a group whose requests may wait at the
    owner (a 2PC prepare, for a hold) never delays the others, and requests
    that must never wait behind them (a 2PC commit, which releases a hold)
    never queue behind them.
    """

    def __init__(self, client: Client, index: int, transport: Transport) -> None:
        self.client = client
        self.index = index
        self.transport = transport
        self.main = _Queue()
        self.groups: dict[str, _Queue] = {}
        self.calls = 0

    def submit(self, item: _Item) -> None:
        kind = item.op["k"]
        if kind in self.client.BYPASS:
            # a step that may wait at the owner never takes a slot: a call of its own
            self.client._loop.create_task(self._send([item], None))
            return
        group = self.client.GROUPED.get(kind)
        q = self.main if group is None else self.groups.setdefault(group, _Queue())
        q.items.append(item)
        self._pump(q)

    def _pump(self, q: _Queue) -> None:
        loop = self.client._loop
        while q.items and q.inflight < IN_FLIGHT:
            batch, q.items = q.items[:MAX_OPS], q.items[MAX_OPS:]
            q.inflight += 1
            loop.create_task(self._send(batch, q))

    async def _send(self, batch: list[_Item], q: _Queue | None) -> None:
        try:
            live = []
            for item in batch:
                if item.future.done():  # its deadline passed while it waited: it is not sent (again)
                    item.settle(None if item.reached else False)
                    continue
                item.attempts += 1
                live.append(item)
            if not live:
                return
            batch = live
            payload = w.encode({"ops": tuple(i.op for i in batch)})
            self.calls += 1
            try:
                raw = await self.transport.call(payload)
            except self.transport.unreachable as exc:
                self._retry(batch, exc)
                return
            except VictorActorsError as exc:  # a typed refusal at the door (a wrong token)
                for item in batch:
                    item.settle(False)
                    if not item.future.done():
                        item.future.set_exception(exc)
                return
            except Exception as exc:
                for item in batch:
                    item.settle(None)
                    if not item.future.done():
                        item.future.set_exception(
                            ScopeFailedError(
                                f"{self.transport.where} failed the call: {type(exc).__name__}: {exc}"
                            )
                        )
                return
            where = self.transport.where
            try:
                reply = w.decode(raw)
                if "e" in reply:
                    err = w.error_from(reply["e"], where)
                    for item in batch:
                        item.settle(False)
                        if not item.future.done():
                            item.future.set_exception(err)
                    return
                results = reply["r"]
                if len(results) != len(batch):
                    raise ScopeFailedError(f"{where} answered {len(results)} of {len(batch)} operations")
            except (VictorActorsError, KeyError, TypeError) as exc:
                for item in batch:
                    item.settle(None)
                    if not item.future.done():
                        item.future.set_exception(
                            ScopeFailedError(f"{where} sent an unreadable reply: {exc}")
                        )
                return
            for item, (ok, value) in zip(batch, results, strict=True):
                item.settle(bool(ok), value if ok else None)  # first: a run learns before its caller
                if item.future.done():
                    continue
                if ok:
                    item.future.set_result(value)
                else:
                    item.future.set_exception(w.error_from(value, where))
        finally:
            if q is not None:
                q.inflight -= 1
                self._pump(q)

    def _retry(self, batch: list[_Item], exc: BaseException) -> None:
        client = self.client
        now = time.monotonic()
        again = []
        sent = getattr(exc, "sent", True)  # a transport that cannot tell: it may have arrived
        for item in batch:
            item.reached = item.reached or sent
            if item.future.done():  # its caller stopped waiting: not sent again
                item.settle(None if item.reached else False)
                continue
            write = item.op["k"] in client.WRITES
            if now + RETRY_PAUSE >= item.deadline or client.closed or (write and item.op["k"] in NOT_RETRIED):
                item.settle(None if item.reached else False)
                item.future.set_exception(
                    client._unavailable(
                        self.index,
                        f"{self.transport.where} could not be reached before the request's deadline "
                        f"({exc}); "
                        + (
                            "the request may have been applied (retry it: retries apply at most once)"
                            if write and item.reached
                            else "nothing was applied"
                        ),
                        may_have_applied=write and item.reached,
                    )
                )
                continue
            if item.op["k"] in client.LOOKUP:
                item.op["rt"] = True  # the first attempt's outcome is unknown: look it up first
            again.append(item)
        client.counters["retries"] += len(again)
        if again:

            def resend() -> None:
                for i in again:
                    self.submit(i)

            client._loop.call_later(RETRY_PAUSE, resend)


class Subscription:
    """A client-side subscription to one scope's commits; ``close()`` ends it."""

    def __init__(self, client: Client, ref: ScopeRef, owner: int, callback: Callable[..., object]):
        self.ref = ref
        self.owner = owner
        self._callback = callback
        self._client = client
        self.closed = False
        self.delivered = 0  # the last version delivered

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._client._unsubscribe(self)


class Client:
    """The engine under :class:`RemoteStateManager` (one owner) and the Ray manager (one per shard).

    Subclasses give the transports and may override :meth:`_unavailable`
    (the error for an owner that could not be reached), ``BYPASS`` (the
    operations that never wait in a lane), ``GROUPED`` (operations that share
    calls in a stream of their own, see :class:`Lane`), ``WRITES`` (the operations whose
    lost reply means "may have been applied") and ``LOOKUP`` (the writes a
    retry marks ``rt``, so the owner looks the first attempt up first).
    """

    BYPASS: frozenset[str] = frozenset()
    GROUPED: Mapping[str, str] = {}  # operation kind -> the lane stream of its own it shares calls in
    WRITES: frozenset[str] = WRITES  # operations that may change state (a lost reply: maybe applied)
    LOOKUP: frozenset[str] = frozenset({"apply"})  # retried as "look the first attempt up first"

    def __init__(self, transports: Callable[[], list[Transport]], request_timeout: float) -> None:
        self._make_transports = transports
        self.request_timeout = request_timeout
        self.closed = False
        self.client_id = uuid.uuid4().hex
        self.counters: dict[str, int] = {"retries": 0}
        self._subs: dict[int, list[Subscription]] = {}
        self._tools: dict[str, tuple[Callable[..., Any], float]] = {}
        self._start()
        _clients.add(self)

    def _start(self) -> None:
        """The loop thread, the transports and the delivery thread (again in a forked child)."""
        self._pid = os.getpid()
        self._transports = self._make_transports()
        self._events: list[tuple[Subscription, StateChanged]] = []
        self._events_cv = threading.Condition()
        self._loop = asyncio.new_event_loop()
        # requests handed over from callers' loops and replies handed back: one wake-up per burst
        self._inbox: collections.deque[Callable[[], None]] = collections.deque()
        self._inbox_armed = False
        self._replies: dict[asyncio.AbstractEventLoop, _Pairs] = {}
        started = threading.Event()
        self._thread = threading.Thread(
            target=self._run_loop, args=(started,), name="victor-actors-client", daemon=True
        )
        self._thread.start()
        started.wait()
        self._lanes = [Lane(self, n, t) for n, t in enumerate(self._transports)]
        self._pollers: dict[int, concurrent.futures.Future[None]] = {}
        self._tool_pollers: dict[int, concurrent.futures.Future[None]] = {}
        self._delivery = threading.Thread(target=self._deliver, name="victor-actors-events", daemon=True)
        self._delivery.start()
        if self._tools:
            self._start_tool_pollers()
        for owner in list(self._subs):
            self._start_poller(owner)

    def _after_fork(self) -> None:
        """In a forked child: nothing of the parent's loop or connections is usable; start afresh.

        The parent's loop, transports and lanes are kept referenced, never
        closed or collected here: the child shares their file descriptions
        with the parent (the loop's epoll instance, its self-pipe, the
        sockets), and closing the loop in the child would remove the self-pipe
        from the epoll set the parent still waits on, so the parent's loop
        would never wake again.
        """
        _INHERITED.append((self._loop, self._transports, self._lanes, self._thread, self._delivery))
        self._start()

    def _run_loop(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(started.set)
        self._loop.run_forever()

    # -- plumbing ---------------------------------------------------------------

    def _check(self) -> None:
        if self._pid < 0:
            self._after_fork()
        if self.closed:
            raise RuntimeClosedError(f"{type(self).__name__} was closed; nothing was applied")

    def _sync(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._pid < 0:
            self._after_fork()
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError(f"a {type(self).__name__}'s sync methods cannot run on its own event loop")
        return asyncio.run_coroutine_threadsafe(self._guard(coro), self._loop).result()

    async def _guard(self, coro: Coroutine[Any, Any, T]) -> T:
        return await coro

    async def _on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the client's loop, from whatever loop the caller is on."""
        if self._pid < 0:
            self._after_fork()
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._guard(coro), self._loop))

    def _unavailable(self, owner: int, message: str, *, may_have_applied: bool) -> VictorActorsError:
        return OwnerUnavailableError(message, may_have_applied=may_have_applied)

    async def _ask(
        self, owner: int, op: dict[str, Any], timeout: float | None, outcome: Outcome | None = None
    ) -> Any:
        """Send ``op`` to ``owner`` through its lane and return the reply's value (or raise its error).

        ``outcome(committed, value)`` is told how the request ended, however late, whether or not
        the caller still waits: True with the reply's value, False (refused, or never sent) or None
        (unknown: sent to an owner that went away, or unanswered).
        """
        self._check()
        wait = self.request_timeout if timeout is None else timeout
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop or running is None:
            return await self._submit(owner, op, wait, outcome)
        # From the caller's own loop: hand the request to the client's loop and get the answer back,
        # no task and no wait_for on the hot path; the requests a caller's loop sends in one burst
        # wake the client's loop once, and the replies that arrive together wake the caller's once
        # (a self-pipe write and a thread wake-up each, dearer than the rest of the hand-over).
        answer: asyncio.Future[Any] = running.create_future()

        def deliver(src: asyncio.Future[Any]) -> None:  # on the client's loop
            pending = self._replies.get(running)
            if pending is None:
                self._replies[running] = [(src, answer)]
                if len(self._replies) == 1:
                    self._loop.call_soon(self._send_replies)
            else:
                pending.append((src, answer))

        def submit() -> None:
            self._submit(owner, op, wait, outcome).add_done_callback(deliver)

        self._post(submit)
        return await answer

    def _post(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the client's loop (from any thread); a burst of posts wakes the loop once."""
        self._inbox.append(fn)
        if not self._inbox_armed:
            self._inbox_armed = True
            try:
                self._loop.call_soon_threadsafe(self._take_inbox)
            except RuntimeError:
                self._inbox_armed = False
                raise

    def _take_inbox(self) -> None:  # on the client's loop
        self._inbox_armed = False  # first: a post from now on wakes the loop again
        inbox = self._inbox
        while inbox:
            fn = inbox.popleft()
            try:
                fn()
            except Exception as exc:  # as the loop would have treated a callback of its own
                self._loop.call_exception_handler({"message": "a client request failed", "exception": exc})

    def _send_replies(self) -> None:  # on the client's loop
        replies, self._replies = self._replies, {}
        for loop, pairs in replies.items():
            try:
                loop.call_soon_threadsafe(_copy_outcomes, pairs)
            except RuntimeError:  # the caller's loop is closed: nobody waits any more
                pass

    def _submit(
        self, owner: int, op: dict[str, Any], wait: float, outcome: Outcome | None = None
    ) -> asyncio.Future[Any]:
        """Queue ``op`` on its lane (on the client's loop); the future fails at the deadline if unanswered."""
        future: asyncio.Future[Any] = self._loop.create_future()
        op.setdefault("to", wait)
        self._lanes[owner].submit(_Item(op, time.monotonic() + wait, future, outcome))
        timer = self._loop.call_later(wait + RETRY_PAUSE * 2, _expire, future, self._lanes[owner], wait)
        future.add_done_callback(lambda _f: timer.cancel())
        return future

    async def _ask_here(self, owner: int, op: dict[str, Any], wait: float) -> Any:
        return await self._submit(owner, op, wait)

    async def _direct(self, owner: int, op: dict[str, Any]) -> Any:
        """One operation in a call of its own, outside the lanes (long polls); raises as received."""
        transport = self._transports[owner]
        ok, value = w.decode(await transport.call(w.encode({"ops": (op,)})))["r"][0]
        if not ok:
            raise w.error_from(value, transport.where)
        return value

    # -- events ------------------------------------------------------------------------

    def _subscribe(
        self, ref: ScopeRef, owner: int, version: int, callback: Callable[..., object]
    ) -> Subscription:
        if not callable(callback):
            raise TypeError("subscribe takes a callable")
        self._check()
        sub = Subscription(self, ref, owner, callback)
        sub.delivered = version
        self._subs.setdefault(owner, []).append(sub)
        self._start_poller(owner)
        return sub

    def _start_poller(self, owner: int) -> None:
        if owner not in self._pollers:
            self._pollers[owner] = asyncio.run_coroutine_threadsafe(self._poll(owner), self._loop)

    def _unsubscribe(self, sub: Subscription) -> None:
        subs = self._subs.get(sub.owner, [])
        if sub in subs:
            subs.remove(sub)

    async def _poll(self, owner: int) -> None:
        while not self.closed:
            subs = [s for s in self._subs.get(owner, []) if not s.closed]
            if not subs:
                await asyncio.sleep(0.05)
                continue
            after: dict[str, int] = {}
            for s in subs:
                key = str(s.ref)
                after[key] = min(after.get(key, s.delivered), s.delivered)
            try:
                events = await self._direct(owner, {"k": "poll", "w": tuple(after.items()), "wait": 0.5})
            except Exception:
                await asyncio.sleep(RETRY_PAUSE)
                continue
            out = []
            for payload_event in events:
                record = w.record_from(payload_event)
                for s in subs:
                    if s.ref == record.ref and record.new_version > s.delivered and not s.closed:
                        s.delivered = record.new_version
                        out.append((s, record))
            if out:
                with self._events_cv:
                    self._events.extend(out)
                    self._events_cv.notify()

    def _deliver(self) -> None:
        while True:
            with self._events_cv:
                while not self._events and not self.closed:
                    self._events_cv.wait()
                if self.closed and not self._events:
                    return
                batch, self._events = self._events, []
            for sub, record in batch:
                if not sub.closed:
                    try:
                        sub._callback(record)
                    except Exception:
                        pass

    # -- tools ------------------------------------------------------------------------

    def _register_tool(self, name: str, fn: Callable[..., Any], timeout: float) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError("a tool name is a non-empty str")
        if not callable(fn):
            raise TypeError("a tool executor must be callable")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValueError("a tool's timeout must be a positive number of seconds")
        self._check()
        self._tools[name] = (fn, float(timeout))
        self._sync(self._register_tools())
        self._start_tool_pollers()

    def _start_tool_pollers(self) -> None:
        for owner in range(len(self._transports)):
            if owner not in self._tool_pollers:
                self._tool_pollers[owner] = asyncio.run_coroutine_threadsafe(
                    self._tool_poll(owner), self._loop
                )

    async def _register_tools(self, owners: Iterable[int] | None = None) -> None:
        table = tuple((n, t) for n, (_, t) in self._tools.items())
        targets = range(len(self._transports)) if owners is None else owners
        op = {"k": "tools", "t": table, "cid": self.client_id}
        await asyncio.gather(*(self._ask_here(n, dict(op), self.request_timeout) for n in targets))

    async def _tool_poll(self, owner: int) -> None:
        registered_with = self._instance(owner)
        while not self.closed:
            try:
                calls = await self._direct(owner, {"k": "tool_poll", "cid": self.client_id, "wait": 0.5})
                if self._instance(owner) != registered_with:  # a new owner: it must learn our tools
                    raise ConnectionResetError("the owner restarted")
            except Exception:  # the owner is away: once it is back, register again (it redelivers)
                await asyncio.sleep(RETRY_PAUSE)
                try:
                    await self._register_tools((owner,))
                    registered_with = self._instance(owner)
                except VictorActorsError:
                    pass
                continue
            for c in calls:
                self._loop.create_task(self._run_tool(owner, c))

    def _instance(self, owner: int) -> Any:
        return getattr(self._transports[owner], "instance", None)

    async def _run_tool(self, owner: int, c: Mapping[str, Any]) -> None:
        fn, timeout = self._tools.get(str(c["name"]), (None, 0.0))
        out: dict[str, Any] = {"k": "tool_done", "key": c["k"]}
        try:
            if fn is None:
                raise LookupError(f"no executor for tool {c['name']!r} in this client")
            call = ToolCall(
                str(c["id"]),
                str(c["name"]),
                thaw(c["args"]),
                ScopeRef.parse(c["scope"]),
                bool(c["re"]),
                c["run"],
            )
            if asyncio.iscoroutinefunction(fn):
                value = await asyncio.wait_for(fn(call), timeout)
            else:
                value = await asyncio.wait_for(asyncio.to_thread(fn, call), timeout)
            out.update(ok=True, v=value)
            w.encode(out)  # a result that cannot be stored is the tool's error, not a crash here
        except Exception as exc:
            out.update(ok=False, v=f"{type(exc).__name__}: {exc}")
        try:
            await self._ask_here(owner, out, self.request_timeout)
        except VictorActorsError:
            pass  # the owner restarted meanwhile: it delivers the request again

    async def _bye(self) -> None:
        op = {"k": "bye", "cid": self.client_id}

        async def one(owner: int) -> None:
            try:
                await asyncio.wait_for(self._direct(owner, dict(op)), BYE_WAIT)
            except Exception:
                pass  # an owner that is away forgets us when it restarts, or when we stop polling

        await asyncio.gather(*(one(n) for n in range(len(self._transports))))

    # -- closing ------------------------------------------------------------------------

    def _close_client(self) -> None:
        """Stop the loop, the pollers and the delivery thread; close the connections. Idempotent."""
        if self.closed:
            return
        self.closed = True
        _clients.discard(self)
        with self._events_cv:
            self._events_cv.notify_all()
        if self._pid < 0:
            return  # a forked child's copy: the parent's threads are not ours to stop
        for poller in (*self._pollers.values(), *self._tool_pollers.values()):
            poller.cancel()
        if self._tools and threading.current_thread() is not self._thread:
            # the owners forget our tools now, and hand the calls we hold to another client
            try:
                asyncio.run_coroutine_threadsafe(self._bye(), self._loop).result(BYE_WAIT + 1.0)
            except Exception:
                pass

        async def stop() -> None:
            for t in self._transports:
                try:
                    await t.aclose()
                except Exception:
                    pass
            for task in asyncio.all_tasks(self._loop):
                if task is not asyncio.current_task():
                    task.cancel()
            self._loop.call_soon(self._loop.stop)

        try:
            asyncio.run_coroutine_threadsafe(stop(), self._loop)
        except RuntimeError:
            return
        self._thread.join(timeout=5)


def _expire(future: asyncio.Future[Any], lane: Lane, wait: float) -> None:
    if not future.done():
        future.set_exception(
            DeadlineExceededError(
                f"{lane.transport.where} did not answer within {wait:g} s; a write may still be applied"
            )
        )


def _copy_outcomes(pairs: _Pairs) -> None:
    for src, dst in pairs:
        if dst.done():
            continue
        if src.cancelled():
            dst.cancel()
        elif src.exception() is not None:
            dst.set_exception(src.exception())  # type: ignore[arg-type]
        else:
            dst.set_result(src.result())


def _mark_forked() -> None:  # pragma: no cover - runs in a forked child
    global _batch_prefix
    _batch_prefix = os.urandom(10).hex()  # never the parent's: ids from both would collide
    for client in list(_clients):
        client._pid = -1  # the next call starts the loop and the connections afresh


os.register_at_fork(after_in_child=_mark_forked)
