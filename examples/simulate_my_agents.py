"""Simulate your own agents: one turn function, run from threads and asyncio, faults, invariants.

Two teams of three research agents. Each turn an agent reads its conversation, answers with a
message and its team finding in one batch, and bumps the team's counter with ``transact``; one
turn in ten runs a step inside a run that fails and must roll back. Injected faults: actor
crashes (the runtime's) and a slow tool (ours). Invariants: the built-in ones (every acknowledged
commit is in the reopened store, the store reads as it did live, restarts accounted for, no
unexpected errors) and ours, plain functions of the run. Then the same simulation is SIGKILLed
mid-load in a child process and every acknowledged commit is looked for after the reopen.

Run it: ``python examples/simulate_my_agents.py``.
"""

from __future__ import annotations

import time

from victor_actors import RunFailedError, TransitionBatch
from victor_actors.sim import BUILT_IN, Fault, FaultPlan, SimRun, Simulation, kill_and_reopen, layout


class ModelDown(RuntimeError):
    """The model provider went away in the middle of a run."""


def turn(agent):
    """One turn of one agent: written once, driven with blocking calls or with awaits."""
    snap = yield agent.snapshot()
    n = len(snap.messages)
    answer = {"role": "assistant", "agent": agent.name, "n": n, "content": f"finding {n}"}
    batch = TransitionBatch().add_message(answer).update_state(f"finding:{agent.name}", n, scope="team")
    agent.ack((yield agent.apply(batch, expected_version=snap.version)))
    agent.ack((yield agent.transact(bump, lock=["team"])), note="counter")
    if agent.rng.random() < 0.1:
        try:
            yield from agent.in_run(lambda run: failing_step(agent, run), timeout=5.0)
        except RunFailedError:
            pass  # rolled back: its draft must be gone (checked below)


def bump(snap):
    return TransitionBatch().update_state("counter", snap.get_state("counter", 0) + 1, scope="team")


def failing_step(agent, run):
    """A step inside a run, then the model fails: the run rolls the draft back."""
    yield agent.apply(TransitionBatch().add_message({"role": "assistant", "draft": True, "content": "half"}))
    raise ModelDown("the model provider went away")


def slow_tool(agent):
    """Our own fault: the agent's next turn starts after a slow tool call."""
    time.sleep(0.01)


def counters_match_acknowledgements(run: SimRun) -> list[str]:
    """Each team's counter equals the increments acknowledged to its agents (after a kill: at
    least those, and at most one more per agent whose last increment was not yet acknowledged)."""
    problems = []
    for team in ("t0", "t1"):
        acked = sum(1 for a in run.ledger.acks if a.note == "counter" and f"team:{team}" in a.versions)
        counter = run.reopened[f"team:{team}"].values.get("counter", 0)
        slack = 3 if run.killed else 0
        if not acked <= counter <= acked + slack:
            problems.append(f"team {team}: counter {counter}, acknowledged increments {acked}")
    return problems


def no_draft_survives(run: SimRun) -> list[str]:
    """A failed run's draft was rolled back (after a kill, a run caught open may have left one)."""
    drafts = {
        ref: sum(isinstance(m, dict) and bool(m.get("draft")) for m in f.messages)
        for ref, f in run.reopened.items()
    }
    return [f"{ref} holds {n} drafts" for ref, n in drafts.items() if n > (1 if run.killed else 0)]


def make(seconds: float | None = None) -> Simulation:
    return Simulation(
        turn,
        layout(teams=2, workflows=1, conversations=3),
        steps=None if seconds else 25,
        seconds=seconds,
        seed=7,
        faults=FaultPlan(crash=0.03, custom=[Fault("slow tool", 0.05, slow_tool)]),
        invariants=[*BUILT_IN, counters_match_acknowledgements, no_draft_survives],
    )


def make_for_kill() -> Simulation:
    return make(seconds=2.0)


if __name__ == "__main__":
    report = make().run()
    print(report.summary())
    killed = kill_and_reopen(f"{__file__}:make_for_kill")
    print(killed.summary(), "after", killed.extra["kill"]["killed_after_seconds"], "s")
    raise SystemExit(0 if report.ok and killed.ok else 1)
