"""``assert_isolated``: what one conversation holds must not show up where it does not belong.

Three ways to decide "where it belongs", chosen by the test (see ``docs/testing.md``):

- ``owners=``: the test says who owns what (tokens planted per conversation, or
  an owner rule) and every scope's messages and state are searched for values
  held where their owner does not allow (``_ownership.py``). The verdict reads
  only the final state, so it is the same with a recorder or without; a
  recorder only adds where each offending value came from (the commit, the
  caller, the call site).
- the recorder mode (no owners, a recorder given or attached): every message
  and key a conversation holds must have come with a request sent to it; data
  copied out of another conversation's snapshot is caught only when it is the
  very same object.
- the by-value mode (no owners, no recorder, or ``mode="value"``): no message
  and no (key, value) pair may be held by two conversations.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable
from typing import Any

from victor_actors._manager import GlobalStateManager
from victor_actors._model import ScopeRef, StateScope, StateTransition
from victor_actors._values import FrozenDict
from victor_actors.testing._calls import WriteCall
from victor_actors.testing._kit import (
    _ABSENT,
    Received,
    Recorder,
    ScopeLike,
    _fail,
    _hkey,
    _messages_of,
    _recorder_of,
    _ref,
    _settled,
    _short,
    _targets,
    _writes_of,
)
from victor_actors.testing._ownership import Found, Owners, claimed_inside, owner_rule, search

__all__ = ["assert_isolated"]

MODES = ("auto", "recorder", "value")


def assert_isolated(
    manager_or_recorder: Recorder | GlobalStateManager,
    *conversations: ScopeLike,
    owners: Owners | None = None,
    mode: str = "auto",
    settle: float = 2.0,
) -> None:
    """Assert that no conversation's data is held where it does not belong.

    ``conversations`` are handles, refs, ``"conversation:id"`` names or bare
    session ids.

    With ``owners`` (the form to prefer), the test says who owns what:
    either a mapping from a scope to the token (or tokens) planted in what
    it is sent, or an owner rule, ``owner(value)`` returning the scopes
    allowed to hold ``value`` (or None: no claim), called on every value at
    every depth. Every scope the manager holds (only ``conversations``, if
    given) is searched, messages and own state, keys included, nested values
    and substrings included; a token may be held by its owner only. The
    verdict is the same in every ``mode``; with a recorder each problem also
    says which commit brought the value, from which caller and call site.

    Without ``owners``, the check depends on the mode, which the failure
    message names:

    - ``mode="recorder"`` (what ``"auto"`` picks when given a recorder, or a
      manager with one attached): every message in a conversation arrived
      in a request sent to it and committed there (or was in its baseline),
      counted; every key of its own state holds its baseline value or a value
      a committed request sent to it wrote. A value copied from another
      conversation's snapshot into a request is caught only when it is the
      very same (structured) object.
    - ``mode="value"`` (what ``"auto"`` picks without a recorder): no message
      and no (key, value) pair of one conversation may appear in another;
      conversations that legitimately hold identical messages fail it.

    Raises:
        AssertionError: listing every problem (up to 20).
        TypeError: ``mode="recorder"`` without a recorder; bad ``owners``.
        ValueError: an unknown ``mode``; a token given to two scopes.
    """
    __tracebackhide__ = True
    if mode not in MODES:
        raise ValueError(f"mode is one of {', '.join(MODES)}, not {mode!r}")
    rec = None if mode == "value" else _recorder_of(manager_or_recorder)
    if mode == "recorder" and rec is None:
        raise TypeError("mode='recorder' needs a Recorder, or a manager with one attached")
    if isinstance(manager_or_recorder, Recorder):
        manager = manager_or_recorder.manager
    else:
        manager = manager_or_recorder
    assert isinstance(manager, GlobalStateManager)
    if rec is None:
        note = "compared by value: no recorder" + (" used" if mode == "value" else " is attached")
    elif isinstance(manager_or_recorder, Recorder):
        note = "recorder mode: the recorder given"
    else:
        note = "recorder mode: the recorder attached to the manager; pass mode='value' to compare by value"
    if owners is not None:
        claims = owner_rule(owners)
        holders = [_ref(c) for c in conversations] or list(manager.scopes())

        def compute() -> list[str]:
            snaps = [(ref, manager.scope(ref).snapshot()) for ref in holders]
            return [_with_provenance(rec, f) for f in search(snaps, claims)]

        problems = _settled(rec, compute, settle) if rec is not None else compute()
        if problems:
            mode_note = "owners given: the same verdict in every mode"
            if rec is not None:
                mode_note += "; provenance from the recorder"
            _fail("scopes hold what their owners do not allow", problems, mode_note)
        return
    refs = [_ref(c) for c in conversations] or [
        r for r in manager.scopes() if r.scope is StateScope.CONVERSATION
    ]
    if rec is None:
        problems = _isolation_by_value(manager, refs)
        if problems:
            _fail(
                "conversations are not isolated (compared by value: no recorder is attached)", problems, note
            )
        return
    problems = _settled(rec, lambda: _isolation_problems(rec, refs), settle)
    if problems:
        _fail("conversations are not isolated", problems, note)


def _with_provenance(rec: Recorder | None, found: Found) -> str:
    """The problem, and with a recorder the first commit that brought the value to its holder."""
    text = found.describe()
    if rec is None:
        return text
    claims = owner_rule(lambda v: found.owners if _contains(v, found.value) else None)
    writers: dict[str, WriteCall] = {}
    for call in rec.calls():
        if isinstance(call, WriteCall):
            for r in call.records():
                writers.setdefault(r.commit_id, call)
    for p in rec.commits(found.holder):
        event = p.event
        if found.where == "message":
            carried = [m for m in event.added_messages if claimed_inside(m, claims)]
        else:
            named = found.path == "(the key's name)"
            carried = [
                c
                for c in event.changes
                if c.key == found.index and c.new_present and (named or claimed_inside(c.new_value, claims))
            ]
        if not carried:
            continue
        how = "a run's rollback" if event.reset else "a request"
        text += f"; it came with commit {event.commit_id} ({how} to {found.holder}"
        writer = writers.get(event.commit_id)
        if writer is not None:
            text += f", {writer.via} by {writer.caller}" + (f" at {writer.site}" if writer.site else "")
        elif p.request is not None and p.request.run_id is None and p.request.kind == "apply":
            text += ", not through a handle: a tool result or a lower-level call"
        return text + ")"
    return text + "; the recorder saw no commit bring it (there before it attached?)"


def _contains(value: Any, claimed: Any) -> bool:
    if isinstance(claimed, str) and isinstance(value, str):
        return claimed in value
    try:
        return bool(value is claimed or value == claimed)
    except Exception:  # a value whose == raises: not the one
        return False


def _isolation_problems(rec: Recorder, refs: list[ScopeRef]) -> list[str]:
    entries, baselines, _tracked = rec._snapshot_data()
    committed_msgs: dict[ScopeRef, Counter[Hashable]] = {}
    committed_writes: dict[ScopeRef, dict[str, list[Any]]] = {}
    sent_to: dict[Hashable, set[ScopeRef]] = {}
    written_to: dict[str, set[ScopeRef]] = {}
    seen: set[ScopeRef] = set()

    def note_sent(ref: ScopeRef, transitions: Iterable[StateTransition]) -> None:
        own = [t for t in transitions if _targets(t, ref)]
        for m in _messages_of(own):
            sent_to.setdefault(_hkey(m), set()).add(ref)
        for key in _writes_of(own):
            written_to.setdefault(key, set()).add(ref)

    for e in entries:
        seen.add(e.ref)
        if isinstance(e, Received):
            if e.transitions is not None and e.kind in ("apply", "prepare"):
                note_sent(e.ref, e.transitions)
            continue
        req = e.request
        if req is None or req.ref != e.ref:
            continue
        if req.kind in ("apply", "prepare") and req.transitions is not None:
            transitions = req.transitions
        elif req.kind == "lock":  # the part came after the lock; the event is the only record of it
            transitions = e.event.transitions
            note_sent(e.ref, transitions)
        else:  # a reset restores earlier content of this scope: nothing new to allow
            continue
        own = [t for t in transitions if _targets(t, e.ref)]
        committed_msgs.setdefault(e.ref, Counter()).update(_hkey(m) for m in _messages_of(own))
        writes = committed_writes.setdefault(e.ref, {})
        for key, value in _writes_of(own).items():
            if value is not _ABSENT:
                writes.setdefault(key, []).append(value)

    def elsewhere(found: set[ScopeRef] | None, ref: ScopeRef, verb: str) -> str:
        others = sorted(str(r) for r in (found or set()) if r != ref)
        if others:
            return f"it was {verb} only to {', '.join(others)}"
        if found and ref in found:
            return f"a request {verb} to it carried it but did not commit"
        return f"no recorded request {verb} it anywhere"

    problems: list[str] = []
    flagged: set[tuple[ScopeRef, str, Hashable]] = set()  # reported as never sent: not twice
    for ref in refs:
        snap = rec.manager.scope(ref).snapshot()
        base = baselines.get(ref)
        if base is None and ref not in seen and snap.version > 0:
            problems.append(
                f"{ref} is at version {snap.version} but the recorder never saw it start "
                "(created from a fork or a store after the recorder attached?): nothing to check it against"
            )
            continue
        allowed: Counter[Hashable] = Counter()
        if base is not None:
            allowed.update(_hkey(m) for m in base.messages)
        allowed.update(committed_msgs.get(ref, Counter()))
        for index, message in enumerate(snap.messages):
            mkey = _hkey(message)
            if allowed[mkey] > 0:
                allowed[mkey] -= 1
                continue
            flagged.add((ref, "message", mkey))
            problems.append(
                f"{ref} holds message {_short(message)} at index {index}, which no request sent to "
                f"{ref} carried (or not that many times); {elsewhere(sent_to.get(mkey), ref, 'sent')}"
            )
        writes = committed_writes.get(ref, {})
        for key, value in snap.state.items():
            if base is not None and key in base.values and base.values[key] == value:
                continue
            if any(v == value for v in writes.get(key, ())):
                continue
            flagged.add((ref, "key", (key, _hkey(value))))
            problems.append(
                f"{ref} holds key {key!r} = {_short(value, 60)}, which no request sent to {ref} wrote; "
                f"{elsewhere(written_to.get(key), ref, 'written')}"
            )
    # Data of one conversation copied into another through a request is a leak too: the request
    # explains how it got there, not that it belongs there. Same rule as the by-value check.
    for problem, (ref, what, item) in _shared_values(rec.manager, refs, same_object=True):
        if (ref, what, item) not in flagged:
            problems.append(f"{problem} (it came through a request sent to {ref}: copied from there?)")
    return problems


def _shared_values(
    manager: GlobalStateManager, refs: list[ScopeRef], *, same_object: bool = False
) -> list[tuple[str, tuple[ScopeRef, str, Hashable]]]:
    """Messages and (key, value) pairs that more than one of ``refs`` holds, after the first holder.

    With ``same_object``, only structured values (mappings, sequences) held as the very same
    object count: what a request copied out of one conversation's snapshot into another. Two
    conversations that were each sent an equal message hold two different objects.
    """
    found: list[tuple[str, tuple[ScopeRef, str, Hashable]]] = []
    first_holder: dict[Hashable, ScopeRef] = {}
    pair_holder: dict[tuple[str, Hashable], ScopeRef] = {}
    snaps = [(ref, manager.scope(ref).snapshot()) for ref in refs]  # keeps every object alive meanwhile

    def ident(value: Any) -> Hashable | None:
        if not same_object:
            return _hkey(value)
        return id(value) if value.__class__ in (FrozenDict, tuple) and value else None

    for ref, snap in snaps:
        for index, message in enumerate(snap.messages):
            key = ident(message)
            if key is None:
                continue
            holder = first_holder.setdefault(key, ref)
            if holder != ref:
                text = f"{ref} holds message {_short(message)} at index {index}, as {holder} does"
                found.append((text, (ref, "message", _hkey(message))))
        for k, value in snap.state.items():
            vkey = ident(value)
            if vkey is None:
                continue
            holder = pair_holder.setdefault((k, vkey), ref)
            if holder != ref:
                text = f"{ref} holds key {k!r} = {_short(value, 60)}, as {holder} does"
                found.append((text, (ref, "key", (k, _hkey(value)))))
    return found


def _isolation_by_value(manager: GlobalStateManager, refs: list[ScopeRef]) -> list[str]:
    return [text for text, _item in _shared_values(manager, refs)]
