"""Every Python block in README.md and docs/ runs as written.

A block fenced as ```python runs in a fresh interpreter, in an empty temporary
directory (so paths it names are its own), and must exit 0 within a minute.
A block that is deliberately not a whole program is fenced as
```python fragment: it is still compiled, so it cannot rot into bad syntax.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```python([^\n]*)\n(.*?)^```", re.M | re.S)


def _blocks() -> list[tuple[str, str, bool]]:
    found = []
    for path in FILES:
        text = path.read_text()
        for match in FENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            fragment = "fragment" in match.group(1).split()
            found.append((f"{path.relative_to(ROOT)}:{line}", match.group(2), fragment))
    return found


BLOCKS = _blocks()


def test_the_docs_have_python_blocks() -> None:
    assert len(BLOCKS) >= 20


@pytest.mark.parametrize(("where", "code", "fragment"), BLOCKS, ids=[b[0] for b in BLOCKS])
def test_block_runs(where: str, code: str, fragment: bool, tmp_path: Path) -> None:
    compile(code, where, "exec")
    if fragment:
        return
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, f"{where} failed:\n{done.stderr[-3000:]}"
