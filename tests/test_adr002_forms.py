"""ADR-002's calls beside today's: get_instance() with no configuration, and the awaited checkpoint forms.

``await manager.save_checkpoint(StateScope.X, handle.to_dict())`` and
``await manager.load_checkpoint(StateScope.X, scope_id)`` (a level first) are ADR-002's form and
return coroutines; ``save_checkpoint(ref)`` and ``load_checkpoint(ref, id)`` stay synchronous
(docs/adr/0026). Before issue 25 the level form failed (a level is not a scope instance),
get_instance() could not checkpoint at all (in memory), and nothing could point it at a store.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from victor_actors import (
    CheckpointNotFoundError,
    ContextSnapshot,
    GlobalStateManager,
    ScopeAccessError,
    StateScope,
    TransitionBatch,
    TransitionValidationError,
    VictorActorsError,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def default() -> Iterator[None]:
    """No process default and no configuration before or after the test."""
    GlobalStateManager._configured = None
    GlobalStateManager.get_instance().close()
    try:
        yield
    finally:
        GlobalStateManager.get_instance().close()
        GlobalStateManager._configured = None


def test_get_instance_keeps_checkpoints_in_memory(default: None) -> None:
    manager = GlobalStateManager.get_instance()
    assert manager.store is None and GlobalStateManager.get_instance() is manager
    conv = manager.get_conversation_state("s")
    conv.apply(TransitionBatch().add_message("hi").update_state("k", 1))
    first = manager.save_checkpoint(conv.ref, label="one")
    conv.update({"k": 2})
    second = manager.save_checkpoint(conv.ref)
    conv.update({"k": 3})
    assert (first, second) == ("conversation:s@1", "conversation:s@2")
    assert [(c.checkpoint_id, c.label) for c in manager.list_checkpoints(conv.ref)] == [
        (second, None),
        (first, "one"),
    ]
    assert manager.load_checkpoint(conv.ref).state == {"k": 2}
    assert manager.load_checkpoint(conv.ref, first).messages == ("hi",)
    record = manager.restore(conv.ref, first)
    assert record.reset and conv.get("k") == 1 and conv.version == 4
    with pytest.raises(CheckpointNotFoundError, match="not the log"):
        manager.restore(conv.ref, 3)  # no checkpoint at version 3, and no log to rebuild it from
    assert conv.version == 4
    with pytest.raises(VictorActorsError, match="need a store"):
        manager.state_at(conv.ref, 1)


def test_memory_checkpoints_keep_the_newest(default: None) -> None:
    with GlobalStateManager.open(keep_checkpoints=2) as manager:
        conv = manager.get_conversation_state("s")
        for n in range(4):
            conv.set("n", n)
            manager.save_checkpoint(conv.ref)
        assert [c.version for c in manager.list_checkpoints(conv.ref)] == [4, 3]
        with pytest.raises(CheckpointNotFoundError):
            manager.load_checkpoint(conv.ref, "conversation:s@1")


def test_the_adr_forms_are_awaited(default: None) -> None:
    manager = GlobalStateManager.get_instance()
    conversation = manager.get_conversation_state("session-123")
    conversation.update({"messages": ["hi"], "stage": "complete"})

    async def adr() -> tuple[str, Any, Any]:
        saved = await manager.save_checkpoint(StateScope.CONVERSATION, conversation.to_dict())
        conversation.update({"stage": "moved on"})
        restored = await manager.load_checkpoint(StateScope.CONVERSATION, "session-123")
        twin = await manager.aload_checkpoint(StateScope.CONVERSATION, "session-123")
        return saved, restored, twin

    saved, restored, twin = asyncio.run(adr())
    assert saved == "conversation:session-123@1"
    assert restored == twin == {"messages": ["hi"], "stage": "complete"}
    assert restored.ref == conversation.ref and restored.version == 1
    assert conversation.get("stage") == "moved on"  # loading changed nothing


def test_todays_forms_stay_synchronous(default: None) -> None:
    manager = GlobalStateManager.get_instance()
    conv = manager.get_conversation_state("s")
    conv.set("k", 1)
    assert manager.save_checkpoint(conv.ref) == "conversation:s@1"
    assert manager.save_checkpoint("conversation:s", label="again") == "conversation:s@1"
    assert isinstance(manager.load_checkpoint("conversation:s"), ContextSnapshot)
    assert isinstance(manager.load_checkpoint(conv.ref, "conversation:s@1"), ContextSnapshot)

    async def twins() -> tuple[str, str, ContextSnapshot]:
        a = await manager.asave_checkpoint(conv.ref)
        b = await manager.asave_checkpoint(StateScope.CONVERSATION, conv.to_dict())
        return a, b, await manager.aload_checkpoint(conv.ref)

    a, b, snap = asyncio.run(twins())
    assert a == b == "conversation:s@1" and snap.state == {"k": 1}


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda conv: {"k": 1}, "names its scope instance"),
        (lambda conv: _changed(conv.to_dict()), "was changed after to_dict"),
        (lambda conv: conv.to_dict(), "TEAM scope"),
    ],
)
def test_the_adr_save_form_refuses_and_saves_nothing(default: None, make: Any, why: str) -> None:
    manager = GlobalStateManager.get_instance()
    team = manager.get_team_state("t")
    team.set("k", 1)
    level = StateScope.CONVERSATION if "TEAM" in why else StateScope.TEAM
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a refused call leaves no coroutine behind unawaited
        with pytest.raises(TransitionValidationError, match=why) as info:
            manager.save_checkpoint(level, make(team))
    assert info.value.field == "state" and "nothing was saved" in str(info.value)
    assert manager.list_checkpoints(team.ref) == []


def _changed(state: dict[str, Any]) -> dict[str, Any]:
    state["k"] = 2
    return state


def test_the_adr_forms_refuse_other_mistakes(default: None) -> None:
    manager = GlobalStateManager.get_instance()
    conv = manager.get_conversation_state("s")
    with pytest.raises(TypeError, match="to_dict"):
        manager.save_checkpoint(StateScope.CONVERSATION)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="takes a level"):
        manager.save_checkpoint(conv.ref, conv.to_dict())  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="id as a str"):
        manager.load_checkpoint(StateScope.CONVERSATION)  # type: ignore[call-overload]
    with pytest.raises(ScopeAccessError):
        asyncio.run(manager.load_checkpoint(StateScope.CONVERSATION, "nobody"))
    with pytest.raises(CheckpointNotFoundError):
        asyncio.run(manager.load_checkpoint(StateScope.CONVERSATION, "s"))
    assert [str(r) for r in manager.scopes()] == ["global:global", "conversation:s"]


def test_configure_puts_the_default_on_a_store(default: None, tmp_path: Path) -> None:
    path = tmp_path / "store"
    GlobalStateManager.configure(path, durability="sync", keep_checkpoints=5)
    manager = GlobalStateManager.get_instance()
    assert manager.store is not None and Path(manager.store.path) == path
    assert manager.options.keep_checkpoints == 5
    conv = manager.get_conversation_state("s")
    conv.update({"k": 1})
    saved = asyncio.run(manager.save_checkpoint(StateScope.CONVERSATION, conv.to_dict()))
    # too late now: refused, and the open default is left as it was
    with pytest.raises(VictorActorsError, match="already open"):
        GlobalStateManager.configure(None)
    assert GlobalStateManager.get_instance() is manager
    manager.close()
    with GlobalStateManager.open(path, read_only=True) as later:
        assert [c.checkpoint_id for c in later.list_checkpoints("conversation:s")] == [saved]


def test_configure_refuses_bad_options_and_changes_nothing(default: None, tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="unknown option"):
        GlobalStateManager.configure(tmp_path / "a", durabilty="sync")
    with pytest.raises(ValueError, match="durability"):
        GlobalStateManager.configure(tmp_path / "a", durability="fast")
    with pytest.raises(TypeError, match="validators"):
        GlobalStateManager.configure(tmp_path / "a", validators=[1])
    assert GlobalStateManager._configured is None
    assert GlobalStateManager.get_instance().store is None
    assert not (tmp_path / "a").exists()


def test_the_environment_variable_names_the_store(tmp_path: Path) -> None:
    code = (
        "import asyncio\n"
        "from victor_actors import GlobalStateManager, StateScope\n"
        "m = GlobalStateManager.get_instance()\n"
        "c = m.get_conversation_state('session-123')\n"
        "c.update({'stage': 'complete'})\n"
        "print(asyncio.run(m.save_checkpoint(StateScope.CONVERSATION, c.to_dict())), m.store.path)\n"
    )
    env = {**os.environ, "VICTOR_ACTORS_STORE": str(tmp_path / "env-store"), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    saved, where = done.stdout.split()
    assert saved == "conversation:session-123@1" and Path(where) == tmp_path / "env-store"
    with GlobalStateManager.open(tmp_path / "env-store", read_only=True) as later:
        restored = asyncio.run(later.load_checkpoint(StateScope.CONVERSATION, "session-123"))
        assert restored == {"stage": "complete"}
