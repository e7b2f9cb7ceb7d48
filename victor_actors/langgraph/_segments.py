"""The scopes of each namespace's segments: found, opened, rolled over and compacted.

A namespace's history is a chain of conversation scopes (segments, see
``_layout``): the newest takes new checkpoints, the full ones are frozen.
So the runtime's periodic full checkpoint of the scope being written covers
one segment (at most ``segment_keys`` keys), never the namespace's whole
history, and a frozen segment is compacted once, when it is frozen, to one
stored checkpoint and no log. Why this shape: docs/adr/0019.

Only the saver's lane leader of a namespace rolls it over (``roll``); readers
derive the chain from the team's ``ns/<namespace>`` entry each time, so a
reader never needs the leader's view. The count lives in the team, not in
segment 0, so a roll-over never writes to a frozen segment again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

from victor_actors import (
    GlobalStateManager,
    ScopeAccessError,
    ScopeHandle,
    ScopeRef,
    StateScope,
    TransitionValidationError,
)
from victor_actors.langgraph import _layout as L
from victor_actors.remote import RemoteScopeHandle, RemoteStateManager

__all__ = ["Handle", "Manager", "Segments"]

# The saver and the store run on a manager that owns its store or on a client of the process that
# does (``victor_actors.connect``: every uvicorn worker of a LangGraph app): the same calls on both.
Manager = GlobalStateManager | RemoteStateManager
Handle = ScopeHandle | RemoteScopeHandle

logger = logging.getLogger("victor_actors")


class Segments:
    """Handles of every namespace segment this saver touched, by scope id, and the operations on them."""

    def __init__(self, manager: Manager, timeout: float | None) -> None:
        self.manager = manager
        self.timeout = timeout
        self._handles: dict[str, Handle] = {}
        self._registered: set[tuple[str, str]] = set()
        self._open_lock = threading.Lock()
        self._compacts: bool | None = None  # whether compaction has a store to shrink (asked once)

    # -- reading ---------------------------------------------------------------

    def _find(self, level: StateScope, ident: str) -> Handle | None:
        # Conversation and team ids of the layout never coincide (a conversation's holds a second
        # ':'), so one map by id serves both.
        handle = self._handles.get(ident)
        if handle is None:
            try:
                handle = self.manager.scope(ScopeRef(level, ident))
            except (ScopeAccessError, TransitionValidationError):  # none, or an id no scope can have
                return None
            self._handles[ident] = handle
        return handle

    def lookup(self, thread_id: str, ns: str, index: int = 0) -> Handle | None:
        """Segment ``index`` of the namespace, or None if it was never created. Creates nothing."""
        return self._find(StateScope.CONVERSATION, L.segment_id(thread_id, ns, index))

    @staticmethod
    def openable(thread_id: str, ns: str) -> bool:
        """Whether the namespace's segment 0 can exist (an older saver listed some that cannot)."""
        try:
            ScopeRef(StateScope.CONVERSATION, L.segment_id(thread_id, ns, 0))
        except TransitionValidationError:
            return False
        return True

    def count(self, thread_id: str, ns: str) -> int:
        """How many segments the namespace has (1 for one never written)."""
        team = self._find(StateScope.TEAM, L.team_id(thread_id))
        return 1 if team is None else L.segment_count(team.snapshot().state.get(L.NS_PREFIX + ns))

    def team(self, thread_id: str) -> Handle | None:
        """The thread's team scope, or None if it was never created. Creates nothing."""
        return self._find(StateScope.TEAM, L.team_id(thread_id))

    def tombstone(self, thread_id: str) -> str | None:
        """The thread's tombstone (see ``_threadops``): the cut-off id of its last deletion, or None."""
        team = self._find(StateScope.TEAM, L.team_id(thread_id))
        if team is None:
            return None
        value = team.snapshot().state.get(L.DELETED)
        return value if isinstance(value, str) else None

    def listed(self, thread_id: str) -> list[str]:
        """Every namespace the thread's team lists, openable or not."""
        team = self._find(StateScope.TEAM, L.team_id(thread_id))
        if team is None:
            return []
        prefix = L.NS_PREFIX
        return sorted(key[len(prefix) :] for key in team.snapshot().state if key.startswith(prefix))

    def namespaces(self, thread_id: str) -> list[str]:
        """The namespaces of a thread that can hold checkpoints.

        A namespace an older saver listed before finding its scope id too long
        (or not storable) never got a scope, so it holds nothing: it is skipped,
        with a warning, so that it cannot break reads and deletes of the
        thread (``delete_thread`` also unlists it).
        """
        out = []
        for ns in self.listed(thread_id):
            if self.openable(thread_id, ns):
                out.append(ns)
            else:
                logger.warning(
                    "LangGraph thread %r lists namespace %r, whose scope id cannot exist: skipped (it holds "
                    "nothing)",
                    thread_id[:60],
                    ns[:60],
                )
        return out

    def known(self, thread_id: str, ns: str) -> bool:
        """Whether every segment of the namespace has a handle here (a read then does no I/O)."""
        if L.team_id(thread_id) not in self._handles:
            return False
        ids = (L.segment_id(thread_id, ns, k) for k in range(self.count(thread_id, ns)))
        return all(ident in self._handles for ident in ids)

    def newest_first(self, thread_id: str, ns: str) -> Iterator[Handle]:
        """The namespace's segments, newest first (none if it was never written)."""
        head = self.lookup(thread_id, ns)
        if head is None:
            return
        for k in range(self.count(thread_id, ns) - 1, 0, -1):
            handle = self.lookup(thread_id, ns, k)
            if handle is not None:  # a crash between creating it and its first commit: nothing in it
                yield handle
        yield head

    # -- writing ---------------------------------------------------------------

    def open_ns(self, thread_id: str, ns: str) -> Handle:
        """Segment 0 of the namespace, created (and listed in its thread's team) on first use."""
        key = (thread_id, ns)
        ident = L.conv_id(thread_id, ns)
        if key in self._registered:
            return self._handles[ident]
        L.check_names(thread_id, ns)  # a name refused is never listed
        with self._open_lock:
            team = self.manager.get_team_state(L.team_id(thread_id))
            self._handles[team.ref.id] = team
            ns_key = L.NS_PREFIX + ns
            if ns_key not in team.snapshot().state:
                # Listed before the namespace gets data, and never unlisted: a crash in between
                # leaves an empty namespace listed, never data that delete_thread cannot find.
                team.apply([L.update(ns_key, True)], timeout=self.timeout)
            handle = self.manager.get_conversation_state(ident, team_id=L.team_id(thread_id))
            self._handles[ident] = handle
            self._registered.add(key)
        return handle

    def _open(self, thread_id: str, ns: str, index: int) -> Handle:
        ident = L.segment_id(thread_id, ns, index)
        handle = self._handles.get(ident)
        if handle is None:
            handle = self.manager.get_conversation_state(ident, team_id=L.team_id(thread_id))
            self._handles[ident] = handle
        return handle

    def for_write(self, thread_id: str, ns: str) -> list[Handle]:
        """Every segment of the namespace, oldest first, created if missing (segment 0 listed)."""
        head = self.open_ns(thread_id, ns)
        return [head, *(self._open(thread_id, ns, k) for k in range(1, self.count(thread_id, ns)))]

    def roll(self, thread_id: str, ns: str, segments: list[Handle]) -> list[Handle]:
        """Open the next segment and freeze the newest: the chain, one longer.

        The new scope exists before the team counts it, so a reader never
        meets a count naming a scope that is not there; a crash after the
        count leaves an empty newest segment, which readers step over.
        """
        index = len(segments)
        new = self._open(thread_id, ns, index)
        team = self.manager.get_team_state(L.team_id(thread_id))
        team.apply([L.update(L.NS_PREFIX + ns, index + 1)], timeout=self.timeout)
        self.compact(segments[-1])
        return [*segments, new]

    def compact(self, handle: Handle) -> None:
        """Make a scope's current state its only stored base: its log and older checkpoints leave LMDB.

        For a frozen segment (it is not written again), for a namespace
        emptied by a delete, and after a prune. The runtime keeps a scope's
        log back to its oldest retained checkpoint, so without this deleted
        values would stay on disk. ``manager.compact`` does it through the
        scope's actor, in order with the scope's commits (a write that lands
        in the segment meanwhile is before or after it, never lost), and
        leaves the runtime's own incremental checkpoints building on it: the
        saver writes no record of its own (docs/adr/0022).
        """
        if self._compacts is None:
            if isinstance(self.manager, RemoteStateManager):  # the owner's store, compacted by the owner
                info = self.manager.info()
                self._compacts = info.get("path") is not None and not info.get("read_only")
            else:  # in memory there is nothing on disk to shrink; read-only, nothing to write
                store = self.manager.store
                self._compacts = store is not None and not store.read_only
        if self._compacts:
            self.manager.compact(handle.ref, label="langgraph: compacted")

    def threads(self) -> list[str]:
        """Every LangGraph thread id: the team scopes ``lg:...``, read a page at a time by prefix."""
        store = self.manager.store
        out: list[str] = []
        if store is None:
            for ref in self.manager.scopes():
                if ref.scope is StateScope.TEAM:
                    thread = L.thread_of_team(ref.id)
                    if thread is not None:
                        out.append(thread)
            return sorted(out)
        if not store.read_only:
            store.flush()  # a new team's record waits for the next group commit: write it first
        after: ScopeRef | None = None
        page = 1000
        while True:
            records = store.prefix_page(L.TEAM_PREFIX, StateScope.TEAM, after, page)
            for record in records:
                thread = L.thread_of_team(record.ref.id)
                if thread is not None:
                    out.append(thread)
            if len(records) < page:
                break
            after = records[-1].ref
        return sorted(out)
