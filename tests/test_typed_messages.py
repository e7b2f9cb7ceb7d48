"""Typed messages: registered attrs classes and dataclasses come back as instances of their class.

From snapshots (messages and key-value state), checkpoints, history, after a reopen, and across
the wire to a client. A process that registered nothing reads them as read-only mappings and
never imports their module; a tag is looked up only among the classes registered in the process.
Before issue 25 an attrs or dataclass message was refused (or, with ``register_converter``, came
back as a FrozenDict), so ``isinstance(m, Message)`` filters silently matched nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import attrs
import pytest

import victor_actors
from victor_actors import GlobalStateManager, TransitionBatch, TransitionValidationError, thaw
from victor_actors.lowlevel import FrozenDict, TaggedValue, register_message_type

ROOT = Path(__file__).resolve().parents[1]


@attrs.frozen
class ToolCallPart:
    name: str
    arguments: dict[str, Any]


@attrs.frozen
class Message:
    role: str
    content: str
    tool_calls: tuple[ToolCallPart, ...] = ()


@dataclasses.dataclass
class Note:
    text: str
    tags: list[str] = dataclasses.field(default_factory=list)
    count: int = dataclasses.field(default=0, init=False)


@attrs.define
class Private:
    _secret: str  # an attrs private attribute: its constructor keyword is "secret"


@pytest.fixture
def typed(tmp_path: Path) -> Path:
    """A store holding typed messages and values, written by a manager that registered the types."""
    path = tmp_path / "store"
    with GlobalStateManager.open(path, message_types=[Message, Note, ToolCallPart, Private]) as manager:
        conv = manager.get_conversation_state("c", workflow_id="wf")
        conv.apply(
            TransitionBatch()
            .add_message(Message("user", "hi"))
            .add_message(Message("assistant", "", (ToolCallPart("ls", {"path": "."}),)))
            .add_message({"role": "tool", "content": "README.md"})
            .update_state("note", Note("remember", ["a"]))
            .update_state("secret", Private("s3"))
        )
        manager.save_checkpoint(conv.ref)
        conv.add_message(Message("user", "after the checkpoint"))
    return path


def test_they_come_back_as_their_class_after_a_reopen(typed: Path) -> None:
    with GlobalStateManager.open(typed) as manager:
        snap = manager.get_conversation_state("c").snapshot()
        messages = list(snap.messages)
        assert [type(m) for m in messages] == [Message, Message, FrozenDict, Message]
        assert [m for m in snap.messages if isinstance(m, Message)][0] == Message("user", "hi")
        assert messages[1].tool_calls == (ToolCallPart("ls", {"path": "."}),)
        assert snap.messages[-1] == Message("user", "after the checkpoint")
        assert snap.messages[0:2] == (Message("user", "hi"), messages[1])
        note = snap.get_state("note")
        assert isinstance(note, Note) and note.tags == ["a"] and snap.state["note"] == note
        assert snap.get_state("secret") == Private("s3")
        assert manager.get_conversation_state("c").to_dict()["note"] == Note("remember", ["a"])
        # history: the checkpoint and an older version
        assert manager.load_checkpoint("conversation:c").messages[0] == Message("user", "hi")
        assert manager.state_at("conversation:c", 1).messages[1] == messages[1]


def test_every_read_is_a_new_instance(typed: Path) -> None:
    with GlobalStateManager.open(typed) as manager:
        conv = manager.get_conversation_state("c")
        note = conv.get("note")
        note.tags.append("local")
        assert conv.get("note").tags == ["a"] and conv.get("note") is not note


def test_events_and_records_carry_the_tagged_form(typed: Path) -> None:
    with GlobalStateManager.open(typed) as manager:
        record = manager.get_conversation_state("c").add_message(Message("user", "x"))
        (added,) = record.added_messages
        assert isinstance(added, TaggedValue) and added.tag == f"{__name__}.Message"
        assert added == {"role": "user", "content": "x", "tool_calls": ()}


def test_a_process_that_registers_nothing_reads_mappings_and_imports_nothing(typed: Path) -> None:
    """In a fresh interpreter: the module defining the classes is never imported."""
    code = textwrap.dedent(
        f"""
        import json, sys
        from victor_actors import GlobalStateManager, thaw
        from victor_actors.lowlevel import TaggedValue
        with GlobalStateManager.open({str(typed)!r}, read_only=True) as m:
            snap = m.get_conversation_state("c").snapshot()
            first = snap.messages[0]
            print(json.dumps({{
                "imported": {__name__!r} in sys.modules,
                "kinds": [type(x).__name__ for x in snap.messages],
                "tag": first.tag,
                "first": thaw(first),
                "note": thaw(snap.get_state("note")),
                "is_mapping": isinstance(snap.get_state("note"), TaggedValue),
            }}))
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["imported"] is False
    assert seen["kinds"] == ["TaggedValue", "TaggedValue", "FrozenDict", "TaggedValue"]
    assert seen["tag"] == f"{__name__}.Message"
    assert seen["first"] == {"role": "user", "content": "hi", "tool_calls": []}
    assert seen["note"] == {"text": "remember", "tags": ["a"]} and seen["is_mapping"]


def test_a_reader_without_the_class_keeps_the_tag_when_it_writes(typed: Path, tmp_path: Path) -> None:
    """A process without the class replays the log and checkpoints: the tags survive its writes."""
    code = textwrap.dedent(
        f"""
        from victor_actors import GlobalStateManager
        with GlobalStateManager.open({str(typed)!r}) as m:
            conv = m.get_conversation_state("c")
            conv.add_message(conv.snapshot().messages[0])  # re-adds a tagged value it cannot revive
            m.save_checkpoint(conv.ref)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    with GlobalStateManager.open(typed) as manager:
        messages = list(manager.get_conversation_state("c").snapshot().messages)
        assert messages[-1] == Message("user", "hi") and isinstance(messages[-1], Message)


def test_a_client_over_the_wire_revives_what_it_registered(tmp_path: Path) -> None:
    url = f"unix://{tmp_path}/owner.sock"
    with GlobalStateManager.open(tmp_path / "store", listen=url, message_types=[Message]) as owner:
        owner.get_conversation_state("c").add_message(Message("user", "from the owner"))
        with victor_actors.connect(url) as client:
            conv = client.get_conversation_state("c")
            conv.add_message(Message("assistant", "from the client"))
            assert list(conv.snapshot().messages) == [
                Message("user", "from the owner"),
                Message("assistant", "from the client"),
            ]
        assert owner.get_conversation_state("c").snapshot().messages[-1] == Message(
            "assistant", "from the client"
        )


def test_plain_dict_messages_stay_read_only_mappings_and_thaw_copies(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c")
    conv.add_message({"role": "user", "content": "hi", "parts": [1, 2]})
    message = conv.snapshot().messages[0]
    assert isinstance(message, FrozenDict) and not isinstance(message, dict)
    with pytest.raises(TypeError):
        message["role"] = "assistant"  # type: ignore[index]
    plain = victor_actors.thaw(message)
    assert isinstance(plain, dict) and plain == {"role": "user", "content": "hi", "parts": [1, 2]}
    plain["parts"].append(3)
    assert conv.snapshot().messages[0]["parts"] == (1, 2)
    assert thaw is victor_actors.thaw


def test_registration_rules() -> None:
    class NotAClass:
        pass

    with pytest.raises(TypeError, match="attrs class or a dataclass"):
        register_message_type(NotAClass)
    with pytest.raises(TypeError, match="takes a class"):
        register_message_type(Note("x"))  # type: ignore[arg-type]
    assert register_message_type(Message) == f"{__name__}.Message"
    assert register_message_type(Message) == f"{__name__}.Message"  # again: nothing changes
    with pytest.raises(ValueError, match="already registered under"):
        register_message_type(Message, tag="other")

    @attrs.frozen
    class Imposter:
        role: str

    with pytest.raises(ValueError, match="already registered to"):
        register_message_type(Imposter, tag=f"{__name__}.Message")
    with pytest.raises(ValueError, match="non-empty str"):
        register_message_type(Imposter, tag="")


def test_a_class_defined_again_replaces_its_older_definition(manager: GlobalStateManager) -> None:
    def define() -> type:
        @dataclasses.dataclass(frozen=True)
        class Local:
            n: int

        return Local

    first, second = define(), define()
    assert manager.register_message_type(first) == manager.register_message_type(second)
    conv = manager.get_conversation_state("c")
    conv.add_message(first(1))
    assert type(conv.snapshot().messages[0]) is second


def test_unregistered_instances_are_refused_at_the_edge(manager: GlobalStateManager) -> None:
    @attrs.frozen
    class Unregistered:
        x: int

    conv = manager.get_conversation_state("c")
    with pytest.raises(TransitionValidationError, match="not a storable value"):
        conv.add_message(Unregistered(1))
    with pytest.raises(TransitionValidationError, match="Note"):
        conv.add_message(Note(text=object()))  # type: ignore[arg-type]
    assert conv.version == 0


def test_a_stored_value_that_no_longer_fits_its_class_reads_as_a_mapping(
    manager: GlobalStateManager, caplog: pytest.LogCaptureFixture
) -> None:
    @attrs.frozen
    class Versioned:
        a: int

    tag = manager.register_message_type(Versioned, tag="versioned")
    conv = manager.get_conversation_state("c")
    conv.add_message(Versioned(1))

    @attrs.frozen
    class Versioned2:  # the class changed: the stored field "a" is gone
        b: int

    import victor_actors._typed as typed

    typed._BY_TAG[tag] = Versioned2
    typed._BY_CLASS[Versioned2] = typed._spec(Versioned2, tag)
    try:
        message = conv.snapshot().messages[0]
    finally:
        typed._BY_TAG[tag] = Versioned
        del typed._BY_CLASS[Versioned2]
    assert isinstance(message, TaggedValue) and message == {"a": 1}
    assert "no longer fits its class" in caplog.text


def test_messages_of_an_asyncio_agent(manager: GlobalStateManager) -> None:
    manager.register_message_type(Message)

    async def agent() -> list[Any]:
        conv = manager.get_conversation_state("a")
        await conv.aadd_message(Message("user", "hi"))
        return [m for m in (await conv.asnapshot()).messages if isinstance(m, Message)]

    assert asyncio.run(agent()) == [Message("user", "hi")]


def test_the_inspector_and_the_cli_show_the_stored_fields(manager: GlobalStateManager) -> None:
    from victor_actors.cli._format import jsonable

    manager.register_message_type(Message)
    conv = manager.get_conversation_state("c")
    conv.apply(TransitionBatch().add_message(Message("user", "hi")).update_state("m", Message("a", "b")))
    snap = conv.snapshot()
    assert json.dumps([jsonable(m) for m in snap.messages]) == json.dumps(
        [{"role": "user", "content": "hi", "tool_calls": []}]
    )
    assert jsonable(dict(snap.state.items())) == {"m": {"role": "a", "content": "b", "tool_calls": []}}
