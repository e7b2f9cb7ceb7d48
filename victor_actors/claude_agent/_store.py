"""``VictorActorsSessionStore``: the Claude Agent SDK's ``SessionStore`` over a project's scopes.

Layout (docs/adr/0028):

``team:claude/<project>``                         the project: ``s/<session>`` -> {"mtime", "summary"}
                                                  for every session whose main transcript is live
``conversation:claude/<project>/<session>``       the main transcript: its entries are the messages;
                                                  ``u/<uuid>`` for each entry uuid stored (dedupe),
                                                  ``sub/<subpath>`` for each live subagent transcript
``conversation:claude/<project>/<session>/<sub>`` a subagent transcript: a child session of the main
                                                  transcript's scope (CREATE_SESSION), entries and
                                                  ``u/<uuid>`` likewise

Names are escaped into ids (``/`` cannot come out of one), so a subpath such as
``subagents/agent-1`` is one id component. A transcript is *live* while its index entry
exists (the project's ``s/`` key for a main one, the main transcript's ``sub/`` key for a
subagent's); ``load`` of a transcript that is not live is None, and the next ``append`` to it
starts it afresh. Scopes are never deleted, only emptied: a deleted transcript's history stays
in the store's log until retention drops it.
"""

from __future__ import annotations

import time
from typing import Any, cast
from urllib.parse import unquote

try:
    from claude_agent_sdk import fold_session_summary
    from claude_agent_sdk.types import (
        SessionKey,
        SessionListSubkeysKey,
        SessionStore,
        SessionStoreEntry,
        SessionStoreListEntry,
        SessionSummaryEntry,
    )
except ImportError as exc:  # pragma: no cover - the extra is installed wherever this module is used
    raise ImportError(
        "victor_actors.claude_agent needs the claude-agent-sdk package: "
        "pip install 'victor-actors[claude-agent]'"
    ) from exc

from victor_actors._agentsdk import (
    Handle,
    Manager,
    check_manager,
    escape,
    name,
    open_conversation,
    open_team,
    scope_id,
    write_if_unmoved,
)
from victor_actors._errors import TransitionValidationError
from victor_actors._model import ScopeRef, StateScope, TransitionBatch
from victor_actors._snapshot import ContextSnapshot
from victor_actors._state import MapView
from victor_actors._values import freeze, thaw

__all__ = ["VictorActorsSessionStore"]

PREFIX = "claude"
_SESSION = "s/"  # in the project's scope: a live main transcript
_SUB = "sub/"  # in a main transcript's scope: a live subagent transcript
_UUID = "u/"  # in a transcript's scope: an entry uuid already stored


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class _Key:
    """A checked ``SessionKey``: its names, and the ids of the scopes it lives in."""

    __slots__ = ("main", "project", "session", "sub", "subpath", "team")

    def __init__(self, key: Any, *, subpath_allowed: bool = True) -> None:
        if not isinstance(key, dict):
            raise TransitionValidationError(
                f"a session key is a dict, not {type(key).__name__}; nothing was done"
            )
        self.project = name(key.get("project_key"), "a session key's project_key")
        self.session = name(key.get("session_id"), "a session key's session_id")
        subpath = key.get("subpath")
        if subpath is not None and not subpath_allowed:
            raise TransitionValidationError("list_subkeys takes a key without a subpath; nothing was done")
        self.subpath = (
            None if subpath is None else name(subpath, "a subpath (omit it for the main transcript)")
        )
        self.team = scope_id(PREFIX, self.project)
        self.main = scope_id(PREFIX, self.project, self.session)
        self.sub = (
            None if self.subpath is None else scope_id(PREFIX, self.project, self.session, self.subpath)
        )


def _entries(entries: Any) -> list[dict[str, Any]]:
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise TransitionValidationError("append takes a list of entries (dicts); nothing was appended")
    return entries


def _fresh(batch: TransitionBatch, state: MapView, *, also: str | None = None) -> None:
    """Empty a transcript scope that is not live (deleted, or written only in part): a new history."""
    batch.clear_messages()
    for key in state:
        if key.startswith(_UUID) or (also is not None and key.startswith(also)):
            batch.delete_state(key)


def _new_entries(batch: TransitionBatch, state: MapView, entries: list[dict[str, Any]], live: bool) -> int:
    """Add ``entries`` to ``batch``, skipping those whose uuid is stored (or earlier in the batch)."""
    seen: set[str] = set()
    added: list[dict[str, Any]] = []
    for entry in entries:
        uuid = entry.get("uuid")
        if isinstance(uuid, str) and uuid:
            if uuid in seen or (live and _UUID + uuid in state):
                continue
            seen.add(uuid)
            batch.update_state(_UUID + uuid, True)
        added.append(entry)
    if added:
        batch.add_messages(added)
    return len(added)


class VictorActorsSessionStore(SessionStore):
    """A ``SessionStore`` (``claude_agent_sdk.SessionStore``) with every optional method, on scopes.

    ``manager`` is a :class:`~victor_actors.GlobalStateManager` or a
    :class:`~victor_actors.RemoteStateManager`; every process of a deployment that opens the
    store with it (``ClaudeAgentOptions(session_store=...)``) sees the same sessions, which
    is what a store behind several pods is for.

    - ``append`` is one atomic batch per call: the entries (those whose ``uuid`` is already
      stored are skipped, as the SDK asks: it retries a batch it is not sure landed), the
      project's index entry with the storage time in epoch milliseconds (strictly rising per
      session) and the session's summary, folded with ``fold_session_summary`` under the same
      check as the entries, so two concurrent appends to one session never fold over each
      other. A subagent transcript (a key with a ``subpath``) is a child scope of the main
      transcript's; it contributes nothing to the summary.
    - ``load`` returns the entries in append order, deep-equal to what was appended, or None
      for a transcript never written or deleted.
    - ``delete`` of a main transcript cascades to its subagent transcripts; with a ``subpath``
      it removes only that one.

    Entries that cannot be stored (anything but JSON-like data) raise
    :class:`~victor_actors.TransitionValidationError` and nothing of the call is appended.
    """

    def __init__(self, manager: Manager) -> None:
        self._manager = check_manager(manager, "VictorActorsSessionStore")

    def __repr__(self) -> str:
        return f"<VictorActorsSessionStore on {self._manager!r}>"

    # -- scopes ----------------------------------------------------------------------------------

    async def _main(self, key: _Key, create: bool) -> Handle | None:
        return await open_conversation(self._manager, key.main, team_id=key.team, create=create)

    async def _sub(self, key: _Key, main: Handle, create: bool) -> Handle | None:
        """The subagent transcript's scope, made a child session of the main one's when ``create``."""
        assert key.sub is not None
        if create and key.sub not in (await main.asnapshot()).sessions:
            try:
                await main.aapply(TransitionBatch().create_session(key.sub, {"subpath": key.subpath}))
            except TransitionValidationError:
                if key.sub not in (await main.asnapshot()).sessions:
                    raise  # not a concurrent creation of the same child: a real error
        return await open_conversation(self._manager, key.sub, create=False)

    async def _project(self, project_key: str) -> MapView | None:
        """The project scope's state (its index), or None if nothing was ever written there."""
        handle = await open_team(self._manager, scope_id(PREFIX, name(project_key, "a project_key")))
        return None if handle is None else (await handle.asnapshot()).state

    # -- the protocol ----------------------------------------------------------------------------

    async def append(self, key: SessionKey, entries: list[SessionStoreEntry]) -> None:
        """Append ``entries`` to the transcript ``key`` names, as one atomic batch.

        Raises:
            TransitionValidationError: the key or an entry is malformed; nothing was appended.
        """
        k = _Key(key)
        plain = _entries(entries)
        if not plain:
            return
        freeze(plain, "entries")  # refuse what cannot be stored before any scope is made
        main = await self._main(k, create=True)
        assert main is not None
        if k.subpath is None:
            await write_if_unmoved(main, lambda snap: self._main_batch(k, snap, plain), _main_lock)
            return
        sub = await self._sub(k, main, create=True)
        assert sub is not None
        await write_if_unmoved(sub, lambda snap: _sub_batch(k, snap, plain), _sub_lock)

    def _main_batch(self, k: _Key, snap: ContextSnapshot, entries: list[dict[str, Any]]) -> TransitionBatch:
        project = snap.ancestor_state(StateScope.TEAM)
        assert project is not None
        index = project.get(_SESSION + escape(k.session))
        batch = TransitionBatch()
        live = index is not None
        if not live:
            _fresh(batch, snap.state, also=_SUB)
        _new_entries(batch, snap.state, entries, live)
        prev = None if index is None else cast(SessionSummaryEntry, thaw(index["summary"]))
        main_key: SessionKey = {"project_key": k.project, "session_id": k.session}
        folded = fold_session_summary(prev, main_key, cast("list[SessionStoreEntry]", entries))
        mtime = max(_now_ms(), (index["mtime"] + 1) if index is not None else 0)
        folded["mtime"] = mtime
        batch.update_state(_SESSION + escape(k.session), {"mtime": mtime, "summary": folded}, scope="team")
        return batch

    async def load(self, key: SessionKey) -> list[SessionStoreEntry] | None:
        """The transcript's entries in append order; None if it was never written or was deleted."""
        k = _Key(key)
        main = await self._main(k, create=False)
        if main is None:
            return None
        if k.subpath is None:
            snap = await main.asnapshot()
            project = snap.ancestor_state(StateScope.TEAM)
            if project is None or _SESSION + escape(k.session) not in project:
                return None
        else:
            sub = await self._sub(k, main, create=False)
            if sub is None:
                return None
            snap = await sub.asnapshot()
            parent = snap.ancestor_state(StateScope.CONVERSATION)
            if parent is None or _SUB + escape(k.subpath or "") not in parent:
                return None
        return [cast(SessionStoreEntry, thaw(m)) for m in snap.messages]

    async def list_sessions(self, project_key: str) -> list[SessionStoreListEntry]:
        """Every live main transcript of the project, with its storage time in epoch milliseconds."""
        index = await self._project(project_key)
        if index is None:
            return []
        return [
            {"session_id": _unescape(k[len(_SESSION) :]), "mtime": int(v["mtime"])}
            for k, v in index.items()
            if k.startswith(_SESSION)
        ]

    async def list_session_summaries(self, project_key: str) -> list[SessionSummaryEntry]:
        """The summary ``append`` folded for each live main transcript of the project."""
        index = await self._project(project_key)
        if index is None:
            return []
        return [
            cast(SessionSummaryEntry, thaw(v["summary"])) for k, v in index.items() if k.startswith(_SESSION)
        ]

    async def delete(self, key: SessionKey) -> None:
        """Delete a transcript; a main one takes its subagent transcripts with it."""
        k = _Key(key)
        main = await self._main(k, create=False)
        if main is None:
            return
        if k.subpath is None:
            children = list((await main.asnapshot()).sessions)
            await write_if_unmoved(main, lambda snap: _delete_main(k, snap), _main_lock)
            for child in children:  # unreachable already (their index is gone): empty them too
                handle = await open_conversation(self._manager, child, create=False)
                if handle is not None:
                    await write_if_unmoved(handle, _empty, _own_lock)
            return
        sub = await self._sub(k, main, create=False)
        if sub is not None:
            await write_if_unmoved(sub, lambda snap: _delete_sub(k, snap), _sub_lock)

    async def list_subkeys(self, key: SessionListSubkeysKey) -> list[str]:
        """The subpaths of the session's live subagent transcripts."""
        k = _Key(key, subpath_allowed=False)
        main = await self._main(k, create=False)
        if main is None:
            return []
        state = (await main.asnapshot()).state
        return [_unescape(s[len(_SUB) :]) for s in state if s.startswith(_SUB)]


def _unescape(text: str) -> str:
    return unquote(text)


def _sub_batch(k: _Key, snap: ContextSnapshot, entries: list[dict[str, Any]]) -> TransitionBatch:
    parent = snap.ancestor_state(StateScope.CONVERSATION)
    assert parent is not None and k.subpath is not None
    flag = _SUB + escape(k.subpath)
    live = flag in parent
    batch = TransitionBatch()
    if not live:
        _fresh(batch, snap.state)
        batch.update_state(flag, True, scope=str(snap.ancestors[0]))
    _new_entries(batch, snap.state, entries, live)
    return batch


def _delete_main(k: _Key, snap: ContextSnapshot) -> TransitionBatch:
    batch = TransitionBatch()
    _fresh(batch, snap.state, also=_SUB)
    batch.delete_state(_SESSION + escape(k.session), scope="team")
    return batch


def _delete_sub(k: _Key, snap: ContextSnapshot) -> TransitionBatch:
    assert k.subpath is not None
    batch = TransitionBatch()
    _fresh(batch, snap.state)
    batch.delete_state(_SUB + escape(k.subpath), scope=str(snap.ancestors[0]))
    return batch


def _empty(snap: ContextSnapshot) -> TransitionBatch | None:
    if not len(snap.messages) and not any(key.startswith(_UUID) for key in snap.state):
        return None
    batch = TransitionBatch()
    _fresh(batch, snap.state)
    return batch


def _main_lock(snap: ContextSnapshot) -> list[ScopeRef]:
    return [snap.ref, *(a for a in snap.ancestors if a.scope is StateScope.TEAM)]


def _sub_lock(snap: ContextSnapshot) -> list[ScopeRef]:
    return [snap.ref, snap.ancestors[0]]


def _own_lock(snap: ContextSnapshot) -> list[ScopeRef]:
    return [snap.ref]
