"""The OpenAI Agents SDK's ``Session`` on victor_actors: one conversation scope per session.

``VictorActorsSession(session_id, manager)`` keeps a session's items as the
messages of the conversation scope ``session_id``: ``add_items`` is one atomic
batch, ``pop_item`` one POP_MESSAGE (each item goes to exactly one caller),
``clear_session`` one CLEAR_MESSAGES. It works on a local manager, on a client of
an owner in another process (``victor_actors.connect``) and on an encrypted
store. Needs the ``openai-agents`` package (``pip install 'victor-actors[openai-agents]'``).
See docs/openai_agents.md and docs/adr/0028.
"""

from victor_actors.openai_agents._session import VictorActorsSession

__all__ = ["VictorActorsSession"]
