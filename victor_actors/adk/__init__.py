"""Google ADK's ``BaseSessionService`` on victor_actors: ADK's state prefixes as scope levels.

``VictorActorsSessionService(manager)`` keeps an ADK app's app state in a team scope, each
user's state in a workflow scope under it and each session's state and events in a
conversation scope under that: ``app:``, ``user:`` and session keys nest like the scope tree,
so ``append_event`` is one atomic batch across the scopes its ``state_delta`` touches, and
``temp:`` keys are never stored. Works on a local manager, on a client of an owner in another
process (``victor_actors.connect``) and on an encrypted store. Needs the ``google-adk``
package (``pip install 'victor-actors[adk]'``). See docs/adk.md and docs/adr/0028.
"""

from victor_actors.adk._service import VictorActorsSessionService

__all__ = ["VictorActorsSessionService"]
