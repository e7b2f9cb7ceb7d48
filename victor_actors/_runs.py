"""Runs: one agent operation, tagged, bounded in time, rolled back if it fails.

``with manager.run(session_id, timeout=30.0) as run:`` (or ``async with
manager.arun(...)``) makes every request inside it carry the run's id (in the
request envelope: actors and subscribers see it through
:func:`current_run_id`) and bounds each request by the run's deadline. If the
block raises or outlives its timeout, the run's own writes are rolled back in
every scope it touched, as ordinary commits:

- a key the run wrote returns to its value before the run, unless another
  writer changed it since (its value is no longer the one the run left),
  in which case it is left alone and reported as a conflict;
- the run's messages are removed, other messages stay in order;
- capabilities and the stage likewise; the run's still-pending tool requests
  are released;
- subscriptions made through the run are closed.

If the body raised, :class:`RunFailedError` is raised from the body's error
(``error`` and ``__cause__`` hold it, untouched) with the
:class:`RollbackReport` as ``rollback_report``; a timeout raises
:class:`RunTimeoutError` (a :class:`DeadlineExceededError`) with the same
report. Cancellation and other ``BaseException`` propagate as they are. The
report is also on ``run.rollback_report``.
"""

from __future__ import annotations

import asyncio
import contextvars
import secrets
import threading
from collections.abc import Callable, Iterable, Mapping
from contextvars import ContextVar
from typing import Any, Protocol, TypeVar

import attrs
import pykka

from victor_actors import _clock, _trace
from victor_actors._cell import ScopeCell
from victor_actors._context import RUN_ID
from victor_actors._errors import DeadlineExceededError, TransitionValidationError
from victor_actors._events import Subscription
from victor_actors._kernel import Kernel
from victor_actors._messages import ApplyRequest
from victor_actors._model import ScopeRef
from victor_actors._rollback import RollbackReport, RunFailedError, RunTimeoutError, ScopeRollback
from victor_actors._state import MessageLog, ScopeState, StateChanged
from victor_actors._trace import RunTrace
from victor_actors._values import check_text


class Subscribable(Protocol):
    """What :meth:`Run.subscribe` takes: anything with ``subscribe(callback)`` (a scope handle)."""

    def subscribe(self, callback: Callable[[StateChanged], object]) -> Subscription: ...


__all__ = ["CURRENT_RUN", "ROLLBACK_GRACE", "Run", "RunContext", "run_bound_deadline"]

CURRENT_RUN: ContextVar[Run | None] = ContextVar("victor_actors_run", default=None)
_ABSENT: Any = object()
# How long past its deadline a run may take to roll back before it returns anyway (issue 31).
ROLLBACK_GRACE = 1.0
T = TypeVar("T")


def same_value(a: Any, b: Any) -> bool:
    """Whether two frozen values are the same value: ``==``, except that NaN is itself.

    Rollback asks "is this still the value the run wrote?"; with ``==`` a NaN
    the run wrote would never be, and would be left behind as another
    writer's.
    """
    if a is b:
        return True
    if a.__class__ is float and b.__class__ is float:
        return a == b or (a != a and b != b)
    if a.__class__ is tuple and b.__class__ is tuple:
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return len(a) == len(b) and all(k in b and same_value(v, b[k]) for k, v in a.items())
    return bool(a.__class__ is b.__class__ and a == b)


class _Plan:
    """One scope's undo plan, built from the run's commit records in order."""

    def __init__(self, ref: ScopeRef) -> None:
        self.ref = ref
        self.keys: dict[str, list[Any]] = {}  # key -> [old_present, old, new_present, new]
        self.caps: dict[str, list[Any]] = {}
        self.stage: list[str] | None = None  # [before the run, as the run left it]
        # The run's message edits, one per commit that changed the log, in commit order: the log became
        # its first ``keep`` messages, then ``added``; ``removed`` were the messages after ``keep``.
        self.edits: list[tuple[int, tuple[Any, ...], tuple[Any, ...]]] = []
        self.tools: list[str] = []
        self.closed = False  # the run closed this scope (CLOSE_SESSION)
        self.report: ScopeRollback | None = None

    def add(self, rec: StateChanged) -> None:
        for changes, into in ((rec.changes, self.keys), (rec.capability_changes, self.caps)):
            for c in changes:
                entry = into.get(c.key)
                if entry is None:
                    # [present before the run, value before, present as the run left it, value, interleaved]
                    into[c.key] = [c.old_present, c.old_value, c.new_present, c.new_value, False]
                    continue
                if c.old_present != entry[2] or (c.old_present and not same_value(c.old_value, entry[3])):
                    entry[4] = True  # someone else wrote it between two of the run's writes
                entry[2:4] = [c.new_present, c.new_value]
        if rec.new_stage is not None:
            if self.stage is None:
                self.stage = [rec.old_stage or "", rec.new_stage]
            else:
                self.stage[1] = rec.new_stage
        if rec.added_messages or rec.removed_messages:
            self.edits.append((rec.first_message_index, rec.removed_messages, rec.added_messages))
        self.tools.extend(r["request_id"] for r in rec.tool_requests)
        self.closed = self.closed or rec.closed

    def target(self, state: ScopeState) -> ScopeState | None:
        """The state with this run's writes undone (on the scope's actor thread)."""
        conflicts: list[str] = []
        values = state.values.mutate()
        restored = _undo(self.keys, values, conflicts, "key")
        caps = state.capabilities.mutate()
        caps_restored = _undo(self.caps, caps, conflicts, "capability")
        stage = state.stage
        stage_restored = False
        if self.stage is not None:
            if state.stage == self.stage[1]:
                stage, stage_restored = self.stage[0], True
            else:
                conflicts.append(f"stage is {state.stage!r}, not {self.stage[1]!r} as the run left it")
        messages, msgs_dropped, msgs_restored = self._undo_messages(state.messages, conflicts)
        pending = state.pending_tools.mutate()
        released = []
        for request_id in self.tools:
            if request_id in pending:
                del pending[request_id]
                released.append(request_id)
        self.report = ScopeRollback(
            self.ref,
            tuple(restored),
            msgs_dropped,
            tuple(caps_restored),
            stage_restored,
            tuple(released),
            tuple(conflicts),
            messages_restored=msgs_restored,
        )
        reopened = self.closed and state.closed
        changed = messages is not state.messages
        if not (restored or caps_restored or stage_restored or changed or released or reopened):
            return None
        return attrs.evolve(
            state,
            values=values.finish(),
            capabilities=caps.finish(),
            stage=stage,
            messages=messages,
            pending_tools=pending.finish(),
            closed=False if reopened else state.closed,
        )

    def _undo_messages(self, log: MessageLog, conflicts: list[str]) -> tuple[MessageLog, int, int]:
        """``log`` with the run's message edits undone, newest first; and the messages dropped and restored.

        Each edit is undone on the log as the later ones' undoing left it: the
        messages it added are taken out (found by value at their place or
        below, since other writers only append there or remove below), and
        the messages it removed are put back where they were, before anything
        appended since. An edit whose place is gone (another writer removed
        messages below it) is reported and skipped.
        """
        if not self.edits:
            return log, 0, 0
        work: list[Any] = list(log)
        dropped = restored = 0
        for keep, removed, added in reversed(self.edits):
            for j in range(len(added) - 1, -1, -1):
                found = _find_message(work, keep + j, added[j])
                if found is None:
                    conflicts.append(f"message {keep + j} of the run is no longer there")
                    continue
                if work[found].__class__ is _PutBack:
                    restored -= 1  # put back by a later edit's undoing: the run had added it itself
                else:
                    dropped += 1
                del work[found]
            if removed:
                if len(work) < keep:
                    conflicts.append(
                        f"the {len(removed)} message(s) the run removed at {keep} were not put back: the log "
                        f"holds {len(work)} messages now (another writer removed some)"
                    )
                    continue
                work[keep:keep] = [_PutBack(m) for m in removed]
                restored += len(removed)
        if not dropped and not restored:
            return log, 0, 0
        kept = [m.message if m.__class__ is _PutBack else m for m in work]
        return MessageLog().extended(kept), dropped, restored


class _PutBack:
    """A message the rollback put back (it may be taken out again by an earlier edit's undoing)."""

    __slots__ = ("message",)

    def __init__(self, message: Any) -> None:
        self.message = message


def _find_message(work: list[Any], index: int, message: Any) -> int | None:
    """Where ``message`` is in ``work``: at ``index`` or the nearest place below it."""
    for i in range(min(index, len(work) - 1), -1, -1):
        item = work[i]
        if same_value(item.message if item.__class__ is _PutBack else item, message):
            return i
    return None


def _undo(plan: dict[str, list[Any]], into: Any, conflicts: list[str], what: str) -> list[str]:
    restored = []
    for key, (old_present, old, new_present, new, interleaved) in plan.items():
        if interleaved:
            # Restoring the value from before the run would erase that other write.
            conflicts.append(f"{what} {key!r} was written by another writer between the run's writes")
            continue
        current = into.get(key, _ABSENT)
        as_left = (current is not _ABSENT) == new_present and (not new_present or same_value(current, new))
        if not as_left:
            conflicts.append(f"{what} {key!r} was changed by another writer since the run wrote it")
            continue
        if old_present:
            into[key] = old
        elif current is not _ABSENT:
            del into[key]
        restored.append(key)
    return restored


class Run:
    """One agent operation in progress. See the module's documentation."""

    def __init__(
        self, kernel: Kernel, resolve: Callable[[ScopeRef], ScopeCell], session_id: str, timeout: float
    ) -> None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValueError(f"a run's timeout must be a positive number, not {timeout!r}")
        self._kernel = kernel
        self._resolve = resolve
        self.session_id = session_id
        if session_id.__class__ is not str or not session_id or check_text(session_id, "") is not None:
            raise TransitionValidationError(
                f"a run's session id must be a non-empty str that UTF-8 can encode, not {session_id!r}"
            )
        self.id = f"{session_id}:{secrets.token_hex(6)}"  # not uuid4: a test may patch that
        self.timeout = timeout
        self.started = _clock.monotonic()
        self.deadline = self.started + timeout
        self.status = "active"
        self.rollback_report: RollbackReport | None = None
        self._lock = threading.Lock()
        self._commits: list[StateChanged] = []
        self._seen: set[tuple[ScopeRef, str]] = set()
        self._touched: set[ScopeRef] = set()  # scopes a request went to whose outcome is unknown
        self._inflight = 0  # requests of this run still being decided on other threads
        self._idle = threading.Condition(self._lock)
        self._subscriptions: list[Subscription] = []

    def __repr__(self) -> str:
        return f"<Run {self.id} {self.status}>"

    @property
    def remaining(self) -> float:
        return self.deadline - _clock.monotonic()

    @property
    def commits(self) -> tuple[StateChanged, ...]:
        """Every commit made for this run so far, in the order the run learned of them.

        Each scope's commits are in that scope's commit order; commits of
        different scopes may interleave in any order.
        """
        with self._lock:
            return tuple(self._commits)

    def record(self, commit: StateChanged) -> None:
        """Note a commit made for this run (from its reply, or from the actor that made it)."""
        with self._lock:
            for rec in (commit, *commit.related):
                key = (rec.ref, rec.commit_id)
                if rec.committed and key not in self._seen:
                    self._seen.add(key)
                    self._commits.append(rec)

    def refs(self) -> set[ScopeRef]:
        """Every scope this run has committed to or sent a request to that may still commit."""
        with self._lock:
            return {r.ref for r in self._commits} | self._touched

    def begin(self, refs: Iterable[ScopeRef]) -> None:
        """A request of the run is about to be decided on another thread (it may outlive its caller)."""
        with self._lock:
            self._inflight += 1
            self._touched.update(refs)

    def end(self) -> None:
        with self._lock:
            self._inflight -= 1
            self._idle.notify_all()

    def touch(self, ref: ScopeRef) -> None:
        """A request to ``ref`` ended without a reply: it may still commit for this run."""
        with self._lock:
            self._touched.add(ref)

    def subscribe(self, handle: Subscribable, callback: Callable[[StateChanged], object]) -> Subscription:
        """A subscription that ends with the run."""
        sub = handle.subscribe(callback)
        with self._lock:
            self._subscriptions.append(sub)
        return sub

    def bind(self, fn: Callable[..., T]) -> Callable[..., T]:
        """Wrap ``fn`` to run in this run's context (for threads and executors)."""
        ctx = contextvars.copy_context()

        def bound(*args: Any, **kwargs: Any) -> T:
            return ctx.copy().run(fn, *args, **kwargs)

        return bound

    def thread(self, target: Callable[..., object], *args: Any, **kwargs: Any) -> threading.Thread:
        """A thread (not started) that works for this run."""
        return threading.Thread(target=self.bind(target), args=args, kwargs=kwargs, daemon=True)

    def rollback_deadline(self, now: float | None = None) -> float:
        """When a rollback starting ``now`` stops waiting: the run's deadline plus :data:`ROLLBACK_GRACE`.

        Never later than ``request_timeout`` from ``now`` (as before this bound
        existed), and never earlier than ``ROLLBACK_GRACE`` from ``now``: a run
        whose body raised early may use what is left of its timeout.
        """
        now = _clock.monotonic() if now is None else now
        request_timeout = self._kernel.options.request_timeout
        grace = min(ROLLBACK_GRACE, request_timeout)
        return min(now + request_timeout, max(self.deadline, now) + grace)

    def rollback(self, reason: str) -> RollbackReport:
        """Undo this run's writes in every scope it touched (see the module's documentation).

        The undo plan of each scope is built on that scope's actor thread, when
        the rollback request is handled: a request of the run still in that
        mailbox (its caller gave up waiting) has committed by then and is
        undone too.

        The whole rollback waits at most until :meth:`rollback_deadline`, so a
        run returns within its timeout and a small grace, whatever
        ``request_timeout`` is (issue 31). The requests go to every scope at
        once; one that no reply confirmed by then stays in its scope's mailbox
        (with ``request_timeout`` to be handled) and is reported in the scope's
        ``conflicts`` as not confirmed, with ``version`` None.
        """
        now = _clock.monotonic()
        end = self.rollback_deadline(now)
        left = _clock.timer(end)
        request_timeout = self._kernel.options.request_timeout
        with self._lock:
            # A request still being decided elsewhere (its caller was cancelled) must land first.
            while self._inflight > 0 and (remaining := left()) > 0:
                self._idle.wait(remaining)
            refs = list(dict.fromkeys([*(r.ref for r in self._commits), *self._touched]))
        sent: list[tuple[ScopeRef, list[_Plan], Any]] = []
        failed: dict[ScopeRef, ScopeRollback] = {}
        for ref in refs:
            plans: list[_Plan] = []

            def target(
                state: ScopeState, ref: ScopeRef = ref, plans: list[_Plan] = plans
            ) -> ScopeState | None:
                plan = _Plan(ref)
                for rec in sorted((r for r in self.commits if r.ref == ref), key=lambda r: r.new_version):
                    plan.add(rec)
                plans.append(plan)
                return plan.target(state)

            # the request itself may wait its turn for request_timeout; the caller waits until `end`
            req = ApplyRequest((), None, _clock.monotonic() + request_timeout, self.id, None, target)
            try:
                sent.append((ref, plans, self._kernel.post(self._resolve(ref), req, end)))
            except Exception as exc:  # report it and go on with the other scopes
                failed[ref] = ScopeRollback(ref, conflicts=(f"the rollback of {ref} failed: {exc!r}",))
        done: dict[ScopeRef, ScopeRollback] = {}
        for ref, plans, future in sent:
            try:
                commit: StateChanged = future.get(timeout=max(left(), 0.0))
            except pykka.Timeout:
                note = (
                    f"the rollback of {ref} was not confirmed by the run's deadline and its grace "
                    f"({ROLLBACK_GRACE} s): it stays queued and is applied when {ref} reaches it "
                    f"within {request_timeout} s"
                )
                done[ref] = ScopeRollback(ref, conflicts=(note,))
                continue
            except Exception as exc:  # report it and go on with the other scopes
                done[ref] = ScopeRollback(ref, conflicts=(f"the rollback of {ref} failed: {exc!r}",))
                continue
            report = (plans[0].report if plans else None) or ScopeRollback(ref)
            done[ref] = attrs.evolve(report, version=commit.version if commit.committed else None)
        results = tuple(failed.get(ref) or done[ref] for ref in refs)
        self.rollback_report = RollbackReport(self.id, reason, results)
        return self.rollback_report

    def _close(self) -> None:
        with self._lock:
            subs, self._subscriptions = self._subscriptions, []
        for sub in subs:
            sub.close()


class RunContext:
    """``with manager.run(...)`` and ``async with manager.arun(...)``."""

    def __init__(
        self, kernel: Kernel, resolve: Callable[[ScopeRef], ScopeCell], session_id: str, timeout: float
    ) -> None:
        self._kernel = kernel
        self._run = Run(kernel, resolve, session_id, timeout)
        self._tokens: tuple[contextvars.Token[Any], contextvars.Token[Any]] | None = None
        self._timeout_cm: Any = None
        self._trace: RunTrace | None = None

    def __enter__(self) -> Run:
        self._tokens = (CURRENT_RUN.set(self._run), RUN_ID.set(self._run.id))
        with self._kernel.lock:
            self._kernel.runs[self._run.id] = self._run
        hooks = _trace.hooks
        if hooks is not None:  # traced: the run's span is current in its body
            self._trace = hooks.run(self._run, self._kernel.names)
        calls = self._kernel.calls
        if calls is not None:  # the testing kit's recorder
            calls("run", None, ("start", self._run, None))
        return self._run

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        try:
            return self._finish(exc)
        finally:
            self._reset()

    async def __aenter__(self) -> Run:
        run = self.__enter__()
        self._timeout_cm = asyncio.timeout(run.timeout)
        await self._timeout_cm.__aenter__()
        return run

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        try:
            try:
                await self._timeout_cm.__aexit__(exc_type, exc, tb)
            except TimeoutError as timed_out:  # the run's timeout cancelled the body
                exc = timed_out
            # the rollback's requests block: run them off the loop (they carry the run id themselves)
            return await asyncio.to_thread(self._finish, exc)
        finally:
            self._reset()

    def _reset(self) -> None:
        if self._trace is not None:
            self._trace.end(self._run.status)
            self._trace = None
        if self._tokens is not None:
            CURRENT_RUN.reset(self._tokens[0])
            RUN_ID.reset(self._tokens[1])
            self._tokens = None

    def _finish(self, exc: BaseException | None) -> bool:
        run = self._run
        try:
            timed_out = run.remaining <= 0 or isinstance(exc, TimeoutError)
            if exc is None and not timed_out:
                run.status = "succeeded"
                return False
            reason = "timed out" if timed_out and exc is None else f"{type(exc).__name__}: {exc}"
            report = run.rollback(reason)
            run.status = "rolled_back"
            if self._trace is not None:
                self._trace.rolled_back(report)
        finally:
            run._close()
            with self._kernel.lock:
                self._kernel.runs.pop(run.id, None)
            calls = self._kernel.calls
            if calls is not None:  # the testing kit's recorder
                calls("run", None, ("end", run, run.rollback_report))
        if (
            exc is None
            or isinstance(exc, TimeoutError)
            or (timed_out and isinstance(exc, DeadlineExceededError))
        ):
            err = RunTimeoutError(
                f"run {run.id} exceeded its timeout of {run.timeout} s; its writes were rolled back"
                + _conflict_note(report),
                run_id=run.id,
                rollback_report=report,
            )
            if exc is not None:
                raise err from exc
            raise err
        if not isinstance(exc, Exception):
            return False  # cancellation, KeyboardInterrupt, SystemExit: propagate as they are
        raise RunFailedError(
            f"run {run.id} failed ({type(exc).__name__}: {exc}); its writes were rolled back"
            + _conflict_note(report),
            error=exc,
            run_id=run.id,
            rollback_report=report,
        ) from exc


def _conflict_note(report: RollbackReport) -> str:
    if not report.conflicts:
        return ""
    return "; left as another writer changed them: " + "; ".join(report.conflicts)


def run_bound_deadline(deadline: float) -> float:
    """A request's deadline, bounded by the current run's (if any)."""
    run = CURRENT_RUN.get()
    if run is None:
        return deadline
    if run.remaining <= 0:
        raise DeadlineExceededError(f"run {run.id} exceeded its timeout; nothing was applied")
    return min(deadline, run.deadline)
