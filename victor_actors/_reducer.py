"""The pure reducer: (scope state, transitions) -> (new state, commit record).

No actors, no I/O, no clock: everything that varies (commit id, run id,
timestamp) comes in as arguments, so replaying the same transitions on the
same state gives the same result. A batch applies all or nothing: any
failure raises before anything is returned, and the input state, being
immutable, is untouched.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from victor_actors._errors import (
    ScopeAccessError,
    ScopeClosedError,
    TransitionValidationError,
    VictorActorsError,
)
from victor_actors._model import StateTransition, TransitionType
from victor_actors._state import KeyChange, ScopeState, StateChanged
from victor_actors._values import FrozenDict

__all__ = ["reduce", "reset"]

_T = TransitionType
_ABSENT: Any = object()
# Enum members bound once: a class attribute lookup per transition adds up on the commit path.
_UPDATE_STATE = _T.UPDATE_STATE
_DELETE_STATE = _T.DELETE_STATE
_ADD_MESSAGE = _T.ADD_MESSAGE
_ADD_MESSAGES = _T.ADD_MESSAGES
_UPDATE_CAPABILITY = _T.UPDATE_CAPABILITY
_UPDATE_STAGE = _T.UPDATE_STAGE
_EXECUTE_TOOL = _T.EXECUTE_TOOL
_TOOL_RESULT = _T.TOOL_RESULT
_CREATE_SESSION = _T.CREATE_SESSION
_CLOSE_SESSION = _T.CLOSE_SESSION
_POP_MESSAGE = _T.POP_MESSAGE
_TRUNCATE_MESSAGES = _T.TRUNCATE_MESSAGES
_CLEAR_MESSAGES = _T.CLEAR_MESSAGES


def _fail(exc: VictorActorsError, index: int, transition: StateTransition) -> VictorActorsError:
    """Say which transition failed, keeping the error's type."""
    name = transition.transition_type.name
    msg = f"transition {index} ({name}) failed: {exc}; nothing was applied"
    if isinstance(exc, TransitionValidationError):
        return TransitionValidationError(msg, index=index, transition_type=name, field=exc.field)
    return type(exc)(msg, index=index, transition_type=name)


def _check_target(state: ScopeState, target: str) -> None:
    if target == str(state.ref):
        return
    for anc in state.lineage:
        if anc.scope.value == target or str(anc) == target:
            raise ScopeAccessError(
                f"it targets {anc}, an ancestor of {state.ref}; the reducer applies one scope's part "
                "(a scope handle splits a cross-scope batch into parts)"
            )
    raise ScopeAccessError(
        f"it targets scope {target!r}, which is neither {state.ref} nor one of its ancestors"
    )


_change = tuple.__new__  # KeyChange's fields as one tuple: a named tuple's __new__ without its call


def _changes(before: dict[str, Any], after: Any) -> tuple[KeyChange, ...]:
    if not before:
        return ()
    out = []
    get = after.get
    for key, old in before.items():
        new = get(key, _ABSENT)
        if old is _ABSENT:
            if new is _ABSENT:
                continue  # deleted a key that was never there: no change
            out.append(_change(KeyChange, (key, None, new, False, True)))
        elif new is _ABSENT:
            out.append(_change(KeyChange, (key, old, None, True, False)))
        else:
            out.append(_change(KeyChange, (key, old, new, True, True)))
    return tuple(out)


def reduce(
    state: ScopeState,
    transitions: Sequence[StateTransition],
    *,
    commit_id: str,
    run_id: str | None = None,
    timestamp: float = 0.0,
    indices: Sequence[int] | None = None,
) -> tuple[ScopeState, StateChanged]:
    """Apply ``transitions`` to ``state`` all or nothing.

    ``indices``, when given, are the transitions' positions in a larger batch
    (one scope's part of a cross-scope batch); errors name those.

    Returns the new state and the commit record. When nothing changed (an
    empty batch, or only deletes of missing keys) the state is returned as
    it was and the record's ``committed`` is False.

    Raises:
        ScopeClosedError: the scope was closed; nothing applied.
        ScopeAccessError: a transition targets a scope other than this one.
        TransitionValidationError: a transition cannot apply here (for
            example a duplicate tool request id); ``index`` and
            ``transition_type`` name it.
    """
    if state.closed:
        raise ScopeClosedError(
            f"{state.ref} is closed; it is readable but takes no batches; nothing was applied"
        )
    if not transitions:
        return state, _noop(state, commit_id, run_id, timestamp)
    new_version = state.version + 1
    # Persistent-map mutations are made on first use: most batches touch one or two of them.
    values: Any = None
    caps: Any = None
    pending: Any = None
    sessions: Any = None
    old_values: dict[str, Any] = {}
    old_caps: dict[str, Any] = {}
    added: list[Any] = []
    # The new log is the old one's first ``keep`` messages, then ``added``: removals lower ``keep``
    # once they have removed everything the batch added.
    old_len = keep = len(state.messages)
    answered = False  # a TOOL_RESULT settled a pending request (its message may have been removed since)
    stage = state.stage
    stage_set = False
    tool_requests: list[Any] = []
    created: list[str] = []
    closed = False
    own_level = state.ref.scope.value
    for index, t in enumerate(transitions):
        try:
            d = t.data._data  # the frozen dict's backing dict: read-only use, and faster
            target = d.get("scope")
            if target is not None and target != own_level:
                _check_target(state, target)
            if closed:
                raise ScopeClosedError(f"{state.ref} was closed earlier in this batch")
            tt = t.transition_type
            if tt is _UPDATE_STATE:
                if values is None:
                    values = state.values.mutate()
                key = d["key"]
                if key not in old_values:
                    old_values[key] = values.get(key, _ABSENT)
                values[key] = d["value"]
            elif tt is _DELETE_STATE:
                if values is None:
                    values = state.values.mutate()
                key = d["key"]
                if key not in old_values:
                    old_values[key] = values.get(key, _ABSENT)
                if key in values:
                    del values[key]
            elif tt is _ADD_MESSAGE:
                added.append(d["message"])
            elif tt is _ADD_MESSAGES:
                added.extend(d["messages"])
            elif tt is _UPDATE_CAPABILITY:
                name = d["capability"]
                if caps is None:
                    caps = state.capabilities.mutate()
                if name not in old_caps:
                    old_caps[name] = caps.get(name, _ABSENT)
                caps[name] = d["value"]
            elif tt is _UPDATE_STAGE:
                stage = d["stage"]
                stage_set = True
            elif tt is _EXECUTE_TOOL:
                request_id = d.get("request_id") or f"{state.ref}@{new_version}#{index}"
                if pending is None:
                    pending = state.pending_tools.mutate()
                if request_id in pending:
                    raise TransitionValidationError(f"tool request {request_id!r} is already pending")
                request = FrozenDict._wrap(
                    {
                        "request_id": request_id,
                        "tool_name": d["tool_name"],
                        "arguments": d["arguments"],
                        "version": new_version,
                    }
                )
                pending[request_id] = request
                tool_requests.append(request)
            elif tt is _TOOL_RESULT:
                request_id = d.get("request_id")
                if request_id is not None:
                    if pending is None:
                        pending = state.pending_tools.mutate()
                    if request_id not in pending:
                        # answered already, or never asked: a result is applied at most once
                        raise TransitionValidationError(f"no pending tool request {request_id!r}")
                    del pending[request_id]
                    answered = True
                added.append(
                    FrozenDict._wrap(
                        {
                            "role": "tool",
                            "tool_name": d["tool_name"],
                            "content": d["result"],
                            "request_id": request_id,
                            "error": d.get("error"),
                        }
                    )
                )
            elif tt is _CREATE_SESSION:
                session_id = d.get("session_id") or f"{state.ref.id}.{new_version}.{index}"
                if sessions is None:
                    sessions = state.sessions.mutate()
                if session_id in sessions or session_id in created:
                    raise TransitionValidationError(f"session {session_id!r} already exists here")
                sessions[session_id] = d.get("metadata", FrozenDict._wrap({}))
                created.append(session_id)
            elif tt is _CLOSE_SESSION:
                target = d.get("session_id")
                if target is not None and target != state.ref.id:
                    raise ScopeAccessError(
                        f"CLOSE_SESSION names {target!r}; a scope closes only itself "
                        "(apply it to that session's scope)"
                    )
                closed = True
            elif tt is _POP_MESSAGE:
                if added:
                    added.pop()
                elif keep:
                    keep -= 1
            elif tt is _TRUNCATE_MESSAGES:
                length = d.get("length")
                if length is None:
                    length = max(0, keep + len(added) - d["drop"])
                if length < keep:
                    keep = length
                    added.clear()
                else:
                    del added[length - keep :]
            elif tt is _CLEAR_MESSAGES:
                keep = 0
                added.clear()
            else:  # BATCH is flattened before it gets here
                raise TransitionValidationError(f"{tt.name} cannot be applied directly")
        except VictorActorsError as exc:
            raise _fail(exc, index if indices is None else indices[index], t) from exc
    new_values = state.values if values is None else values.finish()
    new_caps = state.capabilities if caps is None else caps.finish()
    changes = _changes(old_values, new_values)
    cap_changes = _changes(old_caps, new_caps)
    removed = keep < old_len
    if not (changes or cap_changes or added or removed or answered or stage_set) and not (
        tool_requests or created or closed
    ):
        return state, _noop(state, commit_id, run_id, timestamp)
    messages = state.messages
    if removed:
        messages = messages.truncated(keep)
    # positional: the fields in ScopeState's and StateChanged's order (keywords cost a third more)
    new_state = ScopeState(
        state.ref,
        state.lineage,
        new_version,
        new_values,
        messages.extended(added),
        new_caps,
        stage,
        closed,
        state.pending_tools if pending is None else pending.finish(),
        state.sessions if sessions is None else sessions.finish(),
    )
    record = StateChanged(
        state.ref,
        commit_id,
        state.version,
        new_version,
        tuple(transitions),
        changes,
        cap_changes,
        tuple(added),
        keep,
        state.messages[keep:] if removed else (),
        state.stage if stage_set else None,
        stage if stage_set else None,
        tuple(tool_requests),
        tuple(created),
        closed,
        run_id,
        timestamp,
    )
    return new_state, record


def _noop(state: ScopeState, commit_id: str, run_id: str | None, timestamp: float) -> StateChanged:
    return StateChanged(
        ref=state.ref,
        commit_id=commit_id,
        old_version=state.version,
        new_version=state.version,
        transitions=(),
        run_id=run_id,
        timestamp=timestamp,
    )


def reset(
    state: ScopeState,
    target: ScopeState,
    *,
    commit_id: str,
    run_id: str | None = None,
    timestamp: float = 0.0,
) -> tuple[ScopeState, StateChanged]:
    """Set ``state``'s contents to ``target``'s as one new commit (restore, rollback).

    History is kept: the version rises by one, and the record lists every
    key that differs, as any commit does. It also applies to a closed scope:
    restoring or rolling back is how a close is undone.
    """
    new_version = state.version + 1
    old_values: dict[str, Any] = {k: v for k, v in state.values.items()}
    for key in target.values:
        old_values.setdefault(key, _ABSENT)
    changes = tuple(c for c in _changes(old_values, target.values) if _differs(c))
    old_caps: dict[str, Any] = {k: v for k, v in state.capabilities.items()}
    for key in target.capabilities:
        old_caps.setdefault(key, _ABSENT)
    cap_changes = tuple(c for c in _changes(old_caps, target.capabilities) if _differs(c))
    new_state = attrs.evolve(target, ref=state.ref, lineage=state.lineage, version=new_version)
    record = StateChanged(
        ref=state.ref,
        commit_id=commit_id,
        old_version=state.version,
        new_version=new_version,
        transitions=(),
        changes=changes,
        capability_changes=cap_changes,
        old_stage=state.stage if state.stage != target.stage else None,
        new_stage=target.stage if state.stage != target.stage else None,
        closed=target.closed,
        run_id=run_id,
        timestamp=timestamp,
        reset=True,
    )
    return new_state, record


def _differs(change: KeyChange) -> bool:
    return change.old_present != change.new_present or change.old_value != change.new_value
