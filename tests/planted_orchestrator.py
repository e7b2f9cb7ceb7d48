"""A small orchestrator of the kind a user writes, with seven bugs that can be planted one at a time.

Two teams of three agents, each agent a thread with its own conversation. One
turn per agent: the user's question (with a token planted for that
conversation), a context built from it, an answer and its team finding
committed as one cross-scope batch, +1 on the team's counter with
``transact``, and a run that drafts a message and fails (rolled back).

``BUGS`` names the bugs of issue 31; ``orchestrate(manager, bug)`` runs it with
one planted (or none), and ``check(manager, recorder, outcome)`` is what the
user's test asserts with the kit. ``tests/test_planted_bugs.py`` runs each.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from victor_actors import GlobalStateManager, RunFailedError, ScopeHandle, TransitionBatch, thaw
from victor_actors.testing import (
    Recorder,
    Write,
    assert_commit_order,
    assert_committed_together,
    assert_isolated,
    assert_no_blind_writes,
    assert_no_partial_batch,
    assert_run_left_nothing,
)

BUGS = (
    "shared_builder",  # one TransitionBatch builder shared by every agent
    "shared_context",  # one mutable dict shared by the agents, written as each one's context
    "off_by_one",  # the answer applied through the next agent's handle
    "thawed_copy",  # a teammate's context thaw()ed, edited and written into this conversation
    "lost_update",  # the team counter read, then written without expected_version
    "split_batch",  # the answer and its team finding as two applies instead of one batch
    "plain_thread",  # the run's step in a plain thread instead of run.thread
)
TEAMS = {"red": ("ana", "ben", "cy"), "blue": ("dee", "eli", "fay")}


class SimulatedModelError(RuntimeError):
    """The failing run's model call."""


@dataclass
class Outcome:
    tokens: dict[str, str]  # conversation -> the token planted in what it was sent
    runs: list[str] = field(default_factory=list)  # the ids of the runs that were rolled back


def _agent(
    manager: GlobalStateManager,
    bug: str | None,
    team: str,
    index: int,
    handles: list[ScopeHandle],
    token: str,
    shared: dict[str, Any],
    barrier: threading.Barrier,
    outcome: Outcome,
) -> None:
    conv = handles[index]
    name = conv.ref.id
    question = f"[{token}] {name}: what do you find on topic {index}?"
    conv.add_message({"role": "user", "content": question})

    if bug == "shared_context":
        context = shared.setdefault("context", {"history": []})
        context["history"].append(question)
    else:
        context = {"history": [question]}
    conv.set("context", context)
    barrier.wait(10)  # every agent has its context: the answers may read them

    if bug == "thawed_copy":  # meant to start from its own context, took the teammate's
        brief = thaw(handles[(index + 1) % len(handles)].get("context"))
        brief["for"] = name
        conv.set("brief", brief)

    answer_id = f"{name}-1"
    answer = {"role": "assistant", "content": f"[{token}] finding {index}", "answer_id": answer_id}
    finding = {"by": name, "topic": index, "answer_id": answer_id}
    target = handles[(index + 1) % len(handles)] if bug == "off_by_one" else conv
    if bug == "shared_builder":
        batch = shared.setdefault("batch", TransitionBatch())
        batch.add_message(answer).update_state(f"finding:{name}", finding, scope="team")
        target.apply(batch)
    elif bug == "split_batch":
        target.add_message(answer)
        target.apply(TransitionBatch().update_state(f"finding:{name}", finding, scope="team"))
    else:
        target.apply(
            TransitionBatch().add_message(answer).update_state(f"finding:{name}", finding, scope="team")
        )

    if bug == "lost_update":
        count = manager.get_team_state(team).get("counter")
        conv.apply(TransitionBatch().update_state("counter", count + 1, scope="team"))
    else:
        conv.transact(
            lambda snap: TransitionBatch().update_state(
                "counter", snap.get_state("counter") + 1, scope="team"
            ),
            lock=["team"],
        )

    draft = {"role": "assistant", "content": f"[{token}] draft"}
    try:
        with manager.run(name, timeout=10.0) as run:
            outcome.runs.append(run.id)
            step = (
                threading.Thread(target=conv.add_message, args=(draft,))
                if bug == "plain_thread"
                else run.thread(conv.add_message, draft)
            )
            step.start()
            step.join(10)
            raise SimulatedModelError("the model provider went away")
    except RunFailedError:
        pass


def orchestrate(manager: GlobalStateManager, bug: str | None = None) -> Outcome:
    """Run every agent once, with ``bug`` planted (None: the correct orchestrator)."""
    if bug is not None and bug not in BUGS:
        raise ValueError(f"no such bug: {bug!r}")
    nonce = secrets.token_hex(3)
    outcome = Outcome(tokens={})
    threads = []
    for team, names in TEAMS.items():
        manager.get_team_state(team).set("counter", 0)
        handles = [manager.get_conversation_state(n, team_id=team) for n in names]
        shared: dict[str, Any] = {}
        barrier = threading.Barrier(len(names))
        for i, name in enumerate(names):
            token = outcome.tokens[name] = f"tok-{name}-{nonce}"
            args = (manager, bug, team, i, handles, token, shared, barrier, outcome)
            threads.append(threading.Thread(target=_agent, args=args, name=f"agent-{name}"))
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return outcome


def answer_unit(write: Write) -> Hashable | None:
    """An answer and its team finding belong together: both carry the answer's id."""
    value = write.value
    if write.kind == "message" and isinstance(value, Mapping) and value.get("role") == "assistant":
        return value.get("answer_id")
    if write.kind == "set" and (write.key or "").startswith("finding:") and isinstance(value, Mapping):
        return value.get("answer_id")
    return None


def check(manager: GlobalStateManager, recorder: Recorder, outcome: Outcome) -> None:
    """What the user's test asserts after the agents ran: the kit's checks, nothing hand-written."""
    manager.quiesce()
    assert_isolated(recorder, owners=outcome.tokens)
    assert_isolated(manager, owners=outcome.tokens, mode="value")
    assert_no_blind_writes(recorder)
    for run_id in outcome.runs:
        assert_run_left_nothing(recorder, run_id)
    assert_committed_together(recorder, answer_unit)
    assert_no_partial_batch(recorder)
    assert_commit_order(recorder)
