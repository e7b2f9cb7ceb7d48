"""ContextSnapshot: the immutable view of a scope that coordinators read.

Taken from a scope (O(1): references to persistent values nobody can
change), or built by hand from the state-passed document's keyword fields
for a coordinator's unit test. Both are the same class; how they relate is
in ``docs/state-passed.md`` and ``docs/adr/0025``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, overload

import attrs
import immutables

from victor_actors._errors import TransitionValidationError
from victor_actors._model import ScopeRef, StateScope
from victor_actors._state import MapView, MessageLog, ScopeState
from victor_actors._typed import plain, registered_any, revive
from victor_actors._values import freeze, thaw

__all__ = ["ContextSnapshot", "Orchestration", "ScopeDict", "orchestration"]

_EMPTY: immutables.Map[Any, Any] = immutables.Map()


@attrs.frozen(slots=True)
class Orchestration:
    """What a snapshot built for an orchestrator holds beside a scope's state (the seed's fields).

    ``settings``, ``model``, ``provider``, ``max_tokens`` and ``temperature``
    describe the orchestrator; ``observed_files`` the files it has seen;
    ``session_state`` is the session's key-value state when the snapshot was
    built by hand (None: read from the scope's ancestors).
    """

    settings: Any = None
    model: str | None = None
    provider: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    observed_files: tuple[str, ...] = ()
    session_state: immutables.Map[str, Any] | None = None


class _ChainView(Mapping[str, Any]):
    """The ancestors' key-value state as one read-only mapping: the nearest ancestor's value wins."""

    __slots__ = ("_maps",)

    def __init__(self, maps: tuple[immutables.Map[str, Any], ...]) -> None:
        self._maps = maps

    def __getitem__(self, key: str) -> Any:
        for m in self._maps:
            if key in m:
                return revive(m[key])
        raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        return any(key in m for m in self._maps)

    def __iter__(self) -> Iterator[str]:
        seen: set[str] = set()
        for m in self._maps:
            for key in m:
                if key not in seen:
                    seen.add(key)
                    yield key

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"ReadOnlyMapping({dict(self.items())!r})"


class _RevivedView(MapView):
    """A :class:`MapView` whose values of registered message types come back as their class."""

    __slots__ = ()

    def __getitem__(self, key: str) -> Any:
        return revive(self._map[key])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping) and not isinstance(other, MapView):
            return len(self) == len(other) and all(k in other and other[k] == v for k, v in self.items())
        return super().__eq__(other)


class _RevivedLog(MessageLog):
    """A :class:`MessageLog` whose messages of registered message types come back as their class."""

    __slots__ = ()

    @overload
    def __getitem__(self, index: int) -> Any: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[Any, ...]: ...
    def __getitem__(self, index: int | slice) -> Any:
        item = MessageLog.__getitem__(self, index)
        if isinstance(index, slice):
            return tuple(revive(m) for m in item)
        return revive(item)

    def __iter__(self) -> Iterator[Any]:
        for m in MessageLog.__iter__(self):
            yield revive(m)


def _view(values: immutables.Map[str, Any]) -> MapView:
    return _RevivedView(values) if registered_any() else MapView(values)


def _bad_field(name: str, why: str) -> TransitionValidationError:
    message = f"ContextSnapshot field {name!r} {why}; no snapshot was made"
    return TransitionValidationError(message, field=name)


def _frozen_map(name: str, value: Any) -> immutables.Map[str, Any]:
    if value is None:
        return _EMPTY
    if not isinstance(value, Mapping):
        raise _bad_field(name, f"must be a mapping, not {type(value).__name__}")
    try:
        frozen = freeze(value, name)
    except TransitionValidationError as exc:
        raise _bad_field(name, f"holds a value that cannot be held: {exc}") from None
    return immutables.Map(frozen.items())


def _text_or_none(name: str, value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise _bad_field(name, f"must be a str, not {type(value).__name__}")
    return None if value is None else str.__str__(value)


def orchestration(
    *,
    settings: Any = None,
    model: Any = None,
    provider: Any = None,
    max_tokens: Any = None,
    temperature: Any = None,
    observed_files: Any = (),
    session_state: Any = None,
) -> Orchestration:
    """The orchestrator's fields of a snapshot, checked and copied (``session_state`` frozen).

    Raises:
        TransitionValidationError: a field has the wrong type (the error names it).
    """
    files = observed_files
    if isinstance(files, (str, bytes)) or not isinstance(files, (Sequence, set, frozenset)):
        raise _bad_field("observed_files", f"must be a sequence of str, not {type(files).__name__}")
    if not all(isinstance(f, str) for f in files):
        raise _bad_field("observed_files", "must hold only str paths")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)):
        raise _bad_field("max_tokens", f"must be an int, not {max_tokens!r}")
    if temperature is not None and (
        isinstance(temperature, bool) or not isinstance(temperature, (int, float))
    ):
        raise _bad_field("temperature", f"must be a number, not {temperature!r}")
    return Orchestration(
        settings=settings,
        model=_text_or_none("model", model),
        provider=_text_or_none("provider", provider),
        max_tokens=None if max_tokens is None else int(max_tokens),
        temperature=None if temperature is None else float(temperature),
        observed_files=tuple(str.__str__(f) for f in files),
        session_state=None if session_state is None else _frozen_map("session_state", session_state),
    )


def _built(fields: dict[str, Any]) -> tuple[ScopeState, Orchestration]:
    """The state and orchestrator fields of a snapshot built by hand (the seed's keyword fields)."""
    unknown = fields.keys() - _SEED_FIELDS
    if unknown:
        raise TypeError(
            f"ContextSnapshot() got unknown field(s) {sorted(unknown)}; its fields are {sorted(_SEED_FIELDS)}"
        )
    if "session_id" not in fields:
        raise _bad_field("session_id", "is required")
    session_id = fields["session_id"]
    try:
        ref = ScopeRef(StateScope.CONVERSATION, session_id)
    except TransitionValidationError as exc:
        raise _bad_field("session_id", f"is not a session id: {exc}") from None
    messages = fields.get("messages", ())
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
        raise _bad_field("messages", f"must be a sequence of messages, not {type(messages).__name__}")
    try:
        frozen_messages = tuple(freeze(m, f"messages[{i}]") for i, m in enumerate(messages))
    except TransitionValidationError as exc:
        raise _bad_field("messages", f"holds a message that cannot be held: {exc}") from None
    stage = fields.get("conversation_stage", "initial")
    if not isinstance(stage, str) or not stage:
        raise _bad_field("conversation_stage", f"must be a non-empty str, not {stage!r}")
    host = orchestration(
        settings=fields.get("settings"),
        model=fields.get("model"),
        provider=fields.get("provider"),
        max_tokens=fields.get("max_tokens"),
        temperature=fields.get("temperature"),
        observed_files=fields.get("observed_files", ()),
        session_state=fields.get("session_state") or {},
    )
    state = ScopeState(
        ref,
        values=_frozen_map("conversation_state", fields.get("conversation_state")),
        messages=MessageLog().extended(frozen_messages),
        capabilities=_frozen_map("capabilities", fields.get("capabilities")),
        stage=str.__str__(stage),
    )
    return state, host


_SEED_FIELDS = frozenset(
    {
        "messages",
        "session_id",
        "conversation_stage",
        "settings",
        "model",
        "provider",
        "max_tokens",
        "temperature",
        "conversation_state",
        "session_state",
        "observed_files",
        "capabilities",
    }
)


@attrs.frozen(slots=True, init=False)
class ContextSnapshot:
    """An immutable view of one conversation (or other scope) at one version, with its ancestors.

    Two ways to get one, the same class either way:

    * taken from a scope (``handle.snapshot()``, ``create_snapshot(handle)``):
      O(1) whatever the state size, since it holds references to persistent
      values nobody can change; it has a version and the ancestors' states;
    * built by hand with the seed's keyword fields, for a coordinator's unit
      test: ``ContextSnapshot(messages=(m1, m2), session_id="test",
      conversation_stage="initial", settings=..., model="test",
      provider="test", max_tokens=4096, temperature=0.7,
      conversation_state={}, session_state={}, observed_files=(),
      capabilities={})``. Every field but ``session_id`` is optional.
      Messages and state values are copied in and frozen like state (lists
      become tuples, mappings read-only mappings; a value the store could
      not hold is refused with :class:`TransitionValidationError` naming the
      field); ``settings`` is held as it is. Its version is 0 and it has no
      ancestors; ``session_state`` plays their part.

    It never changes after it is made. ``get_state`` reads the conversation's
    own state first, then the session's (the ancestors', nearest first).
    """

    _state: ScopeState
    _ancestors: tuple[ScopeState, ...] = ()
    _host: Orchestration | None = None

    @overload
    def __init__(
        self, state: ScopeState, ancestors: tuple[ScopeState, ...] = (), host: Orchestration | None = None, /
    ) -> None: ...
    @overload
    def __init__(
        self,
        *,
        messages: Sequence[Any] = (),
        session_id: str,
        conversation_stage: str = "initial",
        settings: Any = None,
        model: str | None = None,
        provider: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        conversation_state: Mapping[str, Any] | None = None,
        session_state: Mapping[str, Any] | None = None,
        observed_files: Sequence[str] = (),
        capabilities: Mapping[str, Any] | None = None,
    ) -> None: ...
    def __init__(self, *args: Any, **fields: Any) -> None:
        if args and not fields and args[0].__class__ is ScopeState and len(args) <= 3:
            self.__attrs_init__(*args)
            return
        if args:
            raise TypeError(
                "ContextSnapshot takes its fields by keyword (messages=..., session_id=..., ...), "
                "or is taken from a scope with handle.snapshot()"
            )
        state, host = _built(fields)
        self.__attrs_init__(state, (), host)

    @property
    def ref(self) -> ScopeRef:
        return self._state.ref

    @property
    def scope(self) -> StateScope:
        return self._state.ref.scope

    @property
    def session_id(self) -> str:
        return self._state.ref.id

    @property
    def version(self) -> int:
        return self._state.version

    @property
    def parent(self) -> ScopeRef | None:
        return self._state.parent

    @property
    def messages(self) -> MessageLog:
        """The message log (a sequence equal to a tuple of the same messages).

        Messages of a registered message type come back as instances of
        their class; plain ones as read-only mappings (``thaw`` copies them).
        """
        log = self._state.messages
        if registered_any():
            return _RevivedLog(log._items, log._len)
        return log

    @property
    def message_count(self) -> int:
        return len(self._state.messages)

    @property
    def state(self) -> MapView:
        """This scope's own key-value state (ancestors' keys not included)."""
        return _view(self._state.values)

    @property
    def conversation_state(self) -> MapView:
        """The seed's name for :attr:`state`: this conversation's own key-value state."""
        return _view(self._state.values)

    @property
    def session_state(self) -> Mapping[str, Any]:
        """The session's key-value state, read-only: the ancestors' (nearest first), or as built by hand."""
        host = self._host
        if host is not None and host.session_state is not None:
            return _view(host.session_state)
        return _ChainView(tuple(anc.values for anc in self._ancestors))

    @property
    def capabilities(self) -> MapView:
        return _view(self._state.capabilities)

    @property
    def conversation_stage(self) -> str:
        return self._state.stage

    @property
    def settings(self) -> Any:
        """The orchestrator's settings object, or None (not given, or a snapshot taken from a bare scope)."""
        return None if self._host is None else self._host.settings

    @property
    def model(self) -> str | None:
        return None if self._host is None else self._host.model

    @property
    def provider(self) -> str | None:
        return None if self._host is None else self._host.provider

    @property
    def max_tokens(self) -> int | None:
        return None if self._host is None else self._host.max_tokens

    @property
    def temperature(self) -> float | None:
        return None if self._host is None else self._host.temperature

    @property
    def observed_files(self) -> tuple[str, ...]:
        return () if self._host is None else self._host.observed_files

    @property
    def is_complete(self) -> bool:
        """True once the stage is ``complete`` (or ``completed``) or the scope is closed."""
        return self._state.closed or self._state.stage in ("complete", "completed")

    @property
    def is_closed(self) -> bool:
        return self._state.closed

    @property
    def pending_tool_requests(self) -> MapView:
        """EXECUTE_TOOL requests with no TOOL_RESULT yet, by request id."""
        return MapView(self._state.pending_tools)

    @property
    def sessions(self) -> MapView:
        """Child sessions created here by CREATE_SESSION, by session id."""
        return MapView(self._state.sessions)

    @property
    def ancestors(self) -> tuple[ScopeRef, ...]:
        return self._state.lineage

    def versions(self) -> dict[ScopeRef, int]:
        """The version of this scope and of each ancestor, as this snapshot saw them.

        Pass it as ``expected_version`` to apply a batch only if none of them moved.
        """
        out = {self._state.ref: self._state.version}
        for anc in self._ancestors:
            out[anc.ref] = anc.version
        return out

    def ancestor_state(self, scope: StateScope | str) -> MapView | None:
        """The key-value state of the ancestor at ``scope``, as of this snapshot."""
        wanted = StateScope.coerce(scope)
        for anc in self._ancestors:
            if anc.ref.scope is wanted:
                return _view(anc.values)
        return None

    def get_state(self, key: str, default: Any = None) -> Any:
        """Read ``key`` from this scope (the conversation's state), else from the session's.

        The session's state is the nearest ancestor that has the key (or, in a
        snapshot built by hand, its ``session_state``).
        """
        values = self._state.values
        if key in values:
            return revive(values[key])
        for anc in self._ancestors:
            if key in anc.values:
                return revive(anc.values[key])
        host = self._host
        if host is not None and host.session_state is not None and key in host.session_state:
            return revive(host.session_state[key])
        return default

    def has_capability(self, name: str) -> bool:
        """True when the capability is set to a truthy value."""
        return bool(self._state.capabilities.get(name, False))

    def get_capability_value(self, name: str, default: Any = None) -> Any:
        return revive(self._state.capabilities.get(name, default))

    def _with_host(self, host: Orchestration) -> ContextSnapshot:
        """This snapshot with an orchestrator's fields (``create_snapshot`` of a host uses it)."""
        return ContextSnapshot(self._state, self._ancestors, host)

    def to_dict(self) -> dict[str, Any]:
        """A plain, mutable deep copy of what this snapshot shows."""
        return {
            "ref": str(self.ref),
            "version": self.version,
            "state": thaw(dict(self._state.values.items())),
            "messages": [thaw(m) for m in self._state.messages],
            "capabilities": thaw(dict(self._state.capabilities.items())),
            "conversation_stage": self._state.stage,
            "closed": self._state.closed,
            "pending_tool_requests": thaw(dict(self._state.pending_tools.items())),
            "sessions": thaw(dict(self._state.sessions.items())),
        }


class ScopeDict(dict[str, Any]):
    """A scope's own key-value state as a plain dict (what ``handle.to_dict()`` returns).

    A ``dict`` in every way (equal to a dict with the same items, mutable,
    JSON-ready), that also names the scope instance it was read from
    (``ref``) and the version (``version``): so ADR-002's
    ``await manager.save_checkpoint(StateScope.CONVERSATION, conversation.to_dict())``
    knows which conversation it means. Values of registered message types
    come back as their class, everything else as dicts and lists.
    """

    __slots__ = ("_source", "ref", "version")

    ref: ScopeRef
    version: int
    _source: immutables.Map[str, Any]

    @classmethod
    def of(cls, state: ScopeState) -> ScopeDict:
        out = cls((key, plain(value)) for key, value in state.values.items())
        out.ref = state.ref
        out.version = state.version
        out._source = state.values
        return out

    def changed_keys(self) -> list[str]:
        """The keys whose value here differs from what was read (added, removed or changed).

        Raises:
            TransitionValidationError: a value here could not be stored at all.
        """
        source = self._source
        mine = freeze(dict(self), "state_dict")
        keys = set(mine) | set(source)
        return sorted(k for k in keys if k not in mine or k not in source or mine[k] != source[k])
