"""Where the numbers come from (machine, Python, packages, load, commit), and where a report goes."""

from __future__ import annotations

import os
import platform
import subprocess
import tempfile
from datetime import datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

__all__ = ["PACKAGES", "default_out", "git_commit", "load_average", "machine", "source_checkout"]

PACKAGES = (
    "victor-actors",
    "pykka",
    "immutables",
    "lmdb",
    "msgpack",
    "zstandard",
    "langgraph",
    "langgraph-checkpoint",
    "langgraph-checkpoint-sqlite",
    "matplotlib",
)


def source_checkout() -> Path | None:
    """The source checkout the running package comes from (an editable install), or None."""
    import victor_actors

    root = Path(victor_actors.__file__).resolve().parent.parent
    return root if (root / ".git").exists() and (root / "pyproject.toml").is_file() else None


def default_out(json_file: str | Path) -> Path:
    """Where a report of ``json_file`` goes without ``--out``: ``<stem>-report/`` beside it, or under
    the temporary directory when beside it is inside the source checkout."""
    path = Path(json_file).resolve()
    out = path.parent / f"{path.stem}-report"
    checkout = source_checkout()
    if checkout is not None and out.is_relative_to(checkout.resolve()):
        out = Path(tempfile.gettempdir()) / "victor-actors-bench" / f"{path.stem}-report"
    return out


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _memory_bytes() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def git_commit(root: Path) -> str | None:
    try:
        proc = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, timeout=10, check=False,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def machine() -> dict[str, Any]:
    """What the report needs to say where the numbers come from."""
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = None
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count() or 0
    return {
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpu_model": _cpu_model(),
        "cpus": os.cpu_count(),
        "cpus_usable": usable,
        "memory_bytes": _memory_bytes(),
        "platform": platform.platform(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "packages": versions,
        "load_average_start": load_average(),
    }
