"""A read-only web inspector over a store, and a live one inside the process that owns it.

``victor-actors serve PATH`` serves the scope tree (versions, sizes, last
commit), each scope's history with a side-by-side diff between any two
versions, its messages as a conversation, its checkpoints, and a search by
id prefix, over a read-only manager: it works while another process owns
the store. :func:`serve_manager` serves the same over a running manager,
plus what only its owner knows (commits per second, live actors, mailbox
depth, supervision events, runs in progress and rolled back), pushed to
the page as server-sent events. Both bind to 127.0.0.1 by default and
answer only GET and HEAD. See ``docs/inspector.md``.

Tooling on top of the runtime: it reads through the public surface, and
nothing below imports it. Starlette and uvicorn (the ``web`` extra) are
imported only when a server starts.

- ``_catalog``: the scope listing: order, filters, cursor;
- ``_views``: the JSON answers, read from a manager and its store; ``_diff``: two versions compared;
- ``_live``: the live feed (counters, supervision events, runs);
- ``_app``: the Starlette application: routes, checks, errors, event stream; ``static/``: the page;
- ``_server``: the socket and uvicorn, on a thread or in the foreground; ``_command``: ``serve``.
"""

from __future__ import annotations

from victor_actors.web._command import add_parser, open_read_only, run_command
from victor_actors.web._errors import InspectorError
from victor_actors.web._server import InspectorServer, serve_manager

__all__ = [
    "InspectorError",
    "InspectorServer",
    "add_parser",
    "open_read_only",
    "run_command",
    "serve_manager",
]
