"""GlobalStateManager: the facade orchestrators use to reach scope actors.

A thin facade over the runtime (``_runtime.py``): it turns the user's calls
into lookups in the scope tree, requests to the kernel and calls on the
services, and hands out :class:`ScopeHandle` objects. The handle and the
manager are the only two modules that know each other.
"""

from __future__ import annotations

import asyncio
import atexit
import importlib
import os
import threading
import warnings
import weakref
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping
from typing import Any, ClassVar, Unpack, overload

from victor_actors import _clock
from victor_actors._cell import Observer, ScopeCell
from victor_actors._errors import ScopeAccessError, VictorActorsError
from victor_actors._events import Subscription
from victor_actors._handle import ScopeHandle
from victor_actors._level_checkpoints import NO_STATE, ScopeDict, is_level_form, ref_to_load, ref_to_save
from victor_actors._memory_checkpoints import MemoryCheckpoints
from victor_actors._messages import ApplyRequest, RestartRequest
from victor_actors._model import GLOBAL_REF, ScopeRef, StateScope, TransitionBatch
from victor_actors._options import OptionArgs, Options, Strategy
from victor_actors._runs import Run, RunContext
from victor_actors._runtime import Runtime
from victor_actors._snapshot import ContextSnapshot
from victor_actors._state import StateChanged
from victor_actors._supervision import SupervisionEvent, SupervisionPolicy
from victor_actors._tools import ToolDispatcher
from victor_actors._typed import register_message_type
from victor_actors._validation import Rule, Validators
from victor_actors.store import CheckpointInfo, Codec, Keyring, RecoveryReport, Store, encrypt_in_place

__all__ = ["STORE_ENV", "GlobalStateManager"]

# Where GlobalStateManager.get_instance() keeps its store when configure() was not called.
STORE_ENV = "VICTOR_ACTORS_STORE"
# open()'s own keyword arguments (the rest are Options): what configure() may pass on.
_OPEN_ARGS = frozenset(
    {
        "read_only",
        "flush_interval",
        "codec",
        "map_size",
        "supervision",
        "encryption",
        "encryption_migrate",
        "lock_timeout",
        "listen",
        "token_file",
        "message_types",
        "validators",
    }
)

_open_managers: weakref.WeakSet[GlobalStateManager] = weakref.WeakSet()


class GlobalStateManager:
    """One entry point for every scope: global, teams, workflows, conversations.

    Each scope instance is owned by one actor, created on first use under
    its parent (a team under global; a workflow under a team or global; a
    conversation under a workflow, a team or global). Handles returned by
    the ``get_*_state`` methods talk to those actors.

    Options (``request_timeout``, ``durability``, ``checkpoint_every``,
    ``keep_checkpoints``, ``idle_timeout``, ``max_live_actors``,
    ``mailbox_size``, ``backpressure``) are described on
    :class:`victor_actors.lowlevel.Options`; a value out of range raises
    ``ValueError`` and an unknown name ``TypeError``, before anything starts.

    The manager's threads are daemon threads and an exit hook closes any
    manager left open, so a program that never calls :meth:`close` still
    exits cleanly. :meth:`close` is idempotent.
    """

    _default: ClassVar[GlobalStateManager | None] = None
    _default_lock: ClassVar[threading.Lock] = threading.Lock()
    _configured: ClassVar[tuple[str | os.PathLike[str] | None, dict[str, Any]] | None] = None

    def __init__(
        self,
        *,
        store: Store | None = None,
        supervision: SupervisionPolicy | None = None,
        message_types: Iterable[type] = (),
        validators: Mapping[StateScope | str, Rule] | None = None,
        **options: Unpack[OptionArgs],
    ) -> None:
        self.options = Options.of(dict(options))
        checks = Validators.of(validators)
        for message_type in message_types:
            register_message_type(message_type)
        self._runtime = Runtime(self.options, store, supervision=supervision, apply_result=self._apply_result)
        self._kernel = self._runtime.kernel
        self._kernel.validate = checks.check if checks else None
        self._memory = MemoryCheckpoints(self.options.keep_checkpoints) if store is None else None
        self._tree = self._runtime.tree
        self._durability = self._runtime.durability
        self._server: Any = None  # the listener of open(listen=...), if any
        _open_managers.add(self)
        self._tree.ensure(GLOBAL_REF, None)

    # -- construction -----------------------------------------------------

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str] | None = None,
        *,
        read_only: bool = False,
        flush_interval: float = 0.05,
        codec: Codec | None = None,
        map_size: int = 256 * 1024 * 1024,
        supervision: SupervisionPolicy | None = None,
        encryption: Keyring | None = None,
        encryption_migrate: bool = False,
        lock_timeout: float = 0.0,
        listen: str | list[str] | None = None,
        token_file: str | os.PathLike[str] | None = None,
        message_types: Iterable[type] = (),
        validators: Mapping[StateScope | str, Rule] | None = None,
        **options: Unpack[OptionArgs],
    ) -> GlobalStateManager:
        """Open a manager: in memory (``path=None``) or on an LMDB store at ``path``.

        With a store, every scope found there is restored lazily, at its
        last durable version, on first access. ``durability`` is ``"sync"``
        (apply returns once the commit is durable; commits from many scopes
        share LMDB transactions), ``"async"`` (apply returns at once; commits
        reach LMDB within ``flush_interval`` seconds; ``close()`` flushes) or
        ``"manual"`` (only explicit checkpoints are written). A full
        checkpoint is written every ``checkpoint_every`` commits, and the
        newest ``keep_checkpoints`` are kept with the log from the oldest kept
        one on.

        Scale (see ``docs/scale.md``): ``idle_timeout`` passivates scopes idle
        that long, ``max_live_actors`` caps live actor threads (least recently
        used scopes are passivated first), ``mailbox_size`` bounds each
        scope's mailbox, and past it a request waits until its deadline
        (``backpressure="wait"``) or is refused at once (``"reject"``) with
        :class:`BackpressureError`.

        Encryption at rest (see ``docs/security.md``): with ``encryption`` (a
        :class:`Keyring`) every record is sealed with AES-256-GCM and no key of
        the store holds a scope id. An encrypted store opens only with the
        keys it was written with; a plaintext store opened with a keyring is
        refused unless ``encryption_migrate=True``, which first encrypts it
        (crash-safe: a rewrite swapped in by renames).

        Other processes (see ``docs/deploying.md``): ``lock_timeout`` waits
        that many seconds for another process to let go of the store (a
        rolling update) before :class:`StoreLockedError`. ``listen``
        (``"unix:///path/to/socket"`` or ``"tcp://host:port"``, or a list)
        also serves this manager's scopes to other processes, which reach
        them with ``victor_actors.connect(url)``; ``token_file`` holds the
        token they must present (required for TCP beyond this machine).

        The application's own types (``docs/state-passed.md``):
        ``message_types`` registers message classes (attrs classes and
        dataclasses) that come back as themselves from snapshots, after a
        reopen too (see :meth:`register_message_type`). ``validators``
        declares what state may hold, per level (``StateScope.TEAM: rule``)
        or per key (``"plan_steps": rule``); a rule is a callable that raises
        on a bad value, or an attrs class the value must convert to. A batch
        that breaks a rule is refused at the edge with
        :class:`TransitionValidationError`, nothing applied.

        Raises:
            StoreLockedError: another live manager owns ``path`` for writing
                (for all of ``lock_timeout``).
            EncryptionKeyError: the keys do not fit the store; nothing was opened.
            ValueError: an option is out of range; nothing was opened.
            TypeError: an option has an unknown name; nothing was opened.
        """
        opts = Options.of(dict(options))  # refuse bad options before the store is touched
        Validators.of(validators)
        message_types = tuple(message_types)
        for message_type in message_types:
            register_message_type(message_type)
        if isinstance(lock_timeout, bool) or not isinstance(lock_timeout, (int, float)) or lock_timeout < 0:
            raise ValueError(f"lock_timeout must be a number of seconds >= 0, not {lock_timeout!r}")
        if listen is not None and read_only:
            raise ValueError("listen needs a manager that owns its store (not read_only)")
        if path is None:
            if read_only:
                raise ValueError("read_only needs a path")
            if encryption is not None:
                raise ValueError("encryption needs a path: an in-memory manager stores nothing")
            return cls(
                supervision=supervision, message_types=message_types, validators=validators, **options
            )._listen(listen, token_file)
        if encryption_migrate:
            if encryption is None or read_only:
                raise ValueError("encryption_migrate needs a keyring and a writable store")
            encrypt_in_place(path, encryption, codec=codec, map_size=map_size)
        store = Store(
            path,
            read_only=read_only,
            codec=codec,
            map_size=map_size,
            flush_interval=flush_interval,
            encryption=encryption,
            lock_timeout=float(lock_timeout),
            wal=opts.wal,
        )
        try:
            manager = cls(
                store=store,
                supervision=supervision,
                message_types=message_types,
                validators=validators,
                **options,
            )
        except BaseException:
            store.close()
            raise
        return manager._listen(listen, token_file)

    def _listen(
        self, listen: str | list[str] | None, token_file: str | os.PathLike[str] | None
    ) -> GlobalStateManager:
        """Serve this manager to other processes (``open(listen=...)``); closed with the manager."""
        if listen is None:
            if token_file is not None:
                self.close()
                raise ValueError("token_file is for listen=; nothing was opened")
            return self
        try:
            # The server sits on top of the facade: found by name at call time, as the inspector
            # is (docs/adr/0013, 0021), never imported by this module.
            remote = importlib.import_module("victor_actors.remote")
            self._server = remote.serve(self, listen, token=remote.read_token(token_file))
        except BaseException:
            self.close()
            raise
        return self

    @classmethod
    def get_instance(cls) -> GlobalStateManager:
        """The process-wide default manager, created on first use (again after it was closed).

        With no configuration it is in memory, and keeps its checkpoints in
        memory, so ADR-002's example runs as written. :meth:`configure`
        (called first) or the environment variable ``VICTOR_ACTORS_STORE``
        (a path) puts it on an LMDB store instead.

        Raises:
            The errors of :meth:`open` for a configured store (nothing is kept).
        """
        with cls._default_lock:
            if cls._default is None or cls._default.closed:
                path, options = cls._configured or (os.environ.get(STORE_ENV) or None, {})
                cls._default = cls.open(path, **options)
            return cls._default

    @classmethod
    def configure(cls, path: str | os.PathLike[str] | None = None, **options: Any) -> None:
        """Set where (and with what options of :meth:`open`) :meth:`get_instance` opens its manager.

        Call it before the first ``get_instance()``; it overrides
        ``VICTOR_ACTORS_STORE``. ``configure()`` with no path goes back to an
        in-memory default.

        Raises:
            VictorActorsError: the default manager is already open (close it
                first); nothing changed.
            TypeError, ValueError: an option is unknown or out of range;
                nothing changed.
        """
        Options.of({k: v for k, v in options.items() if k not in _OPEN_ARGS})
        Validators.of(options.get("validators"))
        with cls._default_lock:
            if cls._default is not None and not cls._default.closed:
                raise VictorActorsError(
                    f"the default manager is already open ({cls._default!r}); configure() applies to the "
                    "next get_instance() after it is closed; nothing changed"
                )
            cls._configured = (path, dict(options))

    def __enter__(self) -> GlobalStateManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        store = self._kernel.store
        where = "in memory" if store is None else repr(store.path)
        return (
            f"<GlobalStateManager {where} {len(self._kernel.cells)} scopes{' closed' if self.closed else ''}>"
        )

    @property
    def closed(self) -> bool:
        return self._kernel.closed

    def close(self, timeout: float = 5.0) -> None:
        """Stop every scope actor and the event thread, flush the store. Idempotent.

        Requests already in a mailbox are answered first; later requests
        raise :class:`RuntimeClosedError`. A manager opened with ``listen=``
        first stops listening and lets the clients' requests in progress
        finish.
        """
        server, self._server = self._server, None
        if server is not None and not self._kernel.forked:
            server.close(drain=timeout)
        self._runtime.close(timeout)
        _open_managers.discard(self)

    @property
    def listening(self) -> list[str]:
        """The URLs this manager serves other processes at (``open(listen=...)``; a TCP port 0 resolved)."""
        server = self._server
        return [] if server is None else list(server.urls)

    @property
    def store(self) -> Store | None:
        """The LMDB store, or None for an in-memory manager."""
        return self._kernel.store

    @property
    def read_only(self) -> bool:
        return self._kernel.read_only

    @property
    def request_timeout(self) -> float:
        return self.options.request_timeout

    @property
    def durability(self) -> str:
        """``"sync"``, ``"async"`` or ``"manual"`` with a store; ``"memory"`` without one."""
        return self._kernel.durability

    @property
    def recovery_reports(self) -> list[RecoveryReport]:
        """What recovery skipped when restoring scopes (one report per scope that was not clean)."""
        return self._tree.recovery_reports

    @property
    def tools(self) -> ToolDispatcher:
        """The tool outbox's dispatcher: ``wait_idle()``, ``unhandled``, counters."""
        return self._runtime.tools

    def register_message_type(self, cls: type, *, tag: str | None = None) -> str:
        """Let instances of ``cls`` (an attrs class or a dataclass) be stored and come back as ``cls``.

        They are stored as their fields under ``tag`` (default
        ``"<module>.<qualname>"``) and revived from snapshots (messages and
        key-value state), from checkpoints and after a reopen; a process
        that did not register the tag reads them as read-only mappings. The
        registry is the process's (as for ``register_converter``): a value is
        frozen when its transition is made. Returns the tag.

        Raises:
            TypeError: ``cls`` is neither an attrs class nor a dataclass.
            ValueError: the tag is another class's; nothing was registered.
        """
        return register_message_type(cls, tag=tag)

    # -- scopes -----------------------------------------------------------

    def _handle(self, cell: ScopeCell) -> ScopeHandle:
        handle = cell.handle
        if handle is None:
            handle = cell.handle = ScopeHandle(self._kernel, cell)
        return handle  # type: ignore[no-any-return]

    def _cell(self, ref: ScopeRef | str) -> ScopeCell:
        if isinstance(ref, str):
            ref = ScopeRef.parse(ref)
        return self._runtime.resolve(ref)

    def get_global_state(self) -> ScopeHandle:
        """The application-wide scope."""
        return self._handle(self._tree.ensure(GLOBAL_REF, None))

    def get_team_state(self, team_id: str, *, create: bool = True) -> ScopeHandle:
        """The scope shared by a team's agents (under global), created on first use.

        Raises:
            ScopeAccessError: the team does not exist and ``create`` is False.
        """
        return self._handle(self._tree.ensure(ScopeRef(StateScope.TEAM, team_id), GLOBAL_REF, create=create))

    def get_workflow_state(
        self, workflow_id: str, team_id: str | None = None, *, create: bool = True
    ) -> ScopeHandle:
        """A workflow's scope, under ``team_id``'s team or, without one, under global.

        Without ``team_id`` an existing workflow is returned wherever it
        lives, and a new one is created under global. With ``create=False``
        nothing is created: a workflow (or team) that does not exist is a
        :class:`ScopeAccessError`, so a mistyped id cannot start a new one.
        """
        ref = ScopeRef(StateScope.WORKFLOW, workflow_id)
        if team_id is None:
            return self._handle(self._tree.ensure(ref, None, create=create))
        team = self.get_team_state(team_id, create=create)
        return self._handle(self._tree.ensure(ref, team.ref, create=create))

    def get_conversation_state(
        self,
        session_id: str,
        workflow_id: str | None = None,
        team_id: str | None = None,
        *,
        create: bool = True,
    ) -> ScopeHandle:
        """One agent's conversation: under the workflow if given, else the team, else global.

        With neither, an existing conversation is returned wherever it lives.
        Ids are unique per level across the whole manager: a conversation id
        taken under one workflow cannot be used under another. Missing
        parents are created on the way, unless ``create=False``, which
        creates nothing and refuses a scope (or parent) that does not exist.

        Raises:
            ScopeAccessError: the conversation exists under another parent,
                or (``create=False``) it or a parent named does not exist.
        """
        ref = ScopeRef(StateScope.CONVERSATION, session_id)
        if workflow_id is not None:
            parent: ScopeRef | None = self.get_workflow_state(workflow_id, team_id, create=create).ref
        elif team_id is not None:
            parent = self.get_team_state(team_id, create=create).ref
        else:
            parent = None
        return self._handle(self._tree.ensure(ref, parent, create=create))

    def scope(self, ref: ScopeRef | str) -> ScopeHandle:
        """The handle of an existing scope.

        Raises:
            ScopeAccessError: no such scope exists.
        """
        return self._handle(self._cell(ref))

    def scopes(self) -> Iterator[ScopeRef]:
        """Every scope instance this manager holds, resident or evicted or only in its store.

        An iterator, read from the store a page at a time: a million scopes
        are never one list. Each scope comes once; scopes created while it
        runs may or may not appear. Nothing is loaded into memory.
        """
        return self._tree.refs()

    def _apply_result(self, ref: ScopeRef, batch: TransitionBatch) -> object:
        return self.scope(ref).apply(batch)

    # -- durability and checkpoints -----------------------------------------

    def flush(self) -> None:
        """Return once every commit made so far is durable (for ``async`` mode)."""
        self._durability.flush()

    async def aflush(self) -> None:
        await asyncio.to_thread(self.flush)

    def set_durability(self, scope_ref: ScopeRef | str, mode: str) -> None:
        """Override the manager's durability mode for one scope.

        Leaving ``manual`` writes a checkpoint first, so the log that follows
        has a base to replay from.
        """
        self._durability.set_durability(self._cell(scope_ref), mode)

    @overload
    def save_checkpoint(
        self, scope_ref: StateScope, state: Mapping[str, Any], /
    ) -> Coroutine[Any, Any, str]: ...
    @overload
    def save_checkpoint(self, scope_ref: ScopeRef | str, *, label: str | None = None) -> str: ...
    def save_checkpoint(self, scope_ref: Any, state: Any = NO_STATE, *, label: str | None = None) -> Any:
        """Write a full checkpoint of the scope's current committed state; return its id.

        The id is ``"<scope>:<id>@<version>"``. Saving twice at one version
        keeps one checkpoint (the later label wins). Without a store the
        checkpoint is kept in memory (the newest ``keep_checkpoints``).

        ADR-002's form, ``await save_checkpoint(StateScope.X, state_dict)``
        (a level first), checkpoints the scope instance ``state_dict`` names
        (``handle.to_dict()`` names it) and is awaited: it returns a
        coroutine that runs off the event loop (``docs/adr/0026``).

        Raises:
            TransitionValidationError: (ADR-002's form) the dict does not name
                a scope of that level, or was changed; nothing was saved.
        """
        if is_level_form(scope_ref, state):
            return self.asave_checkpoint(ref_to_save(scope_ref, state), label=label)
        cell = self._cell(scope_ref)
        if self._memory is not None:
            return self._memory.save(cell, label)
        return self._durability.save_checkpoint(cell, label)

    def list_checkpoints(self, scope_ref: ScopeRef | str) -> list[CheckpointInfo]:
        """The scope's stored checkpoints, newest first."""
        if self._memory is not None:
            return self._memory.infos(self._cell(scope_ref).state.ref)
        self._durability.need_store()
        return self._durability.list_checkpoints(self._cell(scope_ref).state.ref)

    # A level is also a str (StateScope is a StrEnum), so no annotation can keep the two forms apart;
    # at run time the argument's exact class decides (docs/adr/0026).
    @overload
    def load_checkpoint(  # type: ignore[overload-overlap]
        self, scope_ref: StateScope, checkpoint_id: str, /
    ) -> Coroutine[Any, Any, ScopeDict]: ...
    @overload
    def load_checkpoint(
        self, scope_ref: ScopeRef | str, checkpoint_id: str | None = None
    ) -> ContextSnapshot: ...
    def load_checkpoint(self, scope_ref: Any, checkpoint_id: Any = None) -> Any:
        """The stored state of a checkpoint (the newest if no id) as a snapshot. Changes nothing.

        ADR-002's form, ``await load_checkpoint(StateScope.X, scope_id)`` (a
        level first), returns the newest checkpoint's key-value state as a
        dict (a ``ScopeDict`` naming its scope and version), and is awaited.

        Raises:
            CheckpointNotFoundError: no such checkpoint.
            CheckpointCorruptError: the checkpoint is unreadable.
        """
        if is_level_form(scope_ref, NO_STATE):
            return self._aload_dict(ref_to_load(scope_ref, checkpoint_id))
        ref = self._cell(scope_ref).state.ref
        if self._memory is not None:
            return self._memory.load(ref, checkpoint_id)
        self._durability.need_store()
        return self._durability.load_checkpoint(ref, checkpoint_id)

    async def _aload_dict(self, ref: ScopeRef) -> ScopeDict:
        snapshot = await asyncio.to_thread(self.load_checkpoint, ref)
        return ScopeDict.of(snapshot._state)

    def state_at(self, scope_ref: ScopeRef | str, version: int) -> ContextSnapshot:
        """The scope as it was at ``version``, rebuilt from a checkpoint and the log."""
        self._durability.need_store()
        return self._durability.state_at(self._cell(scope_ref), version)

    def restore(
        self, scope_ref: ScopeRef | str, checkpoint: str | int, *, timeout: float | None = None
    ) -> StateChanged:
        """Return the scope to a checkpoint (by id) or a version, as a new commit.

        History is kept: the version keeps rising and subscribers see the
        change like any other.
        """
        cell = self._cell(scope_ref)
        if self._memory is not None:
            target = self._memory.state(cell.state.ref, checkpoint)
        else:
            self._durability.need_writable_store("restore")
            target = self._durability.target(cell, checkpoint)
        wait = self.options.request_timeout if timeout is None else timeout
        req = ApplyRequest((), None, _clock.monotonic() + wait, None, None, target)
        record: StateChanged = self._kernel.ask(cell, req, wait)
        return record

    def fork(self, scope_ref: ScopeRef | str, checkpoint: str | int, new_id: str) -> ScopeHandle:
        """Start a new scope instance ``new_id`` (same level, same parent) from a checkpoint or version.

        The fork's history starts at the checkpoint's version with a full
        checkpoint of its own, so it depends on nothing of its source and
        retention on the source can never break it. The handle returned is
        the fork's, also when scopes are being evicted meanwhile (its
        ancestors are brought back first).

        Raises:
            ScopeAccessError: ``new_id`` already exists; nothing was written.
        """
        self._durability.need_writable_store("fork")
        source = self._cell(scope_ref)
        new_ref = ScopeRef(source.state.ref.scope, new_id)
        if self._tree.exists(new_ref):  # before reading the checkpoint; checked again under the lock
            raise ScopeAccessError(f"cannot fork to {new_ref}: it already exists; nothing was written")
        target = self._durability.target(source, checkpoint)
        state = self._durability.fork_state(source, target, new_ref)
        try:
            cell = self._tree.create_from(state, lambda: self._durability.write_fork(source, state))
        except ScopeAccessError as exc:
            raise ScopeAccessError(f"cannot fork to {new_ref}: {exc}") from None
        return self._handle(cell)

    def compact(self, scope_ref: ScopeRef | str, *, label: str | None = None) -> str:
        """Make the scope's current committed state its only stored base; return that checkpoint's id.

        One full checkpoint, written by the scope's actor between two of its
        commits; in the same transaction every older checkpoint and the log
        up to it leave the store, so values the scope no longer holds are no
        longer on disk (LMDB reuses the pages; the file does not shrink).
        Commits go on as usual while it runs, before or after it. Recovery
        after it starts from that checkpoint: versions before it can no
        longer be read with ``state_at`` or restored by version.

        Raises:
            VictorActorsError: the manager has no store.
            ScopeAccessError: the manager is read-only, or no such scope exists.
        """
        return self._durability.compact(self._cell(scope_ref), label)

    async def acompact(self, scope_ref: ScopeRef | str, *, label: str | None = None) -> str:
        return await asyncio.to_thread(self.compact, scope_ref, label=label)

    async def asave_checkpoint(
        self, scope_ref: ScopeRef | str, state: Any = NO_STATE, *, label: str | None = None
    ) -> str:
        """The asyncio twin of :meth:`save_checkpoint` (either form)."""
        if is_level_form(scope_ref, state):
            scope_ref = ref_to_save(scope_ref, state)
        return await asyncio.to_thread(self.save_checkpoint, scope_ref, label=label)

    async def alist_checkpoints(self, scope_ref: ScopeRef | str) -> list[CheckpointInfo]:
        return await asyncio.to_thread(self.list_checkpoints, scope_ref)

    @overload
    async def aload_checkpoint(  # type: ignore[overload-overlap]
        self, scope_ref: StateScope, checkpoint_id: str, /
    ) -> ScopeDict: ...
    @overload
    async def aload_checkpoint(
        self, scope_ref: ScopeRef | str, checkpoint_id: str | None = None
    ) -> ContextSnapshot: ...
    async def aload_checkpoint(self, scope_ref: Any, checkpoint_id: Any = None) -> Any:
        """The asyncio twin of :meth:`load_checkpoint` (either form)."""
        if is_level_form(scope_ref, NO_STATE):
            return await self._aload_dict(ref_to_load(scope_ref, checkpoint_id))
        return await asyncio.to_thread(self.load_checkpoint, scope_ref, checkpoint_id)

    async def arestore(
        self, scope_ref: ScopeRef | str, checkpoint: str | int, *, timeout: float | None = None
    ) -> StateChanged:
        return await asyncio.to_thread(self.restore, scope_ref, checkpoint, timeout=timeout)

    async def afork(self, scope_ref: ScopeRef | str, checkpoint: str | int, new_id: str) -> ScopeHandle:
        return await asyncio.to_thread(self.fork, scope_ref, checkpoint, new_id)

    # -- scale ---------------------------------------------------------------

    def passivate_idle(self, idle_for: float | None = None) -> int:
        """Passivate now every scope idle for longer than ``idle_for`` seconds; return how many.

        ``idle_for`` defaults to the ``idle_timeout`` option (without one,
        nothing is passivated). ``passivate_idle(0)`` passivates every scope
        that may be passivated (see ``docs/scale.md`` for what pins a scope).
        """
        if idle_for is not None and (isinstance(idle_for, bool) or not idle_for >= 0):
            raise ValueError(f"idle_for must be a number of seconds >= 0, not {idle_for!r}")
        return self._runtime.passivator.sweep(idle_for)

    def quiesce(self, timeout: float = 10.0) -> None:
        """Return once the runtime is quiet: every mailbox empty, every event and tool result delivered.

        Repeats rounds (wait for running tools, pass a barrier through every
        live actor's mailbox and through the event thread) until a whole
        round saw no new commit, so writes that subscribers or tools make in
        answer to other writes are waited for too. For tests and orderly
        shutdowns; it does not stop anyone from sending more.

        Raises:
            DeadlineExceededError: still busy after ``timeout`` seconds.
        """
        self._runtime.quiesce(timeout)

    async def aquiesce(self, timeout: float = 10.0) -> None:
        """The asyncio twin of :meth:`quiesce`; the event loop stays free meanwhile."""
        await asyncio.to_thread(self.quiesce, timeout)

    def stats(self) -> dict[str, int]:
        """Counters: live and passivated scopes, activations, evictions, mailbox depth, commits,
        supervision failures, restarts and escalations, store commits and transactions."""
        return self._runtime.stats()

    # -- tools ---------------------------------------------------------------

    def register_tool(self, name: str, fn: Callable[..., Any], *, timeout: float = 30.0) -> None:
        """Execute committed EXECUTE_TOOL requests for ``name`` with ``fn(call: ToolCall)``.

        ``fn`` may be sync or ``async``; its return value (or its error, or
        a timeout after ``timeout`` seconds) comes back as a TOOL_RESULT in
        the requesting scope. See ``docs/orchestrators.md``.
        """
        self.tools.register(name, fn, timeout=timeout)

    def resume_tools(self) -> int:
        """Dispatch every pending tool request again (after a restart); return how many.

        Restores every stored scope. Requests dispatched again carry
        ``redelivery=True`` and their original idempotency key; those with no
        registered executor are listed in ``manager.tools.unhandled``.
        """
        count = 0
        for ref in self.scopes():
            pending = tuple(self._cell(ref).state.pending_tools.values())
            if pending:
                self.tools.dispatch(ref, pending, redelivery=True)
                count += len(pending)
        return count

    async def aresume_tools(self) -> int:
        """The asyncio twin of :meth:`resume_tools`."""
        return await asyncio.to_thread(self.resume_tools)

    # -- runs ----------------------------------------------------------------

    def run(self, session_id: str, timeout: float = 30.0) -> RunContext:
        """``with manager.run(session_id, timeout=30.0) as run:``: one agent operation.

        Every request inside is tagged with ``run.id`` and bounded by the
        run's deadline. If the block raises or outlives ``timeout``, the
        run's own writes are rolled back in every scope it touched (see
        ``docs/supervision-and-runs.md``) and :class:`RunFailedError` (or
        :class:`RunTimeoutError`) is raised with a ``rollback_report``.
        """
        self._kernel.check_open(GLOBAL_REF)
        return RunContext(self._kernel, self._runtime.resolve, session_id, timeout)

    def active_runs(self) -> tuple[Run, ...]:
        """The runs in progress: ``with manager.run(...)`` blocks entered and not yet left."""
        with self._kernel.lock:
            return tuple(r for r in self._kernel.runs.values() if isinstance(r, Run))

    def arun(self, session_id: str, timeout: float = 30.0) -> RunContext:
        """``async with manager.arun(session_id, timeout=30.0) as run:``; the timeout cancels the body."""
        return self.run(session_id, timeout)

    # -- supervision --------------------------------------------------------

    def set_supervision(
        self,
        supervisor: ScopeRef | str | None,
        strategy: Strategy = "one_for_one",
        *,
        max_restarts: int = 3,
        within: float = 5.0,
    ) -> None:
        """Set how ``supervisor`` (a scope, or None for the root above global) treats failed children."""
        ref = None if supervisor is None else self._cell(supervisor).state.ref
        self._runtime.supervision.set_policy(ref, SupervisionPolicy(strategy, max_restarts, within))

    def subscribe_supervision(self, callback: Callable[[SupervisionEvent], object]) -> Subscription:
        """Call ``callback`` with every failure, restart, escalation and give-up, in order."""
        return self._runtime.supervision.subscribe(callback)

    def restart_scope(self, ref: ScopeRef | str, *, timeout: float | None = None) -> None:
        """Restart a scope from its last committed state, also one supervision gave up on."""
        self._kernel.check_open(GLOBAL_REF)
        wait = self.options.request_timeout if timeout is None else timeout
        self._kernel.ask(self._cell(ref), RestartRequest("restarted by hand"), wait)

    # -- the live inspector -----------------------------------------------------

    def serve(self, *, host: str = "127.0.0.1", port: int = 8765) -> Any:
        """Serve the web inspector over this running manager; return the server (``.url``, ``.close()``).

        Read-only, bound to ``host`` (localhost by default), and live: it adds
        what only the owner knows (commits per second, live actors, mailbox
        depths, supervision events, runs) to the store's views. Needs the
        ``web`` extra (``pip install 'victor-actors[web]'``); see
        ``docs/inspector.md``. ``port=0`` picks a free port.

        Raises:
            VictorActorsError: the ``web`` extra is not installed.
        """
        # The inspector sits on top of the facade: it is found by name at call time (the one
        # plug-in point of the facade, see docs/adr/0013), never imported by this module.
        try:
            web = importlib.import_module("victor_actors.web")
        except ImportError as exc:
            raise VictorActorsError(
                f"manager.serve needs the web extra (pip install 'victor-actors[web]'): {exc}"
            ) from exc
        return web.serve_manager(self, host=host, port=port)

    # -- test hooks (victor_actors.testing) -----------------------------------

    def _set_observer(self, observer: Observer | None) -> None:
        self._kernel.set_observer(observer)

    def _inject_fault(self, ref: ScopeRef | str, fault: BaseException | Callable[[], Any]) -> None:
        self._cell(ref).faults.append(fault)

    def set_observer(self, observer: Observer | None) -> None:
        """Deprecated: use ``victor_actors.testing.set_observer(manager, observer)``."""
        _deprecated("manager.set_observer", "victor_actors.testing.set_observer(manager, observer)")
        self._set_observer(observer)

    def inject_fault(self, ref: ScopeRef | str, fault: BaseException | Callable[[], Any]) -> None:
        """Deprecated: use ``victor_actors.testing.inject_fault(manager, ref, fault)``."""
        _deprecated("manager.inject_fault", "victor_actors.testing.inject_fault(manager, ref, fault)")
        self._inject_fault(ref, fault)


def _deprecated(old: str, new: str) -> None:
    warnings.warn(
        f"{old} is deprecated and goes in the next release; use {new}", DeprecationWarning, stacklevel=3
    )


def _mark_forked() -> None:  # pragma: no cover - runs in a forked child
    for manager in list(_open_managers):
        manager._kernel.mark_forked(os.getppid())


os.register_at_fork(after_in_child=_mark_forked)


@atexit.register
def _close_open_managers() -> None:
    for manager in list(_open_managers):
        try:
            manager.close(timeout=1.0)
        except Exception:  # pragma: no cover - best effort at exit
            pass
