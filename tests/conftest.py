from __future__ import annotations

from collections.abc import Iterator

import pytest

from victor_actors import GlobalStateManager

# The suite runs on three pytest-xdist workers (README's test command: ``-n 3 --dist loadgroup``).
# Each file's tests stay together on one worker (a module's fixtures, such as an owner process or a
# browser, start once), except the files whose tests are each a child process of their own (every
# docs block, every example), which spread over both workers. The tests that start Ray share one
# group: two Ray sessions at once on a 2-core machine only slow each other past their timeouts.
_RAY_FILES = ("test_ray", "test_simulate_ray", "test_bench_ray")
_SPREAD = ("test_docs.py", "test_examples.py")


def _group(item: pytest.Item) -> str | None:
    name = item.path.name
    if name.startswith(_RAY_FILES) or (name == "test_docs.py" and "docs/ray.md" in item.nodeid):
        return "ray"  # a docs block on docs/ray.md starts its own Ray session
    if name in _SPREAD:
        return None
    return name


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        group = _group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture
def manager() -> Iterator[GlobalStateManager]:
    m = GlobalStateManager.open()
    try:
        yield m
    finally:
        m.close()
