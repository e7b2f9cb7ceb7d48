"""``victor_actors.connect("victor-ray:///path/to/store?shards=4")``: a Ray target as a URL.

The scheme is ``victor-ray``, so that it never clashes with Ray Client's own
``ray://host:10001`` (which may be given as the cluster's ``address``)::

    victor-ray:///var/lib/agents                      # the shards of that store, on this process's Ray
    victor-ray:///var/lib/agents?shards=4             # ... started with 4 shards if none run yet
    victor-ray:///var/lib/agents?address=auto         # ... on the running cluster (`ray start`)
    victor-ray:///var/lib/agents?address=ray://head:10001

The path is the store's, absolute, exactly as every driver names it (it
names the shards). Connecting attaches to the shards that run for it and
starts the missing ones, as ``RayStateManager.open`` does.
"""

from __future__ import annotations

import time
import urllib.parse
from typing import Any

from victor_actors._errors import DeadlineExceededError, TransitionValidationError, VictorActorsError
from victor_actors.ray._wire import ShardUnavailableError

__all__ = ["SCHEME", "connect_ray", "is_ray_target", "parse_target"]

SCHEME = "victor-ray"
_PARAMS = frozenset({"shards", "address"})


def is_ray_target(url: Any) -> bool:
    return isinstance(url, str) and url.lower().startswith(SCHEME + ":")


def parse_target(url: str) -> tuple[str, int | None, str | None]:
    """``(path, shards or None, Ray address or None)`` from a ``victor-ray://`` URL.

    Raises:
        TransitionValidationError: the URL is not one (relative path, unknown parameter, a bad count).
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme.lower() != SCHEME:
        raise TransitionValidationError(f"{url!r:.200} is not a {SCHEME}:// URL")
    if parts.netloc or not parts.path.startswith("/"):
        raise TransitionValidationError(
            f"{url!r:.200} names no absolute store path: write {SCHEME}:///var/lib/agents (three slashes)"
        )
    query = urllib.parse.parse_qs(parts.query, keep_blank_values=True, strict_parsing=False)
    unknown = sorted(set(query) - _PARAMS)
    if unknown:
        raise TransitionValidationError(
            f"{url!r:.200}: unknown parameter(s) {unknown}; known: {sorted(_PARAMS)}"
        )
    shards: int | None = None
    if "shards" in query:
        raw = query["shards"][-1]
        if not raw.isdigit() or int(raw) < 1:
            raise TransitionValidationError(f"{url!r:.200}: shards is a positive int, not {raw!r}")
        shards = int(raw)
    address = query["address"][-1] if "address" in query else None
    return urllib.parse.unquote(parts.path), shards, address or None


def connect_ray(url: str, *, token_file: Any = None, request_timeout: float = 30.0, wait: float = 0.0) -> Any:
    """A :class:`RayStateManager` attached to the shards ``url`` names (see the module's docs).

    ``wait`` seconds: keep trying while the shards cannot be reached (a worker starting while the
    cluster comes up).

    Raises:
        TransitionValidationError: the URL is malformed, or ``token_file`` was given (Ray has its own).
        ScopeAccessError, StoreLockedError, ShardUnavailableError: as ``RayStateManager.open``.
    """
    path, shards, address = parse_target(url)
    if token_file is not None:
        raise TransitionValidationError(
            "token_file is for owners reached over sockets; a Ray cluster authenticates its drivers itself"
        )
    from victor_actors.ray._driver import RayStateManager

    end = time.monotonic() + max(float(wait), 0.0)
    while True:
        try:
            return RayStateManager.open(path, shards, address=address, request_timeout=request_timeout)
        except (ShardUnavailableError, DeadlineExceededError) as exc:
            if time.monotonic() >= end or not isinstance(exc, VictorActorsError):
                raise
            time.sleep(0.2)  # polling a cluster's start-up; nothing is ordered by it
