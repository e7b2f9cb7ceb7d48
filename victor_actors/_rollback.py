"""What rolling back a run did, and the errors a failed run raises.

Plain values, below the runtime: the run service builds them, callers read them.
"""

from __future__ import annotations

import attrs

from victor_actors._errors import DeadlineExceededError, VictorActorsError
from victor_actors._model import ScopeRef

__all__ = ["RollbackReport", "RunFailedError", "RunTimeoutError", "ScopeRollback"]


@attrs.frozen(slots=True)
class ScopeRollback:
    """What a rollback did in one scope."""

    ref: ScopeRef
    keys_restored: tuple[str, ...] = ()
    messages_removed: int = 0
    capabilities_restored: tuple[str, ...] = ()
    stage_restored: bool = False
    tool_requests_released: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()  # what another writer changed since: left as it is
    version: int | None = None  # the rollback commit's version, None if nothing was left to undo
    messages_restored: int = 0  # messages the run had removed (pop, truncate, clear), put back


@attrs.frozen(slots=True)
class RollbackReport:
    """What rolling back a run did, scope by scope."""

    run_id: str
    reason: str
    scopes: tuple[ScopeRollback, ...]

    @property
    def conflicts(self) -> tuple[str, ...]:
        return tuple(c for s in self.scopes for c in s.conflicts)


class RunFailedError(VictorActorsError):
    """A run's body raised; the run's writes were rolled back.

    ``error`` is the exception the body raised (also ``__cause__``), ``run_id``
    the run's id and ``rollback_report`` what the rollback did, scope by
    scope. The caller's own exception is left untouched.
    """

    def __init__(
        self, message: str, *, error: BaseException, run_id: str, rollback_report: RollbackReport
    ) -> None:
        super().__init__(message)
        self.error = error
        self.run_id = run_id
        self.rollback_report = rollback_report


class RunTimeoutError(DeadlineExceededError):
    """A run outlived its timeout; its writes were rolled back.

    A :class:`DeadlineExceededError`; ``run_id`` names the run and
    ``rollback_report`` says what the rollback did.
    """

    def __init__(self, message: str, *, run_id: str, rollback_report: RollbackReport) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.rollback_report = rollback_report
