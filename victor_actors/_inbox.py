"""A scope actor's mailbox, and the step token a caller may take when the scope is idle.

One owner per scope means one step at a time, in the order the requests
arrived; it does not mean one particular thread (ADR 0032). The mailbox
counts every message from the moment it is put until the actor has finished
handling it (``outstanding``). When that count is zero and no caller holds
the token, the scope is idle: nothing is queued, nothing is being handled,
and a caller may take the token (``try_claim``) and run the scope's step on
its own thread. While the token is held, messages still queue (they arrive
after the caller's request, so they come after it in the order), and the
actor waits for the token before it handles one (``begin``). Both the check
and the claim happen under the queue's own mutex, the same one ``put``
takes, so a message put at the same moment is either counted before the
claim (and the claim fails) or queued after it (and waits for the step).

A scope whose requests all come from blocking callers never needs its
actor's thread, so the thread is started only with the first message
(``launch``): a scope created, touched once and evicted costs no thread at
all, and an actor that never started is stopped where it is
(``take_unlaunched``), without a message or a thread switch.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["ScopeInbox"]


class ScopeInbox(queue.Queue[Any]):
    """A ``queue.Queue`` that knows whether its actor is idle, with a token for callers' steps."""

    def __init__(self) -> None:
        super().__init__()
        self.outstanding = 0  # put and not yet handled to the end (the one in hand included)
        self.claimed = False  # a caller is running the scope's step on its own thread
        self.waiting = 0  # actor threads waiting in begin() for the token (release wakes them)
        self._released = threading.Condition(self.mutex)
        # starts the actor's thread; called once, with the first message (None: started, or never will)
        self.launch: Callable[[], None] | None = None

    def _put(self, item: Any) -> None:  # called by put() under self.mutex
        self.outstanding += 1
        super()._put(item)
        launch = self.launch
        if launch is not None:
            self.launch = None
            launch()

    def take_unlaunched(self) -> bool:
        """True (once) if the actor's thread never started and the scope is idle: it never will."""
        with self.mutex:
            if self.launch is None or self.outstanding or self.claimed:
                return False
            self.launch = None
            return True

    def try_claim(self) -> bool:
        """Take the step token if the scope is idle (nothing queued, nothing in hand, no holder)."""
        with self.mutex:
            if self.outstanding or self.claimed:
                return False
            self.claimed = True
            return True

    def idle(self) -> bool:
        """Nothing queued, nothing in hand, no caller's step: everything sent so far was handled."""
        with self.mutex:
            return not self.outstanding and not self.claimed

    def release(self) -> None:
        """Give the token back; an actor waiting in :meth:`begin` goes on."""
        with self.mutex:
            self.claimed = False
            if self.waiting:  # counted under the mutex, so no waiter is missed
                self._released.notify_all()

    def begin(self) -> None:
        """On the actor's thread, before it handles a message: wait while a caller holds the token."""
        with self.mutex:
            while self.claimed:
                self.waiting += 1
                try:
                    self._released.wait()
                finally:
                    self.waiting -= 1

    def done(self) -> None:
        """On the actor's thread, once a message is handled: one less outstanding."""
        with self.mutex:
            self.outstanding -= 1
