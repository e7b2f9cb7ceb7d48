"""A LangGraph run interrupted in one process and resumed from its checkpoint in another.

Run it with ``python examples/langgraph_resume.py [STORE_PATH]`` (it needs
``pip install -e '.[langgraph]'``). It uses an LMDB store in a temporary
directory unless given a path, and exits non-zero if anything did not hold.

1. A child process runs a small StateGraph (no model calls: plain functions)
   that outlines and drafts a report, then stops at ``interrupt()`` to ask for
   approval. The child then kills itself with SIGKILL: no close, no flush.
2. A new child process opens the same store, finds the thread waiting at the
   approval node with the draft intact, resumes it with
   ``Command(resume=...)``, and the graph publishes.

Every checkpoint is a commit of the thread's scope, durable before ``put``
returns, so the killed process loses nothing that LangGraph was told was saved.
"""

from __future__ import annotations

import json
import operator
import os
import signal
import subprocess
import sys
import tempfile
from typing import Annotated, Any, TypedDict

THREAD = "report-42"


class Report(TypedDict):
    topic: str
    outline: list[str]
    draft: str
    approved_by: str
    log: Annotated[list[str], operator.add]


def build(saver: Any) -> Any:
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import interrupt

    def outline(state: Report) -> dict[str, Any]:
        points = [f"why {state['topic']}", f"how {state['topic']} works", "what to do next"]
        return {"outline": points, "log": ["outlined"]}

    def draft(state: Report) -> dict[str, Any]:
        text = " ".join(f"{i + 1}. {p.capitalize()}." for i, p in enumerate(state["outline"]))
        return {"draft": text, "log": ["drafted"]}

    def approve(state: Report) -> dict[str, Any]:
        reviewer = interrupt({"question": "publish this draft?", "draft": state["draft"]})
        return {"approved_by": reviewer, "log": [f"approved by {reviewer}"]}

    def publish(state: Report) -> dict[str, Any]:
        return {"log": [f"published {len(state['draft'])} characters"]}

    graph = StateGraph(Report)
    for name, fn in [("outline", outline), ("draft", draft), ("approve", approve), ("publish", publish)]:
        graph.add_node(name, fn)
    graph.add_edge(START, "outline").add_edge("outline", "draft").add_edge("draft", "approve")
    graph.add_edge("approve", "publish").add_edge("publish", END)
    return graph.compile(checkpointer=saver)


def phase_one(path: str) -> None:
    """Run until the interrupt, report, then die without closing anything."""
    from victor_actors.langgraph import VictorActorsSaver

    saver = VictorActorsSaver.open(path)
    graph = build(saver)
    config: Any = {"configurable": {"thread_id": THREAD}}
    out = graph.invoke({"topic": "actor runtimes", "log": []}, config)
    waiting = graph.get_state(config)
    print(json.dumps({"interrupt": out["__interrupt__"][0].value, "next": list(waiting.next)}), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def phase_two(path: str) -> None:
    """Reopen the store, check where the thread stopped, resume it to the end."""
    from langgraph.types import Command

    from victor_actors.langgraph import VictorActorsSaver

    with VictorActorsSaver.open(path) as saver:
        graph = build(saver)
        config: Any = {"configurable": {"thread_id": THREAD}}
        before = graph.get_state(config)
        out = graph.invoke(Command(resume="ana"), config)
        steps = len(list(graph.get_state_history(config)))
        print(json.dumps({"next_before": list(before.next), "final": out, "checkpoints": steps}), flush=True)


def child(phase: str, path: str) -> tuple[int, dict[str, Any]]:
    proc = subprocess.run(
        [sys.executable, __file__, "--phase", phase, path], capture_output=True, text=True, timeout=120
    )
    lines = proc.stdout.strip().splitlines()
    if not lines:
        print(proc.stderr, file=sys.stderr)
        return proc.returncode, {}
    return proc.returncode, json.loads(lines[-1])


def run(path: str) -> int:
    print(f"store: {path}")
    code, first = child("1", path)
    print(f"phase 1: pid exited with {code}; stopped at {first.get('next')}: {first.get('interrupt')}")
    code2, second = child("2", path)
    final = second.get("final", {})
    print(f"phase 2: resumed from {second.get('next_before')}; log: {final.get('log')}")
    print(f"         {second.get('checkpoints')} checkpoints in the thread's history")
    draft = final.get("draft", "")
    expected_log = ["outlined", "drafted", "approved by ana", f"published {len(draft)} characters"]
    checks = {
        "phase 1 was killed (SIGKILL), not closed": code == -signal.SIGKILL,
        "phase 1 stopped at the approval node": first.get("next") == ["approve"],
        "phase 2 found the thread waiting there": second.get("next_before") == ["approve"],
        "the draft survived the kill": bool(draft) and draft == first.get("interrupt", {}).get("draft"),
        "the run finished after the resume": code2 == 0 and final.get("log") == expected_log,
    }
    for what, ok in checks.items():
        print(f"  [{'ok' if ok else 'FAILED'}] {what}")
    return 0 if all(checks.values()) else 1


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--phase":
        (phase_one if sys.argv[2] == "1" else phase_two)(sys.argv[3])
        return 0
    if len(sys.argv) > 1:
        return run(sys.argv[1])
    with tempfile.TemporaryDirectory(prefix="victor-actors-lg-") as path:
        return run(path)


if __name__ == "__main__":
    sys.exit(main())
