"""What the example scripts share: checks that survive ``python -O``, and the exit status they make.

Not an example itself. ``python examples/NAME.py`` puts this folder on ``sys.path``, so the scripts
import it as ``_checks``; copy it along with a script you take elsewhere.
"""

from __future__ import annotations

FAILURES: list[str] = []


def check(condition: bool, what: str) -> None:
    """Record a failed check (an assert would vanish under ``python -O``)."""
    if not condition:
        FAILURES.append(what)
        print(f"CHECK FAILED: {what}")


def verdict() -> int:
    """Say whether every check held; the script's exit status (0 if so)."""
    print("all checks passed" if not FAILURES else f"{len(FAILURES)} CHECKS FAILED")
    return 0 if not FAILURES else 1
