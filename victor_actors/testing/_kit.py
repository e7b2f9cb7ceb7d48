"""The testing kit's recorder and assertions; its fixtures are in ``_plugin.py``."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from victor_actors._handle import ScopeHandle
from victor_actors._kernel import CallObserver
from victor_actors._manager import GlobalStateManager
from victor_actors._messages import ApplyRequest, CheckpointRequest, PrepareRequest, RestartRequest
from victor_actors._model import ScopeRef, StateScope, StateTransition, TransitionType
from victor_actors._state import ScopeState, StateChanged
from victor_actors._values import FrozenDict
from victor_actors.testing._calls import ReadCall, RunMark, WriteCall, call_site, caller, read_call
from victor_actors.testing._hooks import kernel_of

__all__ = [
    "Published",
    "Received",
    "Recorder",
    "assert_commit_order",
    "assert_no_partial_batch",
]

ScopeLike = ScopeRef | ScopeHandle | str

# How many problems a failure message lists before it says "and N more".
_MAX_LISTED = 20


# -- the recorder -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Received:
    """One message a scope's actor received, in the order it received them.

    ``kind`` is ``"apply"`` (a batch for this scope alone), ``"reset"`` (a
    restore or a run rollback: the scope set as a whole), ``"prepare"`` (this
    scope's part of a cross-scope batch), ``"lock"`` (a ``transact`` lock; its
    part arrives later, so ``transitions`` is None), ``"restart"`` (from the
    supervisor), ``"checkpoint"`` (``save_checkpoint``, ``compact``: written
    by the actor between two commits) or ``"other"``. ``commit_id`` is the transaction's commit id
    for ``prepare`` and ``lock``, None otherwise (a single-scope commit gets
    its id on the actor). ``seq`` orders entries across all scopes.
    """

    seq: int
    ref: ScopeRef
    kind: str
    message_type: str
    transitions: tuple[StateTransition, ...] | None
    run_id: str | None
    commit_id: str | None
    message: Any


@dataclass(frozen=True, slots=True)
class Published:
    """One commit event a scope published, with the request it was handling at the time.

    ``request`` is None when the recorder saw no request before the event
    (it was attached while the request was being handled).
    """

    seq: int
    ref: ScopeRef
    event: StateChanged
    request: Received | None


Entry = Received | Published
Call = ReadCall | WriteCall | RunMark


class Recorder:
    """Records, per scope, what each scope's actor received and published.

    ``Recorder(manager)`` attaches at once with ``set_observer``
    (pass ``attach=False`` to attach later, or never: a detached recorder
    still records whatever is passed to :meth:`observe`, which is how tests
    plant data). An observer already set on the manager, such as another
    recorder, keeps being called. Attach before the workload starts: the
    recorder takes each existing scope's state as its baseline then, and
    each later scope's state when it first sees that scope.

    The observer runs on the actors' threads and only appends under a lock,
    so recording is thread-safe and keeps each scope's order. A commit's
    event is recorded before ``apply`` returns (cross-scope commits too:
    the coordinator waits for its participants), so after the workload the
    records are complete; :meth:`wait_quiet` is there for work the test did
    not wait for (tool results, subscribers writing back).

    Use it as a context manager to detach on exit.
    """

    def __init__(self, manager: GlobalStateManager, *, attach: bool = True) -> None:
        self.manager = manager
        self._lock = threading.Lock()
        self._activity = threading.Condition(self._lock)
        self._seq = 0
        self._last_activity = time.monotonic()
        self._entries: list[Entry] = []
        self._received: dict[ScopeRef, list[Received]] = {}
        self._published: dict[ScopeRef, list[Published]] = {}
        self._current: dict[ScopeRef, Received] = {}
        self._baselines: dict[ScopeRef, ScopeState] = {}
        self._tracked: dict[str, tuple[ScopeRef, ...]] = {}
        self._calls: list[Call] = []
        self._previous: Callable[[str, ScopeRef, Any], None] | None = None
        self._previous_calls: CallObserver | None = None
        self._live = False
        self._stopped = False
        if attach:
            self.attach()

    def __repr__(self) -> str:
        with self._lock:
            received = sum(len(v) for v in self._received.values())
            published = sum(len(v) for v in self._published.values())
            scopes = len({e.ref for e in self._entries})
        state = "attached" if self._live else "detached"
        return f"<Recorder {state}: {scopes} scopes, {received} received, {published} published>"

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()

    # -- attaching ----------------------------------------------------------

    def attach(self) -> None:
        """Start observing the manager; take every existing scope's current state as its baseline."""
        manager = self.manager
        with kernel_of(manager).lock:
            if self._live:
                return
            previous = kernel_of(manager).observer
            if previous == self.observe:
                previous = None
            self._previous = previous
            with self._lock:
                for ref, cell in kernel_of(manager).cells.items():
                    self._baselines.setdefault(ref, cell.state)
            self._live = True
            self._stopped = False
            manager._set_observer(self.observe)
            kernel = kernel_of(manager)
            calls = kernel.calls
            self._previous_calls = None if calls == self.observe_call else calls
            kernel.calls = self.observe_call

    def detach(self) -> None:
        """Stop recording and give the manager back its previous observer. Idempotent.

        The records stay readable. If another observer was attached on top
        of this one, it stays, and this recorder only forwards to the one
        below it.
        """
        manager = self.manager
        with kernel_of(manager).lock:
            self._stopped = True
            if not self._live:
                return
            self._live = False
            if kernel_of(manager).observer == self.observe:
                manager._set_observer(self._previous)
            if kernel_of(manager).calls == self.observe_call:
                kernel_of(manager).calls = self._previous_calls

    @property
    def attached(self) -> bool:
        return self._live

    def observe(self, kind: str, ref: ScopeRef, obj: Any) -> None:
        """The observer the manager calls on each actor's thread; tests may call it to plant data.

        ``kind`` is ``"received"`` (``obj`` is the request message) or
        ``"published"`` (``obj`` is the commit's ``StateChanged``).
        """
        if not self._stopped:
            if kind == "received":
                self._on_received(ref, obj)
            elif kind == "published":
                self._on_published(ref, obj)
        previous = self._previous
        if previous is not None:
            previous(kind, ref, obj)

    def observe_call(self, kind: str, ref: ScopeRef | None, obj: Any) -> None:
        """The kernel's ``calls`` hook, on the caller's thread: reads, writes, runs (see ``calls()``)."""
        if not self._stopped:
            self._on_call(kind, ref, obj)
        previous = self._previous_calls
        if previous is not None:
            previous(kind, ref, obj)

    def _on_call(self, kind: str, ref: ScopeRef | None, obj: Any) -> None:
        if kind == "run":
            event, run, report = obj
            with self._lock:
                self._seq += 1
                self._calls.append(RunMark(self._seq, event, run.id, run.session_id, report))
            return
        who, site = caller(), call_site(3)
        with self._lock:
            self._seq += 1
            if kind == "read" and ref is not None:
                self._calls.append(read_call(self._seq, who, site, ref, obj))
            elif kind == "write" and ref is not None:
                via, transitions, expected, record, error = obj
                self._calls.append(
                    WriteCall(self._seq, who, site, ref, via, transitions, expected, record, error)
                )

    def _on_received(self, ref: ScopeRef, message: Any) -> None:
        cls = message.__class__
        transitions: tuple[StateTransition, ...] | None = None
        run_id: str | None = None
        commit_id: str | None = None
        if cls is ApplyRequest:
            kind = "apply" if message.reset_to is None else "reset"
            transitions, run_id = message.transitions, message.run_id
        elif cls is PrepareRequest:
            kind = "prepare" if message.transitions is not None else "lock"
            transitions, run_id, commit_id = message.transitions, message.run_id, message.commit_id
        elif cls is RestartRequest:
            kind = "restart"
        elif cls is CheckpointRequest:
            kind = "checkpoint"
        else:
            kind = "other"
        baseline: ScopeState | None = None
        if self._live and ref not in self._baselines:
            # On the scope's own thread, before it handles the message: its state right now.
            cell = kernel_of(self.manager).cells.get(ref)
            baseline = None if cell is None else cell.state
        with self._lock:
            self._seq += 1
            item = Received(self._seq, ref, kind, cls.__name__, transitions, run_id, commit_id, message)
            if baseline is not None:
                self._baselines.setdefault(ref, baseline)
            self._entries.append(item)
            self._received.setdefault(ref, []).append(item)
            self._current[ref] = item
            self._last_activity = time.monotonic()
            self._activity.notify_all()

    def _on_published(self, ref: ScopeRef, event: StateChanged) -> None:
        with self._lock:
            self._seq += 1
            item = Published(self._seq, ref, event, self._current.get(ref))
            self._entries.append(item)
            self._published.setdefault(ref, []).append(item)
            self._last_activity = time.monotonic()
            self._activity.notify_all()

    # -- reading ------------------------------------------------------------

    def received(self, ref: ScopeLike | None = None) -> list[Received]:
        """The messages ``ref``'s actor received, in order; every scope's, in order, if None."""
        with self._lock:
            if ref is None:
                return [e for e in self._entries if isinstance(e, Received)]
            return list(self._received.get(_ref(ref), ()))

    def published(self, ref: ScopeLike | None = None) -> list[StateChanged]:
        """The events ``ref`` published, in commit order; every scope's, in recording order, if None."""
        return [p.event for p in self.commits(ref)]

    def commits(self, ref: ScopeLike | None = None) -> list[Published]:
        """Like :meth:`published`, each event with the request that produced it."""
        with self._lock:
            if ref is None:
                return [e for e in self._entries if isinstance(e, Published)]
            return list(self._published.get(_ref(ref), ()))

    def calls(self) -> list[Call]:
        """What the callers did, in order: every :class:`ReadCall` (a snapshot handed out), every
        :class:`WriteCall` (an apply or transact and its outcome) and :class:`RunMark` (a run's start
        and end), each read and write with its caller (thread or asyncio task) and call site.

        ``seq`` orders them with :meth:`entries`. Recorded only while attached.
        """
        with self._lock:
            return list(self._calls)

    def entries(self) -> list[Entry]:
        """Everything recorded, across scopes, in the order it was recorded."""
        with self._lock:
            return list(self._entries)

    def scopes(self) -> list[ScopeRef]:
        """Every scope the recorder saw a message or an event of, in first-seen order."""
        with self._lock:
            return list(dict.fromkeys(e.ref for e in self._entries))

    def baseline(self, ref: ScopeLike) -> ScopeState | None:
        """``ref``'s state when the recorder attached or first saw it; None if it never did."""
        with self._lock:
            return self._baselines.get(_ref(ref))

    def track(self, record: StateChanged) -> StateChanged:
        """Remember the ``involved`` scopes of a record ``apply`` or ``transact`` returned; return it.

        The events the scopes publish do not carry ``involved``; only the
        record returned to the caller does. For ``apply`` the recorder knows
        the participants from the prepare messages anyway, but a
        ``transact``'s parts are invisible to it: ``recorder.track(conv.transact(...))``
        lets :func:`assert_no_partial_batch` check that every involved
        scope published the commit.
        """
        if record.involved:
            with self._lock:
                self._tracked[record.commit_id] = record.involved
        return record

    def clear(self) -> None:
        """Forget everything recorded; each live scope's current state becomes its baseline.

        Call it between phases of a test, when no request is in flight.
        """
        manager = self.manager
        with kernel_of(manager).lock, self._lock:
            self._entries.clear()
            self._received.clear()
            self._published.clear()
            self._current.clear()
            self._tracked.clear()
            self._calls.clear()
            self._baselines = {ref: cell.state for ref, cell in kernel_of(manager).cells.items()}

    def wait_quiet(self, quiet: float = 0.05, timeout: float = 5.0) -> bool:
        """Wait until nothing was recorded for ``quiet`` seconds; False if ``timeout`` passed first."""
        end = time.monotonic() + timeout
        with self._lock:
            while True:
                now = time.monotonic()
                idle_until = self._last_activity + quiet
                if now >= idle_until:
                    return True
                if now >= end:
                    return False
                self._activity.wait(min(idle_until, end) - now)

    def _snapshot_data(
        self,
    ) -> tuple[list[Entry], dict[ScopeRef, ScopeState], dict[str, tuple[ScopeRef, ...]]]:
        with self._lock:
            return list(self._entries), dict(self._baselines), dict(self._tracked)


# -- helpers --------------------------------------------------------------------------------


def _ref(scope: ScopeLike) -> ScopeRef:
    """A ScopeRef from a ref, a handle, ``"level:id"``, or a bare conversation session id."""
    if isinstance(scope, ScopeRef):
        return scope
    if isinstance(scope, ScopeHandle):
        return scope.ref
    if isinstance(scope, str):
        if ":" in scope:
            return ScopeRef.parse(scope)
        return ScopeRef(StateScope.CONVERSATION, scope)
    raise TypeError(f"expected a ScopeRef, a ScopeHandle or a scope name, not {type(scope).__name__}")


def _recorder_of(source: Recorder | GlobalStateManager) -> Recorder | None:
    if isinstance(source, Recorder):
        return source
    if isinstance(source, GlobalStateManager):
        owner = getattr(kernel_of(source).observer, "__self__", None)
        return owner if isinstance(owner, Recorder) else None
    raise TypeError(f"expected a Recorder or a GlobalStateManager, not {type(source).__name__}")


def _targets(t: StateTransition, ref: ScopeRef) -> bool:
    target = t.data.get("scope")
    return target is None or target == ref.scope.value or target == str(ref)


def _messages_of(transitions: Iterable[StateTransition]) -> list[Any]:
    """The messages these transitions add, as the reducer builds them."""
    out: list[Any] = []
    for t in transitions:
        tt, d = t.transition_type, t.data
        if tt is TransitionType.ADD_MESSAGE:
            out.append(d["message"])
        elif tt is TransitionType.ADD_MESSAGES:
            out.extend(d["messages"])
        elif tt is TransitionType.TOOL_RESULT:
            out.append(
                FrozenDict._wrap(
                    {
                        "role": "tool",
                        "tool_name": d["tool_name"],
                        "content": d["result"],
                        "request_id": d.get("request_id"),
                        "error": d.get("error"),
                    }
                )
            )
    return out


_ABSENT = object()


def _writes_of(transitions: Iterable[StateTransition]) -> dict[str, Any]:
    """Each key's final value after these transitions (``_ABSENT`` for a delete)."""
    out: dict[str, Any] = {}
    for t in transitions:
        if t.transition_type is TransitionType.UPDATE_STATE:
            out[t.data["key"]] = t.data["value"]
        elif t.transition_type is TransitionType.DELETE_STATE:
            out[t.data["key"]] = _ABSENT
    return out


def _may_be_noop(transitions: Sequence[StateTransition]) -> bool:
    """True if these transitions can leave a scope unchanged (so it publishes nothing)."""
    for t in transitions:
        if t.transition_type is TransitionType.DELETE_STATE:
            continue
        if t.transition_type is TransitionType.ADD_MESSAGES and not t.data["messages"]:
            continue
        return False
    return True


def _hkey(value: Any) -> Hashable:
    try:
        hash(value)
    except TypeError:
        return ("<unhashable>", repr(value))
    return value  # type: ignore[no-any-return]


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fmt_transition(t: StateTransition) -> str:
    d = t.data
    tt = t.transition_type
    at = f" @{d['scope']}" if d.get("scope") is not None else ""
    if tt is TransitionType.ADD_MESSAGE:
        body = _short(d["message"], 40)
    elif tt is TransitionType.UPDATE_STATE:
        body = f"{d['key']}={_short(d['value'], 30)}"
    elif tt is TransitionType.DELETE_STATE:
        body = str(d["key"])
    elif tt is TransitionType.ADD_MESSAGES:
        body = f"{len(d['messages'])} messages"
    else:
        body = ", ".join(f"{k}={_short(v, 20)}" for k, v in d.items() if k != "scope")
    return f"{tt.name}({body}{at})"


def _fmt_transitions(ts: Sequence[StateTransition] | None) -> str:
    if ts is None:
        return "[unknown]"
    shown = ", ".join(_fmt_transition(t) for t in ts[:6])
    more = f", ... {len(ts) - 6} more" if len(ts) > 6 else ""
    return f"[{shown}{more}]"


def _fmt_event(e: StateChanged) -> str:
    return f"{e.commit_id} v{e.old_version}->v{e.new_version}"


def _fail(title: str, problems: list[str], note: str | None = None) -> None:
    __tracebackhide__ = True
    listed = problems[:_MAX_LISTED]
    lines = [f"{title}: {len(problems)} problem(s)"]
    lines += [f"  - {p}" for p in listed]
    if len(problems) > len(listed):
        lines.append(f"  ... and {len(problems) - len(listed)} more")
    if note:
        lines.append(f"  ({note})")
    raise AssertionError("\n".join(lines))


def _settled(rec: Recorder | None, compute: Callable[[], list[str]], settle: float) -> list[str]:
    """Problems now; if any and the recorder is live, again once it has been quiet a moment."""
    problems = compute()
    if problems and rec is not None and rec.attached and settle > 0:
        rec.wait_quiet(timeout=settle)
        problems = compute()
    return problems


# -- assert_no_partial_batch ----------------------------------------------------------------------


def assert_no_partial_batch(manager_or_recorder: Recorder | GlobalStateManager, settle: float = 2.0) -> None:
    """Assert that every commit the recorder saw reflects the whole of its request.

    For each published event, against the request the scope was handling:

    - the event's transitions equal the request's (for a single-scope batch)
      or the scope's part of it (for a cross-scope batch); for a
      ``transact`` lock, whose part the recorder cannot see, every
      transition targets the scope;
    - the event shows every message those transitions add, each key they
      set with its final value, and their last stage;
    - a cross-scope event carries its transaction's commit id.

    For each cross-scope transaction (the prepare messages sharing a commit
    id):

    - if it committed, every participant whose part changes something
      published it, and so did every scope in its ``involved`` (known from
      events, or from records passed to :meth:`Recorder.track`);
    - if it aborted, nobody published it;
    - only participants published it, each once.

    The failure message lists each problem with the commit id, the scopes
    that did and did not publish it, and the transitions involved (what the
    request had, what the event shows).
    """
    __tracebackhide__ = True
    rec = _recorder_of(manager_or_recorder)
    if rec is None:
        raise TypeError("assert_no_partial_batch needs a Recorder, or a manager with one attached")
    problems = _settled(rec, lambda: _partial_problems(rec), settle)
    if problems:
        _fail("partial or inconsistent commits", problems)


def _reflection_problems(p: Published, transitions: Sequence[StateTransition]) -> list[str]:
    """Does the event show everything ``transitions`` do?"""
    e = p.event
    out: list[str] = []
    expected_msgs = _messages_of(transitions)
    if tuple(e.added_messages) != tuple(expected_msgs):
        out.append(
            f"{p.ref} commit {_fmt_event(e)} added {len(e.added_messages)} message(s) "
            f"{_short(tuple(e.added_messages), 120)} but its transitions add {len(expected_msgs)}: "
            f"{_short(tuple(expected_msgs), 120)}"
        )
    changes = {c.key: c for c in e.changes}
    for key, value in _writes_of(transitions).items():
        change = changes.get(key)
        if value is _ABSENT:
            if change is not None and change.new_present:
                out.append(f"{p.ref} commit {_fmt_event(e)} should delete {key!r} but shows it set")
        elif change is None or not change.new_present or change.new_value != value:
            shown = "no change" if change is None else f"{_short(change.new_value, 40)}"
            out.append(
                f"{p.ref} commit {_fmt_event(e)} should set {key!r} = {_short(value, 40)} but shows {shown}"
            )
    stages = [t.data["stage"] for t in transitions if t.transition_type is TransitionType.UPDATE_STAGE]
    if stages and e.new_stage != stages[-1]:
        out.append(
            f"{p.ref} commit {_fmt_event(e)} should move to stage {stages[-1]!r}, shows {e.new_stage!r}"
        )
    return out


def _partial_problems(rec: Recorder) -> list[str]:
    entries, _baselines, tracked = rec._snapshot_data()
    problems: list[str] = []
    prepares: dict[str, list[Received]] = {}
    publishers: dict[str, list[Published]] = {}
    for e in entries:
        if isinstance(e, Received):
            if e.kind in ("prepare", "lock") and e.commit_id is not None:
                prepares.setdefault(e.commit_id, []).append(e)
            continue
        publishers.setdefault(e.event.commit_id, []).append(e)
        event, req = e.event, e.request
        if event.ref != e.ref:
            problems.append(f"{e.ref} published an event of {event.ref} ({_fmt_event(event)})")
        if req is None:
            continue
        if req.kind in ("prepare", "lock") and req.commit_id != event.commit_id:
            problems.append(
                f"{e.ref} published commit {_fmt_event(event)} while handling transaction {req.commit_id}"
            )
        if req.kind in ("apply", "prepare"):
            wanted = req.transitions or ()
            if event.transitions != wanted:
                lacking = [t for t in wanted if t not in event.transitions]
                extra = [t for t in event.transitions if t not in wanted]
                what = "its request" if req.kind == "apply" else f"its part of transaction {req.commit_id}"
                problems.append(
                    f"{e.ref} commit {_fmt_event(event)} applied {len(event.transitions)} of the "
                    f"{len(wanted)} transitions of {what}: missing {_fmt_transitions(lacking)}, "
                    f"extra {_fmt_transitions(extra)}"
                )
                continue
            problems.extend(_reflection_problems(e, event.transitions))
        elif req.kind == "lock":
            stray = [t for t in event.transitions if not _targets(t, e.ref)]
            if stray:
                problems.append(
                    f"{e.ref} commit {_fmt_event(event)} carries transitions for other scopes: "
                    f"{_fmt_transitions(stray)}"
                )
            problems.extend(_reflection_problems(e, event.transitions))
        elif req.kind == "reset" and not event.reset:
            problems.append(f"{e.ref} commit {_fmt_event(event)} answered a reset but is not marked reset")

    for commit_id, pubs in publishers.items():
        refs = [p.ref for p in pubs]
        for ref, count in Counter(refs).items():
            if count > 1:
                problems.append(f"{ref} published commit {commit_id} {count} times")
        if commit_id not in prepares and len(set(refs)) > 1:
            names = ", ".join(sorted({str(r) for r in refs}))
            problems.append(f"commit {commit_id} was published by {names}, but no transaction prepared it")

    for commit_id, reqs in prepares.items():
        participants = {r.ref: r for r in reqs}
        pubs = publishers.get(commit_id, [])
        published_by = {p.ref for p in pubs}
        outcome = getattr(getattr(reqs[0].message, "txn", None), "state", None)
        if outcome not in ("committed", "aborted"):  # planted data, or still deciding
            outcome = "committed" if pubs else "unknown"
        outsiders = published_by - set(participants)
        if outsiders:
            problems.append(
                f"commit {commit_id} was published by {', '.join(sorted(map(str, outsiders)))}, "
                "which did not take part in its transaction"
            )
        if outcome == "aborted":
            if pubs:
                problems.append(
                    f"transaction {commit_id} aborted but {', '.join(sorted(map(str, published_by)))} "
                    "published it"
                )
            continue
        if outcome != "committed":
            continue
        required = {
            ref
            for ref, r in participants.items()
            if r.kind == "prepare" and not _may_be_noop(r.transitions or ())
        }
        for p in pubs:
            required.update(p.event.involved)
        required.update(tracked.get(commit_id, ()))
        missing = required - published_by
        if missing:
            parts = "; ".join(
                f"{r}: "
                + (_fmt_transitions(participants[r].transitions) if r in participants else "no prepare")
                for r in sorted(missing, key=str)
            )
            problems.append(
                f"partial batch: commit {commit_id} was published by "
                f"{', '.join(sorted(map(str, published_by))) or 'nobody'} but not by "
                f"{', '.join(sorted(map(str, missing)))} (their parts: {parts})"
            )
    return problems


# -- assert_commit_order ------------------------------------------------------------------------


def assert_commit_order(
    recorder_or_events: Recorder | GlobalStateManager | Iterable[StateChanged],
    ref: ScopeLike | None = None,
    settle: float = 2.0,
) -> None:
    """Assert that each scope's events come in commit order.

    Takes a :class:`Recorder` (or a manager with one attached), or any
    iterable of ``StateChanged`` events, such as those a subscriber
    collected; with ``ref``, only that scope's events are checked. Per
    scope:

    - each event's ``new_version`` is its ``old_version`` plus one;
    - each event's ``old_version`` is the previous event's ``new_version``
      (no gap, nothing out of order);
    - no commit id and no version appears twice;
    - with a recorder, the first event starts at the version the scope had
      when the recorder first saw it.

    The failure message names the scope and the position of the offending
    event, what it expected, and the run of versions around it
    (``commit-id vOLD->vNEW``).
    """
    __tracebackhide__ = True
    wanted = None if ref is None else _ref(ref)
    rec: Recorder | None = None
    if isinstance(recorder_or_events, (Recorder, GlobalStateManager)):
        rec = _recorder_of(recorder_or_events)
        if rec is None:
            raise TypeError("assert_commit_order needs a Recorder, a manager with one attached, or events")
        recorder = rec

        def compute() -> list[str]:
            entries, baselines, _tracked = recorder._snapshot_data()
            events = [e.event for e in entries if isinstance(e, Published)]
            bases = {r: s.version for r, s in baselines.items()}
            return _order_problems(events, wanted, bases)

        problems = _settled(rec, compute, settle)
    else:
        problems = _order_problems(list(recorder_or_events), wanted, {})
    if problems:
        _fail("events out of commit order", problems)


def _order_problems(
    events: list[StateChanged], wanted: ScopeRef | None, bases: dict[ScopeRef, int]
) -> list[str]:
    by_scope: dict[ScopeRef, list[StateChanged]] = {}
    for e in events:
        if not isinstance(e, StateChanged):
            raise TypeError(f"expected StateChanged events, got {type(e).__name__}")
        if wanted is None or e.ref == wanted:
            by_scope.setdefault(e.ref, []).append(e)
    problems: list[str] = []
    for ref, seq in by_scope.items():

        def around(i: int, seq: list[StateChanged] = seq) -> str:
            lo, hi = max(i - 3, 0), min(i + 3, len(seq))
            shown = ", ".join(("*" if j == i else "") + _fmt_event(seq[j]) for j in range(lo, hi))
            return f"[{'... ' if lo else ''}{shown}{' ...' if hi < len(seq) else ''}]"

        seen_ids: dict[str, int] = {}
        seen_versions: dict[int, int] = {}
        for i, e in enumerate(seq):
            where = f"{ref}: event {i + 1} of {len(seq)} ({_fmt_event(e)})"
            if e.new_version != e.old_version + 1:
                problems.append(f"{where} does not advance the version by one; events {around(i)}")
            if i == 0:
                base = bases.get(ref)
                if base is not None and e.old_version != base:
                    problems.append(
                        f"{where} starts from v{e.old_version}, but the scope was at v{base} "
                        f"when the recorder first saw it; events {around(i)}"
                    )
            else:
                prev = seq[i - 1]
                if e.old_version != prev.new_version:
                    problems.append(
                        f"{where} starts from v{e.old_version}, but the previous event ended at "
                        f"v{prev.new_version}; events {around(i)}"
                    )
            if e.commit_id in seen_ids:
                problems.append(f"{where} repeats the commit id of event {seen_ids[e.commit_id] + 1}")
            elif e.new_version in seen_versions:
                problems.append(
                    f"{where} repeats version v{e.new_version} of event {seen_versions[e.new_version] + 1}"
                )
            seen_ids.setdefault(e.commit_id, i)
            seen_versions.setdefault(e.new_version, i)
    return problems
