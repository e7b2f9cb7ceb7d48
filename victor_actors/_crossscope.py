"""One batch across a scope and its ancestors: all of it commits, or none of it.

The protocol (prepare, then commit or abort) runs on the caller's thread, the
coordinator, against the involved scopes' actors:

1. Prepare, one scope at a time, always in the same order: from the widest
   scope (global) down to the one the batch was applied to. Each actor
   checks its part (deadline, expected version, the reducer), votes, and if
   it voted yes it stops taking other requests until the transaction is
   decided: its thread waits on the shared ``CrossTxn``.
2. If every part voted yes, the coordinator claims the transaction
   (``pending -> committing``), makes every part durable in one store job
   (one LMDB write transaction), publishes every new state under the
   manager's publish lock (so a snapshot spanning these scopes sees all of
   it or none of it), then marks it committed and wakes the actors, which
   publish their events.
3. Otherwise (a part rejected, failed, or missed its deadline) the
   transaction is aborted: nothing was published or stored, and every
   waiting actor resumes with its state as it was.

Deadlock freedom: every transaction locks the scopes it involves in one
global order (by depth, global first), and the scopes a batch may involve
are one chain of ancestors, so no two transactions ever wait on each other
in a cycle. Deadlines bound every wait as well: a prepared actor that hears
nothing past its deadline aborts the transaction itself, unless the
coordinator already claimed it, in which case the outcome is committed and
only moments away.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

from victor_actors._errors import (
    DeadlineExceededError,
    ScopeAccessError,
    ScopeFailedError,
    VersionConflictError,
    VictorActorsError,
)
from victor_actors._model import ScopeRef, StateTransition
from victor_actors._state import ContextSnapshot, ScopeState, StateChanged

if TYPE_CHECKING:
    from victor_actors._handle import ScopeHandle

__all__ = ["CrossTxn", "PrepareRequest", "apply_across", "split_by_scope", "transact"]

_PENDING, _COMMITTING, _COMMITTED, _ABORTED = "pending", "committing", "committed", "aborted"
# How long a prepared actor waits past the transaction's deadline before it may abort it alone.
_GRACE = 1.0


class CrossTxn:
    """The shared fate of one cross-scope transaction."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.lock = threading.Lock()
        self.decided = threading.Condition(self.lock)
        self.state = _PENDING
        self.done_count = 0
        self.involved: tuple[ScopeRef, ...] = ()  # set by the coordinator before it commits
        self.votes: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()

    def claim(self) -> bool:
        """The coordinator's step: pending -> committing. False if an actor aborted it first."""
        with self.lock:
            if self.state != _PENDING:
                return False
            self.state = _COMMITTING
            return True

    def finish_if_pending(self) -> None:
        """A locked participant that was released without a part: abort unless already decided."""
        with self.lock:
            if self.state == _PENDING:
                self.state = _ABORTED
                self.decided.notify_all()

    def finish(self, state: str) -> None:
        with self.lock:
            self.state = state
            self.decided.notify_all()

    def participant_done(self) -> None:
        """A participant finished its work after the outcome (events, sessions, tools)."""
        with self.lock:
            self.done_count += 1
            self.decided.notify_all()

    def wait_participants(self, count: int, timeout: float) -> None:
        """The coordinator waits for that work, so a reply means sessions and tools are under way."""
        end = time.monotonic() + timeout
        with self.lock:
            while self.done_count < count:
                remaining = end - time.monotonic()
                if remaining <= 0:
                    return
                self.decided.wait(remaining)

    def wait_outcome(self) -> str:
        """A prepared actor's wait: returns "committed" or "aborted"."""
        with self.lock:
            while self.state in (_PENDING, _COMMITTING):
                remaining = self.deadline + _GRACE - time.monotonic()
                if self.state == _PENDING and remaining <= 0:
                    self.state = _ABORTED  # the coordinator is gone or too late: abort alone
                    self.decided.notify_all()
                    break
                self.decided.wait(timeout=None if self.state == _COMMITTING else max(remaining, 0.001))
            return self.state


@attrs.frozen(slots=True)
class PrepareRequest:
    """Check this scope's part of a cross-scope batch, vote, and hold until decided."""

    txn: CrossTxn
    transitions: tuple[StateTransition, ...] | None  # None: lock first, the part comes on ``work``
    indices: tuple[int, ...]
    expected_version: int | None
    commit_id: str
    timestamp: float
    run_id: str | None = None
    work: queue.SimpleQueue[tuple[tuple[StateTransition, ...], tuple[int, ...]] | None] | None = None


@attrs.frozen(slots=True)
class Vote:
    """A yes vote: the part's current state and the state it would commit."""

    handle: ScopeHandle
    old: ScopeState
    new: ScopeState
    record: StateChanged


def split_by_scope(
    handle: ScopeHandle, transitions: tuple[StateTransition, ...]
) -> dict[ScopeRef, tuple[list[StateTransition], list[int]]] | None:
    """Group transitions by the scope they target; None if all target ``handle``'s own scope.

    Raises:
        ScopeAccessError: a transition targets a scope that is neither the
            applying scope nor one of its ancestors; nothing is applied.
    """
    own = handle.ref.scope.value
    own_name = str(handle.ref)
    if all(t.data.get("scope") in (None, own, own_name) for t in transitions):
        return None
    lineage = handle._cell.state.lineage
    by_target = {anc.scope.value: anc for anc in lineage}
    by_target.update({str(anc): anc for anc in lineage})
    parts: dict[ScopeRef, tuple[list[StateTransition], list[int]]] = {handle.ref: ([], [])}
    for index, t in enumerate(transitions):
        target = t.data.get("scope")
        if target is None or target == own or target == own_name:
            ref = handle.ref
        else:
            found = by_target.get(target)
            if found is None:
                raise _access(handle.ref, index, t, target)
            ref = found
        part = parts.setdefault(ref, ([], []))
        part[0].append(t)
        part[1].append(index)
    return parts


def _access(ref: ScopeRef, index: int, t: StateTransition, target: str) -> ScopeAccessError:
    what = f"the {target} scope" if ":" not in target else target
    return ScopeAccessError(
        f"transition {index} ({t.transition_type.name}) targets {what}, which is "
        f"neither {ref} nor one of its ancestors (a batch may write only there); nothing was applied",
        index=index,
        transition_type=t.transition_type.name,
    )


def expected_for(expected: Any, ref: ScopeRef, applying: ScopeRef) -> int | None:
    """The version ``expected`` (an int for the applying scope, or a mapping) names for ``ref``."""
    if expected is None or isinstance(expected, int):
        return expected if ref == applying else None
    for key in (ref, str(ref), ref.scope, ref.scope.value):
        if key in expected:
            return int(expected[key])
    return None


def apply_across(
    handle: ScopeHandle,
    parts: dict[ScopeRef, tuple[list[StateTransition], list[int]]],
    expected_version: Any,
    deadline: float,
    run_id: str | None = None,
) -> StateChanged:
    """Run the protocol for ``parts``; return the applying scope's record."""
    manager = handle._manager
    depth = {ref: i for i, ref in enumerate(reversed((*handle._cell.state.lineage,)))}
    depth[handle.ref] = len(depth)
    order = sorted(parts, key=lambda r: depth[r])  # global first: the one global lock order
    txn = CrossTxn(deadline)
    commit_id = manager._new_commit_id()
    now = time.time()
    votes: list[Vote] = []
    error: BaseException | None = None
    participants = {ref: handle if ref == handle.ref else manager.scope(ref) for ref in order}
    for ref, participant in participants.items():
        # Fail fast, before locking anything, when a version is already known to be stale.
        expected = expected_for(expected_version, ref, handle.ref)
        current = participant._cell.state.version
        if expected is not None and expected != current:
            raise VersionConflictError(ref, expected, current)
    for ref in order:
        transitions, indices = parts[ref]
        participant = participants[ref]
        req = PrepareRequest(
            txn,
            tuple(transitions),
            tuple(indices),
            expected_for(expected_version, ref, handle.ref),
            commit_id,
            now,
            run_id,
        )
        try:
            participant._tell(req, deadline)
        except VictorActorsError as exc:  # a full mailbox, a closed manager
            error = exc
            break
        except Exception:
            error = ScopeFailedError(f"{ref}'s actor is not running; nothing was applied")
            break
        try:
            ok, payload = txn.votes.get(timeout=max(deadline - time.monotonic(), 0.0))
        except queue.Empty:
            error = DeadlineExceededError(
                f"{ref} did not prepare its part before the deadline; nothing was applied"
            )
            break
        if not ok:
            error = payload
            break
        old, new, record = payload
        votes.append(Vote(participant, old, new, record))
    return _decide(handle, txn, votes, {r: tuple(p[0]) for r, p in parts.items()}, error)


def _decide(
    handle: ScopeHandle,
    txn: CrossTxn,
    votes: list[Vote],
    parts: dict[ScopeRef, tuple[StateTransition, ...]],
    error: BaseException | None,
) -> StateChanged:
    """Commit (durable in one store job, published under the publish lock) or abort."""
    manager = handle._manager
    if error is not None or not txn.claim():
        txn.finish(_ABORTED)
        if error is None:
            error = DeadlineExceededError(
                "a participant gave up waiting for the decision; nothing was applied"
            )
        raise error
    try:
        manager._persist_many([(v.handle._cell, v.new, v.record, parts.get(v.handle.ref, ())) for v in votes])
    except BaseException:
        txn.finish(_ABORTED)
        raise
    involved = tuple(v.handle.ref for v in votes if v.new is not v.old)
    txn.involved = involved  # every scope's event names them all
    try:
        with manager._publish_lock:
            for v in votes:
                v.handle._cell.state = v.new
    finally:
        txn.finish(_COMMITTED)
    txn.wait_participants(len(votes), _GRACE + 4.0)
    mine = next(v.record for v in votes if v.handle is handle)
    related = tuple(v.record for v in votes if v.handle is not handle and v.new is not v.old)
    return attrs.evolve(mine, involved=involved, related=related)


def _vote(txn: CrossTxn, ref: ScopeRef, deadline: float) -> tuple[bool, Any]:
    try:
        return txn.votes.get(timeout=max(deadline - time.monotonic(), 0.0))
    except queue.Empty:
        return False, DeadlineExceededError(f"{ref} did not answer before the deadline; nothing was applied")


def transact(
    handle: ScopeHandle,
    fn: Callable[[ContextSnapshot], Any],
    lock: tuple[ScopeRef, ...],
    deadline: float,
    to_transitions: Callable[[Any], tuple[StateTransition, ...]],
    run_id: str | None = None,
) -> StateChanged:
    """Lock ``lock`` (global first), let ``fn`` read them and return a batch, apply it, unlock.

    Pessimistic where ``apply`` is optimistic: no version conflicts, at the
    price of holding the locked scopes while ``fn`` runs.
    """
    manager = handle._manager
    lineage = handle._cell.state.lineage
    depth = {ref: i for i, ref in enumerate(reversed(lineage))}
    depth[handle.ref] = len(depth)
    for ref in lock:
        if ref not in depth:
            raise ScopeAccessError(f"transact can lock only {handle.ref} and its ancestors, not {ref}")
    order = sorted(set(lock) | {handle.ref}, key=lambda r: depth[r])
    txn = CrossTxn(deadline)
    commit_id = manager._new_commit_id()
    now = time.time()
    locked: dict[ScopeRef, tuple[ScopeHandle, ScopeState, queue.SimpleQueue[Any]]] = {}
    error: BaseException | None = None
    for ref in order:
        participant = handle if ref == handle.ref else manager.scope(ref)
        work: queue.SimpleQueue[Any] = queue.SimpleQueue()
        try:
            participant._tell(PrepareRequest(txn, None, (), None, commit_id, now, run_id, work), deadline)
        except VictorActorsError as exc:
            error = exc
            break
        except Exception:
            error = ScopeFailedError(f"{ref}'s actor is not running; nothing was applied")
            break
        ok, payload = _vote(txn, ref, deadline)
        if not ok:
            error = payload
            break
        locked[ref] = (participant, payload, work)
    votes: list[Vote] = []
    parts: dict[ScopeRef, tuple[StateTransition, ...]] = {}
    if error is None:
        try:
            own = locked[handle.ref][1]
            ancestors = tuple(locked[a][1] if a in locked else manager.scope(a)._cell.state for a in lineage)
            transitions = to_transitions(fn(ContextSnapshot(own, ancestors)))
            split = split_by_scope(handle, transitions) or {
                handle.ref: (list(transitions), list(range(len(transitions))))
            }
            for ref in split:
                if ref not in locked:
                    raise ScopeAccessError(f"the batch writes {ref}, which this transaction did not lock")
        except BaseException as exc:
            error = exc
        else:
            for ref in order:
                participant, _state, work = locked.pop(ref)
                part, indices = split.get(ref, ([], []))
                parts[ref] = tuple(part)
                work.put((tuple(part), tuple(indices)))
                ok, payload = _vote(txn, ref, deadline)
                if not ok:
                    error = payload
                    break
                old, new, record = payload
                votes.append(Vote(participant, old, new, record))
    for _participant, _state, work in locked.values():
        work.put(None)  # never got its part: let it go (the transaction aborts below)
    return _decide(handle, txn, votes, parts, error)
