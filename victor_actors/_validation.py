"""What state may hold: the application's rules, checked at the edge.

``GlobalStateManager.open(..., validators={StateScope.TEAM: TeamState,
"plan_steps": check_plan})`` declares rules per level (a ``StateScope``
member) or per key (a plain ``str``). A rule is a callable that raises on a
bad value (its return value is ignored), or an attrs class the value must
convert to (with cattrs, no extra keys allowed).

* A key's rule sees every value an UPDATE_STATE writes to that key, in any
  scope, as a plain copy (dicts and lists; registered message types as
  their class).
* A level's rule sees the whole key-value state a batch would leave in a
  scope of that level, when the batch writes or deletes keys there: the
  scope's committed state as the handle sees it at the call, with the
  batch's writes on top. It is checked against the state at the call: two
  writers that each keep a rule that spans keys can still, together, break
  it; ``transact`` serialises them when that matters.

Checks run in the caller's thread, before the batch reaches any actor: a
batch that breaks a rule raises :class:`TransitionValidationError` naming
the key (``field``), the transition (``index``) and the rule, and nothing of
it is applied.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs
import cattrs

from victor_actors._cell import ScopeCell
from victor_actors._errors import TransitionValidationError
from victor_actors._model import StateScope, StateTransition, TransitionType
from victor_actors._state import ScopeState
from victor_actors._typed import plain

__all__ = ["Rule", "Validators"]

Rule = Callable[[Any], object] | type

_UPDATE = TransitionType.UPDATE_STATE
_DELETE = TransitionType.DELETE_STATE


def _name(rule: Rule) -> str:
    return getattr(rule, "__qualname__", None) or repr(rule)


class Validators:
    """The compiled rules of one manager; falsy when there are none."""

    def __init__(self, levels: dict[StateScope, Rule], keys: dict[str, Rule]) -> None:
        self.levels = levels
        self.keys = keys
        self._conv = cattrs.Converter(forbid_extra_keys=True)

    def __bool__(self) -> bool:
        return bool(self.levels or self.keys)

    @classmethod
    def of(cls, rules: Mapping[Any, Any] | None) -> Validators:
        """Check and sort the rules ``open(validators=...)`` was given.

        Raises:
            TypeError: ``rules`` is not a mapping, a key is neither a
                ``StateScope`` nor a str, or a rule is neither callable nor an
                attrs class; nothing was opened.
        """
        if rules is None:
            return cls({}, {})
        if not isinstance(rules, Mapping):
            raise TypeError(
                f"validators must be a mapping of level or key to rule, not {type(rules).__name__}"
            )
        levels: dict[StateScope, Rule] = {}
        keys: dict[str, Rule] = {}
        for where, rule in rules.items():
            if not (attrs.has(rule) if isinstance(rule, type) else callable(rule)):
                raise TypeError(
                    f"the rule for {where!r} must be a callable that raises on a bad value or an attrs "
                    f"class, not {rule!r}; nothing was opened"
                )
            if isinstance(where, StateScope):
                levels[where] = rule
            elif isinstance(where, str) and where:
                keys[str.__str__(where)] = rule
            else:
                raise TypeError(
                    f"a validators key is a StateScope (a level) or a str (a state key), not {where!r}; "
                    "nothing was opened"
                )
        return cls(levels, keys)

    def _run(self, rule: Rule, value: Any) -> str | None:
        """Why ``rule`` refuses ``value`` (already a plain copy), or None."""
        try:
            if isinstance(rule, type):
                self._conv.structure(value, rule)
            else:
                rule(value)
        except cattrs.BaseValidationError as exc:
            return "; ".join(cattrs.transform_error(exc, format_exception=_why))
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return None

    def check(self, cell: ScopeCell, transitions: tuple[StateTransition, ...]) -> None:
        """Refuse ``transitions`` (applied at ``cell``'s scope) if they break a rule; change nothing.

        Raises:
            TransitionValidationError: naming the key, the transition and the rule.
        """
        written: dict[int, list[int]] = {}  # by position in the chain (0: this scope), the transitions
        chain: list[ScopeState] = [cell.state, *(c.state for c in cell.ancestors)]
        for index, t in enumerate(transitions):
            ttype = t.transition_type
            if ttype is not _UPDATE and ttype is not _DELETE:
                continue
            key = t.data["key"]
            rule = self.keys.get(key)
            if rule is not None and ttype is _UPDATE:
                why = self._run(rule, plain(t.data["value"]))
                if why is not None:
                    raise _refused(index, t, key, f"rule {_name(rule)}", why)
            if self.levels:
                written.setdefault(_position(chain, t), []).append(index)
        for at, indices in written.items():
            if at < 0:
                continue  # a scope this one cannot write: the batch is refused there
            state = chain[at]
            rule = self.levels.get(state.ref.scope)
            if rule is None:
                continue
            after = {k: v for k, v in state.values.items()}
            for index in indices:
                t = transitions[index]
                if t.transition_type is _UPDATE:
                    after[t.data["key"]] = t.data["value"]
                else:
                    after.pop(t.data["key"], None)
            why = self._run(rule, plain(after))
            if why is not None:
                first = transitions[indices[0]]
                keys = sorted({transitions[i].data["key"] for i in indices})
                what = f"rule {_name(rule)} of the {state.ref.scope.value} level ({state.ref})"
                raise _refused(indices[0], first, keys[0] if len(keys) == 1 else ", ".join(keys), what, why)


def _why(exc: BaseException, _type: Any) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _position(chain: list[ScopeState], t: StateTransition) -> int:
    """Where in the chain (this scope, then its ancestors) ``t`` writes; -1 if nowhere in it."""
    target = t.data.get("scope")
    if target is None:
        return 0
    for at, state in enumerate(chain):
        if target == state.ref.scope.value or target == str(state.ref):
            return at
    return -1


def _refused(index: int, t: StateTransition, key: str, rule: str, why: str) -> TransitionValidationError:
    return TransitionValidationError(
        f"{t.transition_type.name} transition {index}: key {key!r} is refused by {rule}: {why}; "
        "nothing was applied",
        index=index,
        transition_type=t.transition_type.name,
        field=key,
    )
