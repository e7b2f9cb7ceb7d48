from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES_DIR = Path(__file__).parent.parent / "examples"
# Example scripts run as programs; example test files (test_*.py) run under pytest; modules the
# scripts share (_*.py) are neither.
SCRIPTS = sorted(p for p in EXAMPLES_DIR.glob("*.py") if not p.name.startswith(("test_", "_")))
TEST_FILES = sorted(EXAMPLES_DIR.glob("test_*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_example_runs(script: Path) -> None:
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("test_file", TEST_FILES, ids=lambda p: p.name)
def test_example_test_file_passes(test_file: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", str(test_file), "-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
