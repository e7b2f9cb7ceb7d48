"""The manager's options: declared once, typed, validated at the edge.

``Options`` holds every tunable a manager takes (its defaults and checks
live here and nowhere else); ``OptionArgs`` is the same set as keyword
arguments, so ``GlobalStateManager(...)`` and ``GlobalStateManager.open(...)``
accept them with their types without declaring them again.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict, get_args

import attrs

__all__ = [
    "BACKPRESSURE_POLICIES",
    "DURABILITY_MODES",
    "STRATEGIES",
    "Backpressure",
    "Durability",
    "OptionArgs",
    "Options",
    "Strategy",
]

Durability = Literal["sync", "async", "manual"]
Backpressure = Literal["wait", "reject"]
Strategy = Literal["one_for_one", "one_for_all", "rest_for_one"]

DURABILITY_MODES: tuple[str, ...] = get_args(Durability)
BACKPRESSURE_POLICIES: tuple[str, ...] = get_args(Backpressure)
STRATEGIES: tuple[str, ...] = get_args(Strategy)


def one_of(choices: tuple[str, ...]) -> Any:
    def check(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        if value not in choices:
            raise ValueError(f"{attr.name} must be one of {choices}, not {value!r}")

    return check


def _positive(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{attr.name} must be a positive number, not {value!r}")


def _at_least_one(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{attr.name} must be an int of at least 1, not {value!r}")


def _optional(check: Any) -> Any:
    def run(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        if value is not None:
            check(inst, attr, value)

    return run


@attrs.frozen(slots=True, kw_only=True)
class Options:
    """Every option of a manager, with its default. ``ValueError`` names the one out of range.

    - ``request_timeout``: seconds a request may take, unless the call says otherwise;
    - ``durability``: ``"sync"``, ``"async"`` or ``"manual"`` (see ``docs/store.md``);
      a manager without a store is always in memory;
    - ``checkpoint_every`` / ``keep_checkpoints``: a full checkpoint every that many
      commits, and how many are kept;
    - ``idle_timeout``, ``max_live_actors``, ``mailbox_size``, ``backpressure``:
      passivation, the live-actor cap and bounded mailboxes (see ``docs/scale.md``);
    - ``wal``: a store's group commits made durable by its write-ahead log (one
      ``fdatasync`` each, LMDB synced at checkpoints) rather than by a synced LMDB
      transaction (two flushes); on by default where the system reports its boot id
      (Linux), see ``docs/adr/0033-write-ahead-log.md``. Either way a commit is
      acknowledged only once it survives a power loss.
    """

    request_timeout: float = attrs.field(default=5.0, validator=_positive, converter=float)
    durability: Durability = attrs.field(default="sync", validator=one_of(DURABILITY_MODES))
    checkpoint_every: int = attrs.field(default=100, validator=_at_least_one)
    keep_checkpoints: int = attrs.field(default=3, validator=_at_least_one)
    idle_timeout: float | None = attrs.field(default=None, validator=_optional(_positive))
    max_live_actors: int | None = attrs.field(default=None, validator=_optional(_at_least_one))
    mailbox_size: int | None = attrs.field(default=None, validator=_optional(_at_least_one))
    backpressure: Backpressure = attrs.field(default="wait", validator=one_of(BACKPRESSURE_POLICIES))
    wal: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))

    @classmethod
    def of(cls, args: dict[str, Any]) -> Options:
        """Options from keyword arguments; an unknown name is a ``TypeError``."""
        known = {a.name for a in attrs.fields(cls)}
        unknown = sorted(set(args) - known)
        if unknown:
            raise TypeError(
                f"unknown option(s) {', '.join(unknown)}; the options are {', '.join(sorted(known))}"
            )
        return cls(**args)


class OptionArgs(TypedDict, total=False):
    """The options of :class:`Options` as keyword arguments (same names, same types)."""

    request_timeout: float
    durability: Durability
    checkpoint_every: int
    keep_checkpoints: int
    idle_timeout: float | None
    max_live_actors: int | None
    mailbox_size: int | None
    backpressure: Backpressure
    wal: bool
