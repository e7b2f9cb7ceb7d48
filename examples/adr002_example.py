"""ADR-002's "Code Example", as written, on victor_actors.

ADR-002 (Victor's state management decision) ends with this sketch::

    manager = GlobalStateManager.get_instance()
    conversation = manager.get_conversation_state("session-123")
    conversation.update({"messages": [...], "stage": "complete"})
    await manager.save_checkpoint(StateScope.CONVERSATION, conversation.to_dict())
    restored = await manager.load_checkpoint(StateScope.CONVERSATION, "session-123")

This script runs it three times, with only the import changed (and the
ADR's ``[...]`` filled in with two messages):

1. on the process default with no configuration: in memory, and the
   checkpoint is kept in memory;
2. on a default pointed at an LMDB store first
   (``GlobalStateManager.configure(path)``; ``VICTOR_ACTORS_STORE=path``
   does the same); a later process then reopens the store read-only and
   loads the checkpoint back;
3. beside today's forms, which stay: ``save_checkpoint(ref, label=...)``
   returns the id synchronously, ``load_checkpoint(ref)`` an immutable
   snapshot, ``restore(ref, id)`` makes the checkpoint current again as a
   new commit.

How one name serves a synchronous and an awaited form is in
docs/adr/0026-adr002-calls-beside-todays.md. Run it with
``python examples/adr002_example.py``; it exits 0 when every check holds.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from typing import Any

from _checks import check, verdict

MESSAGES = [
    {"role": "user", "content": "Summarise the quarterly report."},
    {"role": "assistant", "content": "Revenue rose 12%; costs were flat."},
]


async def adr_code_example() -> Any:
    from victor_actors import GlobalStateManager, StateScope  # was: from victor.state import ...

    # Get state manager
    manager = GlobalStateManager.get_instance()

    # Access conversation state
    conversation = manager.get_conversation_state("session-123")

    # Update state (copy-on-write)
    conversation.update({"messages": MESSAGES, "stage": "complete"})

    # Save checkpoint
    await manager.save_checkpoint(StateScope.CONVERSATION, conversation.to_dict())

    # Later, restore
    restored = await manager.load_checkpoint(StateScope.CONVERSATION, "session-123")
    return restored


def in_memory() -> None:
    from victor_actors import GlobalStateManager

    restored = asyncio.run(adr_code_example())
    manager = GlobalStateManager.get_instance()
    print(f"1. in memory: restored {dict(restored)} from {restored.ref} v{restored.version}")
    check(manager.store is None, "get_instance() with no configuration is in memory")
    check(restored == {"messages": MESSAGES, "stage": "complete"}, "the checkpoint comes back as a dict")
    ids = [c.checkpoint_id for c in manager.list_checkpoints("conversation:session-123")]
    check(ids == ["conversation:session-123@1"], "the checkpoint is kept in memory")
    manager.close()


def on_a_store(path: str) -> None:
    from victor_actors import GlobalStateManager, StateScope

    GlobalStateManager.configure(path)  # before the first get_instance(); or VICTOR_ACTORS_STORE=path
    restored = asyncio.run(adr_code_example())
    manager = GlobalStateManager.get_instance()
    check(manager.store is not None, "configure(path) puts the default on the store")
    check(restored["stage"] == "complete", "the checkpoint comes back")
    manager.close()

    # A later process: the store reopened read-only, the checkpoint loaded back the ADR's way.
    with GlobalStateManager.open(path, read_only=True) as later:
        again = asyncio.run(later.load_checkpoint(StateScope.CONVERSATION, "session-123"))
        print(f"2. on {path}: a later process loads {dict(again)}")
        check(again == restored, "the checkpoint is in the store")


def todays_forms(path: str) -> None:
    from victor_actors import ContextSnapshot, GlobalStateManager, TransitionBatch

    with GlobalStateManager.open(path) as manager:
        conversation = manager.get_conversation_state("session-123")
        # The conversation also has a message log and a stage of its own (the ADR's update()
        # writes two keys named "messages" and "stage"); a coordinator's batch writes those.
        conversation.apply(TransitionBatch().add_messages(MESSAGES).update_stage("complete"))
        checkpoint_id = manager.save_checkpoint(conversation.ref, label="stage complete")
        conversation.apply(TransitionBatch().add_message("Now rewrite it as a poem.").update_stage("drafting"))
        stored: ContextSnapshot = manager.load_checkpoint(conversation.ref, checkpoint_id)
        record = manager.restore(conversation.ref, checkpoint_id)
        now = conversation.snapshot()
        print(
            f"3. today's forms: saved {checkpoint_id}, loaded a snapshot of v{stored.version}, "
            f"restored it as commit v{record.version}: stage {now.conversation_stage!r}, "
            f"{now.message_count} messages"
        )
        check(stored.conversation_stage == "complete", "load_checkpoint(ref, id) is a snapshot")
        check(record.reset and now.conversation_stage == "complete", "restore is a new commit")
        check(now.messages == stored.messages, "... with the checkpoint's messages")


def main() -> int:
    in_memory()
    with tempfile.TemporaryDirectory(prefix="victor-actors-adr002-") as path:
        on_a_store(path)
        todays_forms(path)
    return verdict()


if __name__ == "__main__":
    sys.exit(main())
