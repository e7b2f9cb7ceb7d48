"""The shared fate of one cross-scope transaction: the object its participants wait on.

The coordinator (``_txn.py``) and every participating actor hold the same
:class:`CrossTxn`. Participants vote on its queue and, once they voted yes,
park on its condition until the coordinator decides; the state machine
(``pending -> committing -> committed``, or ``-> aborted``) is what lets a
participant abort alone past the deadline without ever aborting a
transaction the coordinator has already claimed for commit. The protocol
and why it cannot deadlock are argued in ``_txn.py``.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

from victor_actors import _clock
from victor_actors._model import ScopeRef

__all__ = ["ABORTED", "COMMITTED", "GRACE", "CrossTxn"]

PENDING, COMMITTING, COMMITTED, ABORTED = "pending", "committing", "committed", "aborted"
# How long a prepared actor waits past the transaction's deadline before it may abort it alone.
GRACE = 1.0


class CrossTxn:
    """The shared fate of one cross-scope transaction."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.lock = threading.Lock()
        self.decided = threading.Condition(self.lock)
        self.state = PENDING
        self.done_count = 0
        self.involved: tuple[ScopeRef, ...] = ()  # set by the coordinator before it commits
        self.votes: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()

    def claim(self) -> bool:
        """The coordinator's step: pending -> committing. False if an actor aborted it first."""
        with self.lock:
            if self.state != PENDING:
                return False
            self.state = COMMITTING
            return True

    def finish_if_pending(self) -> None:
        """A locked participant that was released without a part: abort unless already decided."""
        with self.lock:
            if self.state == PENDING:
                self.state = ABORTED
                self.decided.notify_all()

    def finish(self, state: str) -> None:
        with self.lock:
            self.state = state
            self.decided.notify_all()

    def participant_done(self) -> None:
        """A participant finished its work after the outcome (events, sessions, tools)."""
        with self.lock:
            self.done_count += 1
            self.decided.notify_all()

    def wait_participants(self, count: int, timeout: float) -> None:
        """The coordinator waits for that work, so a reply means sessions and tools are under way."""
        left = _clock.timer(_clock.monotonic() + timeout)
        with self.lock:
            while self.done_count < count:
                remaining = left()
                if remaining <= 0:
                    return
                self.decided.wait(remaining)

    def wait_outcome(self) -> str:
        """A prepared actor's wait: returns "committed" or "aborted"."""
        left = _clock.timer(self.deadline + GRACE)  # virtual time stands still while we wait
        with self.lock:
            while self.state in (PENDING, COMMITTING):
                remaining = left()
                if self.state == PENDING and remaining <= 0:
                    self.state = ABORTED  # the coordinator is gone or too late: abort alone
                    self.decided.notify_all()
                    break
                self.decided.wait(timeout=None if self.state == COMMITTING else max(remaining, 0.001))
            return self.state
