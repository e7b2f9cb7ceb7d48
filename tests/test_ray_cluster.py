"""A shard on a node that is removed restarts on the other node and reopens its store.

Two Ray nodes on one box (``ray.cluster_utils.Cluster``): both see the same disk, which stands in for
storage the restarted shard can reach on a real cluster (docs/ray.md says what that takes).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

from victor_actors.ray import RayStateManager  # noqa: E402

pytestmark = pytest.mark.timeout(120)


class _Probe:
    def node(self) -> str:
        return str(ray.get_runtime_context().get_node_id())


_Probe = ray.remote(num_cpus=0)(_Probe)  # type: ignore[misc]


def _node(actor: Any) -> str:
    """The node a shard runs on, once it answers (it may be restarting)."""
    for _ in range(100):
        try:
            return str(ray.get(actor.node.remote(), timeout=30))
        except (ray.exceptions.ActorUnavailableError, ray.exceptions.RayActorError):
            time.sleep(0.1)  # the actor is restarting; ask again
    raise AssertionError("the shard never answered")


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    worker = c.add_node(num_cpus=1)
    ray.init(address=c.address, log_to_driver=False)
    c.wait_for_nodes()
    # the scheduler may not list the new node yet: a soft affinity would then fall back to the head
    while sum(1 for n in ray.nodes() if n["Alive"]) < 2 or "CPU" not in ray.available_resources():
        time.sleep(0.05)  # polling a condition of the cluster; it orders nothing of ours
    strict = NodeAffinitySchedulingStrategy(worker.node_id, soft=False)
    probe = _Probe.options(scheduling_strategy=strict).remote()  # actors are placed by the GCS
    ray.get(probe.node.remote(), timeout=60)
    ray.kill(probe)
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
        for _ in range(10):  # a soft affinity may still pick the head at first: restart until it holds
            if _node(actor) == worker.node_id:
                break
            ray.kill(actor, no_restart=False)
        assert _node(actor) == worker.node_id
        convs = [m.get_conversation_state(f"n{i}") for i in range(40)]
        mine = [h for h in convs if h.shard == 1][:5]
        for i, h in enumerate(mine):
            h.update({"k": i})
            h.add_message(f"before {i}")
        c.remove_node(worker)
        for i, h in enumerate(mine):  # served again once the shard is back, on the head node
            h.add_message(f"after {i}")
        assert _node(actor) != worker.node_id
        for i, h in enumerate(mine):
            snap = h.snapshot()
            assert snap.get_state("k") == i
            assert list(snap.messages) == [f"before {i}", f"after {i}"]
