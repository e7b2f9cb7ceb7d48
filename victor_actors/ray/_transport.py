"""How a driver reaches a shard: the client's transport seam (``remote._transport``) over Ray.

A call is one Ray actor call carrying the request's bytes (``shard.call``).
Ray raises ``RayActorError`` (and its subclasses) when the shard is dead or
restarting; the client's lane then sends the request again once the shard
is back, as it does for a dropped socket. A shard that is gone for good
(``manager.shutdown()`` from another driver, then a new ``open``) is looked
up again by its name, so a driver carries on with the shards that replaced
it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from victor_actors.ray._shard import NAMESPACE
from victor_actors.remote._transport import Unreachable

__all__ = ["RayTransport", "unreachable_types"]

LOOKUP_PAUSE = 0.5  # seconds between look-ups of a shard's name after its actor died


def unreachable_types() -> tuple[type[BaseException], ...]:
    """What a Ray call to an actor that is dead or restarting raises."""
    import ray

    ex = ray.exceptions
    found = tuple(
        getattr(ex, n) for n in ("RayActorError", "ActorUnavailableError", "ActorDiedError") if hasattr(ex, n)
    )
    return (*found, Unreachable)


class RayTransport:
    """One shard, by its Ray actor handle (looked up again by name once the actor is dead)."""

    def __init__(self, index: int, name: str, actor: Any) -> None:
        self.index = index
        self.name = name
        self.actor = actor
        self.where = f"shard {index}"
        self.unreachable = unreachable_types()
        self.instance: str | None = None
        self._looked_up = 0.0
        self._stale = False

    async def call(self, payload: bytes) -> bytes:
        if self._stale:
            await self._lookup()
        try:
            raw: bytes = await self.actor.call.remote(payload)
        except self.unreachable:
            self._stale = True
            raise
        return raw

    async def _lookup(self) -> None:
        """The actor named for this shard now (the same one while Ray restarts it; another after a
        shutdown and a new start)."""
        now = time.monotonic()
        if now - self._looked_up < LOOKUP_PAUSE:
            return
        self._looked_up = now
        import ray

        try:
            actor = await asyncio.to_thread(ray.get_actor, self.name, namespace=NAMESPACE)
        except ValueError:
            raise Unreachable(f"no shard named {self.name} exists (it was shut down)", sent=False) from None
        except Exception:  # the cluster itself is away: try the handle we have
            return
        self.actor = actor
        self._stale = False

    async def aclose(self) -> None:
        pass
