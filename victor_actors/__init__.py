"""victor_actors: a state runtime for AI agents, one actor per scope.

Conversations, workflows, teams and the global scope are each owned by one
pykka actor that serialises their mutations; everyone else reads immutable
snapshots. See ``docs/architecture.md``.

The top level holds what orchestrator code uses; the pieces below it (the
reducer, state values, the codec, reports) are in :mod:`victor_actors.lowlevel`,
the store in :mod:`victor_actors.store`, test hooks in
:mod:`victor_actors.testing`.
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import TYPE_CHECKING, Any

from victor_actors._applier import TransitionApplier, create_snapshot
from victor_actors._context import current_run_id
from victor_actors._coordinator import Coordinator, CoordinatorRunner
from victor_actors._errors import (
    BackpressureError,
    CheckpointCorruptError,
    CheckpointNotFoundError,
    DeadlineExceededError,
    EncryptionKeyError,
    LogCorruptError,
    OwnerUnavailableError,
    RuntimeClosedError,
    ScopeAccessError,
    ScopeClosedError,
    ScopeFailedError,
    StoreLockedError,
    ToolRequestNotFoundError,
    TransitionValidationError,
    VersionConflictError,
    VictorActorsError,
)
from victor_actors._events import Subscription
from victor_actors._handle import ScopeHandle
from victor_actors._manager import GlobalStateManager
from victor_actors._model import (
    CoordinatorResult,
    ScopeRef,
    StateScope,
    StateTransition,
    TransitionBatch,
    TransitionType,
)
from victor_actors._rollback import RollbackReport, RunFailedError, RunTimeoutError
from victor_actors._runs import Run, RunContext
from victor_actors._snapshot import ContextSnapshot
from victor_actors._state import StateChanged
from victor_actors._tools import ToolCall, ToolDispatcher
from victor_actors._values import thaw
from victor_actors.remote import RemoteStateManager
from victor_actors.remote import connect as _connect_owner
from victor_actors.store import Keyring

if TYPE_CHECKING:
    from victor_actors.ray import RayStateManager

logging.getLogger("victor_actors").addHandler(logging.NullHandler())

__version__ = "0.2.0"

__all__ = [
    "BackpressureError",
    "CheckpointCorruptError",
    "CheckpointNotFoundError",
    "ContextSnapshot",
    "Coordinator",
    "CoordinatorResult",
    "CoordinatorRunner",
    "DeadlineExceededError",
    "EncryptionKeyError",
    "LogCorruptError",
    "GlobalStateManager",
    "Keyring",
    "OwnerUnavailableError",
    "RemoteStateManager",
    "RollbackReport",
    "Run",
    "RunContext",
    "RunFailedError",
    "RunTimeoutError",
    "RuntimeClosedError",
    "ScopeAccessError",
    "ScopeClosedError",
    "ScopeFailedError",
    "ScopeHandle",
    "ScopeRef",
    "StateChanged",
    "StateScope",
    "StateTransition",
    "StoreLockedError",
    "Subscription",
    "ToolCall",
    "ToolDispatcher",
    "ToolRequestNotFoundError",
    "TransitionApplier",
    "TransitionBatch",
    "TransitionType",
    "TransitionValidationError",
    "VersionConflictError",
    "VictorActorsError",
    "__version__",
    "connect",
    "create_snapshot",
    "current_run_id",
    "thaw",
]

# Names that left the top level in 0.2.0, and the module that has them now. They keep
# working from here for one release, with a DeprecationWarning.
_MOVED = {
    "SCHEMA_VERSION": "victor_actors.lowlevel",
    "Codec": "victor_actors.lowlevel",
    "FrozenDict": "victor_actors.lowlevel",
    "KeyChange": "victor_actors.lowlevel",
    "MapView": "victor_actors.lowlevel",
    "MessageLog": "victor_actors.lowlevel",
    "ScopeState": "victor_actors.lowlevel",
    "freeze": "victor_actors.lowlevel",
    "register_converter": "victor_actors.lowlevel",
    "reduce": "victor_actors.lowlevel",
    "CheckpointInfo": "victor_actors.lowlevel",
    "RecoveryReport": "victor_actors.lowlevel",
    "ScopeRollback": "victor_actors.lowlevel",
    "SupervisionEvent": "victor_actors.lowlevel",
    "SupervisionPolicy": "victor_actors.lowlevel",
    "LoopResult": "victor_actors.lowlevel",
    "StepRecord": "victor_actors.lowlevel",
    "merge": "victor_actors.lowlevel",
}


def connect(
    url: str,
    *,
    token_file: str | os.PathLike[str] | None = None,
    request_timeout: float = 30.0,
    connect_timeout: float = 5.0,
    wait: float = 0.0,
) -> RemoteStateManager | RayStateManager:
    """A client of the state at ``url``, with ``GlobalStateManager``'s API.

    ``unix:///path/to/socket`` or ``tcp://host:port``: the store's owner
    process (:func:`victor_actors.remote.connect`, whose keywords it takes;
    ``docs/deploying.md``). ``victor-ray:///path/to/store?shards=N``: the
    Ray shards of that store, attached to (and started if none run yet), on
    this process's Ray or the cluster at ``&address=`` (``auto``,
    ``host:port``, Ray Client's ``ray://host:10001``); a ``RayStateManager``
    (``docs/ray.md``; ``request_timeout`` and ``wait`` apply, a token file is refused).
    """
    if isinstance(url, str) and url.lower().startswith("victor-ray:"):
        from victor_actors.ray._target import connect_ray

        ray_manager: RayStateManager = connect_ray(
            url, token_file=token_file, request_timeout=request_timeout, wait=wait
        )
        return ray_manager
    return _connect_owner(
        url,
        token_file=token_file,
        request_timeout=request_timeout,
        connect_timeout=connect_timeout,
        wait=wait,
    )


def __getattr__(name: str) -> Any:
    where = _MOVED.get(name)
    if where is None:
        raise AttributeError(f"module 'victor_actors' has no attribute {name!r}")
    warnings.warn(
        f"victor_actors.{name} moved to {where}.{name}; the old name goes in the next release",
        DeprecationWarning,
        stacklevel=2,
    )
    import importlib

    return getattr(importlib.import_module(where), name)
