"""The public surface: what each module exports, that docs/api.md lists exactly that, and moved names."""

from __future__ import annotations

import importlib
import re
import warnings
from pathlib import Path

import pytest

import victor_actors
import victor_actors.lowlevel
import victor_actors.testing

DOCS = Path(__file__).resolve().parents[1] / "docs" / "api.md"

# Names the seed documents (Victor's ADR-002 and its coordinator architecture) use: they stay on top.
SEED_NAMES = {
    "GlobalStateManager",
    "StateScope",
    "ScopeRef",
    "ContextSnapshot",
    "StateTransition",
    "TransitionType",
    "TransitionBatch",
    "CoordinatorResult",
    "TransitionApplier",
    "create_snapshot",
}


def _documented(module: str) -> set[str]:
    """The names in the first table under docs/api.md's ``## `module` `` heading."""
    text = DOCS.read_text()
    match = re.search(rf"^## `{re.escape(module)}`\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert match, f"docs/api.md has no section for {module}"
    section = match.group(1)
    table = re.search(r"^\| name \|.*?\n((?:\|.*\n)+)", section, re.M)
    assert table, f"docs/api.md's section for {module} has no table of names"
    rows = [line for line in table.group(1).splitlines() if not line.startswith("|---")]
    names: set[str] = set()
    for row in rows:
        cell = row.split("|")[1]
        names.update(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", cell))
    return names


@pytest.mark.parametrize(
    "module",
    [
        "victor_actors",
        "victor_actors.lowlevel",
        "victor_actors.testing",
        "victor_actors.protocols",
        "victor_actors.ray",
        "victor_actors.remote",
    ],
)
def test_api_md_documents_exactly_all(module: str) -> None:
    exported = set(importlib.import_module(module).__all__)
    documented = _documented(module)
    assert documented == exported, (
        f"undocumented: {sorted(exported - documented)}; documented but not exported: "
        f"{sorted(documented - exported)}"
    )


@pytest.mark.parametrize(
    "module",
    [
        "victor_actors",
        "victor_actors.lowlevel",
        "victor_actors.testing",
        "victor_actors.protocols",
        "victor_actors.ray",
        "victor_actors.remote",
    ],
)
def test_every_exported_name_exists(module: str) -> None:
    mod = importlib.import_module(module)
    for name in mod.__all__:
        assert hasattr(mod, name), f"{module}.{name} is in __all__ but missing"


def test_the_top_level_is_small_and_keeps_the_seed_names() -> None:
    names = set(victor_actors.__all__)
    assert SEED_NAMES <= names
    assert "current_run_id" in names and "RunContext" in names and "ToolDispatcher" in names
    errors = {n for n in names if n.endswith("Error")}
    assert all(issubclass(getattr(victor_actors, n), victor_actors.VictorActorsError) for n in errors)
    # about 20 names for orchestrator code (the seeds' own among them), plus the errors and __version__
    assert len(names - errors - {"__version__"}) <= 25


def test_internals_are_not_exported() -> None:
    for hidden in ("reduce", "ScopeState", "Codec", "MapView", "MessageLog", "inject_fault"):
        assert hidden not in victor_actors.__all__


@pytest.mark.parametrize("name", ["reduce", "ScopeState", "MapView", "MessageLog", "Codec", "FrozenDict"])
def test_a_moved_name_still_imports_from_the_top_with_a_deprecation_warning(name: str) -> None:
    with pytest.warns(DeprecationWarning, match=rf"victor_actors\.{name} moved to victor_actors\.lowlevel"):
        old = getattr(victor_actors, name)
    assert old is getattr(victor_actors.lowlevel, name)


def test_thaw_is_on_top_and_makes_plain_copies_of_what_reads_return() -> None:
    """Issue 29, item 5: reads return FrozenDict and tuples, so ``isinstance(m, dict)`` never matched and
    the way to plain values was in ``lowlevel`` (deprecated on top). ``thaw`` is a top-level name again,
    the same function, and it also copies a snapshot's message log and state view."""
    assert victor_actors.thaw is victor_actors.lowlevel.thaw
    with victor_actors.GlobalStateManager.open() as manager:
        conv = manager.get_conversation_state("c")
        conv.apply(
            victor_actors.TransitionBatch()
            .add_message({"role": "user", "content": "hi", "tags": ["a"]})
            .update_state("plan", {"steps": ["fetch", "chart"]})
        )
        snap = conv.snapshot()
        message = snap.messages[0]
        assert message == {"role": "user", "content": "hi", "tags": ("a",)} and not isinstance(message, dict)
        plain = victor_actors.thaw(snap.messages)
        assert plain == [{"role": "user", "content": "hi", "tags": ["a"]}]
        assert type(plain) is list and type(plain[0]) is dict and type(plain[0]["tags"]) is list
        state = victor_actors.thaw(snap.state)
        assert state == {"plan": {"steps": ["fetch", "chart"]}} and type(state["plan"]["steps"]) is list
        state["plan"]["steps"].append("mutated")  # a copy: the snapshot is untouched
        assert snap.get_state("plan") == {"steps": ("fetch", "chart")}
        assert victor_actors.thaw("text") == "text" and victor_actors.thaw(b"raw") == b"raw"


def test_thaw_is_back_on_top_without_a_warning() -> None:
    """A new user meets read-only messages first: ``victor_actors.thaw`` is where the plain copy is."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert victor_actors.thaw is victor_actors.lowlevel.thaw
    assert "thaw" in victor_actors.__all__


def test_an_unknown_top_level_name_is_an_attribute_error() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(AttributeError, match="no attribute 'nope'"):
            victor_actors.nope  # noqa: B018


def test_deprecated_manager_hooks_warn_and_still_work() -> None:
    with victor_actors.GlobalStateManager.open() as manager:
        conv = manager.get_conversation_state("c")
        with pytest.warns(DeprecationWarning, match="victor_actors.testing.inject_fault"):
            manager.inject_fault(conv.ref, RuntimeError("boom"))
        with pytest.raises(victor_actors.ScopeFailedError):
            conv.set("k", 1)
        seen: list[str] = []
        with pytest.warns(DeprecationWarning, match="victor_actors.testing.set_observer"):
            manager.set_observer(lambda kind, ref, obj: seen.append(kind))
        conv.set("k", 2)
        assert "received" in seen and "published" in seen


def test_options_are_checked_at_the_edge() -> None:
    with pytest.raises(ValueError, match="durability"):
        victor_actors.GlobalStateManager.open(durability="fast")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="unknown option"):
        victor_actors.GlobalStateManager.open(max_actors=3)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="mailbox_size"):
        victor_actors.GlobalStateManager(mailbox_size=0)


def test_the_package_is_typed() -> None:
    assert (Path(victor_actors.__file__).parent / "py.typed").exists()
