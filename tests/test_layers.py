"""The package's import graph points one way: down the layers listed here.

Every module of victor_actors is in exactly one layer. A module may import
modules of its own layer or of lower ones, never of a higher one, and the
graph has no cycle at all. Imports under ``TYPE_CHECKING`` and inside
functions count like any other: a back edge that only the type checker sees
is coupling all the same. docs/architecture.md shows the same layers.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "victor_actors"

# Lowest first. A name ending in ".*" is a subpackage: the package and every module in it.
LAYERS: list[tuple[str, list[str]]] = [
    (
        "values",
        [
            "_errors",
            "_clock",
            "_context",
            "_options",
            "_twins",
            "_values",
            "_typed",
            "_model",
            "_state",
            "_seed_fields",
            "_snapshot",
            "_rollback",
            "_trace",
        ],
    ),
    ("core", ["_reducer"]),
    ("store", ["store.*"]),
    ("shell", ["_events", "_crosstxn", "_messages", "_cell", "_threads", "_inbox", "_actor"]),
    ("kernel", ["_kernel", "_txn"]),
    (
        "services",
        [
            "_durability",
            "_memory_checkpoints",
            "_validation",
            "_archive",
            "_tree",
            "_supervision",
            "_passivation",
            "_runs",
            "_tools",
            "_toolresult",
            "_runtime",
        ],
    ),
    ("facade", ["_handle", "_level_checkpoints", "_manager"]),
    ("remote", ["remote.*"]),
    (
        "on top",
        [
            "__init__",
            "__main__",
            "_coordinator",
            "_applier",
            "protocols",
            "lowlevel",
            "testing.*",
            "langgraph.*",
            "cli.*",
            "sim.*",
            "bench.*",
            "web.*",
            "otel.*",
            "ray.*",
            "_agentsdk",
            "openai_agents.*",
            "claude_agent.*",
            "adk.*",
        ],
    ),
]


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).with_suffix("")
        parts = list(rel.parts)
        name = ".".join(parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            name = ".".join(parts[:-1])
        found[name] = path
    return found


def _layer_of(name: str) -> int:
    for index, (_title, members) in enumerate(LAYERS):
        for member in members:
            if member == name or (
                member.endswith(".*") and (name == member[:-2] or name.startswith(member[:-1]))
            ):
                return index
    raise AssertionError(f"victor_actors.{name} is in no layer: add it to LAYERS in {__file__}")


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules ``name`` imports, anywhere in its file."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ["victor_actors", *name.split(".")] if name != "__init__" else ["victor_actors"]
                if not is_package:
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            # ``from pkg import sub`` is an edge to the submodule, not to the package's __init__
            subs = [f"{module}.{a.name}" for a in node.names]
            known = [
                t for t in subs if t.startswith("victor_actors.") and t[len("victor_actors.") :] in modules
            ]
            targets = known if len(known) == len(subs) else [module, *known]
        for target in targets:
            if target == "victor_actors":
                out.add("__init__")
            elif target.startswith("victor_actors."):
                short = target[len("victor_actors.") :]
                if short in modules:
                    out.add(short)
    out.discard(name)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def test_every_module_is_in_a_layer() -> None:
    for name in _modules():
        _layer_of(name)


def test_no_module_imports_a_higher_layer() -> None:
    upward = []
    for name, targets in sorted(_graph().items()):
        for target in sorted(targets):
            if _layer_of(target) > _layer_of(name):
                upward.append(
                    f"{name} ({LAYERS[_layer_of(name)][0]}) imports {target} ({LAYERS[_layer_of(target)][0]})"
                )
    assert not upward, "imports pointing up the layers:\n" + "\n".join(upward)


def test_the_import_graph_has_no_cycle() -> None:
    graph = _graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = [*stack[stack.index(nxt) :], nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


def test_the_runtime_core_imports_no_tooling() -> None:
    """Everything below the top layer works without the simulator, the benchmarks or the CLI."""
    tooling = ("sim", "bench", "cli", "testing", "langgraph", "ray")
    graph = _graph()
    bad = [
        f"{name} imports {target}"
        for name, targets in graph.items()
        if _layer_of(name) < len(LAYERS) - 1
        for target in targets
        if target.split(".")[0] in tooling
    ]
    assert not bad, bad


def test_the_layer_test_sees_an_upward_edge(tmp_path: Path) -> None:
    """Guards the walker itself: a TYPE_CHECKING import of the manager from the actor is caught."""
    fake = tmp_path / "_actor.py"
    fake.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from victor_actors._manager import X\n"
    )
    found = _imports("_actor", fake, _modules())
    assert "_manager" in found and _layer_of("_manager") > _layer_of("_actor")
