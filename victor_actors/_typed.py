"""Typed messages: application classes that come back as themselves.

An application registers its message classes (attrs classes and
dataclasses). Freezing an instance of one records its fields, frozen, under
the class's *tag* (a :class:`TaggedValue`); the store and the wire write the
tag beside the fields (a msgpack extension type, see ``store/_codec.py``).
Reading revives it: the registry maps the tag to the class the application
registered in this process, and the fields are passed to its constructor.

Nothing is ever imported by a name read from disk or from the wire: a tag is
only ever looked up in this registry, which holds the classes the
application handed in itself. A value whose tag is not registered here (the
class is not imported, or was registered under another tag) comes back as
what it is, a read-only mapping of its fields, with its ``tag`` attached.

The registry is one per process, like ``register_converter``'s: a value is
frozen when its transition is made, before any manager sees it.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import cattrs
from cattrs.gen import make_dict_structure_fn

from victor_actors import _values
from victor_actors._errors import TransitionValidationError
from victor_actors._values import FrozenDict, check_text

__all__ = [
    "TaggedValue",
    "is_registered",
    "plain",
    "register_message_type",
    "registered",
    "registered_any",
    "revive",
]

logger = logging.getLogger("victor_actors")

_lock = threading.Lock()
_BY_TAG: dict[str, type] = {}
_BY_CLASS: dict[type, _Spec] = {}
_warned: set[tuple[str, str]] = set()
_generation = [0]  # bumped on each registration: revival converters are made again


class TaggedValue(FrozenDict):
    """A registered class's instance as it is stored: its fields, frozen, and its class's tag.

    A read-only mapping of the fields (it compares equal to a mapping with
    the same items and the same tag, or, as a plain mapping, with the same
    items). Where the runtime hands a message or a value out, a tagged value
    whose tag is registered in this process is revived into its class.
    """

    __slots__ = ("tag",)

    tag: str

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("a TaggedValue is made by freezing an instance of a registered message type")

    @classmethod
    def _of(cls, tag: str, fields: FrozenDict) -> TaggedValue:
        self = cls.__new__(cls)
        object.__setattr__(self, "_data", fields._data)
        object.__setattr__(self, "_hash", None)
        object.__setattr__(self, "_height", fields._height)
        object.__setattr__(self, "_size", -1)  # its size bound, computed when asked for (size_bound)
        object.__setattr__(self, "tag", tag)
        return self

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TaggedValue):
            return self.tag == other.tag and self._data == other._data
        return super().__eq__(other)

    def __hash__(self) -> int:
        return hash((self.tag, super().__hash__()))

    def __repr__(self) -> str:
        return f"TaggedValue({self.tag!r}, {self._data!r})"


@attrs.frozen(slots=True)
class _Spec:
    """How one registered class is taken apart and put back together."""

    cls: type
    tag: str
    names: tuple[str, ...]  # the attributes stored, in order
    inits: tuple[str, ...]  # the constructor's keyword for each


def _spec(cls: type, tag: str) -> _Spec:
    if attrs.has(cls):
        fields = [a for a in attrs.fields(cls) if a.init]
        return _Spec(cls, tag, tuple(a.name for a in fields), tuple(a.alias or a.name for a in fields))
    if dataclasses.is_dataclass(cls):
        names = tuple(f.name for f in dataclasses.fields(cls) if f.init)
        return _Spec(cls, tag, names, names)
    raise TypeError(
        f"register_message_type takes an attrs class or a dataclass, not {cls!r}; nothing was registered"
    )


def register_message_type(cls: type, *, tag: str | None = None) -> str:
    """Let instances of ``cls`` (an attrs class or a dataclass) enter state and come back as ``cls``.

    ``tag`` (default ``"<module>.<qualname>"``) is what the store writes
    beside the fields; it is only ever looked up in this process's registry,
    never imported. Registering the same class under the same tag again does
    nothing; a class defined again (same module and qualified name, say a
    class made inside a function) replaces the earlier one under its tag.

    Returns:
        The tag.

    Raises:
        TypeError: ``cls`` is neither an attrs class nor a dataclass.
        ValueError: the tag belongs to another class, or ``cls`` is already
            registered under another tag; nothing was registered.
    """
    if not isinstance(cls, type):
        raise TypeError(f"register_message_type takes a class, not {cls!r}; nothing was registered")
    if tag is None:
        tag = f"{cls.__module__}.{cls.__qualname__}"
    if tag.__class__ is not str or not tag or check_text(tag, "the tag") is not None:
        raise ValueError(f"a message type's tag must be a non-empty str UTF-8 can encode, not {tag!r}")
    spec = _spec(cls, tag)
    with _lock:
        known = _BY_CLASS.get(cls)
        if known is not None:
            if known.tag != tag:
                raise ValueError(
                    f"{cls.__qualname__} is already registered under the tag {known.tag!r}; "
                    f"nothing was registered under {tag!r}"
                )
            return tag
        other = _BY_TAG.get(tag)
        if other is not None:
            if (other.__module__, other.__qualname__) != (cls.__module__, cls.__qualname__):
                raise ValueError(
                    f"the tag {tag!r} is already registered to {other.__module__}.{other.__qualname__}; "
                    f"nothing was registered for {cls.__module__}.{cls.__qualname__}"
                )
            # the same class defined again (a reload, a class made in a function): reads revive the
            # newer definition; instances of the older one are still stored under the tag
        _BY_TAG[tag] = cls
        _BY_CLASS[cls] = spec
        _generation[0] += 1
        _values._TYPED[cls] = _freezer(spec)
    return tag


def registered() -> dict[str, type]:
    """Every registered tag and its class (a copy)."""
    with _lock:
        return dict(_BY_TAG)


def is_registered(cls: type) -> bool:
    return cls in _BY_CLASS


def registered_any() -> bool:
    """Whether this process registered any message type (when none is, nothing needs reviving)."""
    return bool(_BY_TAG)


def _keep(value: TaggedValue, path: str, depth: int) -> tuple[Any, int]:
    if depth + value._height > _values.MAX_DEPTH:
        _values._reject(path, f"nested deeper than {_values.MAX_DEPTH} levels")
    return value, value._height


def _freezer(spec: _Spec) -> Any:
    def freeze(value: Any, path: str, depth: int) -> tuple[Any, int]:
        fields = {name: getattr(value, name) for name in spec.names}
        try:
            frozen, height, _bound = _values._freeze(fields, path, depth)
        except TransitionValidationError as exc:
            raise TransitionValidationError(
                f"a {spec.cls.__qualname__} (message type {spec.tag!r}) cannot be stored: {exc}"
            ) from None
        return TaggedValue._of(spec.tag, frozen), height

    return freeze


# A tagged value read back is kept as it is (with its tag) when frozen again, registered or not:
# a process that replays a log without the class must not strip the tag from what it writes.
_values._TYPED[TaggedValue] = _keep


def revive(value: Any) -> Any:
    """``value`` as the application sees it: a tagged value of a registered class becomes an instance.

    The fields are converted by the class's annotations (so a ``tuple`` field
    is a tuple again, a ``list`` a list: both are stored as tuples), falling
    back to the plain copies when the annotations cannot be resolved.
    Anything else (a tag this process did not register included) is returned
    as it is.
    """
    if value.__class__ is not TaggedValue or not _BY_TAG:
        return value
    cls = _BY_TAG.get(value.tag)
    if cls is None:
        return value
    spec = _BY_CLASS[cls]
    try:
        extra = value._data.keys() - set(spec.names)
        if extra:
            raise TypeError(f"stored fields {sorted(extra)} are not fields of the class")
        fields = {name: plain(value._data[name]) for name in spec.names if name in value._data}
        try:
            return _converter().structure(fields, cls)
        except Exception:
            kwargs = {
                init: fields[name]
                for name, init in zip(spec.names, spec.inits, strict=True)
                if name in fields
            }
            return cls(**kwargs)
    except Exception as exc:
        key = (value.tag, type(exc).__name__)
        if key not in _warned:
            _warned.add(key)
            logger.warning(
                "a stored %s (tag %r) no longer fits its class (%s: %s); it reads as a mapping of its fields",
                cls.__qualname__,
                value.tag,
                type(exc).__name__,
                exc,
            )
        return value


_local = threading.local()


def _converter() -> cattrs.Converter:
    """This thread's converter for reviving, made afresh when the registry changed.

    A registered class's field value that is already an instance (revived on
    the way down) is taken as it is; a mapping is structured into the class.
    """
    made: tuple[int, cattrs.Converter] | None = getattr(_local, "conv", None)
    if made is not None and made[0] == _generation[0]:
        return made[1]
    conv = cattrs.Converter(forbid_extra_keys=True)

    def factory(cls: type) -> Any:
        inner: Callable[[Any, Any], Any] = make_dict_structure_fn(cls, conv, _cattrs_forbid_extra_keys=True)

        def hook(value: Any, type_: type) -> Any:
            return value if isinstance(value, type_) else inner(value, type_)

        return hook

    conv.register_structure_hook_factory(lambda t: t in _BY_CLASS, factory)
    _local.conv = (_generation[0], conv)
    return conv


def plain(value: Any) -> Any:
    """A mutable deep copy of a frozen value (dicts and lists), with registered classes revived."""
    if value.__class__ is TaggedValue:
        revived = revive(value)
        if revived is not value:
            return revived
    if isinstance(value, Mapping):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return [plain(item) for item in value]
    return value
