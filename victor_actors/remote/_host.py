"""The owner's side of the wire: a local manager's scopes served to other processes, op by op.

A :class:`Host` wraps the :class:`GlobalStateManager` that owns a store and
answers the operations a client sends (framed bytes in, framed bytes out,
see :mod:`._wire`); it knows nothing of sockets. Every operation of one
call runs as its own asyncio task, so the scopes of many clients commit
concurrently and share group commits, exactly as the owner's own threads
would. Nothing here writes around the owner: every write is a request to
the scope's actor through the manager's own handles.

**At most once.** A client tags every batch with a batch id (in the first
transition's metadata, durable with the commit). A retried batch (its
first attempt's outcome unknown: the connection dropped, the owner
restarted) is looked up first, in a window of recent batch ids kept in
memory and then in the written scopes' last :data:`DEDUPE_WINDOW` stored
commits; when found, that commit is the answer and nothing is applied again.

**Runs.** A client's run lives here, as a local :class:`Run`: its writes
carry the run id, it records its commits and the requests whose answers
were lost, and its rollback is the local one (by value, on each scope's
actor). A run whose client never ends it (the client died) is rolled back
once its deadline has passed.

**Tools.** A client registers the tools it executes; the host registers a
stand-in executor for each name with the local dispatcher, and hands each
call only to a client that registered that tool (long poll). The
dispatcher applies the result as usual, at most once. A call handed to a
client that then stops polling (it died) for :data:`TOOL_LIVENESS` seconds,
or says goodbye, is handed to another client that registered the tool (it
may then run twice, with the same idempotency key); a call no client takes
within the tool's timeout is answered with :class:`ToolUnavailableError`.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import os
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any, ClassVar

from victor_actors._context import RUN_ID
from victor_actors._errors import (
    DeadlineExceededError,
    RuntimeClosedError,
    ScopeAccessError,
    ScopeFailedError,
    TransitionValidationError,
    VictorActorsError,
)
from victor_actors._handle import ScopeHandle
from victor_actors._manager import GlobalStateManager
from victor_actors._model import GLOBAL_REF, ScopeRef, StateScope, StateTransition
from victor_actors._rollback import RollbackReport
from victor_actors._runs import CURRENT_RUN, Run
from victor_actors._snapshot import ContextSnapshot
from victor_actors._state import ScopeState, StateChanged
from victor_actors._tools import ToolCall
from victor_actors._values import FrozenDict, check_text
from victor_actors.remote import _wire as w

__all__ = ["BATCH_KEY", "DEDUPE_WINDOW", "Host", "ToolExecutionError", "ToolUnavailableError"]

BATCH_KEY = "victor_actors.batch"  # transition metadata: the client's batch (or transaction) id
DEDUPE_WINDOW = 256  # stored commits per scope searched for a retried batch id
RECENT_BATCHES = 65536  # batch ids remembered in memory with their commit
EVENT_RING = 1024  # live events kept per watched scope for the clients' polls
RUN_GRACE = 1.0  # seconds after its deadline before an abandoned run is rolled back here
TOOL_LIVENESS = 5.0  # seconds without a poll before a client's tool calls go to another client
TOOL_HANDOUTS = 3  # times one call is handed out before its failure is recorded
Address = tuple[str, str, "str | None", "str | None"]  # (level, id, workflow_id, team_id)


class ToolExecutionError(RuntimeError):
    """A client-side tool raised; its message is the client's error, recorded in the TOOL_RESULT."""


class ToolUnavailableError(TimeoutError):
    """No live client that registered the tool took the call within the tool's timeout.

    Recorded as the TOOL_RESULT's error (``"ToolUnavailableError: ..."``), as any executor's
    failure is: the request is answered, not left pending.
    """


def parse_address(raw: Any) -> Address:
    """A scope address from the wire: (level, id, workflow id or None, team id or None)."""
    if not isinstance(raw, (tuple, list)) or len(raw) != 4:
        raise ScopeAccessError("a scope address is (level, id, workflow_id, team_id); nothing was applied")
    level, ident, wf, team = raw
    for part in (level, ident):
        if not isinstance(part, str):
            raise ScopeAccessError("a scope address names its level and id as str; nothing was applied")
    for part in (wf, team):
        if part is not None and not isinstance(part, str):
            raise ScopeAccessError(
                "a scope address names its workflow and team ids as str or None; nothing was applied"
            )
    return (level, ident, wf, team)


_REFS: dict[str, ScopeRef] = {}  # refs parsed before: an owner sees the same few scopes again and again


def parse_ref(raw: Any) -> ScopeRef:
    """A scope ref from the wire (``"team:t1"``), checked as ``ScopeRef.parse`` checks it; cached."""
    if raw.__class__ is not str:
        raise ScopeAccessError(f"a scope on the wire is named by a str, not {type(raw).__name__}")
    ref = _REFS.get(raw)
    if ref is None:
        ref = ScopeRef.parse(raw)
        if len(_REFS) >= 65536:
            _REFS.clear()
        _REFS[raw] = ref
    return ref


def tagged(steps: tuple[StateTransition, ...], batch_id: str) -> tuple[StateTransition, ...]:
    """``steps`` with the batch id in the first transition's metadata (durable with the commit).

    The first transition is already validated, and a str id is a frozen value: it is copied
    without validating its data again (the hot path pays this once per request).
    """
    if not steps:
        return steps
    first = steps[0]
    meta = dict(first.metadata)
    meta[BATCH_KEY] = batch_id
    out = object.__new__(StateTransition)
    out.__attrs_init__(first.transition_type, first.data, FrozenDict._wrap(meta))
    return (out, *steps[1:])


def carries(transitions: tuple[StateTransition, ...], batch_id: str) -> bool:
    return bool(transitions) and transitions[0].metadata.get(BATCH_KEY) == batch_id


def expected_of(raw: Any) -> Any:
    """``expected_version`` from its wire form: an int, None, or (ref, version) pairs."""
    if raw is None or (isinstance(raw, int) and not isinstance(raw, bool)):
        return raw
    if isinstance(raw, (tuple, list)):
        out = {}
        for pair in raw:
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise ScopeAccessError("expected_version on the wire is (ref, version) pairs")
            ref, version = pair
            if isinstance(version, bool) or not isinstance(version, int):
                raise ScopeAccessError("expected_version on the wire names int versions")
            out[parse_ref(ref)] = version
        return out
    raise ScopeAccessError("expected_version on the wire is an int, None or (ref, version) pairs")


def _text(raw: Any, what: str) -> str:
    if raw.__class__ is not str or not raw or check_text(raw, "") is not None:
        raise TransitionValidationError(f"{what} must be a non-empty str that UTF-8 can encode")
    return str(raw)


def _seconds(raw: Any, default: float, what: str = "a timeout") -> float:
    if raw is None:
        return default
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not 0 < raw <= 86400:
        raise TransitionValidationError(f"{what} on the wire is a number of seconds in (0, 86400]")
    return float(raw)


class _Aborted(VictorActorsError):
    """A client abandoned its transaction (its ``fn`` raised): nothing is applied."""


def _settle(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


class _Tools:
    """Client-side tool executors: which client runs which tool, and the calls waiting for them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_client: dict[str, set[str]] = {}
        self.seen: dict[str, float] = {}  # a client's last poll (monotonic)
        self.timeouts: dict[str, float] = {}
        self.calls: dict[str, dict[str, Any]] = {}  # "scope|request id" -> the call, its answer
        self.proxied: set[str] = set()

    def requeue(self, entry: dict[str, Any], now: float) -> None:
        """Hand ``entry`` out again (its client went away); under ``lock``."""
        entry["sent"] = False
        entry["holder"] = None
        entry["queued"] = now

    def drop_client(self, client: str, now: float) -> int:
        """Forget ``client``'s tools; its calls in hand go to another client. Under ``lock``."""
        self.by_client.pop(client, None)
        self.seen.pop(client, None)
        moved = 0
        for entry in self.calls.values():
            if entry["holder"] == client and not entry["done"].is_set():
                self.requeue(entry, now)
                moved += 1
        return moved


class Host:
    """Serves one local manager's scopes over the wire (see the module's documentation).

    ``call(raw)`` takes one framed request (``{"ops": [...]}``) and returns
    one framed reply (``{"r": [(ok, value), ...]}``, one result per
    operation, in order). A malformed request gets a typed error for the
    whole call; a malformed operation, a typed error in its place. Nothing
    is applied for a request that fails validation.
    """

    OPS: ClassVar[dict[str, Any]] = {}

    def __init__(self, manager: GlobalStateManager, *, name: str = "the owner") -> None:
        self.manager = manager
        self.name = name
        self.instance = os.urandom(8).hex()  # a new id per start: clients see a restart
        self._handles: dict[ScopeRef, ScopeHandle] = {}
        self._recent: collections.OrderedDict[str, StateChanged] = collections.OrderedDict()
        self._rings: dict[ScopeRef, collections.deque[StateChanged]] = {}
        self._subs: dict[ScopeRef, Any] = {}
        self._runs: dict[str, Run] = {}
        self._ended: collections.OrderedDict[str, RollbackReport | None] = collections.OrderedDict()
        self._cursors: collections.OrderedDict[str, Iterator[ScopeRef]] = collections.OrderedDict()
        self._cursor_ids = itertools.count(1)
        self._tools = _Tools()
        self._txs: dict[str, tuple[queue.SimpleQueue[tuple[StateTransition, ...] | None], Any]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._commit_event: asyncio.Event | None = None
        self._tool_event: asyncio.Event | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self.counters: collections.Counter[str] = collections.Counter()

    # -- plumbing ------------------------------------------------------------------

    def _start(self) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._commit_event = asyncio.Event()
            self._tool_event = asyncio.Event()
            self._watchdog = self._loop.create_task(self._watch_runs())

    async def call(self, raw: bytes) -> bytes:
        """Run every operation in ``raw`` concurrently; reply with one result per operation, in order."""
        self._start()
        try:
            ops = w.decode(raw).get("ops")
            if not isinstance(ops, (tuple, list)):
                raise ScopeFailedError(f"a request carries a list of operations, not {type(ops).__name__}")
        except VictorActorsError as exc:
            return w.encode({"r": (), "e": w.error_to(exc)})
        results = await asyncio.gather(*(self._op(op) for op in ops))
        self.counters["calls"] += 1
        self.counters["ops"] += len(ops)
        return w.encode({"r": tuple(results)})

    async def _op(self, op: Any) -> Any:
        try:
            if not isinstance(op, dict) and not hasattr(op, "get"):
                raise ScopeAccessError(f"an operation is a mapping, not {type(op).__name__}")
            kind = op.get("k")
            fn = self.OPS.get(kind) if isinstance(kind, str) else None
            if fn is None:
                raise ScopeAccessError(f"unknown operation {kind!r:.80}; nothing was applied")
            return (True, await fn(self, op))
        except VictorActorsError as exc:
            return (False, w.error_to(exc))
        except Exception as exc:  # a malformed field: the caller's bad data, never a crash here
            err = TransitionValidationError(
                f"malformed {op.get('k', '?') if hasattr(op, 'get') else '?'!r:.80} request "
                f"({type(exc).__name__}: {exc}); nothing was applied"
            )
            return (False, w.error_to(err))

    def handle(self, ref: ScopeRef) -> ScopeHandle:
        h = self._handles.get(ref)
        if h is None:
            h = self.manager.scope(ref)
            if len(self._handles) > 100_000:
                self._handles.clear()
            self._handles[ref] = h
        return h

    def _scope(self, op: Any) -> ScopeHandle:
        return self.handle(parse_ref(op["s"]))

    async def _blocking(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run a blocking manager call off the loop (in this task's context: the current run)."""
        return await asyncio.to_thread(fn, *args, **kwargs)

    # -- scopes -----------------------------------------------------------------------

    async def _open(self, op: Any) -> Any:
        level, ident, wf, team = parse_address(op["a"])
        create = bool(op.get("c", True))
        m = self.manager
        if level == StateScope.GLOBAL.value:
            h = m.get_global_state()
        elif level == StateScope.TEAM.value:
            h = m.get_team_state(ident, create=create)
        elif level == StateScope.WORKFLOW.value:
            h = m.get_workflow_state(ident, team_id=team, create=create)
        elif level == StateScope.CONVERSATION.value:
            h = m.get_conversation_state(ident, workflow_id=wf, team_id=team, create=create)
        else:
            raise ScopeAccessError(f"unknown scope level {level!r:.40}; nothing was created")
        self._handles.setdefault(h.ref, h)
        return self._where(h)

    def _where(self, h: ScopeHandle) -> Any:
        return (str(h.ref), tuple(str(r) for r in h.snapshot()._state.lineage))

    async def _scope_op(self, op: Any) -> Any:
        """An existing scope by its ref (``manager.scope``): its ref and lineage."""
        return self._where(self._scope(op))

    async def _scopes(self, op: Any) -> Any:
        """A page of every scope's ref, from a cursor kept here (``manager.scopes()``)."""
        limit = op.get("n", 1000)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 0 < limit <= 10_000:
            raise TransitionValidationError("a page of scopes holds 1 to 10000 refs")
        cursor = op.get("cur")
        if cursor is None:
            cursor = str(next(self._cursor_ids))
            self._cursors[cursor] = self.manager.scopes()
            while len(self._cursors) > 64:
                self._cursors.popitem(last=False)
        it = self._cursors.get(str(cursor))
        if it is None:
            raise ScopeAccessError("the listing's cursor expired; start the listing again")
        page = await self._blocking(lambda: [str(r) for r in itertools.islice(it, limit)])
        if len(page) < limit:
            self._cursors.pop(str(cursor), None)
            return (tuple(page), None)
        return (tuple(page), cursor)

    # -- writes -----------------------------------------------------------------------

    def _remember(self, batch_id: str, record: StateChanged) -> None:
        self._recent[batch_id] = record
        if len(self._recent) > RECENT_BATCHES:
            self._recent.popitem(last=False)

    def _find(self, refs: frozenset[ScopeRef], batch_id: str) -> StateChanged | None:
        """The commit of ``batch_id``: remembered here, or in one of ``refs``' last stored commits."""
        found = self._recent.get(batch_id)
        if found is not None:
            return found
        store = self.manager.store
        if store is None:
            return None
        for ref in sorted(refs, key=str):
            head = store.head(ref) or 0
            for v in range(head, max(0, head - DEDUPE_WINDOW), -1):
                try:
                    rec = store.commit_record(ref, v)
                except VictorActorsError:
                    break
                if carries(rec.transitions, batch_id):
                    return StateChanged(
                        ref=ref,
                        commit_id=rec.commit_id,
                        old_version=v - 1,
                        new_version=v,
                        transitions=rec.transitions,
                        run_id=rec.run_id,
                        timestamp=rec.timestamp,
                    )
        return None

    def _run_of(self, op: Any) -> Run | None:
        run_id = op.get("run")
        if run_id is None:
            return None
        run = self._runs.get(str(run_id))
        if run is None:
            raise ScopeAccessError(
                f"run {run_id!r:.80} is not active here (it ended, was rolled back, or the owner "
                "restarted); nothing was applied"
            )
        return run

    async def _apply(self, op: Any) -> Any:
        handle = self._scope(op)
        steps = w.transitions_from(op["t"])
        batch_id = op.get("b")
        if batch_id is not None:
            batch_id = _text(batch_id, "a batch id")
            steps = tagged(steps, batch_id)
            if op.get("rt"):
                found = self._find(frozenset(handle.written_scopes(steps)), batch_id)
                if found is not None:
                    self.counters["deduplicated"] += 1
                    return w.record_to(found)
        expected = expected_of(op.get("x"))
        timeout = _seconds(op.get("to"), self.manager.request_timeout)
        run = self._run_of(op)
        if run is not None:
            CURRENT_RUN.set(run)  # this task's own context: the request carries the run's id
            RUN_ID.set(run.id)
        record: StateChanged = await handle.aapply(steps, expected_version=expected, timeout=timeout)
        if batch_id is not None:
            self._remember(batch_id, record)
        return w.record_to(record, transitions=False)  # the client has them

    async def _snapshot(self, op: Any) -> Any:
        snap = self._scope(op).snapshot()
        return w.snapshot_to(snap, self._ancestors(snap))

    def _ancestors(self, snap: ContextSnapshot) -> tuple[ScopeState, ...]:
        """The ancestors a live snapshot is served with (a Ray shard reads global from its mirror)."""
        return snap._ancestors

    # -- pessimistic transactions (transact) ------------------------------------------

    async def _tx_open(self, op: Any) -> Any:
        """Lock the scopes (``handle.transact`` on a worker thread) and answer with their snapshot.

        The worker holds the locks until ``tx_commit`` brings the client's
        batch, ``tx_abort`` comes, or the deadline passes (then nothing is
        applied): a client that dies mid-transaction cannot hold a scope.
        """
        handle = self._scope(op)
        lock = op.get("l")
        refs = None if lock is None else [parse_ref(r) for r in lock]
        timeout = _seconds(op.get("to"), self.manager.request_timeout)
        deadline = time.monotonic() + timeout
        loop = asyncio.get_running_loop()
        opened: asyncio.Future[Any] = loop.create_future()
        box: queue.SimpleQueue[tuple[StateTransition, ...] | None] = queue.SimpleQueue()

        def fn(snapshot: Any) -> tuple[StateTransition, ...]:
            loop.call_soon_threadsafe(_settle, opened, snapshot)
            try:
                steps = box.get(timeout=max(deadline - time.monotonic(), 0.001))
            except queue.Empty:
                raise DeadlineExceededError(
                    "the client sent no batch for its transaction before the deadline; nothing was applied"
                ) from None
            if steps is None:
                raise _Aborted("the client abandoned its transaction; nothing was applied")
            return steps

        work = asyncio.ensure_future(asyncio.to_thread(handle.transact, fn, lock=refs, timeout=timeout))
        await asyncio.wait({opened, work}, return_when=asyncio.FIRST_COMPLETED)
        if not opened.done():
            work.result()  # the transaction failed before fn ran: raise its error
            raise ScopeFailedError("the transaction ended before it locked anything; nothing was applied")
        txid = os.urandom(12).hex()
        self._txs[txid] = (box, work)
        snap = opened.result()
        return (txid, w.snapshot_to(snap, self._ancestors(snap)))

    def _tx(self, op: Any) -> tuple[queue.SimpleQueue[tuple[StateTransition, ...] | None], Any]:
        found = self._txs.pop(str(op.get("id")), None)
        if found is None:
            raise ScopeAccessError(
                "the transaction is unknown here: it expired at its deadline, or the owner restarted; "
                "nothing was applied"
            )
        return found

    async def _tx_commit(self, op: Any) -> Any:
        box, work = self._tx(op)
        try:
            steps = w.transitions_from(op["t"])
        except BaseException:
            box.put(None)
            raise
        box.put(steps)
        record: StateChanged = await work
        return w.record_to(record)

    async def _tx_abort(self, op: Any) -> Any:
        box, work = self._tx(op)
        box.put(None)
        try:
            await work
        except (_Aborted, VictorActorsError):
            pass
        return None

    # -- runs ---------------------------------------------------------------------------

    async def _run_begin(self, op: Any) -> Any:
        session = _text(op.get("sid"), "a run's session id")
        timeout = _seconds(op.get("to"), 30.0, "a run's timeout")
        m = self.manager
        m._kernel.check_open(GLOBAL_REF)
        run = Run(m._kernel, m._runtime.resolve, session, timeout)
        with m._kernel.lock:
            m._kernel.runs[run.id] = run
        self._runs[run.id] = run
        return run.id

    async def _run_end(self, op: Any) -> Any:
        """Finish a client's run: roll it back (``failed``) or let it stand; the report, or None."""
        run_id = str(op.get("id"))
        run = self._runs.get(run_id)
        if run is None:
            if run_id in self._ended:  # rolled back here already (its deadline passed)
                report = self._ended[run_id]
                return None if report is None else w.report_to(report)
            raise ScopeAccessError(f"run {run_id!r:.80} is unknown here (the owner restarted?)")
        if not op.get("failed"):
            self._close_run(run, None)
            run.status = "succeeded"
            self._note_ended(run.id, None)
            return None
        reason = str(op.get("reason") or "failed")[:500]
        return w.report_to(await self._roll_back(run, reason))

    async def _roll_back(self, run: Run, reason: str) -> RollbackReport:
        self._runs.pop(run.id, None)
        try:
            report = await asyncio.to_thread(run.rollback, reason)
            run.status = "rolled_back"
        finally:
            self._close_run(run, None)
        self._note_ended(run.id, report)
        return report

    def _note_ended(self, run_id: str, report: RollbackReport | None) -> None:
        """Remember how a run ended, so that a client's retried ``run_end`` gets the same answer."""
        self._ended[run_id] = report
        while len(self._ended) > 4096:
            self._ended.popitem(last=False)

    def _close_run(self, run: Run, _report: Any) -> None:
        self._runs.pop(run.id, None)
        run._close()
        kernel = self.manager._kernel
        with kernel.lock:
            kernel.runs.pop(run.id, None)

    async def _watch_runs(self) -> None:
        """Roll back runs whose client did not end them by their deadline (it went away)."""
        while True:
            await asyncio.sleep(0.25)
            now = time.monotonic()
            for run in list(self._runs.values()):
                if now > run.deadline + RUN_GRACE and run.id in self._runs:
                    self.counters["runs_abandoned"] += 1
                    try:
                        await self._roll_back(run, "its client did not finish it by its deadline")
                    except Exception:  # pragma: no cover - reported in the run's report
                        pass

    # -- events ---------------------------------------------------------------------------

    async def _poll(self, op: Any) -> Any:
        """Events after the versions given, per scope: live ones from a ring, gaps from the store's log."""
        wanted = {parse_ref(r): int(v) for r, v in op["w"]}
        for ref in wanted:
            self._watch(ref)
        out = self._events_after(wanted)
        if not out:
            event = self._commit_event
            assert event is not None
            event.clear()
            out = self._events_after(wanted)
            if not out:
                try:
                    await asyncio.wait_for(event.wait(), _seconds(op.get("wait"), 0.5, "a poll's wait"))
                except TimeoutError:
                    pass
                out = self._events_after(wanted)
        return tuple(w.record_to(e) for e in out)

    def _watch(self, ref: ScopeRef) -> None:
        if ref in self._subs:
            return
        ring: collections.deque[StateChanged] = collections.deque(maxlen=EVENT_RING)
        handle = self.handle(ref)
        loop = self._loop

        def on_commit(record: StateChanged) -> None:
            ring.append(record)
            event = self._commit_event
            if loop is not None and event is not None:
                try:
                    loop.call_soon_threadsafe(event.set)
                except RuntimeError:  # the host's loop is closed: the owner is stopping
                    pass

        self._subs[ref] = handle.subscribe(on_commit)
        self._rings[ref] = ring

    def _events_after(self, wanted: dict[ScopeRef, int]) -> list[StateChanged]:
        out: list[StateChanged] = []
        store = self.manager.store
        for ref, after in wanted.items():
            ring = list(self._rings.get(ref, ()))
            first = ring[0].new_version if ring else None
            head = store.head(ref) if store is not None else None
            top = ring[-1].new_version if ring else (head or 0)
            if store is not None and (first is None or first > after + 1):
                stop = (first - 1) if first is not None else (head or 0)
                for v in range(after + 1, min(stop, after + EVENT_RING) + 1):
                    try:
                        rec = store.commit_record(ref, v)
                    except VictorActorsError:
                        break
                    out.append(
                        StateChanged(
                            ref=ref,
                            commit_id=rec.commit_id,
                            old_version=v - 1,
                            new_version=v,
                            transitions=rec.transitions,
                            run_id=rec.run_id,
                            timestamp=rec.timestamp,
                            reset=rec.kind == "reset",
                        )
                    )
            out.extend(e for e in ring if e.new_version > after and e.new_version <= top)
        return out

    # -- checkpoints -----------------------------------------------------------------------

    async def _checkpoint(self, op: Any) -> Any:
        ref = self._scope(op).ref
        label = op.get("label")
        return await self._blocking(self.manager.save_checkpoint, ref, label=label)

    async def _compact(self, op: Any) -> Any:
        ref = self._scope(op).ref
        return await self._blocking(self.manager.compact, ref, label=op.get("label"))

    async def _checkpoints(self, op: Any) -> Any:
        ref = self._scope(op).ref
        infos = await self._blocking(self.manager.list_checkpoints, ref)
        return tuple(w.checkpoint_info_to(i) for i in infos)

    async def _load_checkpoint(self, op: Any) -> Any:
        ref = self._scope(op).ref
        snap = await self._blocking(self.manager.load_checkpoint, ref, op.get("c"))
        return w.snapshot_to(snap, snap._ancestors)

    async def _state_at(self, op: Any) -> Any:
        ref = self._scope(op).ref
        version = op.get("v")
        if isinstance(version, bool) or not isinstance(version, int):
            raise TransitionValidationError("state_at takes an int version")
        snap = await self._blocking(self.manager.state_at, ref, version)
        return w.snapshot_to(snap, snap._ancestors)

    async def _restore(self, op: Any) -> Any:
        ref = self._scope(op).ref
        timeout = _seconds(op.get("to"), self.manager.request_timeout)
        record = await self._blocking(self.manager.restore, ref, op["c"], timeout=timeout)
        return w.record_to(record)

    async def _fork(self, op: Any) -> Any:
        ref = self._scope(op).ref
        new_id = op.get("n")
        if not isinstance(new_id, str):
            raise ScopeAccessError("fork takes the new scope's id as a str; nothing was written")
        h = await self._blocking(self.manager.fork, ref, op["c"], new_id)
        self._handles.setdefault(h.ref, h)
        return self._where(h)

    async def _set_durability(self, op: Any) -> Any:
        ref = self._scope(op).ref
        await self._blocking(self.manager.set_durability, ref, str(op.get("m")))
        return None

    # -- tools ---------------------------------------------------------------------------------

    def _proxy(self, call: ToolCall) -> Any:
        """The local executor of a client-side tool (on the dispatcher's thread): hand the call to a
        client that registered the tool and wait for its answer; the dispatcher applies the result.

        Bounded: the call waits at most the tool's timeout for a client to take it
        (:class:`ToolUnavailableError`), and the tool's timeout (and a second) for the client
        that took it. A client that stops polling meanwhile (it died) loses the call to another.
        """
        tools = self._tools
        key = f"{call.scope}|{call.request_id}"
        now = time.monotonic()
        entry: dict[str, Any] = {
            "c": {
                "k": key,
                "id": call.request_id,
                "name": call.tool_name,
                "args": call.arguments,
                "scope": str(call.scope),
                "re": call.redelivery,
                "run": call.run_id,
            },
            "name": call.tool_name,
            "done": threading.Event(),
            "out": None,
            "sent": False,
            "holder": None,  # the client it was handed to
            "queued": now,  # when it became free to take
            "handed": 0.0,  # when it was handed out last
            "handouts": 0,
        }
        with tools.lock:
            tools.calls[key] = entry
        self._wake_tool_polls()
        timeout = tools.timeouts.get(call.tool_name, 30.0)
        try:
            while not entry["done"].wait(0.25):
                with tools.lock:
                    now = time.monotonic()
                    holder = entry["holder"]
                    if holder is None:
                        if now - entry["queued"] > timeout:
                            raise ToolUnavailableError(
                                f"no client that registered tool {call.tool_name!r} took call "
                                f"{call.request_id} within {timeout:g} s"
                            )
                        continue
                    gone = holder not in tools.by_client or now - tools.seen.get(holder, 0.0) > TOOL_LIVENESS
                    if now - entry["handed"] > timeout + 1.0 or (gone and entry["handouts"] >= TOOL_HANDOUTS):
                        raise TimeoutError(f"no client answered tool call {call.request_id} in time")
                    if gone:
                        tools.requeue(entry, now)
                        self.counters["tool_calls_moved"] += 1
                    else:
                        continue
                self._wake_tool_polls()
            ok, value = entry["out"]
        finally:
            with tools.lock:
                tools.calls.pop(key, None)
        if not ok:
            raise ToolExecutionError(str(value))
        return value

    def _wake_tool_polls(self) -> None:
        loop, event = self._loop, self._tool_event
        if loop is not None and event is not None:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:
                pass

    async def _register_tools(self, op: Any) -> Any:
        """A client executes these tools: ``(name, timeout)`` pairs, under its client id."""
        client = _text(op.get("cid"), "a client id")
        tools = self._tools
        new = []
        names = set()
        for name, timeout in op["t"]:
            name = _text(name, "a tool name")
            names.add(name)
            with tools.lock:
                tools.timeouts[name] = _seconds(timeout, 30.0, "a tool's timeout")
                if name not in tools.proxied:
                    tools.proxied.add(name)
                    new.append(name)
        with tools.lock:
            tools.by_client[client] = names
            tools.seen[client] = time.monotonic()
        for name in new:
            self.manager.register_tool(name, self._proxy, timeout=tools.timeouts[name])
        if new and self.manager.store is not None:
            count = await self._blocking(self.manager.resume_tools)
            self.counters["tools_redelivered"] += count
        return len(names)

    async def _tool_poll(self, op: Any) -> Any:
        """Calls for the tools this client registered, not yet handed to any client (long poll).

        Raises:
            ScopeAccessError: this client registered no tools here (this host restarted, or it
                said goodbye): it registers them again.
        """
        client = _text(op.get("cid"), "a client id")
        event = self._tool_event
        assert event is not None
        tools = self._tools
        with tools.lock:
            if client not in tools.by_client:
                raise ScopeAccessError(
                    f"client {client:.40} registered no tools at {self.name} (it restarted?); "
                    "register them again"
                )

        def fresh() -> list[Any]:
            out = []
            now = time.monotonic()
            with tools.lock:
                tools.seen[client] = now
                mine = tools.by_client.get(client, set())
                for entry in tools.calls.values():
                    if not entry["sent"] and entry["name"] in mine:
                        entry["sent"] = True
                        entry["holder"] = client
                        entry["handed"] = now
                        entry["handouts"] += 1
                        out.append(entry["c"])
            return out

        calls = fresh()
        if not calls:
            event.clear()
            calls = fresh()
            if not calls:
                try:
                    await asyncio.wait_for(event.wait(), _seconds(op.get("wait"), 0.5, "a poll's wait"))
                except TimeoutError:
                    pass
                calls = fresh()
        return tuple(calls)

    async def _tool_done(self, op: Any) -> Any:
        with self._tools.lock:
            entry = self._tools.calls.get(str(op["key"]))
            if entry is None or entry["done"].is_set():
                return False  # timed out here, answered already, or the owner restarted since
            entry["out"] = (bool(op["ok"]), op.get("v"))
            entry["done"].set()
        return True

    async def _bye(self, op: Any) -> Any:
        """A client is leaving (``close()``): its tools are forgotten and its calls in hand go to
        another client that registered them. Returns how many calls moved."""
        client = _text(op.get("cid"), "a client id")
        with self._tools.lock:
            moved = self._tools.drop_client(client, time.monotonic())
        if moved:
            self._wake_tool_polls()
        return moved

    async def _tools_state(self, op: Any) -> Any:
        t = self.manager.tools
        return {
            "unhandled": tuple((str(r), rid, name) for r, rid, name in t.unhandled),
            "dispatched": t.dispatched,
            "redelivered": t.redelivered,
            "failed": t.failed,
        }

    async def _tools_idle(self, op: Any) -> Any:
        timeout = _seconds(op.get("to"), 10.0)
        return bool(await self._blocking(self.manager.tools.wait_idle, timeout))

    async def _resume_tools(self, op: Any) -> Any:
        return int(await self._blocking(self.manager.resume_tools))

    # -- the manager ---------------------------------------------------------------------------

    async def _info(self, op: Any) -> Any:
        m = self.manager
        store = m.store
        return {
            "path": None if store is None else store.path,
            "read_only": m.read_only,
            "durability": m.durability,
            "request_timeout": m.request_timeout,
            "pid": os.getpid(),
            "instance": self.instance,
        }

    async def _stats(self, op: Any) -> Any:
        out = dict(self.manager.stats())
        out.update({f"owner_{k}": v for k, v in self.counters.items()})
        out["owner_runs"] = len(self._runs)
        return out

    async def _flush(self, op: Any) -> Any:
        await self._blocking(self.manager.flush)
        return None

    async def _quiesce(self, op: Any) -> Any:
        await self._blocking(self.manager.quiesce, _seconds(op.get("to"), 10.0))
        return None

    async def _passivate_idle(self, op: Any) -> Any:
        idle = op.get("idle")
        return int(await self._blocking(self.manager.passivate_idle, idle))

    async def _restart_scope(self, op: Any) -> Any:
        ref = self._scope(op).ref
        await self._blocking(self.manager.restart_scope, ref)
        return None

    async def _ping(self, op: Any) -> Any:
        if self.manager.closed:
            raise RuntimeClosedError(f"{self.name} is closing; nothing was applied")
        return self.instance

    async def aclose(self) -> None:
        """Stop the host's own tasks (the manager is closed by whoever opened it)."""
        if self._watchdog is not None:
            self._watchdog.cancel()
        for sub in self._subs.values():
            sub.close()
        self._subs.clear()


Host.OPS = {
    "open": Host._open,
    "scope": Host._scope_op,
    "scopes": Host._scopes,
    "apply": Host._apply,
    "snapshot": Host._snapshot,
    "run_begin": Host._run_begin,
    "run_end": Host._run_end,
    "poll": Host._poll,
    "checkpoint": Host._checkpoint,
    "checkpoints": Host._checkpoints,
    "compact": Host._compact,
    "load_checkpoint": Host._load_checkpoint,
    "state_at": Host._state_at,
    "restore": Host._restore,
    "fork": Host._fork,
    "set_durability": Host._set_durability,
    "tools": Host._register_tools,
    "tool_poll": Host._tool_poll,
    "tool_done": Host._tool_done,
    "bye": Host._bye,
    "tools_state": Host._tools_state,
    "tools_idle": Host._tools_idle,
    "resume_tools": Host._resume_tools,
    "info": Host._info,
    "stats": Host._stats,
    "flush": Host._flush,
    "quiesce": Host._quiesce,
    "passivate_idle": Host._passivate_idle,
    "restart_scope": Host._restart_scope,
    "ping": Host._ping,
    "tx_open": Host._tx_open,
    "tx_commit": Host._tx_commit,
    "tx_abort": Host._tx_abort,
}
