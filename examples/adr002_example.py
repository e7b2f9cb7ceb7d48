"""ADR-002's "Code Example", almost verbatim, on victor_actors.

ADR-002 (Victor's state management decision) ends with this sketch::

    manager = GlobalStateManager.get_instance()
    conversation = manager.get_conversation_state("session-123")
    conversation.update({"messages": [...], "stage": "complete"})
    await manager.save_checkpoint(StateScope.CONVERSATION, conversation.to_dict())
    restored = await manager.load_checkpoint(StateScope.CONVERSATION, "session-123")

This script runs the same steps on our runtime and notes, in comments, where
our API differs from the ADR and why. The awaited forms run inside
``asyncio.run``; the same calls exist without the ``a`` prefix for plain
threads. The store is LMDB in a temporary directory; the script reopens it
at the end, read-only, as a later process would, and reads the checkpoint
back from there.

Run it with ``python examples/adr002_example.py``. It exits 0 when every
check holds.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from typing import Any

from _checks import check, verdict

from victor_actors import (
    ContextSnapshot,
    GlobalStateManager,
    StateScope,
    TransitionBatch,
    VictorActorsError,
)

MESSAGES = [
    {"role": "user", "content": "Summarise the quarterly report."},
    {"role": "assistant", "content": "Revenue rose 12%; costs were flat."},
]


def in_memory_default() -> None:
    """The ADR starts from get_instance(): here the process default manager, in memory."""
    manager = GlobalStateManager.get_instance()
    try:
        conversation = manager.get_conversation_state("session-123")
        conversation.update({"messages": MESSAGES, "stage": "complete"})
        try:
            manager.save_checkpoint(conversation.ref, label="in memory")
        except VictorActorsError as exc:
            # Difference 1: checkpoints need a store. get_instance() keeps state in memory
            # only, so below we open a manager on an LMDB path: GlobalStateManager.open(path).
            print(f"get_instance() is in memory and cannot checkpoint: {exc}")
        else:
            check(False, "an in-memory manager refuses checkpoints")
    finally:
        manager.close()


async def adr_code_example(path: str) -> dict[str, Any]:
    """The ADR's steps, awaited; returns what a later process should find in the store."""
    # Get state manager (difference 1: on a store, so checkpoints have somewhere to go).
    manager = GlobalStateManager.open(path)
    try:
        # Access conversation state
        conversation = manager.get_conversation_state("session-123")

        # Update state (copy-on-write). Verbatim, this writes two keys, "messages" and "stage".
        # Difference 2: a conversation also has a message log and a stage of its own
        # (snapshot.messages, snapshot.conversation_stage) that update() does not touch;
        # the second batch writes those, the way a coordinator would.
        await conversation.aupdate({"messages": MESSAGES, "stage": "complete"})
        only_keys = await conversation.asnapshot()
        check(only_keys.conversation_stage == "initial", "update() writes keys, not the stage")
        await conversation.aapply(TransitionBatch().add_messages(MESSAGES).update_stage("complete"))
        snap = await conversation.asnapshot()
        check(snap.state["stage"] == "complete", "the 'stage' key is set")
        check(snap.is_complete and snap.message_count == len(MESSAGES), "stage and message log are set")
        print(
            f"session-123 v{snap.version}: keys {sorted(snap.state)}, "
            f"{snap.message_count} messages, stage {snap.conversation_stage!r}"
        )

        # Save checkpoint.
        # Difference 3: the ADR passes (StateScope.CONVERSATION, conversation.to_dict()); a level
        # cannot say which conversation, and a dict passed in could differ from what is stored.
        # We name the scope instance and checkpoint its committed state; we get back an id.
        checkpoint_id = await manager.asave_checkpoint(conversation.ref, label="stage complete")
        print(f"saved checkpoint {checkpoint_id}")
        check(checkpoint_id == f"{conversation.ref}@{snap.version}", "the id names scope and version")
        check(conversation.ref.scope is StateScope.CONVERSATION, "the ref carries the level")

        # to_dict() still exists: a plain, mutable deep copy of the scope's own key-value state.
        plain = conversation.to_dict()
        plain["stage"] = "edited locally"  # changes the copy only
        check(conversation.get("stage") == "complete", "to_dict() is a copy")

        # The conversation moves on after the checkpoint ...
        await conversation.aapply(
            TransitionBatch()
            .add_message({"role": "user", "content": "Now rewrite it as a poem."})
            .update_stage("drafting")
        )

        # Later, restore.
        # Difference 4: load_checkpoint(ref, id=None) returns the stored state as an immutable
        # ContextSnapshot (the newest checkpoint without an id) and changes nothing;
        # restore(ref, id) makes that state current again as a new commit: the version keeps
        # rising and the history is kept.
        restored: ContextSnapshot = await manager.aload_checkpoint(conversation.ref)
        check(restored.version == snap.version, "load_checkpoint returns the checkpointed version")
        check(restored.messages == snap.messages, "... with its messages")
        moved_on = await conversation.asnapshot()
        check(moved_on.conversation_stage == "drafting", "loading a checkpoint changes nothing")
        record = await manager.arestore(conversation.ref, checkpoint_id)
        now = await conversation.asnapshot()
        print(
            f"restored {checkpoint_id} as commit v{record.version} (reset={record.reset}): "
            f"stage {now.conversation_stage!r}, {now.message_count} messages"
        )
        check(record.reset and record.version == moved_on.version + 1, "restore is one new commit")
        check(now.conversation_stage == "complete", "restore brings the stage back")
        check(now.messages == snap.messages and now.state == snap.state, "... and messages and keys")
        return {"version": now.version, "checkpoint_id": checkpoint_id, "messages": now.messages}
    finally:
        manager.close()


def main() -> int:
    in_memory_default()
    with tempfile.TemporaryDirectory(prefix="victor-actors-adr002-") as path:
        expected = asyncio.run(adr_code_example(path))

        # A later process: open the store read-only and read the checkpoint back.
        with GlobalStateManager.open(path, read_only=True) as later:
            infos = later.list_checkpoints("conversation:session-123")
            snap = later.load_checkpoint("conversation:session-123", expected["checkpoint_id"])
            current = later.get_conversation_state("session-123").snapshot()
            print(
                f"after reopening: checkpoints {[(i.checkpoint_id, i.label) for i in infos]}; "
                f"current v{current.version}, stage {current.conversation_stage!r}"
            )
            check([i.checkpoint_id for i in infos] == [expected["checkpoint_id"]], "one checkpoint stored")
            check(infos[0].label == "stage complete", "its label is stored")
            check(snap.conversation_stage == "complete", "the checkpoint reads back")
            check(snap.messages == expected["messages"], "... with its messages")
            check(current.version == expected["version"], "the current version survived the reopen")
            check(current.messages == expected["messages"], "... and so did the messages")
    return verdict()


if __name__ == "__main__":
    sys.exit(main())
