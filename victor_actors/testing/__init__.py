"""A testing kit for code built on victor_actors: a recorder, assertions, fault and observer hooks.

Its pytest plugin (``victor_actors.testing._plugin``, registered through the
``pytest11`` entry point) adds the fixtures:

- ``state_manager``: a :class:`GlobalStateManager` in memory, closed after the
  test. Mark a test ``@pytest.mark.victor_store`` to get one on an LMDB store
  in a temporary directory instead.
- ``recorder``: a :class:`Recorder` attached to ``state_manager``: every
  message each scope's actor received and every commit event it published,
  per scope, in order.

Assertions, each raising ``AssertionError`` with a message listing every
problem found:

- :func:`assert_isolated`: no message or key of one conversation shows up in
  another; every message and key a conversation holds came from a request
  sent to that conversation.
- :func:`assert_no_partial_batch`: every commit reflects the whole of its
  request (or of its part of a cross-scope batch), and a cross-scope commit
  was published by every scope it committed in, or by none.
- :func:`assert_commit_order`: each scope's events have strictly consecutive
  versions and no duplicates.

Hooks for tests and simulations (not for production code):

- :func:`inject_fault`: make a scope's actor fail (or run a callable) on its
  next request;
- :func:`set_observer`: watch every message and commit of every scope actor.

This package imports no pytest; see ``docs/testing.md``.
"""

from __future__ import annotations

from victor_actors.testing._hooks import Observer, inject_fault, set_observer
from victor_actors.testing._kit import (
    Published,
    Received,
    Recorder,
    assert_commit_order,
    assert_isolated,
    assert_no_partial_batch,
)

__all__ = [
    "Observer",
    "Published",
    "Received",
    "Recorder",
    "assert_commit_order",
    "assert_isolated",
    "assert_no_partial_batch",
    "inject_fault",
    "set_observer",
]
