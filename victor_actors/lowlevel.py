"""The pieces under the runtime, for code that builds on it.

The pure reducer and the state values it works on, the freezing rules for
stored values, the record codec, and the reports and records the runtime
hands back (recovery, checkpoints, rollbacks, supervision, coordinator
loops). Orchestrator code rarely needs them; tooling, stores and tests do.
"""

from __future__ import annotations

from victor_actors._applier import NoConversationError
from victor_actors._clock import VirtualClock, use_clock
from victor_actors._clock import current as current_clock
from victor_actors._coordinator import LoopResult, StepRecord, UnknownHandoffError, merge
from victor_actors._level_checkpoints import ScopeDict
from victor_actors._options import Backpressure, Durability, Options, Strategy
from victor_actors._reducer import reduce
from victor_actors._reducer import reset as reset_state
from victor_actors._rollback import ScopeRollback
from victor_actors._state import KeyChange, MapView, MessageLog, ScopeState
from victor_actors._supervision import SupervisionEvent, SupervisionPolicy
from victor_actors._twins import Step, StepGen, adrive, drive
from victor_actors._typed import TaggedValue, register_message_type
from victor_actors._values import FrozenDict, freeze, register_converter, thaw
from victor_actors.store import SCHEMA_VERSION, CheckpointInfo, Codec, RecoveryReport

__all__ = [
    "SCHEMA_VERSION",
    "Backpressure",
    "CheckpointInfo",
    "Codec",
    "Durability",
    "FrozenDict",
    "KeyChange",
    "LoopResult",
    "MapView",
    "MessageLog",
    "NoConversationError",
    "Options",
    "RecoveryReport",
    "ScopeDict",
    "ScopeRollback",
    "ScopeState",
    "Step",
    "StepGen",
    "StepRecord",
    "Strategy",
    "SupervisionEvent",
    "SupervisionPolicy",
    "TaggedValue",
    "UnknownHandoffError",
    "VirtualClock",
    "adrive",
    "current_clock",
    "drive",
    "freeze",
    "merge",
    "reduce",
    "register_converter",
    "register_message_type",
    "reset_state",
    "thaw",
    "use_clock",
]
