"""What a :class:`Simulation` keeps: the ledger of acknowledgements and faults, the facts it read.

Plain data, so that invariants are plain functions and tests can build a
:class:`SimRun` by hand to plant a violation.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from victor_actors import GlobalStateManager, StateChanged
from victor_actors.lowlevel import thaw

__all__ = ["Ack", "Ledger", "ScopeFacts", "SimRun", "read_scopes"]


@dataclass(frozen=True)
class Ack:
    """One commit the runtime acknowledged to an agent: the version it reached in each scope."""

    agent: str
    commit_id: str
    versions: dict[str, int]  # scope ref (str) -> the version this commit made
    note: str | None = None


class Ledger:
    """What the agents were told and what was done to them, thread-safe; ``sink`` sees each record.

    ``sink(record)`` (a JSON-able dict) is called as each acknowledgement happens: the
    kill-and-reopen check writes them to a file with one ``os.write`` each.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.acks: list[Ack] = []
        self.turns = 0
        self.faults: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.unexpected_errors: list[str] = []
        self.crashes = 0
        self.restarts = 0  # the restarts the injected crashes imply
        self.sink: Callable[[dict[str, Any]], None] | None = None

    def ack(self, agent: str, record: StateChanged, note: str | None = None) -> None:
        versions = {str(r.ref): r.new_version for r in (record, *record.related) if r.committed}
        entry = Ack(agent, record.commit_id, versions, note)
        with self.lock:
            self.acks.append(entry)
            if self.sink is not None:
                self.sink(
                    {
                        "t": "ack",
                        "agent": agent,
                        "commit": record.commit_id,
                        "versions": versions,
                        "note": note,
                    }
                )

    def turn(self) -> None:
        with self.lock:
            self.turns += 1

    def fault(self, name: str, restarts: int = 0) -> None:
        with self.lock:
            self.faults[name] += 1
            if restarts:
                self.crashes += 1
                self.restarts += restarts

    def error(self, exc: BaseException) -> None:
        with self.lock:
            self.errors[type(exc).__name__] += 1

    def unexpected(self, agent: str, exc: BaseException) -> None:
        with self.lock:
            self.unexpected_errors.append(f"{agent}: {type(exc).__name__}: {exc}")
            if self.sink is not None:
                self.sink({"t": "unexpected", "agent": agent, "error": f"{type(exc).__name__}: {exc}"})


@dataclass(frozen=True)
class ScopeFacts:
    """One scope as read at the end: its version, messages and own values, as plain data."""

    version: int
    messages: list[Any]
    values: dict[str, Any]


def read_scopes(manager: GlobalStateManager) -> dict[str, ScopeFacts]:
    """Every scope the manager holds, read as :class:`ScopeFacts` (the default ``observe``)."""
    out = {}
    for ref in manager.scopes():
        snap = manager.scope(ref).snapshot()
        out[str(ref)] = ScopeFacts(snap.version, [thaw(m) for m in snap.messages], thaw(dict(snap.state)))
    return out


@dataclass
class SimRun:
    """What the invariants are given.

    ``live``: what ``observe`` read before the store was closed (None after a
    SIGKILL); ``reopened``: what it read from the store reopened read-only;
    ``stats``: ``manager.stats()`` at the end (None after a SIGKILL);
    ``agents``: the :class:`SimAgent` objects with their ``state``.
    """

    ledger: Ledger
    live: Any
    reopened: Any
    stats: dict[str, Any] | None
    agents: list[Any] = field(default_factory=list)
    faults: Any = None
    killed: bool = False
