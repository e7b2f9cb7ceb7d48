from __future__ import annotations

from collections.abc import Iterator

import pytest

from victor_actors import GlobalStateManager

# The suite runs on two pytest-xdist workers (README's test command). Tests that start a Ray
# session or cluster share one group, so that one worker runs them one after another: two Ray
# sessions at once on a 2-core machine only slow each other down past their timeouts.
_RAY_FILES = ("test_ray", "test_simulate_ray", "test_bench_ray")


def _starts_ray(item: pytest.Item) -> bool:
    name = item.path.name
    if name.startswith(_RAY_FILES):
        return True
    # a docs block on docs/ray.md starts its own Ray session
    return name == "test_docs.py" and "docs/ray.md" in item.nodeid


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _starts_ray(item):
            item.add_marker(pytest.mark.xdist_group("ray"))


@pytest.fixture
def manager() -> Iterator[GlobalStateManager]:
    m = GlobalStateManager.open()
    try:
        yield m
    finally:
        m.close()
