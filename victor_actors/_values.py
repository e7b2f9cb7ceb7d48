"""Frozen values: what a scope may hold.

Every value entering the runtime is frozen on entry: mappings become
:class:`FrozenDict`, lists and tuples become tuples, and scalars stay as they
are. Anything that could not be stored and read back later (an open file, a
lambda, an arbitrary object, a set, a non-string mapping key, an integer
outside 64 bits) is rejected here, at the edge, with a
:class:`~victor_actors.TransitionValidationError`, never at apply time.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NoReturn

from victor_actors._errors import TransitionValidationError

__all__ = [
    "MAX_DEPTH",
    "FrozenDict",
    "check_text",
    "freeze",
    "freeze_measured",
    "register_converter",
    "size_bound",
    "thaw",
]

_INT_MIN = -(2**63)
_INT_MAX = 2**64 - 1
MAX_DEPTH = 64
_MAX_DEPTH = MAX_DEPTH
# A lone surrogate is a valid Python str that UTF-8 (and so the store) cannot encode.
_SURROGATE = re.compile("[\ud800-\udfff]")


def check_text(text: str, what: str) -> str | None:
    """Why ``text`` (an exact ``str``) cannot be stored, or None if it can."""
    if text.isascii():
        return None
    found = _SURROGATE.search(text)
    if found is None:
        return None
    where = f"{found.group()!r} at index {found.start()}"
    return f"{what} holds a lone surrogate ({where}), which UTF-8 cannot encode"


# Types users taught us to store, with the function that turns an instance
# into storable primitives. The result is frozen like any other value; the
# original type is not recorded, so reading it back gives the primitives.
_CONVERTERS: dict[type, Callable[[Any], Any]] = {}

# Registered message types (``_typed.py`` fills it): how to freeze an instance of each, keeping its
# class's tag, and how to keep an already tagged value. Looked up by exact class, before mappings.
_TYPED: dict[type, Callable[[Any, str, int], tuple[Any, int]]] = {}


def register_converter(cls: type, to_storable: Callable[[Any], Any]) -> None:
    """Let values of ``cls`` (and its subclasses) enter state.

    ``to_storable`` turns an instance into storable primitives (a str-keyed
    dict, a list, a str, ...). For a pydantic model that is typically
    ``lambda m: m.model_dump()``; for an attrs class, ``attrs.asdict``. What
    is stored and read back is the primitive form, never the class: nothing
    is ever imported by a name read from storage.
    """
    if not isinstance(cls, type) or not callable(to_storable):
        raise TypeError("register_converter(cls, to_storable) takes a class and a callable")
    _CONVERTERS[cls] = to_storable


class FrozenDict(Mapping[str, Any]):
    """A read-only, hashable mapping with string keys and frozen values.

    Compares equal to any mapping with the same items, so
    ``FrozenDict({"a": 1}) == {"a": 1}``. It has no mutating methods, and its
    values are themselves frozen.
    """

    __slots__ = ("_data", "_hash", "_height", "_size")

    _data: dict[str, Any]
    _hash: int | None
    _height: int  # levels of nesting at and below this mapping (a flat one is 1)
    _size: int  # at least the bytes of its msgpack encoding (size_bound); -1: not computed yet

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        frozen = freeze(dict(*args, **kwargs))
        object.__setattr__(self, "_data", frozen._data)
        object.__setattr__(self, "_hash", None)
        object.__setattr__(self, "_height", frozen._height)
        object.__setattr__(self, "_size", frozen._size)

    @classmethod
    def _wrap(cls, data: dict[str, Any], height: int | None = None, size: int = -1) -> FrozenDict:
        # Internal: ``data`` is already frozen and owned by nobody else.
        if height is None:
            height = 1 + max((_height(v) for v in data.values()), default=0)
        self = _new(cls)
        _set_data(self, data)  # the slots' own setters: object.__setattr__ costs twice as much
        _set_hash(self, None)
        _set_height(self, height)
        _set_size(self, size)
        return self

    def __setattr__(self, name: str, value: Any) -> NoReturn:
        raise AttributeError("FrozenDict is immutable")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError("FrozenDict is immutable")

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def get(self, key: str, default: Any = None) -> Any:
        return self._data.get(key, default)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FrozenDict):
            return self._data == other._data
        if isinstance(other, Mapping):
            return self._data == dict(other.items())
        return NotImplemented

    def __hash__(self) -> int:
        if self._hash is None:
            object.__setattr__(self, "_hash", hash(frozenset(self._data.items())))
        assert self._hash is not None
        return self._hash

    def __repr__(self) -> str:
        return f"FrozenDict({self._data!r})"

    def __reduce__(self) -> NoReturn:
        raise TypeError("victor_actors values are never pickled")

    def thaw(self) -> dict[str, Any]:
        """Return a mutable deep copy as plain dicts and lists."""
        return {key: thaw(item) for key, item in self._data.items()}


_new = object.__new__
_set_data = FrozenDict.__dict__["_data"].__set__
_set_hash = FrozenDict.__dict__["_hash"].__set__
_set_height = FrozenDict.__dict__["_height"].__set__
_set_size = FrozenDict.__dict__["_size"].__set__


def _height(value: Any) -> int:
    """Levels of containers at and below a frozen value."""
    if value.__class__ is FrozenDict:
        return int(value._height)
    if value.__class__ is tuple:
        return 1 + max((_height(v) for v in value), default=0)
    return 0


def _reject(path: str, why: str) -> NoReturn:
    raise TransitionValidationError(f"value at {path or '<root>'} cannot be stored: {why}")


# Upper bounds of msgpack's encoding: a header of at most 5 bytes per str, bytes, list or map;
# at most 9 bytes per number; at most 4 UTF-8 bytes per code point of a str.
_SCALAR = 9
_HEADER = 5


def _text_bound(text: str) -> int:
    return _HEADER + (len(text) if text.isascii() else 4 * len(text))


def size_bound(value: Any) -> int:
    """At least the bytes msgpack takes to encode the frozen ``value`` (never less).

    A walk without encoding anything; a ``FrozenDict`` remembers its bound,
    so a value carried from one batch into the next is walked once. The
    record limit of an in-memory manager is checked against this first, and
    the batch is encoded only when the bound passes the limit.
    """
    cls = value.__class__
    if cls is FrozenDict or isinstance(value, FrozenDict):
        size = value._size
        if size < 0:
            size = _HEADER + sum(_text_bound(k) + size_bound(v) for k, v in value._data.items())
            tag = getattr(value, "tag", None)
            if tag is not None:  # a registered type's value: an extension around (tag, fields)
                size += 3 * _HEADER + _text_bound(tag)
            object.__setattr__(value, "_size", size)
        return int(size)
    if cls is str:
        return _text_bound(value)
    if cls is tuple:
        return _HEADER + sum(size_bound(v) for v in value)
    if cls is bytes:
        return _HEADER + len(value)
    return _SCALAR


def freeze(value: Any, path: str = "") -> Any:
    """Return a deeply immutable, storable copy of ``value``.

    Freezing goes by exact type: a subclass of ``str``, ``int``, ``float``
    or ``bool`` becomes the plain type (its methods never run), a
    ``FrozenDict`` is trusted only as deep as it is known to be, and text
    that UTF-8 cannot encode (a lone surrogate) is refused, in values and in
    mapping keys alike: nothing is let in that the store could not write
    and read back.

    Raises:
        TransitionValidationError: when ``value`` (or anything inside it)
            cannot be stored; the message names the path to the bad part.
    """
    return _freeze(value, path, 0)[0]


def freeze_measured(value: Any, path: str = "") -> tuple[Any, int, int]:
    """:func:`freeze`, with the frozen value's height and its :func:`size_bound` from the same walk."""
    return _freeze(value, path, 0)


def _freeze(value: Any, path: str, depth: int) -> tuple[Any, int, int]:
    """The frozen value, its height (levels of containers at and below it) and its size bound."""
    cls = value.__class__
    if value is None or cls is bool or cls is float:
        return value, 0, _SCALAR
    if cls is str:
        if value.isascii():
            return value, 0, _HEADER + len(value)
        why = check_text(value, "the string")
        if why is not None:
            _reject(path, why)
        return value, 0, _HEADER + 4 * len(value)
    if cls is bytes:
        return value, 0, _HEADER + len(value)
    if cls is int:
        if _INT_MIN <= value <= _INT_MAX:
            return value, 0, _SCALAR
        _reject(path, "integer outside the 64-bit range")
    if cls is FrozenDict:
        if depth + value._height > _MAX_DEPTH:
            _reject(path, f"nested deeper than {_MAX_DEPTH} levels")
        return value, value._height, size_bound(value)
    if depth >= _MAX_DEPTH:
        _reject(path, f"nested deeper than {_MAX_DEPTH} levels (or cyclic)")
    if _TYPED:
        typed = _TYPED.get(cls)
        if typed is not None:
            frozen, height = typed(value, path, depth)
            return frozen, height, size_bound(frozen)
    if cls is dict or isinstance(value, Mapping):  # a dict skips the ABC's instance check
        out: dict[str, Any] = {}
        height = 0
        size = _HEADER
        for key, item in value.items():
            if key.__class__ is not str:
                if not isinstance(key, str):
                    _reject(path, f"mapping key {key!r} is a {type(key).__name__}, not a str")
                key = str.__str__(key)  # the exact str, by type: no method of the subclass runs
            why = check_text(key, f"mapping key {key!r}")
            if why is not None:
                _reject(path, why)
            frozen, below, bound = _freeze(item, f"{path}.{key}" if path else key, depth + 1)
            out[key] = frozen
            height = max(height, below)
            size += bound + _HEADER + 4 * len(key)
        return FrozenDict._wrap(out, height + 1, size), height + 1, size
    if cls is list or cls is tuple or isinstance(value, (list, tuple)):
        items = []
        height = 0
        size = _HEADER
        for i, item in enumerate(value):
            frozen, below, bound = _freeze(item, f"{path}[{i}]", depth + 1)
            items.append(frozen)
            height = max(height, below)
            size += bound
        return tuple(items), height + 1, size
    if isinstance(value, bool):
        return bool(value), 0, _SCALAR
    if isinstance(value, int):
        return _freeze(int.__index__(value), path, depth)
    if isinstance(value, float):
        return float.__float__(value), 0, _SCALAR
    if isinstance(value, str):
        return _freeze(str.__str__(value), path, depth)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _freeze(bytes(value), path, depth)
    if _CONVERTERS:
        for klass in cls.__mro__:
            convert = _CONVERTERS.get(klass)
            if convert is not None:
                return _freeze(convert(value), path, depth + 1)
    if isinstance(value, (set, frozenset)):
        _reject(path, "sets have no stable order; use a list or tuple")
    _reject(
        path,
        f"{type(value).__name__} is not a storable value "
        "(use None, bool, int, float, str, bytes, lists, tuples and str-keyed mappings, "
        "or register_converter() for your type)",
    )


def thaw(value: Any) -> Any:
    """Return a plain, mutable deep copy of a value read from state: dicts and lists.

    Reads give frozen values: a stored mapping comes back as a
    :class:`FrozenDict` (a read-only ``Mapping``, equal to the dict it was
    made from but not a ``dict``), a list as a tuple, and a snapshot's
    ``state`` and ``messages`` as read-only views. ``thaw`` turns any of
    them (and anything nested in them) into ``dict`` and ``list``; other
    values (str, bytes, numbers, None) are returned as they are.
    """
    if isinstance(value, Mapping):
        return {key: thaw(item) for key, item in value.items()}
    if isinstance(value, (tuple, list)) or (
        isinstance(value, Sequence) and not isinstance(value, (str, bytes, bytearray, memoryview))
    ):
        return [thaw(item) for item in value]
    return value
