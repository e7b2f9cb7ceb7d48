"""What every simulated agent shares: the manager, the clock, and the tallies, under one lock."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

from victor_actors import GlobalStateManager
from victor_actors.sim._config import REJECTS, SimConfig, Sink
from victor_actors.sim._ledger import AgentLedger, RunLedger

__all__ = ["Hub"]


class Hub:
    """The manager, the load's clock, and every count the report and the checker read.

    ``sink`` (``--kill``'s child) receives one record per acknowledgment, run
    and rejected batch as it happens, so a SIGKILL cannot lose the record of
    a commit that was acknowledged.
    """

    def __init__(self, manager: GlobalStateManager, config: SimConfig, sink: Sink | None = None) -> None:
        self.manager = manager
        self.config = config
        self.sink = sink
        self.lock = threading.Lock()
        self.started = time.monotonic()
        self.stop_at = self.started + config.seconds
        self.stopping = False
        self.turns = self.commits = self.crashes = self.team_crashes = self.restarts = 0
        self.compensations = self.ambiguous = 0
        self.rejected: dict[str, list[int]] = {kind: [0, 0] for kind in REJECTS}
        self._rejects_handed = 0
        self.errors: Counter[str] = Counter()
        self.examples: dict[str, str] = {}  # the first message of each kind of error
        self.unexpected: list[str] = []
        self.runs: list[RunLedger] = []
        self.subtree = 1 + config.workflows * (1 + config.conversations)  # a team and its descendants

    def next_reject(self) -> str:
        """The kind of the next batch that must fail: the kinds in turn, so that even a short run on a
        starved machine sends each kind (a random pick per agent left one out now and then)."""
        with self.lock:
            kind = REJECTS[self._rejects_handed % len(REJECTS)]
            self._rejects_handed += 1
        return kind

    def emit(self, record: dict[str, Any]) -> None:
        if self.sink is not None:
            self.sink(record)

    def ack(self, ledger: AgentLedger, seq: int, inc: int, kind: str) -> None:
        with self.lock:
            ledger.acked.append(seq)
            ledger.increment += inc
            ledger.next_seq = seq + 1
            self.commits += 1
            if kind == "tool_request":
                ledger.tool_requests.append(seq)
            self.emit({"t": "ack", "agent": ledger.name, "seq": seq, "inc": inc, "kind": kind})

    def error(self, exc: BaseException | str) -> None:
        name = exc if isinstance(exc, str) else type(exc).__name__
        with self.lock:
            self.errors[name] += 1
            if name not in self.examples and not isinstance(exc, str):
                self.examples[name] = " ".join([str(exc), *getattr(exc, "__notes__", ())])

    def unexpected_error(self, exc: BaseException) -> None:
        """An exception no agent step expects: a bug here or in the runtime."""
        text = f"{type(exc).__name__}: {exc}"
        with self.lock:
            self.unexpected.append(text)
        self.emit({"t": "unexpected", "error": text})

    def failures(self) -> int:
        with self.lock:
            rejected = sum(r[1] for r in self.rejected.values())
            return len(self.runs) + rejected + sum(self.errors.values()) + len(self.unexpected)
