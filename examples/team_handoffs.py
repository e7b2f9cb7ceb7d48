"""A team of three agents passing work along: researcher -> writer -> reviewer.

Each agent has its own conversation, all three under one workflow under one
team, and runs in its own thread with its own CoordinatorRunner. Work moves
in two ways at once:

- through **team state**: the researcher's notes, the writer's drafts and the
  reviewer's approvals are written to the team scope by cross-scope batches
  (``update_state(..., scope="team")`` next to the agent's own message), so
  the next agent reads them from its snapshot;
- through **handoff_to**: inside one agent, a coordinator hands off to the
  next coordinator on the same conversation (the writer's "draft" to
  "polish", the reviewer's "open_review" to "approve"), and the runner follows;
  between agents, the last coordinator stops (``should_continue=False``) and
  names the next agent in ``handoff_to``, and the agent's thread routes the
  topic to that agent's inbox.

The agents run concurrently for three topics. The reviewer opens a child
session per topic (CREATE_SESSION) and closes it when done (CLOSE_SESSION);
at the end every agent closes its conversation, which stays readable and can
be checkpointed but takes no more batches. The store is LMDB in a temporary
directory and is reopened at the end.

Run it with ``python examples/team_handoffs.py``; it exits 0 when every check
holds.
"""

from __future__ import annotations

import queue
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from typing import Any

from _checks import check, verdict

from victor_actors import (
    ContextSnapshot,
    CoordinatorResult,
    CoordinatorRunner,
    GlobalStateManager,
    ScopeClosedError,
    ScopeHandle,
    TransitionBatch,
)

TEAM, WORKFLOW = "team-docs", "wf-report"
AGENTS = ("researcher", "writer", "reviewer")
TOPICS = ("actors", "snapshots", "outbox")


def say(agent: str, text: str) -> dict[str, str]:
    return {"role": "assistant", "agent": agent, "content": text}


def team_map(snapshot: ContextSnapshot, key: str) -> dict[str, Any]:
    return dict(snapshot.get_state(key) or {})


# -- coordinators: pure; they read the snapshot (own scope plus workflow and team) ----------------


class Research:
    def process(self, snapshot: ContextSnapshot, topic: str) -> CoordinatorResult:
        notes = f"{topic}: three facts and a source"
        batch = (
            TransitionBatch()
            .add_message(say("researcher", f"researched {topic}"))
            .update_state("research", {**team_map(snapshot, "research"), topic: notes}, scope="team")
        )
        return CoordinatorResult(
            batch, reasoning=f"notes on {topic}", should_continue=False, handoff_to="writer"
        )


class Draft:
    def process(self, snapshot: ContextSnapshot, topic: str) -> CoordinatorResult:
        notes = team_map(snapshot, "research")[topic]  # handed over through team state
        batch = (
            TransitionBatch()
            .add_message(say("writer", f"drafted {topic}"))
            .update_state(f"draft:{topic}", f"Draft on {notes}")  # the writer's own scratch space
        )
        return CoordinatorResult(batch, reasoning="first draft", handoff_to="polish")  # same agent


class Polish:
    def process(self, snapshot: ContextSnapshot, topic: str) -> CoordinatorResult:
        final = snapshot.get_state(f"draft:{topic}") + " (polished)"
        batch = (
            TransitionBatch()
            .add_message(say("writer", f"polished {topic}"))
            .update_state("drafts", {**team_map(snapshot, "drafts"), topic: final}, scope="team")
        )
        return CoordinatorResult(batch, reasoning="final draft", should_continue=False, handoff_to="reviewer")


class OpenReview:
    def process(self, snapshot: ContextSnapshot, topic: str) -> CoordinatorResult:
        # A batch for this scope only: the child conversation exists when apply returns.
        batch = (
            TransitionBatch()
            .add_message(say("reviewer", f"opened a review session for {topic}"))
            .create_session(f"review-{topic}", metadata={"topic": topic})
        )
        return CoordinatorResult(batch, reasoning="review session opened", handoff_to="approve")


class Approve:
    def process(self, snapshot: ContextSnapshot, topic: str) -> CoordinatorResult:
        draft = team_map(snapshot, "drafts")[topic]
        approved = (*(snapshot.get_state("approved") or ()), topic)
        batch = (
            TransitionBatch()
            .add_message(say("reviewer", f"approved {topic}: {draft!r}"))
            .update_state("approved", approved, scope="team")
        )
        if len(approved) == len(snapshot.get_state("topics")):
            batch.update_state("status", "published", scope="workflow")
        return CoordinatorResult(batch, reasoning=f"approved {topic}", should_continue=False)


RUNNERS = {
    "researcher": (CoordinatorRunner({"research": Research()}, max_retries=50), "research"),
    "writer": (CoordinatorRunner({"draft": Draft(), "polish": Polish()}, max_retries=50), "draft"),
    "reviewer": (
        CoordinatorRunner({"open_review": OpenReview(), "approve": Approve()}, max_retries=50),
        "open_review",
    ),
}
NEXT_IN_LINE = {"researcher": "writer", "writer": "reviewer"}  # where the stop signal goes


# -- the agents' threads ----------------------------------------------------------------------------


class Team:
    def __init__(self, manager: GlobalStateManager) -> None:
        self.manager = manager
        self.convs = {
            a: manager.get_conversation_state(a, workflow_id=WORKFLOW, team_id=TEAM) for a in AGENTS
        }
        self.inboxes: dict[str, queue.Queue[str | None]] = {a: queue.Queue() for a in AGENTS}
        self.lock = threading.Lock()
        self.busy = 0
        self.max_busy = 0
        self.retries = 0
        self.log: list[str] = []
        self.errors: list[BaseException] = []

    def agent(self, name: str) -> None:
        runner, entry = RUNNERS[name]
        conv = self.convs[name]
        try:
            while (topic := self.inboxes[name].get(timeout=10.0)) is not None:
                with self.lock:
                    self.busy += 1
                    self.max_busy = max(self.max_busy, self.busy)
                time.sleep(0.02)  # stands for the model thinking: outside the coordinator, never in it
                loop = runner.run(conv, entry, topic)
                next_agent = loop.steps[-1].result.handoff_to
                if name == "reviewer":
                    self.close_review(topic)
                if next_agent is not None:
                    self.bump_handoffs(conv)
                    self.inboxes[next_agent].put(topic)
                with self.lock:
                    self.busy -= 1
                    self.retries += sum(s.attempts - 1 for s in loop.steps)
                    steps = " -> ".join(s.coordinator for s in loop.steps)
                    self.log.append(
                        f"{name:10} {topic:9} {steps}" + (f" => {next_agent}" if next_agent else "")
                    )
        except BaseException as exc:
            self.errors.append(exc)
        finally:
            if name in NEXT_IN_LINE:
                self.inboxes[NEXT_IN_LINE[name]].put(None)

    @staticmethod
    def bump_handoffs(conv: ScopeHandle) -> None:
        # A hot shared counter: transact locks the team and never conflicts. Keep the function short.
        conv.transact(
            lambda snap: TransitionBatch().update_state(
                "handoffs", snap.get_state("handoffs", 0) + 1, scope="team"
            ),
            lock=["team"],
        )

    def close_review(self, topic: str) -> None:
        child = self.manager.get_conversation_state(f"review-{topic}")  # created by OpenReview's batch
        child.apply(
            TransitionBatch()
            .add_message(say("reviewer", f"checklist for {topic}: facts, sources, tone: ok"))
            .close_session(reason="review done")
        )

    def run(self) -> None:
        for topic in TOPICS:
            self.inboxes["researcher"].put(topic)
        self.inboxes["researcher"].put(None)
        threads = [threading.Thread(target=self.agent, args=(a,), name=a) for a in AGENTS]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30.0)


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="victor-actors-team-") as path:
        with GlobalStateManager.open(path) as manager:
            team_scope = manager.get_team_state(TEAM)
            team_scope.update({"topics": TOPICS, "goal": "a three-part report"})
            workflow = manager.get_workflow_state(WORKFLOW, team_id=TEAM)
            team = Team(manager)
            team.run()
            for line in team.log:
                print(line)
            check(not team.errors, f"no agent failed: {team.errors}")

            state = team_scope.snapshot().state
            print(
                f"team v{team_scope.version}: research {sorted(state['research'])}, drafts "
                f"{sorted(state['drafts'])}, approved {list(state['approved'])}, handoffs {state['handoffs']}"
            )
            print(
                f"workflow status {workflow.get('status')!r}; up to {team.max_busy} agents busy at once; "
                f"{team.retries} version conflicts retried by the runners"
            )
            check(sorted(state["research"]) == sorted(TOPICS), "every topic researched")
            check(sorted(state["drafts"]) == sorted(TOPICS), "every topic drafted")
            check(tuple(state["approved"]) == TOPICS, "every topic approved, in order")
            check(state["handoffs"] == 2 * len(TOPICS), "two handoffs per topic")
            check(workflow.get("status") == "published", "the workflow is published")

            for agent, conv in team.convs.items():
                snap = conv.snapshot()
                authors = {m["agent"] for m in snap.messages if isinstance(m, Mapping)}
                expected = len(TOPICS) * (1 if agent == "researcher" else 2)
                print(f"{agent}: {snap.message_count} messages, all by {sorted(authors)}")
                check(authors == {agent} and snap.message_count == expected, f"{agent} holds only its own")
            check(
                "draft:actors" not in team.convs["reviewer"].snapshot().state, "scratch state stays private"
            )

            reviewer = team.convs["reviewer"].snapshot()
            children = [manager.get_conversation_state(sid).snapshot() for sid in reviewer.sessions]
            print(
                f"reviewer's child sessions: {sorted(reviewer.sessions)}, "
                f"closed: {[c.is_closed for c in children]}"
            )
            check(len(children) == len(TOPICS), "one review session per topic")
            check(all(c.is_closed and c.parent == reviewer.ref for c in children), "each under the reviewer")

            # The report is out: every agent closes its own conversation.
            for conv in team.convs.values():
                conv.apply(TransitionBatch().close_session(reason="report published"))
            writer = team.convs["writer"]
            try:
                writer.add_message(say("writer", "one more thing"))
                check(False, "a closed conversation refuses batches")
            except ScopeClosedError as exc:
                print(f"after closing: {type(exc).__name__}: {exc}")
            checkpoint = manager.save_checkpoint(writer.ref, label="closed")
            check(writer.snapshot().message_count == 2 * len(TOPICS), "a closed conversation stays readable")
            print(f"checkpoint of the closed writer conversation: {checkpoint}")

        with GlobalStateManager.open(path, read_only=True) as reopened:
            again = reopened.get_conversation_state("writer").snapshot()
            team_again = reopened.get_team_state(TEAM).snapshot()
            approved = list(team_again.state["approved"])
            print(f"after reopening: writer closed={again.is_closed}, approved {approved}")
            check(again.is_closed and tuple(team_again.state["approved"]) == TOPICS, "durable")
    return verdict()


if __name__ == "__main__":
    sys.exit(main())
