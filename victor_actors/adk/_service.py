"""``VictorActorsSessionService``: Google ADK's ``BaseSessionService`` over an app's scopes.

Layout (docs/adr/0028): ADK's state prefixes nest like the scope tree.

``team:adk/<app>``                      app state (``app:`` keys, stored with their prefix) and
                                        ``adk:user/<user>`` for each user with a session
``workflow:adk/<app>/<user>``           user state (``user:`` keys) and ``adk:session/<id>``
                                        for each live session of the user
``conversation:adk/<app>/<user>/<id>``  session state (keys without a prefix), the events as
                                        messages, and ``temp:adk/updated`` (last_update_time)

``temp:`` keys are never stored (ADK drops them before they reach a service), which is why
the service's own bookkeeping in the session scope can live under ``temp:adk/``: no key
ADK stores can take that name.
"""

from __future__ import annotations

import time
import uuid
from typing import Any
from urllib.parse import unquote

try:
    from google.adk.errors.already_exists_error import AlreadyExistsError
    from google.adk.errors.session_not_found_error import SessionNotFoundError
    from google.adk.events.event import Event
    from google.adk.sessions.base_session_service import (
        BaseSessionService,
        GetSessionConfig,
        ListSessionsResponse,
    )
    from google.adk.sessions.session import Session
    from google.adk.sessions.state import State
    from pydantic_core import PydanticSerializationError, to_jsonable_python
except ImportError as exc:  # pragma: no cover - the extra is installed wherever this module is used
    raise ImportError(
        "victor_actors.adk needs the google-adk package: pip install 'victor-actors[adk]'"
    ) from exc

from victor_actors._agentsdk import (
    Handle,
    Manager,
    check_manager,
    escape,
    name,
    open_conversation,
    open_team,
    open_workflow,
    scope_id,
    write_if_unmoved,
)
from victor_actors._errors import TransitionValidationError
from victor_actors._model import ScopeRef, StateScope, TransitionBatch
from victor_actors._snapshot import ContextSnapshot
from victor_actors._state import MapView
from victor_actors._values import thaw

__all__ = ["VictorActorsSessionService"]

PREFIX = "adk"
UPDATED = "temp:adk/updated"  # in the session scope: last_update_time
_USER = "adk:user/"  # in the app scope: a user with sessions
_SESSION = "adk:session/"  # in the user scope: a live session


def _json(value: Any, what: str) -> Any:
    """``value`` as JSON-like data, as ADK's persistent services store it.

    Raises:
        TransitionValidationError: it has no JSON form (a callable, an arbitrary object).
    """
    try:
        return to_jsonable_python(value)
    except (PydanticSerializationError, TypeError, ValueError) as exc:
        raise TransitionValidationError(f"{what} cannot be stored ({exc}); nothing was written") from None


def _split(state: dict[str, Any] | None, what: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """A state or state delta as (app keys, user keys, session keys), each as stored; temp keys dropped."""
    app: dict[str, Any] = {}
    user: dict[str, Any] = {}
    own: dict[str, Any] = {}
    for key, value in (state or {}).items():
        if not isinstance(key, str):
            raise TransitionValidationError(
                f"{what} has a key that is not a str ({key!r:.60}); nothing was written"
            )
        if key.startswith(State.TEMP_PREFIX):
            continue
        into = app if key.startswith(State.APP_PREFIX) else user if key.startswith(State.USER_PREFIX) else own
        into[key] = _json(value, f"{what}[{key!r}]")
    return app, user, own


def _write_state(
    batch: TransitionBatch, app: dict[str, Any], user: dict[str, Any], own: dict[str, Any]
) -> None:
    for key, value in own.items():
        batch.update_state(key, value)
    for key, value in user.items():
        batch.update_state(key, value, scope=StateScope.WORKFLOW)
    for key, value in app.items():
        batch.update_state(key, value, scope=StateScope.TEAM)


def _merged(snap: ContextSnapshot) -> dict[str, Any]:
    """The state ADK shows for a session: its own keys, the user's and the app's (with their prefixes)."""
    out: dict[str, Any] = {k: thaw(v) for k, v in snap.state.items() if not k.startswith(State.TEMP_PREFIX)}
    for level, prefix in ((StateScope.WORKFLOW, State.USER_PREFIX), (StateScope.TEAM, State.APP_PREFIX)):
        above = snap.ancestor_state(level)
        if above is not None:
            out.update((k, thaw(v)) for k, v in above.items() if k.startswith(prefix))
    return out


def _live(snap: ContextSnapshot, session_id: str) -> bool:
    user = snap.ancestor_state(StateScope.WORKFLOW)
    return user is not None and _SESSION + escape(session_id) in user


def _session_id(value: Any) -> str:
    """ADK's normalisation: surrounding whitespace is not part of an id.

    Raises:
        TransitionValidationError: not a str, or only whitespace; nothing was done.
    """
    stripped = name(value, "a session id").strip()
    if not stripped:
        raise TransitionValidationError(
            f"a session id cannot be only whitespace ({value!r}); nothing was done"
        )
    return stripped


class VictorActorsSessionService(BaseSessionService):
    """A ``BaseSessionService`` (``google.adk.sessions``) on scopes: app, user and session state
    in a team, a workflow and a conversation scope, the events in the conversation's messages.

    ``manager`` is a :class:`~victor_actors.GlobalStateManager` or a
    :class:`~victor_actors.RemoteStateManager` (every ``uvicorn`` worker of an ADK server a
    client of one owner: they share the sessions and never see a stale one). Several apps
    share one store: each app is its own team scope.

    - ``create_session`` writes the session, its initial user and app state and the indexes
      that list it in one atomic batch; two creations of one id: one wins, the other raises
      ``AlreadyExistsError``.
    - ``append_event`` is one atomic batch across the scopes its ``state_delta`` touches: the
      event, the session's keys, the user's and the app's. ``temp:`` keys are applied to the
      caller's session object and never stored. Appends to one session from many callers
      (threads, processes, stale session objects) are ordered by the session's actor: none is
      refused as stale and none is lost; ``last_update_time`` is the newest event timestamp
      appended (it never goes back). Appending to a session that does not exist (or was
      deleted) raises ``SessionNotFoundError``. Inside ``manager.run(...)`` an append belongs to
      the run and is undone with it, in every scope it wrote.
    - ``get_session`` reads the session, its user and app state and its events from one
      snapshot, filtered by ``GetSessionConfig``; ``list_sessions`` lists a user's (or every
      user's) sessions, oldest update first, without events; ``get_user_state`` reads the user
      scope.
    - State values and events are stored in their JSON form, as ADK's database services store
      them; a value with none raises :class:`~victor_actors.TransitionValidationError` and
      nothing is written.
    """

    def __init__(self, manager: Manager) -> None:
        self._manager = check_manager(manager, "VictorActorsSessionService")

    def __repr__(self) -> str:
        return f"<VictorActorsSessionService on {self._manager!r}>"

    # -- scopes ---------------------------------------------------------------------------------

    @staticmethod
    def _ids(app_name: str, user_id: str, session_id: str | None = None) -> tuple[str, str, str | None]:
        app = name(app_name, "an app name")
        user = name(user_id, "a user id")
        team = scope_id(PREFIX, app)
        workflow = scope_id(PREFIX, app, user)
        conv = None if session_id is None else scope_id(PREFIX, app, user, session_id)
        return team, workflow, conv

    async def _session_scope(
        self, app_name: str, user_id: str, session_id: str, create: bool
    ) -> Handle | None:
        team, workflow, conv = self._ids(app_name, user_id, session_id)
        assert conv is not None
        return await open_conversation(self._manager, conv, workflow_id=workflow, team_id=team, create=create)

    # -- the service ----------------------------------------------------------------------------

    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        """Create a session with its initial state (app, user and session keys), atomically.

        Raises:
            AlreadyExistsError: the user already has a live session with this id.
            TransitionValidationError: a name or a state value cannot be stored; nothing was written.
        """
        blank = session_id is None or (isinstance(session_id, str) and not session_id.strip())
        sid = str(uuid.uuid4()) if blank else _session_id(session_id)  # a blank id is no id, as in ADK
        app, user, own = _split(state, "the initial state")
        handle = await self._session_scope(app_name, user_id, sid, create=True)
        assert handle is not None
        now = time.time()

        def build(snap: ContextSnapshot) -> TransitionBatch:
            if _live(snap, sid):
                raise AlreadyExistsError(f"Session with id {sid} already exists.")
            batch = TransitionBatch().clear_messages()  # a deleted session's scope starts afresh
            for key in snap.state:
                batch.delete_state(key)
            _write_state(batch, app, user, own)
            batch.update_state(UPDATED, now)
            batch.update_state(_SESSION + escape(sid), {"created": now}, scope=StateScope.WORKFLOW)
            apps = snap.ancestor_state(StateScope.TEAM)
            if apps is None or _USER + escape(user_id) not in apps:
                batch.update_state(_USER + escape(user_id), True, scope=StateScope.TEAM)
            return batch

        await write_if_unmoved(handle, build, _all_three)
        made = await self._read(handle, app_name, user_id, sid, None)
        if made is None:  # deleted by another caller between the write and this read
            raise SessionNotFoundError(f"Session {sid} was deleted as it was being created.")
        return made

    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> Session | None:
        """The session with its merged state and its events (filtered by ``config``), or None."""
        sid = _session_id(session_id)
        handle = await self._session_scope(app_name, user_id, sid, create=False)
        if handle is None:
            return None
        return await self._read(handle, app_name, user_id, sid, config)

    async def _read(
        self, handle: Handle, app_name: str, user_id: str, sid: str, config: GetSessionConfig | None
    ) -> Session | None:
        snap = await handle.asnapshot()
        if not _live(snap, sid):
            return None
        messages: Any = snap.messages
        if config is not None and config.num_recent_events is not None:
            messages = messages[-config.num_recent_events :] if config.num_recent_events else ()
        events = [Event.model_validate(thaw(m)) for m in messages]
        if config is not None and config.after_timestamp is not None:
            at = len(events)
            while at > 0 and events[at - 1].timestamp >= config.after_timestamp:
                at -= 1
            events = events[at:]
        return Session(
            id=sid,
            app_name=app_name,
            user_id=user_id,
            state=_merged(snap),
            events=events,
            last_update_time=float(snap.state.get(UPDATED, 0.0)),
        )

    async def list_sessions(self, *, app_name: str, user_id: str | None = None) -> ListSessionsResponse:
        """The live sessions of ``user_id`` (or of every user), without events, oldest update first."""
        team_id = scope_id(PREFIX, name(app_name, "an app name"))
        if user_id is None:
            team = await open_team(self._manager, team_id)
            if team is None:
                return ListSessionsResponse()
            users = [
                _unescape(k[len(_USER) :]) for k in (await team.asnapshot()).state if k.startswith(_USER)
            ]
        else:
            users = [name(user_id, "a user id")]
        sessions: list[Session] = []
        for user in users:
            workflow = await open_workflow(self._manager, scope_id(PREFIX, app_name, user), team_id)
            if workflow is None:
                continue
            index: MapView = (await workflow.asnapshot()).state
            for key in index:
                if not key.startswith(_SESSION):
                    continue
                sid = _unescape(key[len(_SESSION) :])
                handle = await self._session_scope(app_name, user, sid, create=False)
                found = None if handle is None else await self._read(handle, app_name, user, sid, None)
                if found is not None:
                    found.events = []
                    sessions.append(found)
        sessions.sort(key=lambda s: (s.last_update_time, s.user_id, s.id))
        return ListSessionsResponse(sessions=sessions)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        """Delete a session: its state and events, and its entry in the user's list (one batch)."""
        sid = _session_id(session_id)
        handle = await self._session_scope(app_name, user_id, sid, create=False)
        if handle is None:
            return

        def build(snap: ContextSnapshot) -> TransitionBatch | None:
            if not _live(snap, sid):
                return None
            batch = TransitionBatch().clear_messages()
            for key in snap.state:
                batch.delete_state(key)
            return batch.delete_state(_SESSION + escape(sid), scope=StateScope.WORKFLOW)

        await write_if_unmoved(handle, build, _all_three)

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        """The user's state, keys without their ``user:`` prefix (empty if none was stored)."""
        team, workflow, _conv = self._ids(app_name, user_id)
        handle = await open_workflow(self._manager, workflow, team)
        if handle is None:
            return {}
        state = (await handle.asnapshot()).state
        n = len(State.USER_PREFIX)
        return {k[n:]: thaw(v) for k, v in state.items() if k.startswith(State.USER_PREFIX)}

    async def append_event(self, session: Session, event: Event) -> Event:
        """Append ``event`` and apply its state delta, in one atomic batch across the scopes it touches.

        Raises:
            SessionNotFoundError: the session does not exist (or was deleted); nothing was written.
            TransitionValidationError: the event or a state value cannot be stored; nothing was written.
        """
        if event.partial:
            return event
        sid = _session_id(session.id)
        delta = event.actions.state_delta if event.actions else None
        app, user, own = _split(delta, "the event's state_delta")
        stored = dict(event.model_dump(mode="json", exclude_none=True))
        if stored.get("actions", {}).get("state_delta"):
            kept = {
                k: v
                for k, v in stored["actions"]["state_delta"].items()
                if not k.startswith(State.TEMP_PREFIX)
            }
            stored["actions"] = {**stored["actions"], "state_delta": kept}
        handle = await self._session_scope(session.app_name, session.user_id, sid, create=False)
        if handle is None:
            raise SessionNotFoundError(f"Session {sid} not found.")
        updated: list[float] = []

        def build(snap: ContextSnapshot) -> TransitionBatch:
            if not _live(snap, sid):
                raise SessionNotFoundError(f"Session {sid} not found.")
            batch = TransitionBatch().add_message(stored)
            _write_state(batch, app, user, own)
            newest = max(float(snap.state.get(UPDATED, 0.0)), event.timestamp)
            updated.append(newest)
            return batch.update_state(UPDATED, newest)

        def lock(snap: ContextSnapshot) -> list[ScopeRef]:
            wanted = {StateScope.WORKFLOW} if user else set()
            if app:
                wanted.add(StateScope.TEAM)
            return [snap.ref, *(a for a in snap.ancestors if a.scope in wanted)]

        await write_if_unmoved(handle, build, lock)
        # committed: now the caller's session object, as ADK's base class updates it
        await super().append_event(session=session, event=event)
        session.last_update_time = updated[-1]
        return event


def _unescape(text: str) -> str:
    return unquote(text)


def _all_three(snap: ContextSnapshot) -> list[ScopeRef]:
    return [snap.ref, *(a for a in snap.ancestors if a.scope in (StateScope.WORKFLOW, StateScope.TEAM))]
