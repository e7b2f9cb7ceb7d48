"""The two places a benchmark looks past the public surface, kept in this one file.

- :func:`is_live`: whether a scope's actor is running right now (``scale``
  splits requests that had to reactivate a passivated scope from those that
  found it live). ``manager.stats()`` has the totals, but it is O(scopes),
  too slow to call around each of 10,000 requests among 100,000 scopes.
- :func:`send_nowait`: send an apply request and return its pykka future
  without waiting (``pipeline`` measures sync pipelining with no asyncio, to
  split the event loop's wake-ups from the actor's own work). The public
  API pipelines only through ``aapply``.

Neither is public API; both read private attributes of :class:`ScopeHandle`.
``tests/test_bench.py`` checks that they still work, so a change inside the
handle breaks a test rather than a benchmark run.
"""

from __future__ import annotations

from typing import Any

from victor_actors import ScopeHandle, TransitionBatch

__all__ = ["is_live", "send_nowait"]


def is_live(handle: ScopeHandle) -> bool:
    """Whether ``handle``'s scope has a running actor (False: passivated, the next request reloads it)."""
    return handle.is_live


def send_nowait(handle: ScopeHandle, batch: TransitionBatch) -> Any:
    """Send ``batch`` to a single-scope handle's actor; its pykka future (``.get(timeout)``: the record)."""
    req, _wait, parts = handle._request(batch, None, None, None)
    if parts is not None:
        raise ValueError("send_nowait takes single-scope batches only")
    sent, future = handle._kernel._try_send(handle._cell, req, True)
    if not sent:
        raise RuntimeError(f"{handle.ref}: the request could not be sent")
    return future
