"""The long-term store's items: state keys, stored records, filters, namespace matches, similarity.

Pure functions, no I/O. An item lives in its store's scope under the key
``i/<label>/<label>/.../<key>`` (each part with ``%`` and ``/`` escaped, so
the parts split back apart) as one msgpack ``bytes`` record:

====  ============================================================
``v``  the value, itself msgpack bytes (decoded only when read)
``c``  created at (seconds since the epoch, by the store's clock)
``u``  updated at
``n``  the item's version: 1 when created, one more at each put
``t``  its TTL in minutes, or None
``e``  when it expires (seconds), or None
``x``  its vectors: float32 bytes, one per embedded text (or absent)
====  ============================================================
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import ormsgpack  # type: ignore[import-not-found, unused-ignore]
from langgraph.store.base import (  # type: ignore[import-not-found, unused-ignore]
    InvalidNamespaceError,
    MatchCondition,
)

from victor_actors import CheckpointCorruptError, TransitionValidationError

__all__ = [
    "ITEM_PREFIX",
    "StoreNamespaceError",
    "check_labels",
    "cosine",
    "item_key",
    "matches",
    "namespace_matches",
    "pack",
    "pack_value",
    "split_key",
    "unpack",
    "unpack_value",
    "vector_bytes",
    "vector_of",
]

ITEM_PREFIX = "i/"
_OPERATORS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte")


class StoreNamespaceError(TransitionValidationError, InvalidNamespaceError):
    """A namespace (or key) the store refuses: empty, or a label empty, not text, with ``.`` or NUL.

    Both a ``TransitionValidationError`` and LangGraph's ``InvalidNamespaceError``
    (each a ``ValueError``). Nothing was read or written.
    """


def _esc(text: str) -> str:
    return text.replace("%", "%25").replace("/", "%2F") if ("%" in text or "/" in text) else text


def _unesc(text: str) -> str:
    return text.replace("%2F", "/").replace("%25", "%") if "%" in text else text


def check_labels(namespace: Any, *, what: str, nonempty: bool) -> tuple[str, ...]:
    """``namespace`` as a tuple of labels LangGraph allows and UTF-8 can encode.

    Raises:
        StoreNamespaceError: not a tuple of non-empty strings without ``.``
            or NUL, text UTF-8 cannot encode, or empty where ``nonempty``.
    """
    if isinstance(namespace, (str, bytes)) or not isinstance(namespace, (tuple, list)):
        raise StoreNamespaceError(f"{what} must be a tuple of strings, not {type(namespace).__name__}")
    labels: tuple[str, ...] = tuple(namespace)
    if nonempty and not labels:
        raise StoreNamespaceError(f"{what} cannot be empty; nothing was written")
    for label in labels:
        if not isinstance(label, str):
            raise StoreNamespaceError(f"{what} {labels!r} holds a {type(label).__name__}, not a string")
        if not label or "." in label or "\x00" in label:
            raise StoreNamespaceError(
                f"{what} {labels!r} holds the label {label!r}: labels must be non-empty and hold no '.' "
                "and no NUL; nothing was read or written"
            )
        check_text(label, f"a label of {what}")
    return labels


def check_text(text: str, what: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise StoreNamespaceError(
            f"{what} holds {exc.object[exc.start : exc.end]!r}, which UTF-8 cannot encode; "
            "nothing was read or written"
        ) from None
    return text


def item_key(namespace: tuple[str, ...], key: str) -> str:
    return ITEM_PREFIX + "/".join(_esc(part) for part in (*namespace, key))


def split_key(state_key: str) -> tuple[tuple[str, ...], str]:
    """(namespace, key) of an ``i/...`` state key."""
    parts = state_key[len(ITEM_PREFIX) :].split("/")
    return tuple(_unesc(p) for p in parts[:-1]), _unesc(parts[-1])


def pack_value(value: Any) -> bytes:
    """An item's value as msgpack bytes.

    Raises:
        TransitionValidationError: not a mapping with string keys, or a value
            msgpack cannot hold (text UTF-8 cannot encode, an object).
    """
    if not isinstance(value, Mapping):
        raise TransitionValidationError(
            f"a store item's value must be a mapping (or None to delete), not {type(value).__name__}; "
            "nothing was written",
            field="value",
        )
    try:
        return bytes(ormsgpack.packb(dict(value)))
    except (TypeError, ValueError) as exc:
        raise TransitionValidationError(
            f"a store item's value cannot be stored ({exc}): use str keys and JSON-like values; "
            "nothing was written",
            field="value",
        ) from None


def unpack_value(data: bytes) -> dict[str, Any]:
    value = ormsgpack.unpackb(data)
    if not isinstance(value, dict):
        raise CheckpointCorruptError("a store item's value does not decode to a mapping")
    return value


def pack(record: Mapping[str, Any]) -> bytes:
    return bytes(ormsgpack.packb(dict(record)))


def unpack(data: Any) -> dict[str, Any]:
    """A stored item record.

    Raises:
        CheckpointCorruptError: bytes that do not decode to a record.
    """
    try:
        record = ormsgpack.unpackb(data)
    except (TypeError, ormsgpack.MsgpackDecodeError) as exc:
        raise CheckpointCorruptError(f"a store item's record does not decode ({exc})") from None
    if not isinstance(record, dict) or "v" not in record:
        raise CheckpointCorruptError("a store item's record is not a mapping with a value")
    return record


# -- filters and namespace matches ------------------------------------------------------


def matches(value: Any, condition: Any) -> bool:
    """Whether an item's value satisfies a ``search`` filter (as LangGraph's stores read one).

    A mapping with ``$``-keys is a set of operators on the value (``$eq``,
    ``$ne``, ``$gt``, ``$gte``, ``$lt``, ``$lte``; order comparisons are
    numeric); any other mapping matches field by field, recursively (a field
    name with dots that is not itself a field is a path into nested mappings,
    as LangGraph's SQL stores read it); a list
    matches a list of the same length element by element; anything else by
    equality.

    Raises:
        TransitionValidationError: an unknown operator.
    """
    if isinstance(condition, Mapping):
        if any(isinstance(k, str) and k.startswith("$") for k in condition):
            return all(_operator(value, op, operand) for op, operand in condition.items())
        return isinstance(value, Mapping) and all(matches(_field(value, k), v) for k, v in condition.items())
    if isinstance(condition, (list, tuple)):
        return (
            isinstance(value, (list, tuple))
            and len(value) == len(condition)
            and all(matches(v, c) for v, c in zip(value, condition, strict=True))
        )
    return bool(value == condition)


def _field(value: Mapping[str, Any], key: Any) -> Any:
    """``value[key]``; a key with dots that is not itself a field is a path (``"user.name"``)."""
    if key in value or not isinstance(key, str) or "." not in key:
        return value.get(key)
    found: Any = value
    for part in key.split("."):
        if not isinstance(found, Mapping):
            return None
        found = found.get(part)
    return found


def _operator(value: Any, op: str, operand: Any) -> bool:
    if op == "$eq":
        return bool(value == operand)
    if op == "$ne":
        return bool(value != operand)
    if op not in _OPERATORS:
        raise TransitionValidationError(
            f"unknown filter operator {op!r}; use one of {', '.join(_OPERATORS)}; nothing was read",
            field="filter",
        )
    try:
        left, right = float(value), float(operand)
    except (TypeError, ValueError):
        return False  # a missing or non-numeric field is not ordered against a number
    if op == "$gt":
        return left > right
    if op == "$gte":
        return left >= right
    if op == "$lt":
        return left < right
    return left <= right


def namespace_matches(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    """A ``list_namespaces`` condition: a prefix or suffix of labels, ``"*"`` matching any one."""
    path = tuple(condition.path)
    if len(namespace) < len(path):
        return False
    if condition.match_type == "prefix":
        pairs = zip(namespace, path, strict=False)
    elif condition.match_type == "suffix":
        pairs = zip(reversed(namespace), reversed(path), strict=False)
    else:
        raise TransitionValidationError(
            f"unknown match type {condition.match_type!r}: use 'prefix' or 'suffix'", field="match_type"
        )
    return all(p == "*" or n == p for n, p in pairs)


# -- vectors ----------------------------------------------------------------------------


def vector_bytes(vector: Sequence[float], dims: int | None) -> bytes:
    """A vector as float32 bytes.

    Raises:
        TransitionValidationError: not ``dims`` numbers.
    """
    if dims is not None and len(vector) != dims:
        raise TransitionValidationError(
            f"the embedding function returned a vector of {len(vector)} numbers, not the index's dims "
            f"({dims}); nothing was written",
            field="index",
        )
    return array("f", vector).tobytes()


def vector_of(data: bytes) -> array[float]:
    out = array("f")
    out.frombytes(data)
    return out


def cosine(query: Sequence[float], vectors: Iterable[Sequence[float]]) -> float | None:
    """The best cosine similarity of ``query`` with any of ``vectors``; None without vectors."""
    qn = math.sqrt(sum(q * q for q in query))
    best: float | None = None
    for vector in vectors:
        vn = math.sqrt(sum(v * v for v in vector))
        score = sum(q * v for q, v in zip(query, vector, strict=False)) / (qn * vn) if qn and vn else 0.0
        if best is None or score > best:
            best = score
    return best
