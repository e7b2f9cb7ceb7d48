"""The error hierarchy: one root, a few precise children a caller can act on.

Every message says what was wrong and what was left unchanged.
"""

from __future__ import annotations

__all__ = [
    "BackpressureError",
    "CheckpointCorruptError",
    "CheckpointNotFoundError",
    "DeadlineExceededError",
    "EncryptionKeyError",
    "LogCorruptError",
    "OwnerUnavailableError",
    "RuntimeClosedError",
    "ScopeAccessError",
    "ScopeClosedError",
    "ScopeFailedError",
    "StoreLockedError",
    "ToolRequestNotFoundError",
    "TransitionValidationError",
    "VersionConflictError",
    "VictorActorsError",
]


class VictorActorsError(Exception):
    """Root of every error raised by victor_actors.

    ``index`` and ``transition_type`` name the transition of a batch that
    caused the error, when one did (else both are None).
    """

    index: int | None = None
    transition_type: str | None = None

    def __init__(self, *args: object, index: int | None = None, transition_type: str | None = None) -> None:
        super().__init__(*args)
        if index is not None:
            self.index = index
        if transition_type is not None:
            self.transition_type = transition_type


class TransitionValidationError(VictorActorsError, ValueError):
    """A transition, batch or value is malformed; nothing was applied.

    Raised when a transition is created with missing or wrong data, when a
    value cannot be frozen and stored, and when a batch fails inside the
    reducer (then ``index`` and ``transition_type`` name the failing
    transition).
    """

    def __init__(
        self,
        message: str,
        *,
        index: int | None = None,
        transition_type: str | None = None,
        field: str | None = None,
    ) -> None:
        super().__init__(message, index=index, transition_type=transition_type)
        self.field = field


class VersionConflictError(VictorActorsError):
    """``expected_version`` did not match the scope's current version.

    Nothing was applied. ``ref`` is the scope's ``ScopeRef``,
    ``expected_version`` the version the caller named and ``current_version``
    the version the scope holds. (This module sits below the model, so
    ``ref`` is typed ``object`` here.)
    """

    def __init__(self, ref: object, expected: int, current: int) -> None:
        super().__init__(
            f"{ref}: expected version {expected} but the scope is at version {current}; nothing was applied"
        )
        self.ref = ref
        self.expected_version = expected
        self.current_version = current


class ScopeAccessError(VictorActorsError):
    """A request named a scope it may not touch, or an unknown scope; nothing was applied."""


class ScopeClosedError(VictorActorsError):
    """The scope was closed by CLOSE_SESSION; it stays readable but rejects batches."""


class ScopeFailedError(VictorActorsError):
    """The scope's actor failed while handling the request, or is not running.

    The scope's committed state is unchanged by the failed request.
    """


class DeadlineExceededError(VictorActorsError):
    """A request's deadline passed before it was handled or answered.

    A request that expired while waiting in the mailbox was not applied. A
    request whose reply did not arrive in time may still be applied later by
    the actor; the caller can tell by reading the scope's version.
    """


class ToolRequestNotFoundError(VictorActorsError, LookupError):
    """A tool request is neither pending nor answered in the scope asked; nothing changed.

    It was never made there, or a run's rollback released it: a result will
    never come, so make a new request if the tool is still needed.
    """


class BackpressureError(VictorActorsError):
    """A scope's mailbox is full and the request was rejected; nothing was applied."""


class RuntimeClosedError(VictorActorsError):
    """The manager was closed; no further requests are accepted."""


class OwnerUnavailableError(VictorActorsError):
    """The process that owns the scope could not be reached (an owner, or a Ray shard).

    ``may_have_applied`` says whether the request may have been applied
    before the owner went away: False means it certainly was not (it was a
    read, or it was never sent); True means it may have been. A write the
    client retried for you is applied at most once (by its batch id), so
    sending it again after the owner is back is safe; or read the scope's
    version to tell.
    """

    def __init__(self, message: str, *, may_have_applied: bool = True) -> None:
        super().__init__(message)
        self.may_have_applied = may_have_applied


class CheckpointNotFoundError(VictorActorsError):
    """No checkpoint (or stored version) matches what was asked for; nothing changed."""


class CheckpointCorruptError(VictorActorsError):
    """A stored record failed its checksum or could not be decoded.

    ``ref`` and ``version`` name the record (either may be None when the
    record's key itself is unreadable). Nothing was loaded from it.
    """

    def __init__(
        self, message: str, *, ref: object = None, version: int | None = None, fatal: bool = False
    ) -> None:
        super().__init__(message)
        self.ref = ref
        self.version = version
        # fatal: the record is fine but this code cannot read it (a newer schema,
        # a missing migration); recovery must stop rather than skip it.
        self.fatal = fatal


class LogCorruptError(CheckpointCorruptError):
    """The store's write-ahead log cannot be replayed as it is; nothing was opened or changed.

    Raised on open when a record in the middle of the log fails its check
    while good records follow it (damage, not a write cut short by a crash),
    when its sequence numbers are not contiguous, when the log belongs to
    another store, or when the data file is older than the log's last
    checkpoint. Opening with ``drop_damaged_log=True`` replays what precedes
    the damage and drops the rest (docs/adr/0033-write-ahead-log.md).
    """


class StoreLockedError(VictorActorsError):
    """Another live manager owns the store for writing; nothing was opened.

    Open it with ``read_only=True`` to inspect it meanwhile.
    """


class EncryptionKeyError(VictorActorsError):
    """The store's encryption and the keys given do not fit; nothing was opened or changed.

    Raised for an encrypted store opened without a keyring, with keys that
    do not match it, a plaintext store opened with a keyring (unless
    ``encryption_migrate=True``), and a malformed keyring or key file. The
    message names key ids, never keys.
    """
