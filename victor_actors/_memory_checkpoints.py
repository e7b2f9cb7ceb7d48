"""Checkpoints of a manager without a store, kept in memory.

ADR-002's example runs on ``GlobalStateManager.get_instance()`` with no
configuration, and checkpoints there: a manager without a store keeps each
checkpoint as a reference to the scope's committed state (an immutable
``ScopeState``, so a checkpoint costs O(1) and shares everything with the
live scope). The newest ``keep_checkpoints`` are kept per scope; they live
as long as the manager. A restore to one goes through the scope's actor like
any other restore (``GlobalStateManager.restore``).

What needs the log (``state_at``, a restore to a version no checkpoint
holds, ``fork``) still needs a store.
"""

from __future__ import annotations

import threading
import time

import attrs

from victor_actors._cell import ScopeCell
from victor_actors._durability import parse_checkpoint_id
from victor_actors._errors import CheckpointNotFoundError, TransitionValidationError
from victor_actors._model import ScopeRef
from victor_actors._snapshot import ContextSnapshot
from victor_actors._state import ScopeState
from victor_actors._values import check_text
from victor_actors.store import CheckpointInfo

__all__ = ["MemoryCheckpoints"]


@attrs.frozen(slots=True)
class _Kept:
    state: ScopeState
    label: str | None
    timestamp: float


class MemoryCheckpoints:
    """Per scope, its newest checkpoints (newest last), each a committed state and its label."""

    def __init__(self, keep: int) -> None:
        self._keep = max(int(keep), 1)
        self._kept: dict[ScopeRef, list[_Kept]] = {}
        self._lock = threading.Lock()

    def save(self, cell: ScopeCell, label: str | None) -> str:
        """Keep the scope's committed state; return the checkpoint id (``"<scope>@<version>"``)."""
        if label is not None:
            if not isinstance(label, str):
                raise TypeError("label must be a str")
            label = str.__str__(label)
            why = check_text(label, "the label")
            if why is not None:
                raise TransitionValidationError(f"{why}; no checkpoint was written", field="label")
        state = cell.state
        kept = _Kept(state, label, time.time())
        with self._lock:
            chain = self._kept.setdefault(state.ref, [])
            chain[:] = [k for k in chain if k.state.version != state.version]  # one per version
            chain.append(kept)
            chain.sort(key=lambda k: k.state.version)
            del chain[: -self._keep]
        return f"{state.ref}@{state.version}"

    def infos(self, ref: ScopeRef) -> list[CheckpointInfo]:
        """The scope's checkpoints, newest first."""
        with self._lock:
            chain = list(self._kept.get(ref, ()))
        return [
            CheckpointInfo(f"{ref}@{k.state.version}", ref, k.state.version, k.label, k.timestamp, 0)
            for k in reversed(chain)
        ]

    def state(self, ref: ScopeRef, checkpoint: str | int | None) -> ScopeState:
        """The state a checkpoint (an id, a version, or None for the newest) holds.

        Raises:
            CheckpointNotFoundError: no such checkpoint is kept.
        """
        with self._lock:
            chain = list(self._kept.get(ref, ()))
        if not chain:
            raise CheckpointNotFoundError(f"{ref} has no checkpoint")
        if checkpoint is None:
            return chain[-1].state
        version = parse_checkpoint_id(ref, checkpoint)
        for k in chain:
            if k.state.version == version:
                return k.state
        kept = ", ".join(f"{ref}@{k.state.version}" for k in reversed(chain))
        raise CheckpointNotFoundError(
            f"{ref} has no checkpoint at version {version} in memory (kept: {kept}); "
            "a manager without a store keeps only its checkpoints, not the log between them"
        )

    def load(self, ref: ScopeRef, checkpoint_id: str | None) -> ContextSnapshot:
        return ContextSnapshot(self.state(ref, checkpoint_id))
