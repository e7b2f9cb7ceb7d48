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
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# A fence may be indented (a block inside a list item): the block is dedented by the fence's indent.
FENCE = re.compile(r"^([ \t]*)```python([^\n]*)\n(.*?)^\1```", re.M | re.S)


def _blocks() -> list[tuple[str, str, bool]]:
    found = []
    for path in FILES:
        text = path.read_text()
        for match in FENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            indent, info, body = match.groups()
            code = textwrap.dedent(body) if indent else body
            fragment = "fragment" in info.split()
            found.append((f"{path.relative_to(ROOT)}:{line}", code, fragment))
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
