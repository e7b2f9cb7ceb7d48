"""ADR-002's checkpoint calls: a level and a state dict, or a level and a scope id.

ADR-002 writes ``await manager.save_checkpoint(StateScope.CONVERSATION,
conversation.to_dict())`` and ``await manager.load_checkpoint(
StateScope.CONVERSATION, "session-123")``. The manager's ``save_checkpoint``
and ``load_checkpoint`` keep their synchronous form (a scope instance first)
and take this one too: a bare level first makes the call ADR-002's awaited
form, which returns a coroutine (``docs/adr/0026``). This module checks the
arguments of that form, at the call, before anything is written.
"""

from __future__ import annotations

from typing import Any

import immutables

from victor_actors._errors import TransitionValidationError
from victor_actors._model import GLOBAL_REF, ScopeRef, StateScope
from victor_actors._state import ScopeState
from victor_actors._typed import plain
from victor_actors._values import freeze

__all__ = ["NO_STATE", "ScopeDict", "is_level_form", "ref_to_load", "ref_to_save"]


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


class _NoState:
    def __repr__(self) -> str:
        return "<no state>"


NO_STATE: Any = _NoState()


def is_level_form(scope: Any, second: Any) -> bool:
    """Whether a checkpoint call is ADR-002's form: a bare level first (or a state dict second)."""
    return scope.__class__ is StateScope or (second is not NO_STATE and isinstance(second, dict))


def _level(scope: Any, call: str) -> StateScope:
    if not isinstance(scope, (StateScope, str)):
        raise TypeError(f"{call} takes a level (StateScope.X) first in ADR-002's form, not {scope!r}")
    return StateScope.coerce(scope)


def ref_to_save(scope: Any, state: Any) -> ScopeRef:
    """The scope instance ``save_checkpoint(level, state_dict)`` means.

    ``state_dict`` must come from ``handle.to_dict()`` (which names its scope
    instance) of a scope at ``level``, unchanged since: the checkpoint holds
    the scope's committed state, so a dict edited by hand would not be what
    is saved.

    Raises:
        TypeError: no state dict was given.
        TransitionValidationError: the dict does not name a scope, names one
            at another level, or was changed; nothing was saved.
    """
    level = _level(scope, "save_checkpoint")
    if state is NO_STATE:
        raise TypeError(
            "save_checkpoint(StateScope.X, state_dict) takes the dict handle.to_dict() returned; "
            "save_checkpoint(ref) checkpoints a scope by name"
        )
    if not isinstance(state, ScopeDict):
        raise TransitionValidationError(
            f"save_checkpoint({level.name}, state) takes the dict handle.to_dict() returned, which names "
            f"its scope instance; a {type(state).__name__} does not (use save_checkpoint(ref) with the "
            "scope's ref instead); nothing was saved",
            field="state",
        )
    if state.ref.scope is not level:
        raise TransitionValidationError(
            f"save_checkpoint({level.name}, state): the state is {state.ref}'s, a {state.ref.scope.name} "
            "scope; nothing was saved",
            field="state",
        )
    changed = state.changed_keys()
    if changed:
        raise TransitionValidationError(
            f"save_checkpoint({level.name}, state): the dict was changed after to_dict() (keys "
            f"{changed[:5]}{' ...' if len(changed) > 5 else ''}); a checkpoint holds {state.ref}'s "
            "committed state, so apply the change first (handle.update(...)); nothing was saved",
            field="state",
        )
    return state.ref


def ref_to_load(scope: Any, scope_id: Any) -> ScopeRef:
    """The scope instance ``load_checkpoint(level, scope_id)`` means (``"global"`` for the global scope)."""
    level = _level(scope, "load_checkpoint")
    if level is StateScope.GLOBAL and scope_id in (None, "global"):
        return GLOBAL_REF
    if scope_id.__class__ is not str:
        raise TypeError(
            f"load_checkpoint({level.name}, scope_id) takes the scope's id as a str, not {scope_id!r}"
        )
    return ScopeRef(level, scope_id)
