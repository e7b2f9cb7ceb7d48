"""The state-passed document's snapshot fields: what a snapshot built by hand is given, checked and frozen.

``ContextSnapshot(messages=..., session_id=..., ...)`` takes the document's
twelve fields by keyword. The conversation's own (messages, key-value state,
capabilities, stage) become a :class:`ScopeState` at version 0, frozen by the
same rules as state where they can be (so a coordinator sees in its unit test
the types it sees in production); what the store could not hold (a mock, a
provider's message object) is copied into read-only containers down to
itself and held as it is. The orchestrator's (``settings``, ``model``,
``provider``, ``max_tokens``, ``temperature``, ``observed_files``) and the
session's state sit beside it in an :class:`Orchestration`, which
``create_snapshot(host)`` also fills from a host's attributes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import attrs
import immutables

from victor_actors._errors import TransitionValidationError
from victor_actors._model import ScopeRef, StateScope
from victor_actors._state import MessageLog, ScopeState
from victor_actors._values import freeze

__all__ = ["SEED_FIELDS", "Orchestration", "built", "orchestration"]

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


def _bad_field(name: str, why: str) -> TransitionValidationError:
    message = f"ContextSnapshot field {name!r} {why}; no snapshot was made"
    return TransitionValidationError(message, field=name)


def _held(value: Any) -> Any:
    """``value`` frozen as state is, where it can be; else copied into read-only containers down to
    what cannot be stored (a mock, a provider's message object), which is held as it is."""
    try:
        return freeze(value)
    except TransitionValidationError:
        pass
    if isinstance(value, Mapping):
        # never a FrozenDict: freezing trusts one to hold only what the store can, and this does not
        return MappingProxyType({key: _held(item) for key, item in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(_held(item) for item in value)
    if isinstance(value, (set, frozenset)):
        return frozenset(_held(item) for item in value)
    return value


def _frozen_map(name: str, value: Any) -> immutables.Map[str, Any]:
    if value is None:
        return _EMPTY
    if not isinstance(value, Mapping):
        raise _bad_field(name, f"must be a mapping, not {type(value).__name__}")
    for key in value:
        if not isinstance(key, str):
            raise _bad_field(name, f"has a key that is not a str: {key!r}")
    return immutables.Map({str.__str__(key): _held(item) for key, item in value.items()})


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


def built(fields: dict[str, Any]) -> tuple[ScopeState, Orchestration]:
    """The state and orchestrator fields of a snapshot built by hand (the seed's keyword fields)."""
    unknown = fields.keys() - SEED_FIELDS
    if unknown:
        raise TypeError(
            f"ContextSnapshot() got unknown field(s) {sorted(unknown)}; its fields are {sorted(SEED_FIELDS)}"
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
    frozen_messages = tuple(_held(m) for m in messages)
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


SEED_FIELDS = frozenset(
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
