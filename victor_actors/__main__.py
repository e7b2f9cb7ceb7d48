"""``python -m victor_actors``: the read-only command line (see ``docs/cli.md``)."""

from __future__ import annotations

from victor_actors._cli import main

if __name__ == "__main__":
    raise SystemExit(main())
