"""Who owns what: the search behind ``assert_isolated(..., owners=...)``.

The test says who owns what, in one of two forms:

- tokens: ``{"conversation:alice": "tok-alice-7f3", "bob": ["tok-bob-1", ...]}``,
  strings planted in what each conversation is sent (a user's question, a
  secret in its context). A token may be held by its owner only.
- an owner rule: ``owner(value) -> scopes | None``, called on every value a
  scope holds, at every depth (a whole message, a state value, each item and
  string inside them, each state key); it returns the scopes allowed to hold
  that value (a scope-like or several), or None when it claims nothing.

:func:`search` walks each scope's messages and own state (keys and values,
nested mappings and sequences, substrings for tokens) and returns every
value held by a scope its owner does not allow. It reads only the final
state, so it gives the same verdict with a recorder or without one; a
recorder only adds where each value came from.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from victor_actors._handle import ScopeHandle
from victor_actors._model import ScopeRef, StateScope
from victor_actors._snapshot import ContextSnapshot

__all__ = ["Claims", "Found", "OwnerRule", "Owners", "claimed_inside", "owner_rule", "search"]

ScopeLike = ScopeRef | ScopeHandle | str
# owner(value) -> the scopes allowed to hold value (one or several), or None: no claim
OwnerRule = Callable[[Any], "ScopeLike | Iterable[ScopeLike] | None"]
Owners = Mapping[Any, "str | Iterable[str]"] | OwnerRule
# claims(value) -> [(what was claimed in it, the scopes allowed to hold that)]
Claims = Callable[[Any], list[tuple[Any, tuple[ScopeRef, ...]]]]

# how deep the search goes into nested values before it stops (a cycle cannot occur in frozen
# values, but a value held as-is, such as a mock, may nest without end)
_MAX_DEPTH = 64


def as_ref(scope: ScopeLike) -> ScopeRef:
    if isinstance(scope, ScopeRef):
        return scope
    if isinstance(scope, ScopeHandle):
        return scope.ref
    if isinstance(scope, str):
        return ScopeRef.parse(scope) if ":" in scope else ScopeRef(StateScope.CONVERSATION, scope)
    raise TypeError(f"expected a ScopeRef, a ScopeHandle or a scope name, not {type(scope).__name__}")


@dataclass(frozen=True, slots=True)
class Found:
    """A value held by a scope its owner does not allow.

    ``where`` is ``"message"`` or ``"key"``; ``index`` the message's index or
    the key; ``path`` the way into the value (``['content'][0]``, or
    ``(the key's name)`` when the key itself carries it); ``value`` what the
    owner claimed (the token, or the value the rule was given); ``owners``
    the scopes allowed to hold it.
    """

    holder: ScopeRef
    where: str
    index: int | str
    path: str
    value: Any
    owners: tuple[ScopeRef, ...]

    def describe(self) -> str:
        allowed = ", ".join(str(r) for r in self.owners) or "no scope"
        what = f"message {self.index}" if self.where == "message" else f"key {self.index!r}"
        at = f" at {self.path}" if self.path else ""
        return f"{self.holder} holds {_short(self.value)} in {what}{at}, which only {allowed} may hold"


def _short(value: Any, limit: int = 70) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def owner_rule(owners: Owners) -> Claims:
    """One function for both forms: ``claims(value)`` -> [(what was claimed, allowed scopes)]."""
    if callable(owners) and not isinstance(owners, Mapping):
        rule = owners

        def claims_by_rule(value: Any) -> list[tuple[Any, tuple[ScopeRef, ...]]]:
            allowed = rule(value)
            if allowed is None:
                return []
            if isinstance(allowed, (ScopeRef, ScopeHandle, str)):
                return [(value, (as_ref(allowed),))]
            return [(value, tuple(as_ref(a) for a in allowed))]

        return claims_by_rule
    if not isinstance(owners, Mapping):
        raise TypeError(
            f"owners is a mapping of scope to token(s) or a callable, not {type(owners).__name__}"
        )
    by_token: dict[str, ScopeRef] = {}
    for scope, tokens in owners.items():
        ref = as_ref(scope)
        for token in (tokens,) if isinstance(tokens, str) else tokens:
            if not isinstance(token, str) or not token:
                raise TypeError(f"a token is a non-empty str, not {token!r} (for {ref})")
            other = by_token.setdefault(token, ref)
            if other != ref:
                raise ValueError(f"token {token!r} is given to both {other} and {ref}")
    if not by_token:
        return lambda value: []
    # longest first, so that a token that contains another is found whole
    pattern = re.compile("|".join(re.escape(t) for t in sorted(by_token, key=len, reverse=True)))

    def claims_by_token(value: Any) -> list[tuple[Any, tuple[ScopeRef, ...]]]:
        if value.__class__ is not str and not isinstance(value, str):
            return []
        return [(t, (by_token[t],)) for t in dict.fromkeys(m.group(0) for m in pattern.finditer(value))]

    return claims_by_token


def _walk(value: Any, path: str, depth: int = 0) -> Iterator[tuple[str, Any]]:
    """Every value inside ``value``, itself first, each with its path; mapping keys too."""
    yield path, value
    if depth >= _MAX_DEPTH or isinstance(value, (str, bytes, int, float)):
        return
    if isinstance(value, Mapping):
        for k, v in value.items():
            if isinstance(k, str):
                yield f"{path}(a key)", k
            yield from _walk(v, f"{path}[{k!r}]", depth + 1)
    elif isinstance(value, (tuple, list, frozenset, set)):
        for i, v in enumerate(value):
            yield from _walk(v, f"{path}[{i}]", depth + 1)


def _check(
    holder: ScopeRef,
    where: str,
    index: int | str,
    root: Any,
    claims: Claims,
    seen: set[Any],
    out: list[Found],
) -> None:
    for path, value in _walk(root, ""):
        for claimed, allowed in claims(value):
            key = (where, index, allowed)
            if holder in allowed or key in seen:
                continue
            seen.add(key)
            out.append(Found(holder, where, index, path, claimed, allowed))


def search(snaps: Iterable[tuple[ScopeRef, ContextSnapshot]], claims: Claims) -> list[Found]:
    """Every value a scope holds that its owner does not allow it to (see the module's documentation).

    One problem per holder, place (message or key) and set of owners.
    """
    found: list[Found] = []
    for holder, snap in snaps:
        seen: set[Any] = set()
        for i, message in enumerate(snap.messages):
            _check(holder, "message", i, message, claims, seen, found)
        for key, value in snap.state.items():
            for claimed, allowed in claims(key):
                if holder not in allowed:
                    found.append(Found(holder, "key", key, "(the key's name)", claimed, allowed))
            _check(holder, "key", key, value, claims, seen, found)
    return found


def claimed_inside(value: Any, claims: Claims) -> bool:
    """Whether ``claims`` claims anything at any depth of ``value``."""
    return any(claims(v) for _path, v in _walk(value, ""))


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True
