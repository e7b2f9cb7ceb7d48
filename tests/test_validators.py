"""Validators: what an application declares its state may hold, refused at the edge.

``GlobalStateManager.open(..., validators={StateScope.TEAM: rule, "plan_steps": rule})``: a rule
is a callable that raises on a bad value, or an attrs class the value must convert to. A batch
that breaks one raises TransitionValidationError naming the key and the rule, and nothing of it is
applied, in any scope. Before issue 25 ``open`` took no ``validators`` (a TypeError).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

import victor_actors
from victor_actors import (
    CoordinatorResult,
    CoordinatorRunner,
    GlobalStateManager,
    StateScope,
    TransitionApplier,
    TransitionBatch,
    TransitionValidationError,
)


def _non_negative(_instance: Any, _attribute: Any, value: int) -> None:
    if value < 0:
        raise ValueError("budget must be at least 0")


@attrs.define
class TeamState:
    members: list[str] = attrs.Factory(list)
    budget: int = attrs.field(default=0, validator=_non_negative)


def plan_steps(value: Any) -> None:
    if not isinstance(value, list) or not all(isinstance(step, str) and step for step in value):
        raise ValueError("plan_steps is a list of non-empty str")


@pytest.fixture
def checked(tmp_path: Path) -> Iterator[GlobalStateManager]:
    with GlobalStateManager.open(
        tmp_path / "store", validators={StateScope.TEAM: TeamState, "plan_steps": plan_steps}
    ) as manager:
        yield manager


def _versions(manager: GlobalStateManager) -> dict[str, int]:
    return {str(ref): manager.scope(ref).version for ref in manager.scopes()}


BAD: list[tuple[str, Any, str, str]] = [
    (
        "a key rule (callable)",
        TransitionBatch().update_state("plan_steps", ["ok", ""]),
        "plan_steps",
        "plan_steps",
    ),
    (
        "a key rule, any scope",
        TransitionBatch().update_state("plan_steps", "x", scope="team"),
        "plan_steps",
        "plan_steps",
    ),
    (
        "a level rule (attrs class)",
        TransitionBatch().update_state("budget", -1, scope="team"),
        "budget",
        "TeamState",
    ),
    (
        "a field the class lacks",
        TransitionBatch().update_state("extra", 1, scope="team"),
        "extra",
        "TeamState",
    ),
    (
        "a value that does not convert",
        TransitionBatch().update_state("budget", "lots", scope="session"),
        "budget",
        "TeamState",
    ),
]


@pytest.mark.parametrize(("what", "bad", "key", "rule"), BAD, ids=[b[0] for b in BAD])
def test_a_refused_batch_changes_nothing_anywhere(
    checked: GlobalStateManager, what: str, bad: TransitionBatch, key: str, rule: str
) -> None:
    conv = checked.get_conversation_state("c", team_id="t")
    conv.apply(TransitionBatch().update_state("budget", 5, scope="team").update_state("n", 1))
    before = _versions(checked)
    batch = TransitionBatch().update_state("n", 2).add_message("m").update_state("g", 1, scope="global")
    batch.extend(bad)
    with pytest.raises(TransitionValidationError) as info:
        conv.apply(batch)
    err = info.value
    assert err.field == key and rule in str(err) and repr(key) in str(err)
    assert err.index == 3 and err.transition_type == "UPDATE_STATE"
    assert "nothing was applied" in str(err)
    assert _versions(checked) == before
    assert conv.get("n") == 1 and conv.snapshot().message_count == 0
    assert checked.get_global_state().get("g") is None and checked.get_team_state("t").get("budget") == 5


def test_good_batches_apply(checked: GlobalStateManager) -> None:
    conv = checked.get_conversation_state("c", team_id="t")
    conv.apply(
        TransitionBatch()
        .update_state("plan_steps", ["collect", "draft"])
        .update_state("members", ["ana"], scope="team")
        .update_state("budget", 3, scope="session")
    )
    assert conv.get("plan_steps") == ("collect", "draft")
    assert checked.get_team_state("t").to_dict() == {"members": ["ana"], "budget": 3}
    # a delete is checked too: the team's state without "budget" still converts (it has a default)
    checked.get_team_state("t").delete("budget")
    # keys at other levels and messages are free
    conv.apply(TransitionBatch().update_state("anything", {"x": 1}).add_message("hi"))


def test_every_write_path_is_checked(checked: GlobalStateManager) -> None:
    conv = checked.get_conversation_state("c", team_id="t")
    team = checked.get_team_state("t")
    bad = TransitionBatch().update_state("budget", -1, scope="team")
    calls = [
        lambda: team.set("budget", -1),
        lambda: team.update({"budget": -1}),
        lambda: conv.modify(lambda snap: bad),
        lambda: conv.transact(lambda snap: bad),
        lambda: asyncio.run(conv.aapply(bad)),
        lambda: asyncio.run(conv.atransact(lambda snap: bad)),
        lambda: TransitionApplier(conv).apply_batch_sync(bad),
        lambda: CoordinatorRunner().step(conv, _Decides(bad), "go"),
    ]
    for call in calls:
        with pytest.raises(TransitionValidationError, match="budget must be at least 0"):
            call()
    assert _versions(checked) == {"global:global": 0, "team:t": 0, "conversation:c": 0}


class _Decides:
    def __init__(self, batch: TransitionBatch) -> None:
        self.batch = batch

    def process(self, snapshot: Any, user_message: str) -> CoordinatorResult:
        return CoordinatorResult(self.batch)


def test_a_remote_client_is_checked_at_the_owner(tmp_path: Path) -> None:
    url = f"unix://{tmp_path}/owner.sock"
    with GlobalStateManager.open(
        tmp_path / "store", listen=url, validators={"plan_steps": plan_steps}
    ) as owner:
        with victor_actors.connect(url) as client:
            conv = client.get_conversation_state("c")
            with pytest.raises(TransitionValidationError, match="plan_steps"):
                conv.apply(TransitionBatch().update_state("plan_steps", [1]))
            assert conv.version == 0
        assert owner.get_conversation_state("c").version == 0


def test_callable_level_rules_see_the_whole_state(manager: GlobalStateManager) -> None:
    seen: list[dict[str, Any]] = []

    def workflow_rule(state: dict[str, Any]) -> None:
        seen.append(state)
        if state.get("done") and not state.get("result"):
            raise ValueError("a done workflow has a result")

    with GlobalStateManager.open(validators={StateScope.WORKFLOW: workflow_rule}) as checked:
        wf = checked.get_workflow_state("wf")
        wf.update({"result": "42", "steps": [1]})
        wf.update({"done": True})
        with pytest.raises(TransitionValidationError, match="a done workflow has a result"):
            wf.delete("result")
        assert wf.get("result") == "42" and wf.version == 2
    assert seen[-1] == {"steps": [1], "done": True}  # plain copies: lists, dicts


@pytest.mark.parametrize(
    "validators",
    [
        [("plan_steps", plan_steps)],
        {"plan_steps": "not a rule"},
        {"plan_steps": dict},
        {3: plan_steps},
        {"": plan_steps},
    ],
)
def test_bad_validators_open_nothing(tmp_path: Path, validators: Any) -> None:
    with pytest.raises(TypeError):
        GlobalStateManager.open(tmp_path / "store", validators=validators)
    assert not (tmp_path / "store").exists()
