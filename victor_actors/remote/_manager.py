"""RemoteStateManager: ``GlobalStateManager``'s API in a process that does not own the store.

``victor_actors.connect(url)`` returns one. Every call is a request to the
owner (``victor-actors owner``, or a manager opened with ``listen=``) over
one connection per client process; the owner's scope actors do the work,
so every guarantee of the owner holds: commits are as durable, batches as
atomic, snapshots never torn, events in commit order per scope. See
``docs/deploying.md`` for how to run it and what happens when the owner
goes away.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from victor_actors._errors import DeadlineExceededError, OwnerUnavailableError, VictorActorsError
from victor_actors._model import ScopeRef
from victor_actors._rollback import RollbackReport, RunFailedError, RunTimeoutError
from victor_actors._snapshot import ContextSnapshot
from victor_actors._state import StateChanged
from victor_actors._typed import register_message_type
from victor_actors._values import check_text
from victor_actors.remote import _wire as w
from victor_actors.remote._client import Client
from victor_actors.remote._frames import read_token
from victor_actors.remote._handle import CURRENT_REMOTE_RUN, RemoteRun, RemoteScopeHandle
from victor_actors.remote._transport import SocketTransport, Transport
from victor_actors.store import CheckpointInfo

__all__ = ["RemoteStateManager", "RemoteTools", "connect"]

# Operations that may wait at the owner (a lock, a flush, a quiesce): each goes in a call of its own,
# so it never holds a lane's slot that the hot path (apply, snapshot) needs.
_SLOW = frozenset(
    {
        "tx_open",
        "tx_commit",
        "tx_abort",
        "run_begin",
        "run_end",
        "quiesce",
        "tools_idle",
        "resume_tools",
        "flush",
        "fork",
        "restore",
        "checkpoint",
        "checkpoints",
        "compact",
        "load_checkpoint",
        "state_at",
        "scopes",
        "passivate_idle",
        "restart_scope",
        "set_durability",
    }
)


def _id(value: Any, what: str = "a scope id") -> str:
    if value.__class__ is not str or not value or check_text(value, "") is not None:
        raise VictorActorsError(f"{what} must be a non-empty str that UTF-8 can encode, not {value!r:.80}")
    return str(value)


def _opt(value: Any, what: str) -> str | None:
    return None if value is None else _id(value, what)


class RemoteTools:
    """``client.tools``: the owner's tool dispatcher, seen from a client."""

    def __init__(self, manager: RemoteStateManager) -> None:
        self._manager = manager

    def register(self, name: str, fn: Callable[..., Any], *, timeout: float = 30.0) -> None:
        """Execute requests for tool ``name`` in this process (see ``RemoteStateManager.register_tool``)."""
        self._manager.register_tool(name, fn, timeout=timeout)

    def _state(self) -> dict[str, Any]:
        m = self._manager
        return dict(m._sync(m._ask(0, {"k": "tools_state"}, None)))

    @property
    def unhandled(self) -> list[tuple[ScopeRef, str, str]]:
        """Requests no executor is registered for, at the owner: (scope, request id, tool)."""
        return [(ScopeRef.parse(r), str(rid), str(n)) for r, rid, n in self._state()["unhandled"]]

    @property
    def dispatched(self) -> int:
        return int(self._state()["dispatched"])

    @property
    def redelivered(self) -> int:
        return int(self._state()["redelivered"])

    @property
    def failed(self) -> int:
        return int(self._state()["failed"])

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Whether the owner's executors (this client's tools included) went idle within ``timeout``."""
        m = self._manager
        return bool(m._sync(m._ask(0, {"k": "tools_idle", "to": timeout}, timeout + 5)))

    async def await_idle(self, timeout: float = 10.0) -> bool:
        m = self._manager
        return bool(await m._ask(0, {"k": "tools_idle", "to": timeout}, timeout + 5))


class RemoteStateManager(Client):
    """The local manager's API, served by the process that owns the store (see the module's docs).

    Made by :func:`connect`. Thread-safe; every blocking call has an
    ``a``-prefixed twin. Requests that cannot reach the owner before their
    deadline raise :class:`OwnerUnavailableError`, which says whether the
    request may have been applied; the client reconnects by itself when an
    owner is back, and a write it sent again for you is applied at most once.
    """

    BYPASS = _SLOW

    def __init__(
        self, url: str, *, token: bytes | None, request_timeout: float, connect_timeout: float
    ) -> None:
        self.url = url
        self._token = token
        self._connect_timeout = connect_timeout
        self._addresses: dict[tuple[Any, ...], RemoteScopeHandle] = {}
        super().__init__(self._transports_for, request_timeout)
        self.tools = RemoteTools(self)
        self._info: dict[str, Any] = {}

    def _transports_for(self) -> list[Transport]:
        return [
            SocketTransport(
                self.url, token=self._token, client_id=self.client_id, connect_timeout=self._connect_timeout
            )
        ]

    def __enter__(self) -> RemoteStateManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<RemoteStateManager {self.url}{' closed' if self.closed else ''}>"

    # -- the owner --------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        """The owner's account of itself: ``path``, ``pid``, ``instance``, ``durability``, ``read_only``."""
        self._info = dict(self._sync(self._ask(0, {"k": "info"}, None)))
        return dict(self._info)

    async def ainfo(self) -> dict[str, Any]:
        self._info = dict(await self._ask(0, {"k": "info"}, None))
        return dict(self._info)

    @property
    def read_only(self) -> bool:
        return bool((self._info or self.info()).get("read_only"))

    @property
    def durability(self) -> str:
        return str((self._info or self.info()).get("durability"))

    @property
    def store(self) -> None:
        """None: the store is the owner's; a client never opens it (see ``info()['path']``)."""
        return None

    def ping(self, timeout: float = 5.0) -> str:
        """The owner's instance id, once it answers (a readiness probe).

        Raises:
            OwnerUnavailableError: no owner answered within ``timeout``.
        """
        return str(self._sync(self._ask(0, {"k": "ping"}, timeout)))

    async def aping(self, timeout: float = 5.0) -> str:
        return str(await self._ask(0, {"k": "ping"}, timeout))

    # -- scopes -----------------------------------------------------------------

    def _handle_from(self, where: Any) -> RemoteScopeHandle:
        ref, lineage = where
        return RemoteScopeHandle(self, ScopeRef.parse(ref), tuple(ScopeRef.parse(r) for r in lineage))

    async def _aopen(
        self, address: tuple[str, str, str | None, str | None], create: bool
    ) -> RemoteScopeHandle:
        key = (*address, create)
        h = self._addresses.get(key)
        if h is None:
            h = self._handle_from(await self._ask(0, {"k": "open", "a": address, "c": create}, None))
            if len(self._addresses) > 100_000:
                self._addresses.clear()
            self._addresses[key] = h
        return h

    def _open(self, address: tuple[str, str, str | None, str | None], create: bool) -> RemoteScopeHandle:
        h = self._addresses.get((*address, create))
        return h if h is not None else self._sync(self._aopen(address, create))

    def get_global_state(self) -> RemoteScopeHandle:
        """The application-wide scope."""
        return self._open(("global", "global", None, None), True)

    def get_team_state(self, team_id: str, *, create: bool = True) -> RemoteScopeHandle:
        """A team's scope (under global), created on first use unless ``create=False``."""
        return self._open(("team", _id(team_id), None, None), create)

    def get_workflow_state(
        self, workflow_id: str, team_id: str | None = None, *, create: bool = True
    ) -> RemoteScopeHandle:
        """A workflow's scope, under ``team_id``'s team or, without one, wherever it lives (or global)."""
        return self._open(("workflow", _id(workflow_id), None, _opt(team_id, "a team id")), create)

    def get_conversation_state(
        self,
        session_id: str,
        workflow_id: str | None = None,
        team_id: str | None = None,
        *,
        create: bool = True,
    ) -> RemoteScopeHandle:
        """One agent's conversation, as ``GlobalStateManager.get_conversation_state``."""
        return self._open(
            (
                "conversation",
                _id(session_id),
                _opt(workflow_id, "a workflow id"),
                _opt(team_id, "a team id"),
            ),
            create,
        )

    async def aget_global_state(self) -> RemoteScopeHandle:
        return await self._aopen(("global", "global", None, None), True)

    async def aget_team_state(self, team_id: str, *, create: bool = True) -> RemoteScopeHandle:
        return await self._aopen(("team", _id(team_id), None, None), create)

    async def aget_workflow_state(
        self, workflow_id: str, team_id: str | None = None, *, create: bool = True
    ) -> RemoteScopeHandle:
        return await self._aopen(("workflow", _id(workflow_id), None, _opt(team_id, "a team id")), create)

    async def aget_conversation_state(
        self,
        session_id: str,
        workflow_id: str | None = None,
        team_id: str | None = None,
        *,
        create: bool = True,
    ) -> RemoteScopeHandle:
        address = (
            "conversation",
            _id(session_id),
            _opt(workflow_id, "a workflow id"),
            _opt(team_id, "a team id"),
        )
        return await self._aopen(address, create)

    def _ref(self, ref: ScopeRef | str | RemoteScopeHandle) -> ScopeRef:
        if isinstance(ref, RemoteScopeHandle):
            return ref.ref
        if isinstance(ref, str):
            return ScopeRef.parse(ref)
        if isinstance(ref, ScopeRef):
            return ref
        raise TypeError(f"a scope is named by a ScopeRef, a str or a handle, not {type(ref).__name__}")

    def scope(self, ref: ScopeRef | str) -> RemoteScopeHandle:
        """The handle of an existing scope.

        Raises:
            ScopeAccessError: no such scope exists.
        """
        return self._handle_from(self._sync(self._ask(0, {"k": "scope", "s": str(self._ref(ref))}, None)))

    def scopes(self) -> Iterator[ScopeRef]:
        """Every scope instance the owner holds, a page at a time (nothing is loaded)."""
        cursor: Any = None
        while True:
            op: dict[str, Any] = {"k": "scopes", "n": 1000}
            if cursor is not None:
                op["cur"] = cursor
            page, cursor = self._sync(self._ask(0, op, None))
            for ref in page:
                yield ScopeRef.parse(ref)
            if cursor is None:
                return

    # -- durability and checkpoints ------------------------------------------------

    def _call(self, op: dict[str, Any], timeout: float | None = None) -> Any:
        return self._sync(self._ask(0, op, timeout))

    def flush(self) -> None:
        """Return once every commit the owner made so far is durable (for ``async`` mode)."""
        self._call({"k": "flush"})

    async def aflush(self) -> None:
        await self._ask(0, {"k": "flush"}, None)

    def set_durability(self, scope_ref: ScopeRef | str, mode: str) -> None:
        self._call({"k": "set_durability", "s": str(self._ref(scope_ref)), "m": mode})

    def save_checkpoint(self, scope_ref: ScopeRef | str, *, label: str | None = None) -> str:
        """Write a checkpoint of the scope's committed state (at the owner); return its id."""
        return str(self._call({"k": "checkpoint", "s": str(self._ref(scope_ref)), "label": label}))

    async def asave_checkpoint(self, scope_ref: ScopeRef | str, *, label: str | None = None) -> str:
        return str(
            await self._ask(0, {"k": "checkpoint", "s": str(self._ref(scope_ref)), "label": label}, None)
        )

    def compact(self, scope_ref: ScopeRef | str, *, label: str | None = None) -> str:
        """Make the scope's committed state its only stored base, as ``GlobalStateManager.compact``."""
        return str(self._call({"k": "compact", "s": str(self._ref(scope_ref)), "label": label}))

    async def acompact(self, scope_ref: ScopeRef | str, *, label: str | None = None) -> str:
        return str(await self._ask(0, {"k": "compact", "s": str(self._ref(scope_ref)), "label": label}, None))

    def list_checkpoints(self, scope_ref: ScopeRef | str) -> list[CheckpointInfo]:
        """The scope's stored checkpoints, newest first."""
        rows = self._call({"k": "checkpoints", "s": str(self._ref(scope_ref))})
        return [w.checkpoint_info_from(r) for r in rows]

    async def alist_checkpoints(self, scope_ref: ScopeRef | str) -> list[CheckpointInfo]:
        rows = await self._ask(0, {"k": "checkpoints", "s": str(self._ref(scope_ref))}, None)
        return [w.checkpoint_info_from(r) for r in rows]

    def load_checkpoint(self, scope_ref: ScopeRef | str, checkpoint_id: str | None = None) -> ContextSnapshot:
        """The stored state of a checkpoint (the newest if no id) as a snapshot."""
        op = {"k": "load_checkpoint", "s": str(self._ref(scope_ref)), "c": checkpoint_id}
        return w.snapshot_from(self._call(op))

    async def aload_checkpoint(
        self, scope_ref: ScopeRef | str, checkpoint_id: str | None = None
    ) -> ContextSnapshot:
        op = {"k": "load_checkpoint", "s": str(self._ref(scope_ref)), "c": checkpoint_id}
        return w.snapshot_from(await self._ask(0, op, None))

    def state_at(self, scope_ref: ScopeRef | str, version: int) -> ContextSnapshot:
        """The scope as it was at ``version``."""
        return w.snapshot_from(self._call({"k": "state_at", "s": str(self._ref(scope_ref)), "v": version}))

    async def astate_at(self, scope_ref: ScopeRef | str, version: int) -> ContextSnapshot:
        op = {"k": "state_at", "s": str(self._ref(scope_ref)), "v": version}
        return w.snapshot_from(await self._ask(0, op, None))

    def restore(
        self, scope_ref: ScopeRef | str, checkpoint: str | int, *, timeout: float | None = None
    ) -> StateChanged:
        """Return the scope to a checkpoint (by id) or a version, as a new commit."""
        return self._sync(self.arestore(scope_ref, checkpoint, timeout=timeout))

    async def arestore(
        self, scope_ref: ScopeRef | str, checkpoint: str | int, *, timeout: float | None = None
    ) -> StateChanged:
        if isinstance(checkpoint, bool) or not isinstance(checkpoint, (str, int)):
            raise TypeError("checkpoint is a checkpoint id (str) or a version (int)")
        op = {"k": "restore", "s": str(self._ref(scope_ref)), "c": checkpoint}
        return w.record_from(await self._ask(0, op, timeout))

    def fork(self, scope_ref: ScopeRef | str, checkpoint: str | int, new_id: str) -> RemoteScopeHandle:
        """Start a new scope ``new_id`` from a checkpoint or version, as ``GlobalStateManager.fork``."""
        return self._sync(self.afork(scope_ref, checkpoint, new_id))

    async def afork(self, scope_ref: ScopeRef | str, checkpoint: str | int, new_id: str) -> RemoteScopeHandle:
        if isinstance(checkpoint, bool) or not isinstance(checkpoint, (str, int)):
            raise TypeError("checkpoint is a checkpoint id (str) or a version (int)")
        op = {"k": "fork", "s": str(self._ref(scope_ref)), "c": checkpoint, "n": _id(new_id, "the fork's id")}
        return self._handle_from(await self._ask(0, op, None))

    # -- scale, stats ------------------------------------------------------------------

    def passivate_idle(self, idle_for: float | None = None) -> int:
        return int(self._call({"k": "passivate_idle", "idle": idle_for}))

    def quiesce(self, timeout: float = 10.0) -> None:
        """Return once the owner is quiet (see ``GlobalStateManager.quiesce``)."""
        self._call({"k": "quiesce", "to": timeout}, timeout + 5)

    async def aquiesce(self, timeout: float = 10.0) -> None:
        await self._ask(0, {"k": "quiesce", "to": timeout}, timeout + 5)

    def restart_scope(self, ref: ScopeRef | str, *, timeout: float | None = None) -> None:
        self._call({"k": "restart_scope", "s": str(self._ref(ref))}, timeout)

    def stats(self) -> dict[str, int]:
        """The owner's counters, and this client's own (``client_retries``, ``client_calls``)."""
        return self._sync(self.astats())

    async def astats(self) -> dict[str, int]:
        out = dict(await self._ask(0, {"k": "stats"}, None))
        out.update({f"client_{k}": v for k, v in self.counters.items()})
        out["client_calls"] = sum(lane.calls for lane in self._lanes)
        return out

    # -- tools -----------------------------------------------------------------------------

    def register_tool(self, name: str, fn: Callable[..., Any], *, timeout: float = 30.0) -> None:
        """Execute committed EXECUTE_TOOL requests for ``name`` in this process, with ``fn(call)``.

        The owner hands each request for ``name`` to a client that
        registered it (long poll); the result comes back as a TOOL_RESULT in
        the requesting scope, applied at most once. A request pending when
        the owner restarts is delivered again (``redelivery=True``, same
        idempotency key).
        """
        self._register_tool(name, fn, timeout)

    def register_message_type(self, cls: type, *, tag: str | None = None) -> str:
        """Let ``cls`` (an attrs class or a dataclass) come back as itself in this process (see
        ``GlobalStateManager.register_message_type``; the registry is the process's). Returns the tag."""
        return register_message_type(cls, tag=tag)

    def resume_tools(self) -> int:
        """Have the owner dispatch every pending tool request again; return how many."""
        return int(self._call({"k": "resume_tools"}, max(self.request_timeout, 60.0)))

    async def aresume_tools(self) -> int:
        return int(await self._ask(0, {"k": "resume_tools"}, max(self.request_timeout, 60.0)))

    # -- transactions (the handle's transact) -----------------------------------------------

    def _blocking(self, kind: str, op: dict[str, Any], timeout: float | None) -> Any:
        return self._sync(self._atx(kind, op, timeout))

    async def _atx(self, kind: str, op: dict[str, Any], timeout: float | None) -> Any:
        return await self._ask(0, {"k": kind, **op}, timeout)

    # -- runs -------------------------------------------------------------------------------

    @contextmanager
    def run(self, session_id: str, timeout: float = 30.0) -> Iterator[RemoteRun]:
        """``with client.run(session_id, timeout=30.0) as run:``: one agent operation, hosted by the owner.

        As ``GlobalStateManager.run``: every write inside carries the run's
        id; if the block raises or outlives ``timeout``, the owner rolls back
        the run's own writes in every scope it touched and this raises
        :class:`RunFailedError` (or :class:`RunTimeoutError`) with the
        ``rollback_report``. If this process dies inside the block, the owner
        rolls the run back once its deadline has passed.
        """
        run = self._sync(self._begin(session_id, timeout))
        token = CURRENT_REMOTE_RUN.set(run)
        try:
            yield run
        except BaseException as exc:
            CURRENT_REMOTE_RUN.reset(token)
            self._sync(self._finish(run, exc))
            raise
        CURRENT_REMOTE_RUN.reset(token)
        self._sync(self._finish(run, None))

    @asynccontextmanager
    async def arun(self, session_id: str, timeout: float = 30.0) -> AsyncIterator[RemoteRun]:
        """The asyncio twin of :meth:`run`; the body is also cancelled at the timeout."""
        run = await self._begin(session_id, timeout)
        token = CURRENT_REMOTE_RUN.set(run)
        try:
            async with asyncio.timeout(timeout):
                yield run
        except BaseException as exc:
            CURRENT_REMOTE_RUN.reset(token)
            await self._finish(run, exc)
            raise
        CURRENT_REMOTE_RUN.reset(token)
        await self._finish(run, None)

    async def _begin(self, session_id: str, timeout: float) -> RemoteRun:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValueError(f"a run's timeout must be a positive number, not {timeout!r}")
        session = _id(session_id, "a run's session id")
        run_id = await self._ask(0, {"k": "run_begin", "sid": session, "to": float(timeout)}, None)
        return RemoteRun(str(run_id), session, float(timeout))

    async def _finish(self, run: RemoteRun, exc: BaseException | None) -> None:
        timed_out = run.remaining <= 0 or isinstance(exc, TimeoutError)
        if exc is None and not timed_out:
            await self._ask(0, {"k": "run_end", "id": run.id, "failed": False}, None)
            run.status = "succeeded"
            return
        reason = "timed out" if timed_out and exc is None else f"{type(exc).__name__}: {exc}"
        raw = await self._ask(0, {"k": "run_end", "id": run.id, "failed": True, "reason": reason}, None)
        report = w.report_from(raw) if raw is not None else RollbackReport(run.id, reason, ())
        run.rollback_report = report
        run.status = "rolled_back"
        note = ""
        if report.conflicts:
            note = "; left as another writer changed them: " + "; ".join(report.conflicts)
        if (
            exc is None
            or isinstance(exc, TimeoutError)
            or (timed_out and isinstance(exc, DeadlineExceededError))
        ):
            err = RunTimeoutError(
                f"run {run.id} exceeded its timeout of {run.timeout} s; its writes were rolled back{note}",
                run_id=run.id,
                rollback_report=report,
            )
            raise err from exc
        if not isinstance(exc, Exception):
            return  # cancellation, KeyboardInterrupt, SystemExit: propagate as they are
        raise RunFailedError(
            f"run {run.id} failed ({type(exc).__name__}: {exc}); its writes were rolled back{note}",
            error=exc,
            run_id=run.id,
            rollback_report=report,
        ) from exc

    # -- closing -------------------------------------------------------------------------------

    def close(self) -> None:
        """Close this client's connection and threads (the owner and its scopes carry on). Idempotent."""
        self._close_client()


def connect(
    url: str,
    *,
    token_file: str | os.PathLike[str] | None = None,
    request_timeout: float = 30.0,
    connect_timeout: float = 5.0,
    wait: float = 0.0,
) -> RemoteStateManager:
    """A client of the owner at ``url`` (``unix:///path/to/socket`` or ``tcp://host:port``).

    ``token_file`` holds the owner's shared token (needed for TCP beyond
    this machine). ``wait`` seconds: keep trying until an owner answers
    (a pod starting beside its owner); 0 connects lazily, on the first call.

    Raises:
        TransitionValidationError: ``url`` is not an owner's URL.
        ScopeAccessError: the token file is unreadable, or the owner refused the token.
        OwnerUnavailableError: ``wait`` was given and no owner answered in time.
    """
    if (
        isinstance(request_timeout, bool)
        or not isinstance(request_timeout, (int, float))
        or request_timeout <= 0
    ):
        raise ValueError(f"request_timeout must be a positive number of seconds, not {request_timeout!r}")
    SocketTransport(url, token=None, client_id="", connect_timeout=connect_timeout)  # checks the URL first
    client = RemoteStateManager(
        url,
        token=read_token(token_file),
        request_timeout=float(request_timeout),
        connect_timeout=connect_timeout,
    )
    if wait > 0:
        end = time.monotonic() + wait
        while True:
            try:
                client.ping(timeout=max(min(end - time.monotonic(), 5.0), 0.1))
                break
            except VictorActorsError as exc:
                if time.monotonic() >= end or not _transient(exc):
                    client.close()
                    raise
                time.sleep(0.1)  # polling another process's start-up; nothing is ordered by it
    return client


def _transient(exc: VictorActorsError) -> bool:
    return isinstance(exc, (OwnerUnavailableError, DeadlineExceededError))
