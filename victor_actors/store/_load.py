"""Load and replay: a scope's state from its newest good checkpoint plus its log.

Recovery uses the same reducer as the live path, so replaying a stored
commit gives exactly the state that was published when it was made.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import attrs

from victor_actors._errors import CheckpointCorruptError, CheckpointNotFoundError, VictorActorsError
from victor_actors._model import ScopeRef
from victor_actors._reducer import reduce
from victor_actors._state import ScopeState
from victor_actors.store._codec import Codec, CommitRecord
from victor_actors.store._keys import place, ref_key, version_of

__all__ = ["CheckpointInfo", "RecoveryReport", "apply_record", "load_state"]

Scan = Callable[..., Iterator[tuple[bytes, bytes]]]
# unseal(raw, place, what): the plaintext record stored at place (raises CheckpointCorruptError)
Unseal = Callable[[bytes, bytes, str], bytes]


def _plain(raw: bytes, _place: bytes, _what: str) -> bytes:
    return raw


@attrs.frozen(slots=True)
class CheckpointInfo:
    """One stored checkpoint, as ``list_checkpoints`` shows it."""

    checkpoint_id: str
    ref: ScopeRef
    version: int
    label: str | None
    timestamp: float
    size: int
    readable: bool = True


@attrs.frozen(slots=True)
class RecoveryReport:
    """What recovery of one scope used and what it had to skip.

    ``head_found`` is False when the scope's head record (its newest
    committed version) could not be found: then ``version`` is only what the
    records that could be found reach, and commits after it may exist unseen.
    A writable manager does not serve such a scope (``CheckpointCorruptError``);
    a read-only one serves it with this report.
    """

    ref: ScopeRef
    version: int
    checkpoint_version: int | None
    replayed: int
    skipped: tuple[str, ...] = ()
    latest_stored_version: int = 0
    head_found: bool = True

    @property
    def clean(self) -> bool:
        return not self.skipped


def load_state(
    scan: Scan,
    codec: Codec,
    ref: ScopeRef,
    lineage: tuple[ScopeRef, ...],
    *,
    upto: int | None = None,
    head: int | None = None,
    head_note: str | None = None,
    prefix: bytes | None = None,
    unseal: Unseal = _plain,
    read_checkpoint: Callable[[bytes, bytes], ScopeState] | None = None,
) -> tuple[ScopeState, RecoveryReport]:
    """Rebuild ``ref``'s state: the newest good checkpoint plus a replay of later commits.

    With ``upto``, rebuild the state at that version instead of the latest.
    A corrupt checkpoint is skipped for an older one; a corrupt or missing
    commit ends the replay there. ``head`` is the scope's newest committed
    version as its head record says: a replay that ends short of it reports
    the missing tail, and records above it (which no commit wrote) are
    ignored and reported. What was skipped is in the report. ``read_checkpoint(key, raw)``
    decodes a stored checkpoint (a format-2 manifest needs its chunks and values records);
    without it, every checkpoint is read as a full record.
    """
    if prefix is None:
        prefix = ref_key(ref)
    ckpt_items = list(scan("ckpt", prefix, reverse=True))
    log_items = [(version_of(k), k, v) for k, v in scan("log", prefix)]
    stored = max([v for v, _k, _v in log_items] + [version_of(k) for k, _ in ckpt_items] + [0])
    skipped: list[str] = [] if head_note is None else [head_note]
    latest = stored
    if head is not None:
        if stored > head:
            skipped.append(
                f"records above the head version {head} (up to v{stored}) were written by no commit"
            )
        latest = head
    target = latest if upto is None else upto
    starts: list[tuple[ScopeState, int | None]] = []
    for key, raw in ckpt_items:
        version = version_of(key)
        if version > target:
            continue
        try:
            if read_checkpoint is not None:
                starts.append((read_checkpoint(key, raw), version))
                break
            where = place("ckpt", key)
            plain = unseal(raw, where, f"checkpoint v{version} of {ref}")
            record = codec.decode_checkpoint(plain, ref=ref, version=version, place=where)
            starts.append((record.state, version))
            break
        except CheckpointCorruptError as exc:
            if exc.fatal:
                raise
            skipped.append(f"checkpoint v{version}: {exc}")
    first_log = log_items[0][0] if log_items else None
    if not starts and (first_log is None or first_log == 1):
        starts.append((ScopeState(ref=ref, lineage=lineage), None))
    if not starts and upto is not None and not skipped:
        oldest = min((version_of(k) for k, _ in ckpt_items), default=None)
        since = "" if oldest is None else f"; the oldest version it can rebuild is {oldest}"
        raise CheckpointNotFoundError(
            f"{ref}: version {upto} is no longer stored{since} (retention keeps the newest "
            "checkpoints and the log after the oldest of them); nothing was loaded"
        )
    if not starts:
        raise CheckpointCorruptError(
            f"{ref}: no readable checkpoint and the log starts at version {first_log}; "
            f"cannot rebuild its state ({'; '.join(skipped)})",
            ref=ref,
        )
    state, ck_version = starts[0]
    state = attrs.evolve(state, ref=ref, lineage=lineage)
    replayed = 0
    for version, key, raw in log_items:
        if version <= state.version or version > target:
            continue
        if version != state.version + 1:
            skipped.append(f"commit v{state.version + 1} is missing")
            break
        try:
            where = place("log", key)
            rec = codec.decode_commit(
                unseal(raw, where, f"commit v{version} of {ref}"), ref=ref, version=version, place=where
            )
            state = apply_record(state, rec)
        except CheckpointCorruptError as exc:
            if exc.fatal:
                raise
            skipped.append(f"commit v{version}: {exc}")
            break
        except VictorActorsError as exc:  # a record that decodes but does not replay
            skipped.append(f"commit v{version} does not replay: {exc}")
            break
        replayed += 1
    if (
        upto is None
        and head is not None
        and state.version < head
        and not any("missing" in s for s in skipped)
    ):
        skipped.append(f"the head version is {head} but the log reaches only v{state.version}")
    if upto is not None and upto > latest:
        raise CheckpointNotFoundError(f"{ref} has no version {upto}; its newest is {latest}")
    if upto is not None and state.version != upto:
        raise CheckpointNotFoundError(
            f"{ref}: version {upto} cannot be rebuilt from the store (reached {state.version})"
        )
    return state, RecoveryReport(
        ref, state.version, ck_version, replayed, tuple(skipped), max(latest, stored)
    )


def apply_record(state: ScopeState, rec: CommitRecord) -> ScopeState:
    """Replay one stored commit on ``state`` (deterministic: same reducer, same inputs)."""
    if rec.kind == "reset":
        if rec.state is None:  # its state was too large for one record: it is the checkpoint there
            raise CheckpointCorruptError(
                f"{state.ref}: reset commit v{rec.version} keeps its state in the checkpoint at "
                f"v{rec.version}, which could not be read",
                ref=state.ref,
                version=rec.version,
            )
        return attrs.evolve(rec.state, ref=state.ref, lineage=state.lineage, version=rec.version)
    new_state, _record = reduce(
        state, rec.transitions, commit_id=rec.commit_id, run_id=rec.run_id, timestamp=rec.timestamp
    )
    if new_state.version != rec.version:
        raise CheckpointCorruptError(
            f"{state.ref}: replaying commit v{rec.version} gave version {new_state.version}",
            ref=state.ref,
            version=rec.version,
        )
    return new_state
