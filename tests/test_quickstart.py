"""README's test command is what CI runs, and it installs what the suite needs on a fresh machine.

Issue 29, item 1: the command in README's Quick start did not install the browser the web
inspector's tests drive (only ``.ci/run`` did, before running the command), so on a fresh machine
it was red. Now the command's first step is ``scripts/install_browser.sh``, and ``.ci/run`` runs
the command verbatim.
"""

from __future__ import annotations

import itertools
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "install_browser.sh"


def _readme_test_command() -> str:
    text = (ROOT / "README.md").read_text()
    quick = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", quick, re.S)
    assert block, "README's Quick start has no bash block"
    lines = block.group(1).splitlines()
    for comment, command in itertools.pairwise(lines):
        if comment.startswith("# run the whole test suite"):
            return command
    raise AssertionError("README's Quick start has no '# run the whole test suite' command")


def test_ci_runs_readmes_test_command_verbatim() -> None:
    command = _readme_test_command()
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert command in ci, f"{command!r} is not a line of .ci/run"
    assert "pytest" in command and "'.[test]'" in command


def test_the_test_command_installs_the_browser_first() -> None:
    command = _readme_test_command()
    assert command.startswith("bash scripts/install_browser.sh && ")
    assert SCRIPT.is_file()
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0
    script = SCRIPT.read_text()
    for needed in ("/usr/bin/chromium", "/usr/bin/chromedriver", "apt-get", "chromium chromium-driver"):
        assert needed in script
    # the path tests/test_web.py drives
    web = (ROOT / "tests" / "test_web.py").read_text()
    assert 'CHROMIUM = "/usr/bin/chromium"' in web and 'CHROMEDRIVER = "/usr/bin/chromedriver"' in web


def test_with_the_browser_there_the_script_does_nothing() -> None:
    """On a machine that has both (this one: the browser tests need them), it exits 0 quietly."""
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "" and done.stderr == ""
