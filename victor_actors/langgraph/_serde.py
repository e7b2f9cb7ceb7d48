"""A strict serializer for LangGraph checkpoints: an allowlist, no pickle, and errors instead of guesses.

LangGraph's :class:`JsonPlusSerializer` writes msgpack, where values of
classes (dataclasses, pydantic models, enums, ...) are extension records
naming a module and a class. Reading one back imports that module and calls
that class. In its strict mode LangGraph refuses classes outside an
allowlist, but silently: it logs a warning and hands back the raw fields, so
a resumed graph runs on a dict where it had an object.

:class:`StrictSerializer` keeps LangGraph's format and its safe built-in list
(``SAFE_MSGPACK_TYPES``: datetimes, UUIDs, LangChain messages, ``Send``,
``Interrupt``, ``Command``, ...), adds the classes you name, and checks every
extension record of a payload *before* anything is constructed. A class that
is not allowed raises :class:`DisallowedTypeError` naming it; nothing is
imported. The same check runs when a value is written, so a value that could
not be read back is refused at ``put`` time, not discovered after a restart.
Pickle is never written nor read.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import ormsgpack  # type: ignore[import-not-found, unused-ignore]
from langgraph.checkpoint.serde import _msgpack as lg_msgpack  # type: ignore[import-not-found, unused-ignore]
from langgraph.checkpoint.serde.jsonplus import (  # type: ignore[import-not-found, unused-ignore]
    EXT_CONSTRUCTOR_KW_ARGS,
    EXT_CONSTRUCTOR_POS_ARGS,
    EXT_CONSTRUCTOR_SINGLE_ARG,
    EXT_DELTA_SNAPSHOT,
    EXT_METHOD_SINGLE_ARG,
    EXT_NUMPY_ARRAY,
    EXT_PYDANTIC_V1,
    EXT_PYDANTIC_V2,
    JsonPlusSerializer,
)

from victor_actors import VictorActorsError

__all__ = ["DisallowedTypeError", "StrictSerializer", "type_key"]

# Bytes that start a msgpack extension record (fixext 1..16, ext 8/16/32). A payload without any of
# them holds no extension record, so it needs no check (``in`` on bytes is a memchr: fast).
_EXT_MARKERS = tuple(bytes([b]) for b in (0xC7, 0xC8, 0xC9, 0xD4, 0xD5, 0xD6, 0xD7, 0xD8))
_CLASS_CODES = frozenset(
    {
        EXT_CONSTRUCTOR_SINGLE_ARG,
        EXT_CONSTRUCTOR_POS_ARGS,
        EXT_CONSTRUCTOR_KW_ARGS,
        EXT_PYDANTIC_V1,
        EXT_PYDANTIC_V2,
    }
)
_NUMPY = ("numpy", "ndarray")
# The formats this serializer reads. "json" (LangChain's reviver) and "pickle" are refused.
_PLAIN_TYPES = frozenset({"null", "bytes", "bytearray", "msgpack"})
_UNSET = object()


class DisallowedTypeError(VictorActorsError, TypeError):
    """A stored (or about to be stored) value names a type the serializer does not allow.

    ``type_name`` is the dotted name (``"mymod.MyClass"``) or the refused
    format (``"pickle"``). Nothing was imported and nothing was written.
    """

    def __init__(self, message: str, *, type_name: str) -> None:
        super().__init__(message)
        self.type_name = type_name


def type_key(item: tuple[str, ...] | type) -> tuple[str, ...]:
    """``(module, name)`` for a class, or the tuple itself."""
    if isinstance(item, type):
        return (item.__module__, item.__name__)
    if isinstance(item, tuple) and len(item) >= 2 and all(isinstance(part, str) for part in item):
        return item
    raise TypeError(f"an allowed type is a class or a (module, name) tuple, not {item!r}")


def _refused(module: str, name: str, writing: bool) -> DisallowedTypeError:
    dotted = f"{module}.{name}"
    if writing:
        what = f"cannot store a value of type {dotted}: it is not in the serializer's allowlist, so it could "
        what += "not be read back; nothing was written"
    else:
        what = f"refusing to load a stored value of type {dotted}: it is not in the serializer's allowlist; "
        what += "nothing was imported"
    hint = f"allow it with VictorActorsSaver(..., allowed_types=[({module!r}, {name!r})]) if you trust it"
    return DisallowedTypeError(f"{what} ({hint})", type_name=dotted)


class StrictSerializer(JsonPlusSerializer):  # type: ignore[misc, unused-ignore]
    """LangGraph's msgpack serializer with a strict allowlist, checked before anything is built.

    ``allowed_types``: classes (or ``(module, name)`` tuples) to allow on top
    of LangGraph's ``SAFE_MSGPACK_TYPES``. ``numpy`` arrays need
    ``("numpy", "ndarray")``.

    Raises:
        DisallowedTypeError: from ``dumps_typed`` and ``loads_typed``, for a
            class outside the allowlist, a pickled or JSON-revived payload,
            or an unknown extension record.
    """

    def __init__(self, allowed_types: Iterable[tuple[str, ...] | type] = ()) -> None:
        keys = tuple(type_key(item) for item in allowed_types)
        super().__init__(
            pickle_fallback=False, allowed_json_modules=None, allowed_msgpack_modules=keys or None
        )
        self._allowed_cache: tuple[object, frozenset[tuple[str, ...]]] = (_UNSET, frozenset())

    @property
    def allowed_types(self) -> frozenset[tuple[str, ...]]:
        """Every ``(module, name)`` this serializer constructs: the safe list and the extra ones."""
        extra = self._allowed_msgpack_modules
        cached_for, allowed = self._allowed_cache
        if cached_for is not extra:  # with_msgpack_allowlist() clones swap the set: recompute
            if extra is True:
                raise DisallowedTypeError(
                    "a StrictSerializer never allows every type (allowed_msgpack_modules=True)",
                    type_name="*",
                )
            allowed = lg_msgpack.SAFE_MSGPACK_TYPES | frozenset(extra or ())
            self._allowed_cache = (extra, allowed)
        return allowed

    def check(self, data: bytes, *, writing: bool = False) -> None:
        """Raise :class:`DisallowedTypeError` if msgpack ``data`` names a type that is not allowed."""
        for marker in _EXT_MARKERS:
            if marker in data:
                break
        else:
            return
        allowed = self.allowed_types
        errors: list[DisallowedTypeError] = []

        def hook(code: int, payload: bytes) -> None:
            try:
                visit(code, payload)
            except DisallowedTypeError as exc:
                errors.append(exc)
                raise
            return None

        def visit(code: int, payload: bytes) -> None:
            if code == EXT_NUMPY_ARRAY:
                if _NUMPY not in allowed:
                    raise _refused(*_NUMPY, writing)
                return
            inner = ormsgpack.unpackb(payload, ext_hook=hook, option=ormsgpack.OPT_NON_STR_KEYS)
            if code == EXT_DELTA_SNAPSHOT:
                return
            if code not in _CLASS_CODES and code != EXT_METHOD_SINGLE_ARG:
                raise DisallowedTypeError(
                    f"{'cannot store' if writing else 'refusing to load'} a msgpack extension record "
                    f"with unknown code {code}; nothing was imported",
                    type_name=f"ext:{code}",
                )
            if not (
                isinstance(inner, (list, tuple))
                and len(inner) >= 3
                and isinstance(inner[0], str)
                and isinstance(inner[1], str)
            ):
                raise DisallowedTypeError(
                    f"a malformed msgpack extension record (code {code}); nothing was imported",
                    type_name=f"ext:{code}",
                )
            module, name = inner[0], inner[1]
            if code == EXT_METHOD_SINGLE_ARG:
                method = inner[3] if len(inner) > 3 else None
                if (module, name, method) not in lg_msgpack.SAFE_MSGPACK_METHODS:
                    raise _refused(module, f"{name}.{method}", writing)
            elif (module, name) not in allowed:
                raise _refused(module, name, writing)

        try:
            ormsgpack.unpackb(data, ext_hook=hook, option=ormsgpack.OPT_NON_STR_KEYS)
        except (ValueError, ormsgpack.MsgpackDecodeError) as exc:
            if errors:
                raise errors[0] from None
            if writing:
                raise
            raise DisallowedTypeError(
                f"refusing to load an unreadable msgpack payload ({exc}); nothing was imported",
                type_name="msgpack",
            ) from None

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        type_, data = super().dumps_typed(obj)
        if type_ == "msgpack":
            self.check(data, writing=True)
        elif type_ not in _PLAIN_TYPES:  # pragma: no cover - pickle_fallback is always False
            raise DisallowedTypeError(f"refusing to write the {type_!r} format", type_name=type_)
        return type_, data

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        type_, payload = data
        if type_ not in _PLAIN_TYPES:
            raise DisallowedTypeError(
                f"refusing to load a value stored in the {type_!r} format: only null, bytes, bytearray and "
                "msgpack are read (no pickle, no JSON revival); nothing was imported",
                type_name=type_,
            )
        if type_ == "msgpack":
            self.check(payload)
        return super().loads_typed((type_, payload))
