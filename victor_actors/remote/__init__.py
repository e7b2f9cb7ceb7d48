"""One state, many processes: a client for other processes, and the owner that serves them.

One process owns a store (its scope actors, its group commit, its
snapshots); every other process is a client of it::

    # the owner: victor-actors owner /var/lib/agents --socket /run/agents.sock
    # or, in a process that already owns the store:
    manager = GlobalStateManager.open("/var/lib/agents", listen="unix:///run/agents.sock")

    # any other process (a web worker, a notebook, a pool worker):
    import victor_actors
    client = victor_actors.connect("unix:///run/agents.sock")
    conv = client.get_conversation_state("s1", team_id="t1")
    conv.apply(TransitionBatch().add_message({"role": "user", "content": "hi"}))

The client has the local manager's API; see ``docs/deploying.md``.
"""

from __future__ import annotations

from victor_actors._errors import OwnerUnavailableError
from victor_actors.remote._client import Subscription
from victor_actors.remote._frames import MAX_FRAME, parse_url, read_token
from victor_actors.remote._handle import RemoteRun, RemoteScopeHandle
from victor_actors.remote._host import BATCH_KEY, DEDUPE_WINDOW, Host
from victor_actors.remote._manager import RemoteStateManager, RemoteTools, connect
from victor_actors.remote._server import OwnerServer, serve

__all__ = [
    "BATCH_KEY",
    "DEDUPE_WINDOW",
    "MAX_FRAME",
    "Host",
    "OwnerServer",
    "OwnerUnavailableError",
    "RemoteRun",
    "RemoteScopeHandle",
    "RemoteStateManager",
    "RemoteTools",
    "Subscription",
    "connect",
    "parse_url",
    "read_token",
    "serve",
]
