"""The state-passed model as immutable values.

Scopes, scope references, transitions, batches and coordinator results. No
actors and no I/O here: these are plain values, validated when they are made.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import attrs

from victor_actors._errors import TransitionValidationError
from victor_actors._values import FrozenDict, check_text, freeze, freeze_measured

__all__ = [
    "MAX_ID_BYTES",
    "SESSION",
    "CoordinatorResult",
    "ScopeRef",
    "StateScope",
    "StateTransition",
    "TransitionBatch",
    "TransitionType",
]


class StateScope(enum.StrEnum):
    """The four levels at which agent state lives, from widest to narrowest."""

    GLOBAL = "global"
    TEAM = "team"
    WORKFLOW = "workflow"
    CONVERSATION = "conversation"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def coerce(cls, value: StateScope | str) -> StateScope:
        """Return the scope for a ``StateScope`` or its string value.

        Raises:
            TransitionValidationError: for anything else.
        """
        if isinstance(value, StateScope):
            return value
        try:
            return cls(value)
        except ValueError:
            names = ", ".join(repr(s.value) for s in cls)
            raise TransitionValidationError(
                f"unknown scope {value!r}; expected one of {names}", field="scope"
            ) from None


def _coerce_scope(value: StateScope | str) -> StateScope:
    return StateScope.coerce(value)


# The longest scope id, in UTF-8 bytes. A store key is a 3-byte prefix, the id and an 8-byte version
# (and, quarantined, a 5-byte database name): 400 keeps every key well inside LMDB's 511 bytes.
MAX_ID_BYTES = 400


@attrs.frozen(slots=True, order=False)
class ScopeRef:
    """Names one scope instance: its level and its id (``team:team-a``)."""

    scope: StateScope = attrs.field(converter=_coerce_scope)
    id: str = attrs.field()

    @id.validator
    def _check_id(self, _attr: Any, value: Any) -> None:
        if value.__class__ is not str or not value:
            raise TransitionValidationError(
                f"a scope id must be a non-empty str, not {_short(value)}", field="id"
            )
        why = check_text(value, "the scope id")
        if why is not None:
            raise TransitionValidationError(f"{why}; nothing was created", field="id")
        if len(value) > MAX_ID_BYTES // 4 and len(value.encode("utf-8")) > MAX_ID_BYTES:
            raise TransitionValidationError(
                f"a scope id holds at most {MAX_ID_BYTES} bytes in UTF-8; this one holds "
                f"{len(value.encode('utf-8'))} ({_short(value)}); nothing was created",
                field="id",
            )

    def __repr__(self) -> str:
        return f"ScopeRef({self.scope.value!r}, {self.id!r})"

    def __str__(self) -> str:
        return f"{self.scope.value}:{self.id}"

    @classmethod
    def parse(cls, text: str) -> ScopeRef:
        """Parse ``"team:team-a"`` (the form ``str(ref)`` gives) into a ref."""
        scope, sep, ident = text.partition(":")
        if not sep:
            raise TransitionValidationError(f"expected 'scope:id', got {text!r}", field="ref")
        return cls(StateScope.coerce(scope), ident)


GLOBAL_REF = ScopeRef(StateScope.GLOBAL, "global")


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}... ({len(text)} characters)"


class TransitionType(enum.StrEnum):
    """Every kind of state change or side-effect request a batch may carry."""

    ADD_MESSAGE = "add_message"
    ADD_MESSAGES = "add_messages"
    UPDATE_STATE = "update_state"
    DELETE_STATE = "delete_state"
    CREATE_SESSION = "create_session"
    CLOSE_SESSION = "close_session"
    EXECUTE_TOOL = "execute_tool"
    TOOL_RESULT = "tool_result"
    UPDATE_CAPABILITY = "update_capability"
    UPDATE_STAGE = "update_stage"
    BATCH = "batch"
    # Message removal (docs/adr/0024): after the seed's eleven, so their order and values stay.
    POP_MESSAGE = "pop_message"
    TRUNCATE_MESSAGES = "truncate_messages"
    CLEAR_MESSAGES = "clear_messages"

    def __str__(self) -> str:
        return self.value


_UPDATE_STATE = TransitionType.UPDATE_STATE
_ADD_MESSAGE = TransitionType.ADD_MESSAGE

# For each type: (required fields, optional fields). Anything else is an error.
_FIELDS: dict[TransitionType, tuple[frozenset[str], frozenset[str]]] = {
    TransitionType.ADD_MESSAGE: (frozenset({"message"}), frozenset({"scope"})),
    TransitionType.ADD_MESSAGES: (frozenset({"messages"}), frozenset({"scope"})),
    TransitionType.UPDATE_STATE: (frozenset({"key", "value"}), frozenset({"scope"})),
    TransitionType.DELETE_STATE: (frozenset({"key"}), frozenset({"scope"})),
    TransitionType.CREATE_SESSION: (frozenset(), frozenset({"session_id", "metadata", "kwargs"})),
    TransitionType.CLOSE_SESSION: (frozenset(), frozenset({"session_id", "reason"})),
    TransitionType.EXECUTE_TOOL: (
        frozenset({"tool_name", "arguments"}),
        frozenset({"request_id", "scope"}),
    ),
    TransitionType.TOOL_RESULT: (
        frozenset({"tool_name", "result"}),
        frozenset({"request_id", "error", "scope"}),
    ),
    TransitionType.UPDATE_CAPABILITY: (frozenset({"capability"}), frozenset({"value", "scope"})),
    TransitionType.UPDATE_STAGE: (frozenset({"stage"}), frozenset({"scope"})),
    TransitionType.BATCH: (frozenset({"transitions"}), frozenset()),
    TransitionType.POP_MESSAGE: (frozenset(), frozenset({"scope"})),
    TransitionType.TRUNCATE_MESSAGES: (frozenset(), frozenset({"length", "drop", "scope"})),
    TransitionType.CLEAR_MESSAGES: (frozenset(), frozenset({"scope"})),
}


def _coerce_type(value: TransitionType | str) -> TransitionType:
    if isinstance(value, TransitionType):
        return value
    try:
        return TransitionType(value)
    except ValueError:
        raise TransitionValidationError(
            f"unknown transition type {value!r}", field="transition_type"
        ) from None


def _bad(ttype: TransitionType, field: str, why: str) -> TransitionValidationError:
    return TransitionValidationError(
        f"{ttype.name} transition: field {field!r} {why}",
        transition_type=ttype.name,
        field=field,
    )


def _need_str(ttype: TransitionType, data: Mapping[str, Any], field: str) -> None:
    value = data.get(field)
    if not isinstance(value, str) or not value:
        raise _bad(ttype, field, f"must be a non-empty str, got {value!r}")


# The seed's "session" scope: the applying conversation's parent (its workflow or team), resolved
# when the batch is applied (docs/adr/0025); never global, whose state every conversation shares.
SESSION = "session"


def _scope_target(ttype: TransitionType, value: Any) -> str:
    """A transition's ``scope``: a level (``"team"``), one instance (``"team:team-a"``), or ``"session"``."""
    if value.__class__ is str and value == SESSION:
        return SESSION
    try:
        if isinstance(value, ScopeRef):
            return str(value)
        if isinstance(value, str) and ":" in value:
            return str(ScopeRef.parse(value))
        return StateScope.coerce(value).value
    except TransitionValidationError:
        raise _bad(ttype, "scope", f"names no scope: {value!r}") from None


def _check_truncate(ttype: TransitionType, data: Mapping[str, Any]) -> None:
    """TRUNCATE_MESSAGES names exactly one of ``length`` (messages kept) or ``drop`` (messages removed)."""
    given = [f for f in ("length", "drop") if f in data]
    if not given:
        raise _bad(ttype, "length", "is required, or 'drop' (keep a length, or drop a suffix)")
    if len(given) == 2:
        raise _bad(ttype, "drop", "cannot be given with 'length' (keep a length, or drop a suffix)")
    field = given[0]
    value = data[field]
    if value.__class__ is not int or value < 0:
        raise _bad(ttype, field, f"must be a non-negative int, got {_short(value)}")


def _validate(ttype: TransitionType, data: dict[str, Any]) -> tuple[dict[str, Any], int | None, int]:
    """Check ``data`` for ``ttype`` and return it frozen, field by field, with its height and size bound.

    The height and the bound come from the one walk that freezes the values,
    so neither the frozen mapping nor the record-size check walks them again
    (-1: not known, computed when first asked for).
    """
    required, optional = _FIELDS[ttype]
    if ttype is TransitionType.UPDATE_CAPABILITY and "name" in data and "capability" not in data:
        data["capability"] = data.pop("name")
    missing = required - data.keys()
    if missing:
        raise _bad(ttype, sorted(missing)[0], "is required")
    unknown = data.keys() - required - optional
    if unknown:
        allowed = ", ".join(sorted(required | optional))
        raise _bad(ttype, sorted(unknown)[0], f"is not a known field (allowed: {allowed})")
    if "scope" in data:
        if data["scope"] is None:
            del data["scope"]
        else:
            data["scope"] = _scope_target(ttype, data["scope"])
    if ttype is TransitionType.BATCH:
        inner = data["transitions"]
        if isinstance(inner, TransitionBatch):
            inner = inner.transitions
        if not isinstance(inner, (list, tuple)) or not all(isinstance(t, StateTransition) for t in inner):
            raise _bad(ttype, "transitions", "must be a sequence of StateTransition")
        return {"transitions": tuple(inner)}, None, -1
    if ttype in (TransitionType.UPDATE_STATE, TransitionType.DELETE_STATE):
        _need_str(ttype, data, "key")
    elif ttype is TransitionType.ADD_MESSAGE:
        if data["message"] is None:
            raise _bad(ttype, "message", "must not be None")
    elif ttype is TransitionType.ADD_MESSAGES:
        if not isinstance(data["messages"], (list, tuple)):
            raise _bad(ttype, "messages", "must be a list or tuple of messages")
        if any(m is None for m in data["messages"]):
            raise _bad(ttype, "messages", "must not contain None")
    elif ttype in (TransitionType.EXECUTE_TOOL, TransitionType.TOOL_RESULT):
        _need_str(ttype, data, "tool_name")
        if ttype is TransitionType.EXECUTE_TOOL and not isinstance(data["arguments"], Mapping):
            raise _bad(ttype, "arguments", f"must be a mapping, got {type(data['arguments']).__name__}")
        if data.get("request_id") is not None:
            _need_str(ttype, data, "request_id")
        if data.get("error") is not None and not isinstance(data["error"], str):
            raise _bad(ttype, "error", "must be a str or None")
    elif ttype in (TransitionType.CREATE_SESSION, TransitionType.CLOSE_SESSION):
        if data.get("session_id") is None:
            data.pop("session_id", None)
        else:
            _need_str(ttype, data, "session_id")
    elif ttype is TransitionType.UPDATE_CAPABILITY:
        _need_str(ttype, data, "capability")
        data.setdefault("value", True)
    elif ttype is TransitionType.UPDATE_STAGE:
        _need_str(ttype, data, "stage")
    elif ttype is TransitionType.TRUNCATE_MESSAGES:
        _check_truncate(ttype, data)
    frozen: dict[str, Any] = {}
    height = 0
    size = _MAP_HEADER
    for key, value in data.items():
        try:
            frozen[key], below, bound = freeze_measured(value, key)
        except TransitionValidationError as exc:
            raise _bad(ttype, key, f"holds a value that cannot be stored: {exc}") from None
        if below > height:
            height = below
        size += bound + _MAP_HEADER + 4 * len(key)
    return frozen, height + 1, size


_MAP_HEADER = 5  # as _values' bound: at most 5 bytes of msgpack header per map, str or list


_EMPTY_META = FrozenDict._wrap({})


def _fast(ttype: TransitionType, key: str, name: str, value: Any) -> StateTransition:
    """A ``{"key": key, name: value}`` transition without a scope, made as ``StateTransition(...)`` makes it.

    The builders' common case (``update_state("k", v)``, ``add_message(m)``
    with no key) skips the generic field checks, which cannot fail for it:
    the fields are fixed here, ``key`` is a non-empty ASCII ``str`` (the
    caller checks) and the value is frozen and measured by the same walk.
    The frozen data, its height and its size bound are those ``_validate``
    gives (tests/test_request_path.py compares the two).
    """
    try:
        frozen, below, bound = freeze_measured(value, name)
    except TransitionValidationError as exc:
        raise _bad(ttype, name, f"holds a value that cannot be stored: {exc}") from None
    if key:
        data = {"key": key, name: frozen}
        # as _validate: a map header, then per field its bound, a header and 4 bytes per name character
        size = 3 * _MAP_HEADER + _MAP_HEADER + len(key) + 12 + bound + 4 * len(name)
    else:
        data = {name: frozen}
        size = 2 * _MAP_HEADER + bound + 4 * len(name)
    t = _new(StateTransition)
    _init(t, ttype, FrozenDict._wrap(data, below + 1, size), _EMPTY_META)
    return t


_new = object.__new__


@attrs.frozen(slots=True, init=False)
class StateTransition:
    """One state change or side-effect request, validated and frozen on creation.

    ``data`` depends on the type:

    ================== =====================================================
    ADD_MESSAGE        ``message``; optional ``scope``
    ADD_MESSAGES       ``messages`` (list or tuple); optional ``scope``
    UPDATE_STATE       ``key``, ``value`` (may be None); optional ``scope``
    DELETE_STATE       ``key``; optional ``scope``
    CREATE_SESSION     optional ``session_id`` (generated if absent), ``metadata``
    CLOSE_SESSION      optional ``session_id`` (this scope's own id), ``reason``
    EXECUTE_TOOL       ``tool_name``, ``arguments`` (mapping); optional ``request_id``
    TOOL_RESULT        ``tool_name``, ``result``; optional ``request_id``, ``error``
    UPDATE_CAPABILITY  ``capability`` (``name`` is accepted too); optional ``value`` (default True)
    UPDATE_STAGE       ``stage``
    BATCH              ``transitions`` (StateTransition objects)
    POP_MESSAGE        optional ``scope``: removes the last message, if any
    TRUNCATE_MESSAGES  ``length`` (keep the first ``length``) or ``drop``
                       (remove the last ``drop``); optional ``scope``
    CLEAR_MESSAGES     optional ``scope``: removes every message
    ================== =====================================================

    A removal of messages that are not there removes what there is (a pop
    of an empty log, a truncate to a length the log does not reach): like a
    delete of a missing key, it changes nothing. The commit record's
    ``removed_messages`` holds what a batch removed.

    Raises:
        TransitionValidationError: naming the type and the field, when a
            field is missing, unknown, of the wrong type, or not storable.
    """

    transition_type: TransitionType
    data: FrozenDict
    metadata: FrozenDict

    def __init__(
        self,
        transition_type: TransitionType | str,
        data: Mapping[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        ttype = _coerce_type(transition_type)
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise TransitionValidationError(
                f"{ttype.name} transition: data must be a mapping, got {type(data).__name__}",
                transition_type=ttype.name,
                field="data",
            )
        checked, height, size = _validate(ttype, dict(data))
        if not metadata:
            frozen_meta = _EMPTY_META
        else:
            try:
                frozen_meta = freeze(dict(metadata), "metadata")
            except TransitionValidationError as exc:
                raise _bad(ttype, "metadata", str(exc)) from None
        self.__attrs_init__(ttype, FrozenDict._wrap(checked, height, size), frozen_meta)

    @property
    def scope(self) -> StateScope | None:
        """The level this transition targets, or None for the applying scope (and for ``"session"``,
        which names the applying scope's parent and is resolved when the batch is applied)."""
        value = self.data.get("scope")
        if value is None or value == SESSION:
            return None
        return StateScope(value.partition(":")[0])

    @property
    def target(self) -> ScopeRef | None:
        """The scope instance this transition names, if it names one (``scope="team:t"``)."""
        value = self.data.get("scope")
        return ScopeRef.parse(value) if value is not None and ":" in value else None

    def flatten(self) -> Iterator[StateTransition]:
        """Yield this transition, or the transitions inside it for BATCH."""
        if self.transition_type is TransitionType.BATCH:
            for inner in self.data["transitions"]:
                yield from inner.flatten()
        else:
            yield self


_init = StateTransition.__attrs_init__


class TransitionBatch:
    """An ordered batch of transitions, applied all or nothing.

    The builders validate their transition at once and return the batch, so
    calls chain: ``TransitionBatch().add_message(m).update_state("k", 1)``.
    The batch itself is a mutable builder; applying it captures the
    transitions as they are then, so later changes to the batch never reach
    state already applied.
    """

    __slots__ = ("metadata", "transitions")

    def __init__(
        self,
        transitions: Iterable[StateTransition] = (),
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        if transitions.__class__ is tuple and not transitions and metadata is None:  # TransitionBatch()
            self.transitions: list[StateTransition] = []
            self.metadata: dict[str, Any] = {}
            return
        self.transitions = list(transitions)
        for t in self.transitions:
            if not isinstance(t, StateTransition):
                raise TransitionValidationError(
                    f"a batch holds StateTransition objects, not {type(t).__name__}",
                    field="transitions",
                )
        self.metadata = dict(metadata or {})

    def add(self, transition: StateTransition) -> TransitionBatch:
        """Append a transition made elsewhere."""
        if not isinstance(transition, StateTransition):
            raise TransitionValidationError(
                f"a batch holds StateTransition objects, not {type(transition).__name__}",
                field="transitions",
            )
        self.transitions.append(transition)
        return self

    def _push(self, ttype: TransitionType, data: dict[str, Any]) -> TransitionBatch:
        self.transitions.append(StateTransition(ttype, data))
        return self

    def add_message(
        self, message: Any, *, scope: StateScope | ScopeRef | str | None = None
    ) -> TransitionBatch:
        if scope is None:
            self.transitions.append(
                _fast(_ADD_MESSAGE, "", "message", message)
                if message is not None
                else StateTransition(_ADD_MESSAGE, {"message": message})
            )
            return self
        return self._push(TransitionType.ADD_MESSAGE, {"message": message, "scope": scope})

    def add_messages(
        self, messages: Sequence[Any], *, scope: StateScope | ScopeRef | str | None = None
    ) -> TransitionBatch:
        return self._push(TransitionType.ADD_MESSAGES, {"messages": messages, "scope": scope})

    def update_state(
        self, key: str, value: Any, scope: StateScope | ScopeRef | str | None = None
    ) -> TransitionBatch:
        if scope is None and key.__class__ is str and key and key.isascii():
            self.transitions.append(_fast(_UPDATE_STATE, key, "value", value))
            return self
        return self._push(TransitionType.UPDATE_STATE, {"key": key, "value": value, "scope": scope})

    def delete_state(self, key: str, scope: StateScope | ScopeRef | str | None = None) -> TransitionBatch:
        return self._push(TransitionType.DELETE_STATE, {"key": key, "scope": scope})

    def update_capability(self, name: str, value: Any = True) -> TransitionBatch:
        return self._push(TransitionType.UPDATE_CAPABILITY, {"capability": name, "value": value})

    def update_stage(self, stage: str) -> TransitionBatch:
        return self._push(TransitionType.UPDATE_STAGE, {"stage": stage})

    def execute_tool(
        self, tool_name: str, arguments: Mapping[str, Any] | None = None, *, request_id: str | None = None
    ) -> TransitionBatch:
        data: dict[str, Any] = {"tool_name": tool_name, "arguments": arguments or {}}
        if request_id is not None:
            data["request_id"] = request_id
        return self._push(TransitionType.EXECUTE_TOOL, data)

    def tool_result(
        self,
        tool_name: str,
        result: Any,
        *,
        request_id: str | None = None,
        error: str | None = None,
    ) -> TransitionBatch:
        data: dict[str, Any] = {"tool_name": tool_name, "result": result}
        if request_id is not None:
            data["request_id"] = request_id
        if error is not None:
            data["error"] = error
        return self._push(TransitionType.TOOL_RESULT, data)

    def create_session(
        self, session_id: str | None = None, metadata: Mapping[str, Any] | None = None
    ) -> TransitionBatch:
        data: dict[str, Any] = {"session_id": session_id}
        if metadata is not None:
            data["metadata"] = metadata
        return self._push(TransitionType.CREATE_SESSION, data)

    def close_session(self, session_id: str | None = None, *, reason: str | None = None) -> TransitionBatch:
        data: dict[str, Any] = {}
        if session_id is not None:
            data["session_id"] = session_id
        if reason is not None:
            data["reason"] = reason
        return self._push(TransitionType.CLOSE_SESSION, data)

    def pop_message(self, *, scope: StateScope | ScopeRef | str | None = None) -> TransitionBatch:
        """Remove the last message (none if the log is empty); the commit's ``removed_messages`` holds it."""
        return self._push(TransitionType.POP_MESSAGE, {"scope": scope})

    def truncate_messages(
        self, length: int, *, scope: StateScope | ScopeRef | str | None = None
    ) -> TransitionBatch:
        """Keep the first ``length`` messages and remove the rest."""
        return self._push(TransitionType.TRUNCATE_MESSAGES, {"length": length, "scope": scope})

    def drop_messages(
        self, count: int, *, scope: StateScope | ScopeRef | str | None = None
    ) -> TransitionBatch:
        """Remove the last ``count`` messages (all of them, if there are fewer)."""
        return self._push(TransitionType.TRUNCATE_MESSAGES, {"drop": count, "scope": scope})

    def clear_messages(self, *, scope: StateScope | ScopeRef | str | None = None) -> TransitionBatch:
        """Remove every message."""
        return self._push(TransitionType.CLEAR_MESSAGES, {"scope": scope})

    def extend(self, other: TransitionBatch | Iterable[StateTransition]) -> TransitionBatch:
        """Append another batch's transitions (and merge its metadata)."""
        if isinstance(other, TransitionBatch):
            self.transitions.extend(other.transitions)
            self.metadata.update(other.metadata)
        else:
            for t in other:
                self.add(t)
        return self

    def is_empty(self) -> bool:
        return not self.transitions

    def __len__(self) -> int:
        return len(self.transitions)

    def __iter__(self) -> Iterator[StateTransition]:
        return iter(self.transitions)

    def __bool__(self) -> bool:
        return True

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TransitionBatch):
            return NotImplemented
        return self.transitions == other.transitions and self.metadata == other.metadata

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"TransitionBatch({self.transitions!r}, metadata={self.metadata!r})"

    def freeze(self) -> tuple[StateTransition, ...]:
        """The transitions as they are now, flattened (BATCH unpacked)."""
        out: list[StateTransition] = []
        for t in self.transitions:
            out.extend(t.flatten())
        return tuple(out)


def _confidence(_inst: Any, _attr: Any, value: float) -> None:
    if not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise TransitionValidationError(
            f"confidence must be within [0, 1], got {value!r}", field="confidence"
        )


@attrs.frozen(slots=True)
class CoordinatorResult:
    """What a coordinator decided: transitions plus why, and what to do next."""

    transitions: TransitionBatch = attrs.field(factory=TransitionBatch)
    reasoning: str | None = None
    confidence: float = attrs.field(default=1.0, validator=_confidence)
    metadata: Mapping[str, Any] = attrs.field(factory=dict)
    should_continue: bool = True
    handoff_to: str | None = None

    @classmethod
    def no_op(cls, reasoning: str | None = None, **kwargs: Any) -> CoordinatorResult:
        """A result that changes nothing."""
        return cls(TransitionBatch(), reasoning, **kwargs)

    @classmethod
    def transitions_only(
        cls, *transitions: StateTransition, reasoning: str | None = None, **kwargs: Any
    ) -> CoordinatorResult:
        """A result carrying exactly these transitions."""
        return cls(TransitionBatch(transitions), reasoning, **kwargs)

    @property
    def has_transitions(self) -> bool:
        return not self.transitions.is_empty()

    def add_message(self, message: Any) -> CoordinatorResult:
        """Add a message to this result's batch; returns the result."""
        self.transitions.add_message(message)
        return self

    def update_state(
        self, key: str, value: Any, scope: StateScope | ScopeRef | str | None = None
    ) -> CoordinatorResult:
        """Add a state update to this result's batch; returns the result."""
        self.transitions.update_state(key, value, scope)
        return self
