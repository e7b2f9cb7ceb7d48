"""The protocols of ``victor_actors.protocols`` are implemented by our handles and managers, local and
remote: mypy checks ``tests/typing_protocols.py`` (and CI's mypy run covers that file too).

A second run checks that the check can fail: a handle-like class missing one method of the
protocol is an error.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import victor_actors
from victor_actors import GlobalStateManager
from victor_actors.protocols import ConversationState, ScopeWriter, StateManager

mypy_api = pytest.importorskip("mypy.api")

ROOT = Path(__file__).resolve().parents[1]


def _mypy(*files: str) -> tuple[str, int]:
    out, err, status = mypy_api.run(["--config-file", str(ROOT / "pyproject.toml"), *files])
    return out + err, status


def test_our_handles_and_managers_conform_under_mypy() -> None:
    report, status = _mypy(str(ROOT / "tests" / "typing_protocols.py"))
    assert status == 0, report


def test_the_check_can_fail(tmp_path: Path) -> None:
    """A reader-only double passes as a ConversationReader and fails as a ConversationState."""
    double = tmp_path / "double.py"
    double.write_text(
        "from typing import Any\n"
        "from victor_actors import ContextSnapshot, ScopeRef\n"
        "from victor_actors.protocols import ConversationReader, ConversationState\n"
        "class ReadOnlyDouble:\n"
        "    ref = ScopeRef('conversation', 'c')\n"
        "    parent = None\n"
        "    version = 0\n"
        "    def snapshot(self) -> ContextSnapshot: return ContextSnapshot(session_id='c')\n"
        "    async def asnapshot(self) -> ContextSnapshot: return self.snapshot()\n"
        "    def get(self, key: str, default: Any = None) -> Any: return default\n"
        "    def to_dict(self) -> dict[str, Any]: return {}\n"
        "reader: ConversationReader = ReadOnlyDouble()\n"
        "writer: ConversationState = ReadOnlyDouble()\n"
    )
    report, status = _mypy(str(double))
    assert status == 1, report
    errors = [line for line in report.splitlines() if ": error:" in line]
    # (mypy's cache may name the file where an identical module was checked before: match its name)
    assert len(errors) == 1 and "double.py:13: error: Incompatible types" in errors[0], report


def test_the_protocols_are_exported_and_need_no_inheritance() -> None:
    assert "ConversationState" in victor_actors.protocols.__all__
    with GlobalStateManager.open() as manager:
        handle = manager.get_conversation_state("c")
        for member in ("snapshot", "apply", "aapply", "add_message", "modify", "transact", "subscribe"):
            assert callable(getattr(handle, member))
        assert not isinstance(handle, type) and ConversationState not in type(handle).__mro__
    assert ScopeWriter.__module__ == StateManager.__module__ == "victor_actors.protocols"
