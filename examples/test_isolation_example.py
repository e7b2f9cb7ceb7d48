"""An example test for code built on victor_actors, using the pytest plugin it installs.

Three research agents work at the same time, each in its own conversation under one team. Each
keeps private notes, all of them write findings to the shared team scope in the same batch as
their own messages, and all bump one team counter. The test checks what should always hold:

- no agent's messages or notes show up in another agent's conversation;
- every cross-scope batch committed in every scope it touched (no partial batch);
- every scope's events came in commit order.

Run it with ``python -m pytest examples/test_isolation_example.py``. The ``state_manager`` and
``recorder`` fixtures come from the plugin, which is active once victor_actors is installed.
"""

from __future__ import annotations

import threading

from victor_actors import GlobalStateManager, ScopeHandle, TransitionBatch
from victor_actors.testing import (
    Recorder,
    assert_commit_order,
    assert_isolated,
    assert_no_partial_batch,
)

TOPICS = {"ana": "pricing", "ben": "competitors", "cy": "regulation"}


def research(agent: ScopeHandle, topic: str) -> None:
    """A stand-in for an LLM agent: three steps of private notes and shared findings."""
    for step in range(3):
        agent.apply(
            TransitionBatch()
            .add_message({"role": "user", "content": "next step"})  # every agent hears this
            .add_message({"role": "assistant", "content": f"{topic}: finding {step}"})
            .update_state("notes", f"private {topic} notes, step {step}")
            .update_state(f"finding:{topic}", step, scope="team")  # shared, atomically with the above
        )
        agent.transact(
            lambda snap: TransitionBatch().update_state(
                "findings", snap.get_state("findings", 0) + 1, scope="team"
            ),
            lock=["team"],
        )


def test_agents_stay_isolated(state_manager: GlobalStateManager, recorder: Recorder) -> None:
    agents = {name: state_manager.get_conversation_state(name, team_id="research") for name in TOPICS}
    threads = [
        threading.Thread(target=research, args=(agents[name], topic)) for name, topic in TOPICS.items()
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    team = state_manager.get_team_state("research")
    assert team.get("findings") == 9
    assert agents["ana"].get("finding:competitors") == 2  # ancestors are shared, by design

    assert_isolated(recorder, *agents.values())
    assert_no_partial_batch(recorder)
    assert_commit_order(recorder)
