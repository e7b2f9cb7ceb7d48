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
   kernel's publish lock (so a snapshot spanning these scopes sees all of
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
from collections.abc import Callable, Iterable
from typing import Any

import attrs

from victor_actors import _clock, _trace
from victor_actors._cell import ScopeCell
from victor_actors._crosstxn import ABORTED, COMMITTED, GRACE, CrossTxn
from victor_actors._errors import (
    DeadlineExceededError,
    ScopeAccessError,
    VersionConflictError,
    VictorActorsError,
)
from victor_actors._kernel import Kernel
from victor_actors._messages import PrepareRequest
from victor_actors._model import SESSION, ScopeRef, StateScope, StateTransition
from victor_actors._snapshot import ContextSnapshot
from victor_actors._state import ScopeState, StateChanged

__all__ = ["apply_across", "expected_for", "resolve_session", "split_by_scope", "transact"]


@attrs.frozen(slots=True)
class Vote:
    """A yes vote: the part's current state and the state it would commit."""

    cell: ScopeCell
    old: ScopeState
    new: ScopeState
    record: StateChanged


def split_by_scope(
    cell: ScopeCell, transitions: tuple[StateTransition, ...]
) -> dict[ScopeRef, tuple[list[StateTransition], list[int]]] | None:
    """Group transitions by the scope they target; None if all target ``cell``'s own scope.

    Raises:
        ScopeAccessError: a transition targets a scope that is neither the
            applying scope nor one of its ancestors; nothing is applied.
    """
    ref = cell.state.ref
    own = ref.scope.value
    own_name = str(ref)
    if all(t.data.get("scope") in (None, own, own_name) for t in transitions):
        return None
    lineage = cell.state.lineage
    by_target = {anc.scope.value: anc for anc in lineage}
    by_target.update({str(anc): anc for anc in lineage})
    parts: dict[ScopeRef, tuple[list[StateTransition], list[int]]] = {ref: ([], [])}
    for index, t in enumerate(transitions):
        target = t.data.get("scope")
        if target is None or target == own or target == own_name:
            into = ref
        else:
            found = by_target.get(target)
            if found is None:
                raise _access(ref, index, t, target)
            into = found
        part = parts.setdefault(into, ([], []))
        part[0].append(t)
        part[1].append(index)
    return parts


def resolve_session(
    ref: ScopeRef, lineage: tuple[ScopeRef, ...], transitions: tuple[StateTransition, ...]
) -> tuple[StateTransition, ...]:
    """``transitions`` with the seed's ``scope="session"`` made concrete: the applying scope's parent.

    The parent is the workflow or team the conversation sits under; the
    rewritten transitions name it (``"workflow:wf-1"``), so the commit
    records say where they wrote.

    Raises:
        ScopeAccessError: a transition names the session, and the applying
            scope has no parent but global (whose state every conversation
            shares); nothing is applied.
    """
    named = [i for i, t in enumerate(transitions) if t.data._data.get("scope") == SESSION]  # read only
    if not named:
        return transitions
    index = named[0]
    t = transitions[index]
    parent = lineage[0] if lineage else None
    if parent is None or parent.scope is StateScope.GLOBAL:
        raise ScopeAccessError(
            f"transition {index} ({t.transition_type.name}) targets the session, the parent of {ref}; "
            f"{ref} sits directly under global, whose state every conversation shares (open it under a "
            "workflow or a team, or name scope='global' if that is meant); nothing was applied",
            index=index,
            transition_type=t.transition_type.name,
        )
    target = str(parent)
    return tuple(
        StateTransition(t.transition_type, {**t.data, "scope": target}, t.metadata)
        if t.data.get("scope") == SESSION
        else t
        for t in transitions
    )


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


def _participants(cell: ScopeCell, refs: Iterable[ScopeRef]) -> dict[ScopeRef, ScopeCell]:
    """The cells of ``refs`` (``cell`` and some of its ancestors), global first: the one lock order."""
    by_ref = {c.state.ref: c for c in cell.ancestors}
    by_ref[cell.state.ref] = cell
    depth = {ref: i for i, ref in enumerate(reversed(cell.state.lineage))}
    depth[cell.state.ref] = len(depth)
    return {ref: by_ref[ref] for ref in sorted(refs, key=lambda r: depth[r])}


def apply_across(
    kernel: Kernel,
    cell: ScopeCell,
    parts: dict[ScopeRef, tuple[list[StateTransition], list[int]]],
    expected_version: Any,
    deadline: float,
    run_id: str | None = None,
) -> StateChanged:
    """Run the protocol for ``parts``; return the applying scope's record."""
    applying = cell.state.ref
    participants = _participants(cell, parts)
    hooks = _trace.hooks
    # each participant's span: a child of the caller's
    trace = None if hooks is None else hooks.capture(kernel.names)
    txn = CrossTxn(deadline)
    commit_id = kernel.new_commit_id()
    now = _clock.time()
    votes: list[Vote] = []
    error: BaseException | None = None
    for ref, participant in participants.items():
        # Fail fast, before locking anything, when a version is already known to be stale.
        expected = expected_for(expected_version, ref, applying)
        current = participant.state.version
        if expected is not None and expected != current:
            raise VersionConflictError(ref, expected, current)
    for ref, participant in participants.items():
        transitions, indices = parts[ref]
        req = PrepareRequest(
            txn,
            tuple(transitions),
            tuple(indices),
            expected_for(expected_version, ref, applying),
            commit_id,
            now,
            run_id,
            trace=trace,
        )
        try:
            kernel.tell(participant, req, deadline)
        except VictorActorsError as exc:  # a full mailbox, a closed manager, a stopped actor
            error = exc
            break
        try:
            ok, payload = txn.votes.get(timeout=_clock.remaining(deadline))
        except queue.Empty:
            error = DeadlineExceededError(
                f"{ref} did not prepare its part before the deadline; nothing was applied"
            )
            break
        if not ok:
            error = payload
            break
        old, new, record, served = payload
        votes.append(Vote(served, old, new, record))
    return _decide(kernel, cell, txn, votes, {r: tuple(p[0]) for r, p in parts.items()}, error)


def _decide(
    kernel: Kernel,
    cell: ScopeCell,
    txn: CrossTxn,
    votes: list[Vote],
    parts: dict[ScopeRef, tuple[StateTransition, ...]],
    error: BaseException | None,
) -> StateChanged:
    """Commit (durable in one store job, published under the publish lock) or abort."""
    if error is not None or not txn.claim():
        txn.finish(ABORTED)
        if error is None:
            error = DeadlineExceededError(
                "a participant gave up waiting for the decision; nothing was applied"
            )
        raise error
    try:
        if kernel.persist is not None:
            kernel.persist.persist_many(
                [(v.cell, v.new, v.record, parts.get(v.cell.state.ref, ())) for v in votes]
            )
    except BaseException:
        txn.finish(ABORTED)
        raise
    involved = tuple(v.cell.state.ref for v in votes if v.new is not v.old)
    txn.involved = involved  # every scope's event names them all
    try:
        with kernel.publish_lock:
            for v in votes:
                v.cell.state = v.new
    finally:
        txn.finish(COMMITTED)
    txn.wait_participants(len(votes), GRACE + 4.0)
    applying = cell.state.ref
    mine = next(v.record for v in votes if v.old.ref == applying)
    related = tuple(v.record for v in votes if v.old.ref != applying and v.new is not v.old)
    return attrs.evolve(mine, involved=involved, related=related)


def _vote(txn: CrossTxn, ref: ScopeRef, deadline: float) -> tuple[bool, Any]:
    try:
        return txn.votes.get(timeout=_clock.remaining(deadline))
    except queue.Empty:
        return False, DeadlineExceededError(f"{ref} did not answer before the deadline; nothing was applied")


def transact(
    kernel: Kernel,
    cell: ScopeCell,
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
    applying = cell.state.ref
    lineage = cell.state.lineage
    for ref in lock:
        if ref != applying and ref not in lineage:
            raise ScopeAccessError(f"transact can lock only {applying} and its ancestors, not {ref}")
    participants = _participants(cell, set(lock) | {applying})
    hooks = _trace.hooks
    trace = None if hooks is None else hooks.capture(kernel.names)
    txn = CrossTxn(deadline)
    commit_id = kernel.new_commit_id()
    now = _clock.time()
    locked: dict[ScopeRef, tuple[ScopeCell, ScopeState, queue.SimpleQueue[Any]]] = {}
    error: BaseException | None = None
    for ref, participant in participants.items():
        work: queue.SimpleQueue[Any] = queue.SimpleQueue()
        try:
            kernel.tell(
                participant,
                PrepareRequest(txn, None, (), None, commit_id, now, run_id, work, trace),
                deadline,
            )
        except VictorActorsError as exc:
            error = exc
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
            own = locked[applying][1]
            ancestors = tuple(
                locked[a.state.ref][1] if a.state.ref in locked else a.state for a in cell.ancestors
            )
            transitions = to_transitions(fn(ContextSnapshot(own, ancestors)))
            split = split_by_scope(cell, transitions) or {
                applying: (list(transitions), list(range(len(transitions))))
            }
            for ref in split:
                if ref not in locked:
                    raise ScopeAccessError(f"the batch writes {ref}, which this transaction did not lock")
        except BaseException as exc:
            error = exc
        else:
            for ref in participants:
                participant, _state, work = locked.pop(ref)
                part, indices = split.get(ref, ([], []))
                parts[ref] = tuple(part)
                work.put((tuple(part), tuple(indices)))
                ok, payload = _vote(txn, ref, deadline)
                if not ok:
                    error = payload
                    break
                old, new, record, served = payload
                votes.append(Vote(served, old, new, record))
    for _participant, _state, work in locked.values():
        work.put(None)  # never got its part: let it go (the transaction aborts below)
    return _decide(kernel, cell, txn, votes, parts, error)
