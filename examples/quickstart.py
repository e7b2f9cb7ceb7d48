"""The main job for now: a team, a workflow and two conversations driven through the manager.

Run it with ``python examples/quickstart.py [STORE_PATH]``. It uses an LMDB
store in a temporary directory unless given a path, reopens it at the end to
show that everything was durable, prints what happened, and exits non-zero if
any of the runtime's promises did not hold.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import threading

from victor_actors import (
    GlobalStateManager,
    ScopeAccessError,
    StateChanged,
    TransitionBatch,
)


def main() -> int:
    if len(sys.argv) > 1:
        return run(sys.argv[1])
    with tempfile.TemporaryDirectory(prefix="victor-actors-") as path:
        return run(path)


def run(path: str) -> int:
    events: list[StateChanged] = []
    print(f"store: {path}")
    with GlobalStateManager.open(path) as manager:
        glob = manager.get_global_state()
        team = manager.get_team_state("team-a")
        workflow = manager.get_workflow_state("wf-1", team_id="team-a")
        alice = manager.get_conversation_state("alice", workflow_id="wf-1", team_id="team-a")
        bob = manager.get_conversation_state("bob", workflow_id="wf-1", team_id="team-a")
        done = threading.Event()

        def on_change(event: StateChanged) -> None:
            events.append(event)
            if event.new_version == 4:
                done.set()

        alice.subscribe(on_change)

        glob.update({"model": "local-test-model"})
        team.update({"goal": "ship the report", "counter": 0})
        workflow.apply(TransitionBatch().update_stage("drafting").update_state("step", 1))

        # Each agent works in its own conversation.
        alice.apply(
            TransitionBatch()
            .add_message({"role": "user", "content": "Draft the summary."})
            .update_state("draft", "v1")
            .execute_tool("search", {"query": "quarterly figures"})
        )
        bob.apply(TransitionBatch().add_message({"role": "user", "content": "Review the draft."}))

        # Optimistic concurrency on the shared team counter, from two threads: modify applies the
        # batch only if the team is still at the snapshot's version, else builds it again on a fresh
        # snapshot, up to `retries` more times (then VersionConflictError). Each conflict here is a
        # commit of the other thread's 100, so 100 retries always suffice.
        def bump(n: int) -> None:
            for _ in range(n):
                team.modify(
                    lambda snap: TransitionBatch().update_state("counter", snap.get_state("counter") + 1),
                    retries=100,
                )

        threads = [threading.Thread(target=bump, args=(100,)) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

        # One batch across alice's conversation and the team: both commit, or neither.
        cross = alice.apply(
            TransitionBatch()
            .update_state("notes", "shared the outline")
            .update_state("outline", "v1", scope="team")
        )
        print(f"cross-scope commit {cross.commit_id} in {[str(r) for r in cross.involved]}")

        # A batch aimed below the scope it is applied to is refused and changes nothing.
        before = team.version
        try:
            team.apply(TransitionBatch().update_state("x", 1).update_state("y", 2, scope="conversation"))
        except ScopeAccessError as exc:
            print(f"rejected as expected: {type(exc).__name__}")
        assert team.version == before

        # The asyncio twins leave the event loop free.
        async def agent_turn() -> None:
            await alice.aapply(TransitionBatch().add_message({"role": "assistant", "content": "Done."}))
            await alice.aupdate({"stage": "complete"})

        asyncio.run(agent_turn())
        done.wait(5.0)

        snap_a, snap_b = alice.snapshot(), bob.snapshot()
        print(
            f"alice v{snap_a.version}: {snap_a.message_count} messages, draft={snap_a.get_state('draft')!r}"
        )
        goal, model = snap_a.get_state("goal"), snap_a.get_state("model")
        print(f"  reads goal from team: {goal!r}; model from global: {model!r}")
        print(f"  pending tool requests: {list(snap_a.pending_tool_requests)}")
        print(f"bob v{snap_b.version}: {snap_b.message_count} messages")
        print(f"team v{team.version}: counter={team.get('counter')}, outline={team.get('outline')!r}")
        print(f"events seen by alice's subscriber: {[e.new_version for e in events]}")

        checkpoint = manager.save_checkpoint(alice.ref, label="end of the turn")
        print(f"checkpoint: {checkpoint}")
        ok = (
            team.get("counter") == 200
            and snap_b.message_count == 1
            and snap_a.message_count == 2
            and snap_a.get_state("outline") == "v1"
            and all(m not in snap_b.messages for m in snap_a.messages)
            and [e.new_version for e in events] == [1, 2, 3, 4]
        )
    with GlobalStateManager.open(path) as reopened:
        again = reopened.get_conversation_state("alice").snapshot()
        team_again = reopened.get_team_state("team-a")
        print(f"after reopening: alice v{again.version}, team counter={team_again.get('counter')}")
        ok = ok and again.version == snap_a.version and again.messages == snap_a.messages
        ok = ok and team_again.get("counter") == 200 and again.get_state("goal") == "ship the report"
    print("all checks passed" if ok else "CHECK FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
