"""``assert_isolated(..., owners=...)``: the test says who owns what; both modes give one verdict.

Issue 31, item 1. ``CASES`` is the table the modes must agree on: each case is
a small scenario, the verdict the ownership check must give, and what the
older checks without owners give in the recorder and by-value modes (kept
here so that docs/testing.md's table is checked, not just written).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from victor_actors import GlobalStateManager, ScopeHandle, TransitionBatch, thaw
from victor_actors.testing import Recorder, assert_isolated

Scenario = Callable[[ScopeHandle, ScopeHandle, ScopeHandle], None]  # (a, b, team)
TOKENS = {"a": "tok-a-91", "b": "tok-b-37"}


def _clean(a: ScopeHandle, b: ScopeHandle, team: ScopeHandle) -> None:
    a.add_message({"role": "user", "content": "[tok-a-91] my card is 4242"})
    b.add_message({"role": "user", "content": "[tok-b-37] hello"})


def _same_text(a: ScopeHandle, b: ScopeHandle, team: ScopeHandle) -> None:
    _clean(a, b, team)
    a.add_message({"role": "user", "content": "continue"})  # equal messages, each sent on its own
    b.add_message({"role": "user", "content": "continue"})


def _copied_object(a: ScopeHandle, b: ScopeHandle, team: ScopeHandle) -> None:
    _clean(a, b, team)
    b.add_message(a.snapshot().messages[0])  # a's very message object, sent to b


def _substring(a: ScopeHandle, b: ScopeHandle, team: ScopeHandle) -> None:
    _clean(a, b, team)
    quoted = a.snapshot().messages[0]["content"]
    b.add_message({"role": "assistant", "content": f"as the other user said: {quoted[:16]}"})


def _nested(a: ScopeHandle, b: ScopeHandle, team: ScopeHandle) -> None:
    _clean(a, b, team)
    a.set("profile", {"cards": [{"id": "tok-a-91", "last4": "4242"}]})
    profile = thaw(a.get("profile"))  # an edited copy: a new object, equal to nothing
    profile["seen_by"] = "b"
    b.set("notes", {"from_a": profile})


def _key_name(a: ScopeHandle, b: ScopeHandle, team: ScopeHandle) -> None:
    _clean(a, b, team)
    b.set("cache:tok-a-91", 1)


def _in_team(a: ScopeHandle, b: ScopeHandle, team: ScopeHandle) -> None:
    _clean(a, b, team)
    a.apply(TransitionBatch().update_state("finding", "tok-a-91 pays with 4242", scope="team"))


def _equal_pair(a: ScopeHandle, b: ScopeHandle, team: ScopeHandle) -> None:
    _clean(a, b, team)
    a.set("plan", "draft")  # equal (key, value) pairs, written by each on its own
    b.set("plan", "draft")


@dataclass(frozen=True)
class Case:
    name: str
    scenario: Scenario
    leaks: bool  # the ownership check's verdict (tokens), in every mode
    recorder_mode: bool  # the recorder mode without owners fails
    value_mode: bool  # the by-value mode without owners fails


CASES = [
    Case("clean", _clean, False, False, False),
    Case("equal messages sent to each", _same_text, False, False, True),
    Case("equal (key, value) written by each", _equal_pair, False, False, True),
    Case("a's message object sent to b", _copied_object, True, True, True),
    Case("a's token quoted inside b's message", _substring, True, False, False),
    Case("a's token nested in an edited copy in b", _nested, True, False, False),
    Case("a's token in a key name of b", _key_name, True, False, False),
    Case("a's token in the team", _in_team, True, False, False),
]


def _verdict(check: Callable[[], None]) -> bool:
    """True if the check failed (a leak found)."""
    try:
        check()
    except AssertionError:
        return True
    return False


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_both_modes_agree_on_every_case(case: Case) -> None:
    with GlobalStateManager.open() as manager, Recorder(manager) as recorder:
        a = manager.get_conversation_state("a", team_id="t")
        b = manager.get_conversation_state("b", team_id="t")
        case.scenario(a, b, manager.get_team_state("t"))
        verdicts = {
            "recorder": _verdict(lambda: assert_isolated(recorder, owners=TOKENS, settle=0)),
            "manager, recorder attached": _verdict(lambda: assert_isolated(manager, owners=TOKENS, settle=0)),
            "by value": _verdict(lambda: assert_isolated(manager, owners=TOKENS, mode="value")),
        }
        assert set(verdicts.values()) == {case.leaks}, verdicts
        # the older checks, without owners, as docs/testing.md's table says
        assert _verdict(lambda: assert_isolated(recorder, a, b, settle=0)) is case.recorder_mode
        assert _verdict(lambda: assert_isolated(manager, a, b, mode="value")) is case.value_mode


def test_the_failure_names_the_holder_the_owner_the_place_and_the_commit() -> None:
    with GlobalStateManager.open() as manager, Recorder(manager) as recorder:
        a = manager.get_conversation_state("a", team_id="t")
        b = manager.get_conversation_state("b", team_id="t")
        _nested(a, b, manager.get_team_state("t"))
        with pytest.raises(AssertionError) as info:
            assert_isolated(recorder, owners=TOKENS, settle=0)
    text = str(info.value)
    assert "scopes hold what their owners do not allow: 1 problem(s)" in text
    assert "conversation:b holds 'tok-a-91' in key 'notes' at ['from_a']['cards'][0]['id']" in text
    assert "which only conversation:a may hold" in text
    assert "apply by thread 'MainThread' at tests/test_kit_ownership.py:" in text and "in _nested" in text
    assert "owners given: the same verdict in every mode" in text


def test_an_owner_rule_may_allow_several_scopes() -> None:
    """A callable owner rule: messages naming their agent belong to its conversation and the team."""

    def owner(value: Any) -> list[str] | None:
        if isinstance(value, dict) or hasattr(value, "get"):
            agent = value.get("agent") if hasattr(value, "get") else None
            if isinstance(agent, str):
                return [f"conversation:{agent}", "team:t"]
        return None

    with GlobalStateManager.open() as manager:
        a = manager.get_conversation_state("a", team_id="t")
        b = manager.get_conversation_state("b", team_id="t")
        a.add_message({"agent": "a", "content": "hello"})
        a.apply(TransitionBatch().update_state("last", {"agent": "a", "content": "hello"}, scope="team"))
        assert_isolated(manager, owners=owner)  # the team may hold it
        b.set("peek", [{"agent": "a", "content": "hello"}])
        with pytest.raises(AssertionError, match=r"conversation:b holds .* in key 'peek' at \[0\]"):
            assert_isolated(manager, owners=owner)


def test_the_mode_is_explicit_and_named() -> None:
    """Requesting a recorder no longer switches the mode silently: the failure names the mode used,
    and ``mode="value"`` compares by value even with a recorder attached."""
    with GlobalStateManager.open() as manager, Recorder(manager):
        a = manager.get_conversation_state("a")
        b = manager.get_conversation_state("b")
        a.add_message("continue")
        b.add_message("continue")
        assert_isolated(manager)  # auto: the attached recorder; equal messages sent to each are fine
        with pytest.raises(AssertionError, match=r"compared by value"):
            assert_isolated(manager, mode="value")
        with pytest.raises(AssertionError, match=r"recorder mode: the recorder attached to the manager"):
            a.add_message({"role": "user", "content": "secret"})
            b.add_message(a.snapshot().messages[-1])  # a's message object, copied into b's request
            assert_isolated(manager, a, b, settle=0)


def test_bad_owners_and_modes_are_refused() -> None:
    with GlobalStateManager.open() as manager:
        with pytest.raises(ValueError, match="mode is one of"):
            assert_isolated(manager, mode="strict")
        with pytest.raises(TypeError, match="mode='recorder' needs a Recorder"):
            assert_isolated(manager, mode="recorder")
        with pytest.raises(ValueError, match="given to both"):
            assert_isolated(manager, owners={"a": "tok", "b": "tok"})
        with pytest.raises(TypeError, match="a token is a non-empty str"):
            assert_isolated(manager, owners={"a": ""})
