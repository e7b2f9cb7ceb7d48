"""A testing kit for code built on victor_actors: a recorder, assertions, fault and observer hooks.

Its pytest plugin (``victor_actors.testing._plugin``, registered through the
``pytest11`` entry point) adds the fixtures:

- ``state_manager``: a :class:`GlobalStateManager` in memory, closed after the
  test. Mark a test ``@pytest.mark.victor_store`` to get one on an LMDB store
  in a temporary directory instead.
- ``recorder``: a :class:`Recorder` attached to ``state_manager``: every
  message each scope's actor received and every commit event it published,
  per scope, in order, and the callers' reads, writes and runs.
- ``victor_seed``: a seed for a simulation (``--victor-seed N``, else a new
  one per test, named in the report of a failing test).

Assertions, each raising ``AssertionError`` with a message listing every
problem found:

- :func:`assert_isolated`: with ``owners=`` (tokens planted per conversation,
  or an owner rule), no scope holds a value its owner does not allow, nested
  or as a substring, with the same verdict with or without a recorder;
  without owners, no message or key of one conversation shows up in
  another (by the recorder's provenance, or by value).
- :func:`assert_no_blind_writes`: no read-modify-write of a shared scope
  committed without ``expected_version``, ``modify`` or ``transact``;
- :func:`assert_run_left_nothing`: a run wrote nothing outside its tag and
  its rollback left nothing behind;
- :func:`assert_committed_together`: writes the test groups together were
  committed in one commit.
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

from victor_actors.testing._calls import ReadCall, RunMark, WriteCall
from victor_actors.testing._history import (
    Write,
    assert_committed_together,
    assert_no_blind_writes,
    assert_run_left_nothing,
)
from victor_actors.testing._hooks import Observer, inject_fault, set_observer
from victor_actors.testing._isolation import assert_isolated
from victor_actors.testing._kit import (
    Published,
    Received,
    Recorder,
    assert_commit_order,
    assert_no_partial_batch,
)

__all__ = [
    "Observer",
    "Published",
    "ReadCall",
    "Received",
    "Recorder",
    "RunMark",
    "Write",
    "WriteCall",
    "assert_commit_order",
    "assert_committed_together",
    "assert_isolated",
    "assert_no_blind_writes",
    "assert_no_partial_batch",
    "assert_run_left_nothing",
    "inject_fault",
    "set_observer",
]
