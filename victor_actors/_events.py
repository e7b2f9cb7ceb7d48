"""Delivery of change events to subscribers, off the actors' threads.

Actors never call user callbacks themselves: a callback that applied a batch
to the scope that called it would wait on its own mailbox. Each manager has
one event thread; an actor hands it (subscribers, event) after a commit, and
it calls the subscribers in commit order. A callback that raises, even with
a ``BaseException``, is logged and affects nothing else.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from victor_actors import _trace
from victor_actors._context import RUN_ID

__all__ = ["EventBus", "Subscription"]

logger = logging.getLogger("victor_actors")

_STOP = object()


class Subscription:
    """A live subscription to one scope's change events. ``close()`` ends it."""

    __slots__ = ("_callback", "_closed", "_on_close", "ref")

    def __init__(
        self, ref: Any, callback: Callable[[Any], object], on_close: Callable[[Subscription], None]
    ) -> None:
        self.ref = ref
        self._callback = callback
        self._on_close = on_close
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Stop receiving events. Idempotent; events already queued are dropped."""
        if not self._closed:
            self._closed = True
            self._on_close(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def deliver(self, event: Any) -> None:
        if self._closed:
            return
        run_id = getattr(event, "run_id", None)
        token = RUN_ID.set(run_id) if run_id is not None else None
        try:
            self._callback(event)
        except BaseException:
            logger.exception("subscriber %r of %s raised; the commit stands", self._callback, self.ref)
        finally:
            if token is not None:
                RUN_ID.reset(token)


class EventBus:
    """One daemon thread that calls subscribers in the order commits happened."""

    def __init__(self, name: str, names: _trace.Names = _trace.CLEAR) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._name = name
        self._names = names  # how the manager's scope ids appear in telemetry
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.published = 0  # events handed to the thread so far

    @property
    def thread(self) -> threading.Thread | None:
        """The event thread, once started."""
        return self._thread

    @property
    def queued(self) -> int:
        """Events waiting for the event thread (a slow subscriber shows here)."""
        return self._queue.qsize()

    def barrier(self, timeout: float) -> bool:
        """Return once every event queued before the call was delivered; False on timeout."""
        if self._thread is None:
            return True
        reached = threading.Event()
        self._queue.put(reached)
        return reached.wait(timeout)

    def publish(self, subscribers: tuple[Subscription, ...], event: Any) -> None:
        """Queue ``event`` (a commit's ``StateChanged``, or a supervision event) for ``subscribers``."""
        if self._thread is None:
            self._start()
        self.published += 1
        hooks = _trace.hooks  # traced: subscribers run in the publishing request's context
        self._queue.put((subscribers, event, None if hooks is None else hooks.capture(self._names)))

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                thread = threading.Thread(target=self._run, name=f"{self._name}-events", daemon=True)
                thread.start()
                self._thread = thread

    def _run(self) -> None:
        get = self._queue.get
        while True:
            item = get()
            if item is _STOP:
                return
            if item.__class__ is threading.Event:
                item.set()  # a barrier: everything queued before it was delivered
                continue
            subscribers, event, trace = item
            if trace is None:
                for sub in subscribers:
                    sub.deliver(event)
            else:
                trace.deliver(subscribers, event)

    def close(self, timeout: float = 5.0) -> None:
        """Deliver what is queued, then stop the thread (not waiting on itself)."""
        thread = self._thread
        if thread is None:
            return
        self._queue.put(_STOP)
        if thread is not threading.current_thread():
            thread.join(timeout)
