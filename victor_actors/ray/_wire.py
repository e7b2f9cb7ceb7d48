"""The wire as the Ray shards speak it: :mod:`victor_actors.remote._wire`, and the shard's own error.

The framing, the error table and the conversions are shared with every other
transport (``victor_actors.remote``); only :class:`ShardUnavailableError`
is Ray's: an owner that could not be reached, named by its shard number.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from victor_actors._errors import OwnerUnavailableError, ScopeFailedError
from victor_actors.remote._wire import (
    decode,
    encode,
    error_from,
    error_to,
    record_from,
    record_to,
    rollback_from,
    rollback_to,
    snapshot_from,
    snapshot_to,
    state_from,
    state_to,
    transitions_from,
    transitions_to,
)

__all__ = [
    "ShardUnavailableError",
    "decode",
    "encode",
    "error_from",
    "error_to",
    "ops_of",
    "record_from",
    "record_to",
    "rollback_from",
    "rollback_to",
    "snapshot_from",
    "snapshot_to",
    "state_from",
    "state_to",
    "transitions_from",
    "transitions_to",
]


class ShardUnavailableError(OwnerUnavailableError):
    """A shard could not be reached (killed, restarting, or its node gone).

    ``shard`` is its number. ``may_have_applied`` says whether the request
    may have been applied before the shard went away: False means it was
    certainly not; True means it may have been (read the scope's version
    once the shard is back, or retry: the manager's retries are applied at
    most once, by batch id).
    """

    def __init__(self, message: str, *, shard: int = -1, may_have_applied: bool = True) -> None:
        super().__init__(message, may_have_applied=may_have_applied)
        self.shard = shard


def ops_of(payload: Any) -> tuple[Any, ...]:
    """The operations of a decoded call frame (``{"ops": [op, ...]}``).

    Raises:
        ScopeFailedError: the frame holds no sequence of operations; nothing was run.
    """
    ops = payload.get("ops") if isinstance(payload, Mapping) else None
    if not isinstance(ops, (tuple, list)):
        raise ScopeFailedError(
            "a shard call's frame must hold its operations as a list under 'ops', not "
            f"{type(ops).__name__}; nothing was run"
        )
    return tuple(ops)
