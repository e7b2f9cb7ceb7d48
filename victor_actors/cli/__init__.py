"""The ``victor-actors`` command line: read-only views of an LMDB store, the simulator, the benchmarks.

Every view (``inspect``, ``history``, ``show``, ``diff``, ``export``) opens the
store with ``GlobalStateManager.open(path, read_only=True)``, so it works while
another process owns the store for writing. Errors print one line to stderr
and exit with status 2. ``simulate`` (:mod:`victor_actors.sim`) and ``bench``
(:mod:`victor_actors.bench`) are commands of their own. See ``docs/cli.md``.

- ``_main``: the parser and :func:`main`, the console script's entry point;
- ``_commands``: the views; ``_format``: how they write values, times and commits.
"""

from __future__ import annotations

from victor_actors.cli._main import main

__all__ = ["main"]
