"""Agent steps per second: snapshot, coordinator, durable apply, against a LangGraph step.

    python -m victor_actors.bench.agent [--quick] [--json FILE]

One agent step on our runtime is what the state-passed loop does: take a
snapshot of the conversation, call a pure coordinator on it (it appends one
reply message and bumps a step counter), apply its transitions with the
snapshot's versions, durably (sync mode, LMDB). The LangGraph baseline is a
one-node StateGraph (the node appends one message) compiled with SqliteSaver,
one ``invoke`` per step with durability="sync". Both start each round from the
same 100-message state and take the same number of steps. Rounds interleave
(ours, theirs, theirs, ours, ...) so the noisy machine's drift hits both.

Without LangGraph (the bench extra: ``pip install 'victor-actors[bench]'``) the LangGraph
subject is skipped (``skipped`` in the JSON says why); ours still run, durable and in memory.
"""

from __future__ import annotations

import gc
import json
import platform
import sqlite3
import tempfile
import time
from datetime import UTC, datetime
from typing import Any

from victor_actors import (
    ContextSnapshot,
    CoordinatorResult,
    CoordinatorRunner,
    GlobalStateManager,
    TransitionBatch,
)
from victor_actors.bench._common import quick_and_json, version_of
from victor_actors.bench._peers import Messages, langgraph

START_MESSAGES = 100


def message(i: int) -> dict[str, str]:
    role = "assistant" if i % 2 else "user"
    return {"role": role, "content": f"step {i}: checked the quarterly figures and drafted the next part"}


class Responder:
    """A pure coordinator: reply to the last message, count steps."""

    def process(self, snapshot: ContextSnapshot, user_message: str) -> CoordinatorResult:
        n = snapshot.message_count
        batch = (
            TransitionBatch()
            .add_message(message(n))
            .update_state("steps", snapshot.get_state("steps", 0) + 1)
        )
        return CoordinatorResult(batch, reasoning=None, should_continue=False)


def respond(state: Messages) -> dict[str, Any]:
    return {"messages": [message(len(state["messages"]))]}


def ours(manager: GlobalStateManager, runner: CoordinatorRunner, name: str, steps: int) -> float:
    conv = manager.get_conversation_state(name)
    conv.apply(TransitionBatch().add_messages([message(i) for i in range(START_MESSAGES)]))
    coordinator = Responder()
    start = time.perf_counter()
    for _ in range(steps):
        runner.step(conv, coordinator, "next")
    elapsed = time.perf_counter() - start
    assert conv.snapshot().message_count == START_MESSAGES + steps
    return elapsed


def theirs(graph: Any, name: str, steps: int) -> float:
    cfg: Any = {"configurable": {"thread_id": name}}
    graph.invoke({"messages": [message(i) for i in range(START_MESSAGES)]}, cfg, durability="sync")
    start = time.perf_counter()
    for _ in range(steps):
        graph.invoke({"messages": []}, cfg, durability="sync")
    elapsed = time.perf_counter() - start
    assert len(graph.get_state(cfg).values["messages"]) == START_MESSAGES + steps + 1
    return elapsed


def main() -> int:
    args = quick_and_json(__doc__)
    rounds, steps = (2, 30) if args.quick else (6, 150)
    lg = langgraph()
    skipped = {"langgraph": lg} if isinstance(lg, str) else {}
    print("victor_actors agent-step benchmark")
    when = datetime.now(UTC).isoformat(timespec="seconds")
    print(f"date: {when}  python: {platform.python_version()}  pykka: {version_of('pykka')}")
    print(f"langgraph: {version_of('langgraph')}  victor_actors: {version_of('victor-actors')}")
    for subject, why in skipped.items():
        print(f"skipped: the {subject} subject ({why})")
    subjects = ["ours_sync", "ours_memory"] + ([] if skipped else ["langgraph_sqlite"])
    totals = dict.fromkeys(subjects, 0.0)
    with tempfile.TemporaryDirectory(prefix="va-bench-agent-") as tmp:
        durable = GlobalStateManager.open(f"{tmp}/store")
        memory = GlobalStateManager.open()
        conn = sqlite3.connect(f"{tmp}/lg.sqlite", check_same_thread=False)
        graph = None if isinstance(lg, str) else lg.one_node_graph(lg.saver(conn), respond)
        runner = CoordinatorRunner()
        try:
            ours(durable, runner, "warm", 5)
            if graph is not None:
                theirs(graph, "warm", 5)
            gc.disable()
            for r in range(rounds):
                order = [s for s in ("ours_sync", "langgraph_sqlite", "ours_memory") if s in totals]
                if r % 2:
                    order.reverse()
                for subject in order:
                    if subject == "ours_sync":
                        totals[subject] += ours(durable, runner, f"c{r}", steps)
                    elif subject == "ours_memory":
                        totals[subject] += ours(memory, runner, f"c{r}", steps)
                    else:
                        totals[subject] += theirs(graph, f"g{r}", steps)
        finally:
            gc.enable()
            durable.close()
            memory.close()
            conn.close()
    n = rounds * steps
    rates = {k: n / v for k, v in totals.items()}
    print(f"\n{rounds} interleaved rounds x {steps} steps, each from a {START_MESSAGES}-message state")
    print(f"{'what':58} {'steps/s':>10}")
    print(f"{'ours: snapshot + coordinator + durable apply (sync LMDB)':58} {rates['ours_sync']:10.0f}")
    print(f"{'ours: the same in memory (no store)':58} {rates['ours_memory']:10.0f}")
    theirs_rate = f"{rates['langgraph_sqlite']:10.0f}" if "langgraph_sqlite" in rates else "   skipped"
    print(f"{'LangGraph: one-node StateGraph invoke + SqliteSaver (sync)':58} {theirs_rate}")
    ratio = rates["ours_sync"] / rates["langgraph_sqlite"] if "langgraph_sqlite" in rates else None
    if ratio is not None:
        print(f"\nratio ours (durable) / LangGraph: {ratio:.2f}x")
    if args.json:
        out = {"rounds": rounds, "steps": steps, "rates": rates, "ratio_durable_vs_langgraph": ratio}
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(out | {"skipped": skipped}, fh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
