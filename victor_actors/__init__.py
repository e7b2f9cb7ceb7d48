"""victor_actors: a state runtime for AI agents, one actor per scope.

Conversations, workflows, teams and the global scope are each owned by one
pykka actor that serialises their mutations; everyone else reads immutable
snapshots. See ``docs/architecture.md``.
"""

from __future__ import annotations

import logging

from victor_actors._context import current_run_id
from victor_actors._coordinator import Coordinator, CoordinatorRunner, LoopResult, StepRecord, merge
from victor_actors._errors import (
    BackpressureError,
    CheckpointCorruptError,
    CheckpointNotFoundError,
    DeadlineExceededError,
    RuntimeClosedError,
    ScopeAccessError,
    ScopeClosedError,
    ScopeFailedError,
    StoreLockedError,
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
from victor_actors._reducer import reduce
from victor_actors._runs import RollbackReport, Run, ScopeRollback
from victor_actors._state import (
    ContextSnapshot,
    KeyChange,
    MapView,
    MessageLog,
    ScopeState,
    StateChanged,
)
from victor_actors._supervision import SupervisionEvent, SupervisionPolicy
from victor_actors._tools import ToolCall
from victor_actors._values import FrozenDict, freeze, register_converter, thaw
from victor_actors.store import CheckpointInfo, RecoveryReport
from victor_actors.store._codec import SCHEMA_VERSION, Codec

logging.getLogger("victor_actors").addHandler(logging.NullHandler())

__version__ = "0.1.0"

__all__ = [
    "SCHEMA_VERSION",
    "BackpressureError",
    "CheckpointCorruptError",
    "CheckpointInfo",
    "CheckpointNotFoundError",
    "Codec",
    "Coordinator",
    "ContextSnapshot",
    "CoordinatorResult",
    "CoordinatorRunner",
    "DeadlineExceededError",
    "FrozenDict",
    "GlobalStateManager",
    "KeyChange",
    "LoopResult",
    "MapView",
    "MessageLog",
    "RuntimeClosedError",
    "ScopeAccessError",
    "ScopeClosedError",
    "ScopeFailedError",
    "ScopeHandle",
    "ScopeRef",
    "RecoveryReport",
    "RollbackReport",
    "Run",
    "ScopeRollback",
    "ScopeState",
    "StateChanged",
    "StateScope",
    "StateTransition",
    "StepRecord",
    "StoreLockedError",
    "Subscription",
    "ToolCall",
    "SupervisionEvent",
    "SupervisionPolicy",
    "TransitionBatch",
    "TransitionType",
    "TransitionValidationError",
    "VersionConflictError",
    "VictorActorsError",
    "__version__",
    "current_run_id",
    "freeze",
    "merge",
    "reduce",
    "register_converter",
    "thaw",
]
