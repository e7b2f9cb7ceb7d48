"""What the recorder keeps of the callers' side: who read which scope, who wrote what, where.

The actors' side (what each scope's actor received and published) tells the
order of commits but not who made them or what they had read first. The
kernel's ``calls`` hook, set by an attached :class:`Recorder`, reports on the
caller's own thread every snapshot a handle hands out, the outcome of every
``apply``/``aapply``/``transact``/``atransact``, and each run's start and
end. This module turns those reports into plain records: a :class:`ReadCall`,
a :class:`WriteCall` or a :class:`RunMark`, each with the caller (its thread,
or its asyncio task) and, for reads and writes, the call site: the first
frame outside the runtime.

The history checks (``_history.py``) and the provenance notes of
``assert_isolated`` read them.
"""

from __future__ import annotations

import asyncio
import os
import sys
import sysconfig
import threading
from dataclasses import dataclass
from typing import Any

import victor_actors
from victor_actors._model import ScopeRef
from victor_actors._snapshot import ContextSnapshot
from victor_actors._state import ScopeState, StateChanged

__all__ = ["ReadCall", "RunMark", "WriteCall", "caller", "call_site"]

_PACKAGE = os.path.dirname(os.path.abspath(victor_actors.__file__)) + os.sep
# the runtime's frames are skipped, except the simulator's: its agents are "user code" to the kit
_USER_PARTS = os.path.join(_PACKAGE, "sim") + os.sep
_STDLIB = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep


@dataclass(frozen=True, slots=True)
class ReadCall:
    """A snapshot a caller took: ``ref`` and, in ``states``, every scope it shows (ancestors too)."""

    seq: int
    caller: str
    site: str | None
    ref: ScopeRef
    states: tuple[ScopeState, ...]

    def state_of(self, ref: ScopeRef) -> ScopeState | None:
        """The state of ``ref`` this read showed, if it showed that scope."""
        for state in self.states:
            if state.ref == ref:
                return state
        return None


@dataclass(frozen=True, slots=True)
class WriteCall:
    """A write a caller made through a handle, after its outcome was known.

    ``via`` is ``apply``, ``aapply``, ``transact`` or ``atransact``;
    ``transitions`` and ``expected_version`` are what an apply sent (None for
    a transact, whose batch its ``fn`` built under the locks); ``record`` is
    the commit record returned (with ``related`` for the other scopes of a
    cross-scope batch), ``error`` the exception raised instead.
    """

    seq: int
    caller: str
    site: str | None
    ref: ScopeRef
    via: str
    transitions: Any
    expected_version: Any
    record: StateChanged | None
    error: BaseException | None

    def records(self) -> tuple[StateChanged, ...]:
        """Every scope's commit record of this write (none if it did not commit)."""
        if self.record is None:
            return ()
        return tuple(r for r in (self.record, *self.record.related) if r.committed)


@dataclass(frozen=True, slots=True)
class RunMark:
    """A run started (``event`` "start") or ended ("end", with its rollback report or None)."""

    seq: int
    event: str
    run_id: str
    session_id: str
    report: Any


def caller() -> str:
    """The calling agent as the kit names it: its asyncio task, else its thread."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running loop in this thread
        task = None
    thread = threading.current_thread()
    if task is not None:
        return f"task {task.get_name()!r}"
    return f"thread {thread.name!r}"


def call_site(skip: int = 2) -> str | None:
    """``file:line in function`` of the first frame outside the runtime and the standard library."""
    frame: Any = sys._getframe(skip)
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith("<"):  # "<string>" (python -c) is the user's; "<frozen ...>" is not
            if not filename.startswith("<frozen"):
                return f"{filename}:{frame.f_lineno} in {frame.f_code.co_name}"
            frame = frame.f_back
            continue
        filename = os.path.abspath(filename)
        runtime = filename.startswith(_PACKAGE) and not filename.startswith(_USER_PARTS)
        if not runtime and not filename.startswith(_STDLIB):
            try:
                shown = os.path.relpath(filename)
            except ValueError:  # another drive (Windows)
                shown = filename
            if shown.startswith(".."):
                shown = filename
            return f"{shown}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back
    return None


def read_call(seq: int, who: str, site: str | None, ref: ScopeRef, snap: ContextSnapshot) -> ReadCall:
    return ReadCall(seq, who, site, ref, (snap._state, *snap._ancestors))
