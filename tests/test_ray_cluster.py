"""A shard on a node that is removed restarts on the other node and reopens its store.

Two Ray nodes on one box (``ray.cluster_utils.Cluster``): both see the same disk, which stands in for
storage the restarted shard can reach on a real cluster (docs/ray.md says what that takes).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

from victor_actors.ray import RayStateManager  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    worker = c.add_node(num_cpus=1)
    ray.init(address=c.address, log_to_driver=False)
    c.wait_for_nodes()
    yield c, worker
    ray.shutdown()
    c.shutdown()


def test_a_shard_on_a_removed_node_restarts_elsewhere_with_its_state(cluster: Any, tmp_path: Path) -> None:
    c, worker = cluster
    on_worker = NodeAffinitySchedulingStrategy(worker.node_id, soft=True)
    with RayStateManager.open(
        tmp_path / "cluster", shards=2, shard_options={1: {"scheduling_strategy": on_worker}}
    ) as m:
        actor = m.shard_actor(1)
        assert ray.get(actor.node.remote()) == worker.node_id
        convs = [m.get_conversation_state(f"n{i}") for i in range(40)]
        mine = [h for h in convs if h.shard == 1][:5]
        for i, h in enumerate(mine):
            h.update({"k": i})
            h.add_message(f"before {i}")
        c.remove_node(worker)
        for i, h in enumerate(mine):  # served again once the shard is back, on the head node
            h.add_message(f"after {i}")
        assert ray.get(actor.node.remote()) != worker.node_id
        for i, h in enumerate(mine):
            snap = h.snapshot()
            assert snap.get_state("k") == i
            assert list(snap.messages) == [f"before {i}", f"after {i}"]
