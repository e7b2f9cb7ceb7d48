"""Joining Ray, and finding (or starting) a store's shards: detached named actors any driver attaches to.

A store's shards are named after its path (``victor-actors-<hash>-shard-<n>``
in the ``victor_actors`` namespace) and started detached, so they belong to
the cluster, not to the driver that started them: any driver, in any
process on any node, that opens the same path attaches to the same shards
(``get_if_exists``), and a driver's exit or death leaves them running.
``manager.shutdown()`` stops them for everyone.

Which Ray: the one this process already initialised; else the cluster at
``address`` (or ``RAY_ADDRESS``: ``auto``, ``host:port``, Ray Client's
``ray://...``); else a private local one for this process alone, which ends
with it (the single-process case, where no other driver can attach).
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Mapping
from typing import Any

from victor_actors._errors import ScopeAccessError, ScopeFailedError, VictorActorsError
from victor_actors.ray import _wire as w
from victor_actors.ray._shard import NAMESPACE, Shard, shard_name

__all__ = ["Shards", "join_ray", "token_for"]

PING_TIMEOUT = 120.0  # seconds for a shard to start (or restart) and answer


def _ray() -> Any:
    import ray

    return ray


def join_ray(address: str | None, cpus: int) -> tuple[bool, bool]:
    """Make sure this process is connected to Ray; (whether it connected now, whether the cluster is
    its own private one)."""
    ray = _ray()
    if ray.is_initialized():
        return False, False
    target = address or os.environ.get("RAY_ADDRESS") or None
    if target:
        ray.init(address=target, namespace=NAMESPACE, log_to_driver=False)
        return True, False
    ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    return True, True


def token_for(root: str | None) -> str:
    """The name part of a store's shards: a hash of its absolute path (random in memory)."""
    if root is None:
        return "mem-" + uuid.uuid4().hex[:12]
    return hashlib.blake2b(root.encode(), digest_size=6).hexdigest()


class Shards:
    """A store's shard actors as one driver found or started them."""

    def __init__(self, token: str, actors: list[Any], created: set[int]) -> None:
        self.token = token
        self.actors = actors
        self.created = created  # the ones this driver started (not attached to)
        self.info: list[dict[str, Any]] = []

    @property
    def names(self) -> list[str]:
        return [shard_name(self.token, n) for n in range(len(self.actors))]

    @classmethod
    def attach(
        cls,
        root: str | None,
        shards: int,
        token: str,
        local: Mapping[str, Any],
        *,
        max_restarts: int,
        shard_options: Mapping[int, Mapping[str, Any]] | None,
    ) -> Shards:
        """The store's running shards, starting the ones that do not run yet; each answered once.

        Raises:
            ScopeAccessError: the shards running for this path are not ``shards`` of them.
            StoreLockedError: a shard's store is held by another live shard (another cluster).
            VictorActorsError: a shard refused to start (its store is damaged, ...), as typed.
        """
        ray = _ray()
        remote = ray.remote(Shard)
        actors, created = [], set()
        for n in range(shards):
            name = shard_name(token, n)
            try:
                actor = ray.get_actor(name, namespace=NAMESPACE)
            except ValueError:
                extra = dict((shard_options or {}).get(n, {}))
                actor = remote.options(
                    name=name,
                    namespace=NAMESPACE,
                    lifetime="detached",
                    get_if_exists=True,
                    max_restarts=max_restarts,
                    max_task_retries=0,
                    num_cpus=0,
                    max_concurrency=1000,
                    **extra,
                ).remote(root, n, shards, token, dict(local))
                created.add(n)
            actors.append(actor)
        found = cls(token, actors, created)
        try:
            found.check(shards)
        except BaseException:
            found.kill(found.created)
            raise
        return found

    def check(self, shards: int) -> None:
        """Ping every shard; refuse a count that is not the path's, or a shard that refuses to serve."""
        ray = _ray()
        try:
            self.info = list(ray.get([a.ping.remote() for a in self.actors], timeout=PING_TIMEOUT))
        except Exception as exc:
            cause = getattr(exc, "cause", None) or exc
            raise ScopeFailedError(
                f"a shard could not start: {type(cause).__name__}: {cause}; nothing was opened"
            ) from None
        for info in self.info:
            if info.get("e") is not None:
                raise w.error_from(info["e"], f"shard {info.get('i')}")
            if info.get("n") != shards:
                raise ScopeAccessError(
                    f"the running shards hold a cluster of {info.get('n')!r} shards, not {shards}: scopes "
                    "would be routed to shards that do not hold them (resharding is not supported); "
                    "nothing was opened"
                )

    def kill(self, which: set[int] | None = None) -> None:
        ray = _ray()
        for n, actor in enumerate(self.actors):
            if which is None or n in which:
                try:
                    ray.kill(actor, no_restart=True)
                except Exception:
                    pass

    def stop(self, timeout: float = 30.0) -> None:
        """Flush and close every shard's store, then end the actors (for every driver)."""
        ray = _ray()
        try:
            ray.get([a.close.remote() for a in self.actors], timeout=timeout)
        except Exception:
            pass  # a shard that is away has nothing in memory to flush
        self.kill()


def existing_count(token: str) -> int | None:
    """The shard count of a store whose shards run (asked of shard 0), or None."""
    ray = _ray()
    try:
        actor = ray.get_actor(shard_name(token, 0), namespace=NAMESPACE)
        info = ray.get(actor.ping.remote(), timeout=PING_TIMEOUT)
    except (ValueError, VictorActorsError):
        return None
    except Exception:
        return None
    n = info.get("n") if isinstance(info, dict) else None
    return n if isinstance(n, int) else None
