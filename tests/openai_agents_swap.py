"""A pytest plugin (``-p openai_agents_swap``) that runs the OpenAI Agents SDK's own session tests on
VictorActorsSession: every ``SQLiteSession`` the SDK's test modules name becomes ours.

Loaded by tests/test_openai_agents.py into a child pytest that runs inside the SDK's published source
distribution (fetched at test time, never copied into this tree). Each test runs once per manager
variant named in ``VICTOR_SWAP`` (default: both), and passes only if it passes on each:

- ``local``: one GlobalStateManager per SQLite file the test names (a store beside it), or a fresh
  temporary store for ``:memory:``;
- ``remote``: the same stores, encrypted at rest, each opened by an owner listening on a unix
  socket, and the sessions on a ``victor_actors.connect`` client of it (another process's view).

The SDK's suite runs its async tests with pytest-asyncio; this plugin runs them itself
(``asyncio.run`` per test and variant), which is all those modules ask of it.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest

import victor_actors
from victor_actors import GlobalStateManager, Keyring
from victor_actors.openai_agents import VictorActorsSession

VARIANTS = tuple(os.environ.get("VICTOR_SWAP", "local,remote").split(","))
_variant = VARIANTS[0]
_KEYS = Keyring({"k1": bytes(range(32))}, active="k1")
_lock = threading.Lock()
_open: dict[str, tuple[GlobalStateManager, Any, int]] = {}  # store path -> (owner, manager used, sessions)


def _manager_for(db_path: Any) -> tuple[str, Any]:
    """The manager sessions on ``db_path`` share (made on first use), and the key to release it by."""
    if str(db_path) == ":memory:":
        path = tempfile.mkdtemp(prefix="va-memory-")
    else:
        path = f"{Path(db_path).expanduser().resolve()}.victor-{_variant}"
    with _lock:
        found = _open.get(path)
        if found is not None:
            owner, used, count = found
            _open[path] = (owner, used, count + 1)
            return path, used
        if _variant == "remote":
            url = f"unix://{tempfile.mkdtemp(prefix='va-sock-')}/owner.sock"
            owner = GlobalStateManager.open(path, listen=url, encryption=_KEYS)
            used: Any = victor_actors.connect(url)
        else:
            owner = GlobalStateManager.open(path)
            used = owner
        _open[path] = (owner, used, 1)
        return path, used


def _release(path: str) -> None:
    with _lock:
        owner, used, count = _open[path]
        if count > 1:
            _open[path] = (owner, used, count - 1)
            return
        del _open[path]
    if used is not owner:
        used.close()
    owner.close()


class SessionStandIn(VictorActorsSession):
    """Takes ``SQLiteSession``'s arguments; its sessions on one file share one store."""

    def __init__(
        self,
        session_id: str,
        db_path: Any = ":memory:",
        sessions_table: str = "agent_sessions",
        messages_table: str = "agent_messages",
        session_settings: Any = None,
    ) -> None:
        del sessions_table, messages_table  # the scope is the table
        if isinstance(session_settings, dict):
            from agents.memory.session_settings import coerce_session_settings

            session_settings = coerce_session_settings(session_settings)
        self._path, manager = _manager_for(db_path)
        self._released = False
        super().__init__(session_id, manager, session_settings=session_settings)

    def close(self) -> None:
        if not self._released:
            self._released = True
            _release(self._path)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "asyncio: an async test (run here when pytest-asyncio is absent)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        module = getattr(item, "module", None)
        if module is not None and hasattr(module, "SQLiteSession"):
            module.SQLiteSession = SessionStandIn


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool:
    global _variant
    names = pyfuncitem._fixtureinfo.argnames
    kwargs = {n: pyfuncitem.funcargs[n] for n in names}
    for variant in VARIANTS:
        _variant = variant
        try:
            if inspect.iscoroutinefunction(pyfuncitem.obj):
                asyncio.run(pyfuncitem.obj(**kwargs))
            else:
                pyfuncitem.obj(**kwargs)
        except BaseException as exc:
            exc.add_note(f"(on the {variant!r} manager)")
            raise
        finally:
            _close_all()
    return True


def _close_all() -> None:
    """Close the stores a test left open (sessions it never closed), before the next variant."""
    with _lock:
        left = list(_open)
    for path in left:
        while path in _open:
            _release(path)

