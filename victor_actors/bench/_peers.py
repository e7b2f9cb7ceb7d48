"""The LangGraph peers the store and agent benchmarks measure ours against, imported only when asked.

Without the ``bench`` extra, :func:`langgraph` returns the reason (with the
install hint) instead of the peer; the benchmark then measures ours alone
and lists ``"langgraph"`` under ``skipped`` in its JSON, and the rows whose
baseline it is say why instead of a ratio.
"""

from __future__ import annotations

import importlib
import operator
import sqlite3
from collections.abc import Callable
from types import ModuleType
from typing import Annotated, Any, TypedDict

from victor_actors.bench._registry import INSTALL_HINT, distribution

__all__ = ["LangGraph", "Messages", "langgraph", "peer_modules"]

Message = dict[str, str]


class Messages(TypedDict):
    """A LangGraph state of one channel, ``messages``, that each step appends to."""

    messages: Annotated[list[Message], operator.add]


def peer_modules(*names: str) -> list[ModuleType] | str:
    """Import ``names`` in order; or why one cannot be imported here (with the install hint)."""
    modules = []
    for name in names:
        try:
            modules.append(importlib.import_module(name))
        except ImportError as exc:
            missing = exc.name if exc.name and exc.name.split(".")[0] == name.split(".")[0] else name
            return f"{distribution(missing)} not installed ({INSTALL_HINT})"
    return modules


class LangGraph:
    """SqliteSaver and a one-node StateGraph: what LangGraph users run, as the same-run baseline."""

    def __init__(self, base: ModuleType, sqlite: ModuleType, graph: ModuleType) -> None:
        self._base, self._sqlite, self._graph = base, sqlite, graph

    def saver(self, conn: sqlite3.Connection) -> Any:
        """A ``SqliteSaver`` on ``conn``, its tables made."""
        saver = self._sqlite.SqliteSaver(conn)
        saver.setup()
        return saver

    def one_node_graph(self, saver: Any, respond: Callable[[Messages], dict[str, Any]]) -> Any:
        """``START -> respond -> END`` over :class:`Messages`, compiled with ``saver``."""
        g = self._graph.StateGraph(Messages).add_node("respond", respond)
        return (
            g.add_edge(self._graph.START, "respond")
            .add_edge("respond", self._graph.END)
            .compile(checkpointer=saver)
        )

    def conversation_puts(
        self, saver: Any, thread_id: str, messages: list[Message], after: Callable[[int], None] | None = None
    ) -> Any:
        """One put per message of the whole conversation so far, as LangGraph does every super-step.

        Returns the last checkpoint; ``after(step)`` runs after each put.
        """
        config: Any = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
        cp, msgs = self._base.empty_checkpoint(), []
        for i, message in enumerate(messages):
            msgs.append(message)
            cp = self._base.create_checkpoint(cp, None, i)
            cp["channel_values"] = {"messages": msgs}
            cp["channel_versions"] = {"messages": i + 1}
            meta: Any = {"source": "loop", "step": i, "parents": {}}
            config = saver.put(config, cp, meta, {"messages": i + 1})
            if after is not None:
                after(i + 1)
        return cp


def langgraph() -> LangGraph | str:
    """The LangGraph peer, or why it cannot run here."""
    modules = peer_modules("langgraph.checkpoint.base", "langgraph.checkpoint.sqlite", "langgraph.graph")
    return modules if isinstance(modules, str) else LangGraph(*modules)
