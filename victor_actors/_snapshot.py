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

from victor_actors._model import ScopeRef, StateScope
from victor_actors._seed_fields import Orchestration, built
from victor_actors._state import MapView, MessageLog, ScopeState
from victor_actors._typed import registered_any, revive
from victor_actors._values import thaw

__all__ = ["ContextSnapshot"]


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
      become tuples, mappings read-only mappings); what the store could not
      hold (a mock, a provider's message object) and ``settings`` are held
      as they are, in read-only containers. A field of the wrong kind is a
      :class:`TransitionValidationError` naming the field. Its version is 0
      and it has no ancestors; ``session_state`` plays their part.

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
        state, host = built(fields)
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
