"""``python -m victor_actors``: the command line (see ``docs/cli.md``)."""

from __future__ import annotations

from victor_actors.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
