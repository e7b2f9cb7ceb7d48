"""History checks over a recording: blind writes, what a run left behind, writes that belong together.

They read what the :class:`Recorder` keeps of both sides: the callers' reads,
writes and runs (``_calls.py``: who, and from which line) and the actors'
messages and commits (``_kit.py``). Each failure lists the offending commits
with their ids, scopes, callers and call sites. In the spirit of Jepsen's
Elle, they judge the history that happened, with one difference: a blind
write is reported whether or not another writer happened to interleave this
time, since the test wants to catch the bug before the race does.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any

from victor_actors._manager import GlobalStateManager
from victor_actors._model import ScopeRef, StateScope, StateTransition, TransitionType
from victor_actors._state import StateChanged
from victor_actors.testing._calls import ReadCall, RunMark, WriteCall
from victor_actors.testing._kit import (
    Published,
    Received,
    Recorder,
    ScopeLike,
    _fail,
    _messages_of,
    _recorder_of,
    _ref,
    _settled,
    _short,
    _targets,
)

__all__ = ["Write", "assert_committed_together", "assert_no_blind_writes", "assert_run_left_nothing"]


def _need(source: Recorder | GlobalStateManager, what: str) -> Recorder:
    rec = _recorder_of(source)
    if rec is None:
        raise TypeError(f"{what} needs a Recorder, or a manager with one attached")
    return rec


def _writers(rec: Recorder) -> dict[str, WriteCall]:
    """Commit id -> the handle call that made it (the first, for a cross-scope commit's scopes)."""
    out: dict[str, WriteCall] = {}
    for call in rec.calls():
        if isinstance(call, WriteCall):
            for r in call.records():
                out.setdefault(r.commit_id, call)
    return out


def _by(call: WriteCall | None) -> str:
    if call is None:
        return "not through a handle (a tool result, a rollback or a lower-level call)"
    return f"{call.via} by {call.caller}" + (f" at {call.site}" if call.site else "")


# -- assert_no_blind_writes ----------------------------------------------------------------------


def _checked_scopes(call: WriteCall) -> set[ScopeRef]:
    """The scopes whose version ``call`` checked (``expected_version``)."""
    expected = call.expected_version
    if expected is None or call.record is None:
        return set()
    refs = [r.ref for r in call.records()]
    if isinstance(expected, int):
        return {call.ref}
    checked = set()
    for key in expected:
        for ref in refs:
            if key == ref or key == str(ref) or key == ref.scope.value or key == ref.scope:
                checked.add(ref)
    return checked


def assert_no_blind_writes(
    manager_or_recorder: Recorder | GlobalStateManager,
    *scopes: ScopeLike,
    ignore_keys: Iterable[str] = (),
    settle: float = 2.0,
) -> None:
    """Assert that no caller read a shared scope and then overwrote one of its keys unchecked.

    A blind write is a read-modify-write that can lose an update: a caller
    (a thread, or an asyncio task) took a snapshot showing a shared scope,
    then committed through ``apply``/``aapply`` a batch that sets or deletes
    a key that snapshot showed, without ``expected_version`` for that scope.
    ``modify`` (which passes the versions it read) and ``transact`` (which
    locks) never count. A scope is shared when it is a team, workflow or
    global scope, or when more than one caller wrote it during the recording.
    Only the callers' reads while the recorder was attached are known.

    ``scopes`` limits the check to those scopes; ``ignore_keys`` exempts keys
    that are overwritten on purpose (a status flag, say).

    The failure lists each such commit: its id, the scope and key, what the
    caller had read and wrote, the caller and its call site, and whether
    another writer's update was in fact lost this time.
    """
    __tracebackhide__ = True
    rec = _need(manager_or_recorder, "assert_no_blind_writes")
    wanted = {_ref(s) for s in scopes}
    ignored = set(ignore_keys)
    problems = _settled(rec, lambda: _blind_problems(rec, wanted, ignored), settle)
    if problems:
        _fail("blind writes (read-modify-write without a version check)", problems)


def _blind_problems(rec: Recorder, wanted: set[ScopeRef], ignored: set[str]) -> list[str]:
    calls = rec.calls()
    writers_of: dict[ScopeRef, set[str]] = {}
    for call in calls:
        if isinstance(call, WriteCall):
            for r in call.records():
                writers_of.setdefault(r.ref, set()).add(call.caller)

    def shared(ref: ScopeRef) -> bool:
        return ref.scope is not StateScope.CONVERSATION or len(writers_of.get(ref, ())) > 1

    last_read: dict[tuple[str, ScopeRef], ReadCall] = {}
    problems: list[str] = []
    for call in calls:
        if isinstance(call, ReadCall):
            for state in call.states:
                last_read[(call.caller, state.ref)] = call
            continue
        if not isinstance(call, WriteCall) or call.via not in ("apply", "aapply"):
            continue
        checked = _checked_scopes(call)
        for record in call.records():
            ref = record.ref
            if (wanted and ref not in wanted) or ref in checked or not shared(ref):
                continue
            read = last_read.get((call.caller, ref))
            seen = None if read is None else read.state_of(ref)
            if read is None or seen is None:
                continue
            for change in record.changes:
                if change.key in ignored or change.key not in seen.values:
                    continue
                was = seen.values[change.key]
                lost = ""
                if not change.old_present or change.old_value != was:
                    before = _short(change.old_value, 30) if change.old_present else "nothing"
                    lost = f"; an update was lost: it overwrote {before}, committed by another writer since"
                new = _short(change.new_value, 30) if change.new_present else "(deleted)"
                problems.append(
                    f"commit {record.commit_id} in {ref}: {_by(call)} wrote {change.key!r} = {new} after "
                    f"reading {ref} at v{seen.version} ({change.key!r} was {_short(was, 30)}), with no "
                    f"expected_version for {ref}, nor modify or transact{lost}"
                )
    return problems


# -- assert_run_left_nothing ----------------------------------------------------------------------


def assert_run_left_nothing(
    manager_or_recorder: Recorder | GlobalStateManager, run: Any, settle: float = 2.0
) -> None:
    """Assert that a run wrote nothing outside its tag and, if rolled back, left nothing behind.

    ``run`` is a :class:`Run` or its id; the recorder must have been attached
    when it started. Checked:

    - nothing was committed to the run's own conversation (its session id)
      between the run's start and end without the run's tag (a step done in a
      plain thread instead of ``run.thread``/``run.bind`` escapes the run and
      its rollback); every commit such a caller made in that window, in any
      scope, is listed;
    - if the run was rolled back: its rollback report lists no scope it could
      not undo (a conflict, a failure, an undo not confirmed), and none of the
      messages the run's tagged commits added is still in its scope.
    """
    __tracebackhide__ = True
    rec = _need(manager_or_recorder, "assert_run_left_nothing")
    run_id = run if isinstance(run, str) else getattr(run, "id", None)
    if not isinstance(run_id, str):
        raise TypeError(f"expected a Run or a run id, not {type(run).__name__}")
    problems = _settled(rec, lambda: _run_problems(rec, run_id), settle)
    if problems:
        _fail(f"run {run_id} left writes behind", problems)


def _run_problems(rec: Recorder, run_id: str) -> list[str]:
    marks = [c for c in rec.calls() if isinstance(c, RunMark) and c.run_id == run_id]
    start = next((m for m in marks if m.event == "start"), None)
    end = next((m for m in marks if m.event == "end"), None)
    if start is None:
        raise AssertionError(f"the recorder never saw run {run_id} start (attach it before the run)")
    own = ScopeRef(StateScope.CONVERSATION, start.session_id)
    last = end.seq if end is not None else float("inf")
    writers = _writers(rec)
    problems: list[str] = []
    escaped: list[Published] = []
    for e in rec.entries():
        if not isinstance(e, Published) or not start.seq < e.seq < last or e.ref != own:
            continue
        req = e.request
        if req is None or req.kind not in ("apply", "prepare", "lock") or req.run_id == run_id:
            continue
        escaped.append(e)
    escapees = {writers[e.event.commit_id].caller for e in escaped if e.event.commit_id in writers}
    listed: set[tuple[str, ScopeRef]] = set()
    for e in escaped:
        listed.add((e.event.commit_id, e.ref))
        problems.append(
            f"commit {e.event.commit_id} in {own} during the run carries no run tag: "
            f"{_by(writers.get(e.event.commit_id))}; the rollback cannot see it "
            "(a step in a plain thread? use run.thread or run.bind)"
        )
    for call in rec.calls():  # the same callers' other commits in the run's window
        if isinstance(call, WriteCall) and call.caller in escapees and start.seq < call.seq <= last:
            for r in call.records():
                if (r.commit_id, r.ref) not in listed and r.run_id != run_id:
                    listed.add((r.commit_id, r.ref))
                    problems.append(
                        f"commit {r.commit_id} in {r.ref} by the same caller during the run, untagged: "
                        f"{_by(call)}"
                    )
    if end is not None and end.report is not None:
        for scope in end.report.scopes:
            for conflict in scope.conflicts:
                problems.append(f"its rollback left {scope.ref} as it was: {conflict}")
        problems.extend(_messages_left(rec, run_id))
    return problems


def _messages_left(rec: Recorder, run_id: str) -> list[str]:
    """Messages the run's tagged commits added that are still in their scope after the rollback."""
    added: dict[ScopeRef, list[Any]] = {}
    for p in rec.commits():
        if p.event.run_id == run_id and not p.event.reset:
            added.setdefault(p.ref, []).extend(p.event.added_messages)
    problems = []
    for ref, messages in added.items():
        held = list(rec.manager.scope(ref).snapshot().messages)
        for m in messages:
            if any(h is m for h in held):
                problems.append(f"{ref} still holds the run's message {_short(m)}")
    return problems


# -- assert_committed_together -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Write:
    """One write of a commit, as :func:`assert_committed_together`'s ``group`` sees it.

    ``kind`` is ``"message"`` (``value`` is the message, a tool result's
    too), ``"set"`` (``key``, ``value``), ``"delete"`` (``key``) or the
    transition's type in lower case for the rest; ``ref`` the scope it was
    committed in, ``commit_id`` its commit.
    """

    ref: ScopeRef
    kind: str
    key: str | None
    value: Any
    commit_id: str


def _writes(ref: ScopeRef, commit_id: str, transitions: Iterable[StateTransition]) -> list[Write]:
    out = []
    for t in transitions:
        if not _targets(t, ref):
            continue
        tt = t.transition_type
        if tt is TransitionType.UPDATE_STATE:
            out.append(Write(ref, "set", t.data["key"], t.data["value"], commit_id))
        elif tt is TransitionType.DELETE_STATE:
            out.append(Write(ref, "delete", t.data["key"], None, commit_id))
        elif tt in (TransitionType.ADD_MESSAGE, TransitionType.ADD_MESSAGES, TransitionType.TOOL_RESULT):
            out.extend(Write(ref, "message", None, m, commit_id) for m in _messages_of((t,)))
        else:
            out.append(Write(ref, tt.name.lower(), None, dict(t.data), commit_id))
    return out


def assert_committed_together(
    manager_or_recorder: Recorder | GlobalStateManager,
    group: Callable[[Write], Hashable | None],
    settle: float = 2.0,
) -> None:
    """Assert that writes the test says belong together were committed in one commit.

    ``group(write)`` names the unit a :class:`Write` belongs to (an answer's
    id, say, for both the answer message in the conversation and its finding
    in the team), or None for a write that belongs to none. All the writes
    of one unit must share one commit id: one batch, single-scope or
    cross-scope (whose scopes share its id). Rollbacks are not counted.

    The failure lists each split unit with every commit that carried part of
    it: the commit id, the scope, what it wrote, and who wrote it from where.
    """
    __tracebackhide__ = True
    rec = _need(manager_or_recorder, "assert_committed_together")
    if not callable(group):
        raise TypeError("assert_committed_together takes group(write) -> a unit's name or None")
    problems = _settled(rec, lambda: _together_problems(rec, group), settle)
    if problems:
        _fail("writes that belong together were committed apart", problems)


def _fmt_write(w: Write) -> str:
    if w.kind == "set":
        return f"{w.key}={_short(w.value, 40)} in {w.ref}"
    if w.kind == "delete":
        return f"delete {w.key} in {w.ref}"
    return f"{w.kind} {_short(w.value, 40)} in {w.ref}"


def _together_problems(rec: Recorder, group: Callable[[Write], Hashable | None]) -> list[str]:
    units: dict[Hashable, dict[str, list[Write]]] = {}
    for e in rec.entries():
        if not isinstance(e, Published) or e.event.reset:
            continue
        req = e.request
        if isinstance(req, Received) and req.kind not in ("apply", "prepare", "lock"):
            continue
        event: StateChanged = e.event
        for w in _writes(e.ref, event.commit_id, event.transitions):
            unit = group(w)
            if unit is not None:
                units.setdefault(unit, {}).setdefault(w.commit_id, []).append(w)
    writers = _writers(rec)
    problems = []
    for unit, commits in units.items():
        if len(commits) < 2:
            continue
        parts = []
        for commit_id, ws in commits.items():
            what = ", ".join(_fmt_write(w) for w in ws[:3]) + (", ..." if len(ws) > 3 else "")
            parts.append(f"commit {commit_id} ({what}; {_by(writers.get(commit_id))})")
        problems.append(f"{unit!r} was split over {len(commits)} commits: " + "; ".join(parts))
    return problems
