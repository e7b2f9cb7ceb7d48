"""The Claude Agent SDK's ``SessionStore`` on victor_actors: a project's transcripts as scopes.

``VictorActorsSessionStore(manager)`` mirrors the SDK's session transcripts into scopes: a
project is a team scope, a session's main transcript a conversation scope under it, and
each subagent transcript a child session of that conversation. Every method of the
protocol, the optional ones included, is implemented; it passes the SDK's own
``run_session_store_conformance`` with nothing skipped, on a local manager, through a client
of an owner in another process (``victor_actors.connect``) and on an encrypted store.
Needs the ``claude-agent-sdk`` package (``pip install 'victor-actors[claude-agent]'``).
See docs/claude_agent.md and docs/adr/0028.
"""

from victor_actors.claude_agent._store import VictorActorsSessionStore

__all__ = ["VictorActorsSessionStore"]
