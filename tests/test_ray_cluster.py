"""Many drivers on a real multi-node Ray cluster: attach, share, die, reattach; a node removed.

One ``ray.cluster_utils.Cluster`` for the module: a head and two worker nodes on this box, all seeing
the same disk (which stands in for storage a restarted shard can reach: docs/ray.md says what that
takes on a real cluster). Drivers are real processes that join it through ``RAY_ADDRESS``, as a
second host's driver or a second uvicorn worker would. The test that removes a node runs last.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

from victor_actors import (  # noqa: E402
    ScopeAccessError,
    ScopeRef,
    StoreLockedError,
    TransitionBatch,
    TransitionValidationError,
)
from victor_actors.ray import RayStateManager, ShardUnavailableError  # noqa: E402

pytestmark = pytest.mark.timeout(180)

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

# A driver process: joins the cluster named by RAY_ADDRESS and attaches to the store's shards. Each
# line it prints is written with one write() call (a SIGKILL never leaves half a line).
DRIVER = r"""
import json, os, sys, time
from victor_actors import TransitionBatch
from victor_actors.ray import RayStateManager

def say(*parts):
    os.write(1, (" ".join(str(p) for p in parts) + "\n").encode())

cfg = json.loads(sys.argv[1])
m = RayStateManager.open(cfg["path"], shards=cfg["shards"])
me = cfg.get("me", 0)

if cfg["mode"] == "share":
    n = cfg["n"]
    found = m.get_conversation_state("s1")  # by its id alone: it was created under team t by another driver
    say("FOUND", json.dumps([str(found.ref), found.version, [str(r) for r in found.lineage], found.shard]))
    team = m.get_team_state("t")
    own = m.get_conversation_state(f"own-{me}", team_id=f"u{me}")
    for i in range(n):
        team.modify(lambda s: TransitionBatch().update_state("n", s.get_state("n", 0) + 1), retries=1000)
        m.get_conversation_state(f"c{i % 3}").add_message({"d": me, "i": i})
        own.modify(lambda s: TransitionBatch().add_message(i)
                   .update_state("g", s.get_state("g", 0) + 1, scope="global"), retries=1000)
    end = time.monotonic() + 60
    while team.get("n", 0) < cfg["total"] and time.monotonic() < end:
        time.sleep(0.05)  # polling the other drivers' progress; it orders nothing
    seen = {f"c{k}": [[x["d"], x["i"]] for x in m.get_conversation_state(f"c{k}").snapshot().messages]
            for k in range(3)}
    say("SEEN", json.dumps({"n": team.get("n"), "g": m.get_global_state().get("g"), "messages": seen}))

elif cfg["mode"] == "writer":  # until killed: a message per batch, a cross-shard +1 on global in every other
    conv = m.get_conversation_state("k", team_id="kt")
    i = 0
    while True:
        if i % 2:
            conv.modify(lambda s: TransitionBatch().add_message({"i": i, "g": 1})
                        .update_state("kg", s.get_state("kg", 0) + 1, scope="global"), retries=1000)
        else:
            conv.add_message({"i": i})
        say("ACK", i)
        i += 1

elif cfg["mode"] == "reattach":
    conv = m.get_conversation_state("k")
    conv.modify(lambda s: TransitionBatch().add_message({"i": -1, "g": 1})
                .update_state("kg", s.get_state("kg", 0) + 1, scope="global"), retries=1000)
    snap = conv.snapshot()
    say("STATE", json.dumps({"messages": [dict(x) for x in snap.messages], "kg": snap.get_state("kg")}))

elif cfg["mode"] == "resume":  # after a node went away: writes again where it left off
    convs = [m.get_conversation_state(name) for name in cfg["names"]]
    for h in convs:
        h.add_message("from the other driver")
    say("RESUMED", json.dumps([h.version for h in convs]))
m.close()
say("CLOSED")
"""


def _driver(address: str, **cfg: Any) -> subprocess.Popen[str]:
    env = {**os.environ, "RAY_ADDRESS": address}
    return subprocess.Popen(
        [sys.executable, "-c", DRIVER, json.dumps(cfg)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _lines(proc: subprocess.Popen[str], timeout: float = 150) -> dict[str, Any]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    found: dict[str, Any] = {}
    for line in out.splitlines():
        tag, _, rest = line.partition(" ")
        found[tag] = json.loads(rest) if rest.startswith(("[", "{")) else rest
    return found


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
    workers = [c.add_node(num_cpus=1) for _ in range(2)]
    ray.init(address=c.address, log_to_driver=False)
    c.wait_for_nodes()
    # the scheduler may not list the new nodes yet: a soft affinity would then fall back to the head
    while sum(1 for n in ray.nodes() if n["Alive"]) < 3:
        time.sleep(0.05)  # polling a condition of the cluster; it orders nothing of ours
    for worker in workers:
        strict = NodeAffinitySchedulingStrategy(worker.node_id, soft=False)
        probe = _Probe.options(scheduling_strategy=strict).remote()  # actors are placed by the GCS
        ray.get(probe.node.remote(), timeout=60)
        ray.kill(probe)
    yield c, workers
    ray.shutdown()
    c.shutdown()


@pytest.fixture(scope="module")
def pair(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any, Any]]:
    """One store's shards with two drivers of them, for the tests that only need two drivers (each uses
    scope ids of its own): starting a store's shards is what a test here spends most on."""
    path = str(tmp_path_factory.mktemp("pair") / "store")
    a = RayStateManager.open(path, shards=2)
    b = RayStateManager.open(path, shards=2)  # another driver of the same shards (here in this process)
    yield path, a, b
    a.close()
    b.shutdown()


def _on_nodes(c: Any, workers: list[Any]) -> dict[int, dict[str, Any]]:
    nodes = [c.head_node.node_id, *(w.node_id for w in workers)]
    return {
        n: {"scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False)}
        for n, node in enumerate(nodes)
    }


def test_three_drivers_on_three_nodes_share_one_store(cluster: Any, tmp_path: Path) -> None:
    """Three driver processes attach to the shards of one store (one shard per node) and write the same
    team counter, the same conversations and the global scope: no lost update, no partial batch, no
    message lost or doubled, each driver reads the others' commits, and a conversation another driver
    created under its team is found by its id alone. Before issue 24 the second driver was refused
    (ActorAlreadyExistsError): shards were named but not attached to."""
    c, workers = cluster
    path, n = str(tmp_path / "store"), 12
    m = RayStateManager.open(path, shards=3, shard_options=_on_nodes(c, workers))
    try:
        assert len({_node(m.shard_actor(k)) for k in range(3)}) == 3  # one shard per node
        s1 = m.get_conversation_state("s1", team_id="t")
        s1.add_message("created with its team")
        for k in range(3):
            m.get_conversation_state(f"c{k}", team_id="t")
        drivers = [
            _driver(c.address, path=path, shards=3, mode="share", me=d, n=n, total=3 * n) for d in range(3)
        ]
        outs = [_lines(p) for p in drivers]
        for out in outs:
            assert out["FOUND"] == [str(s1.ref), 1, ["team:t", "global:global"], s1.shard]
            assert "CLOSED" in out
        assert m.get_team_state("t").get("n") == 3 * n  # no lost update
        assert m.get_global_state().get("g") == 3 * n  # every cross-shard batch, once
        for d in range(3):  # ... and its message with it, once each (no partial batch)
            assert list(m.get_conversation_state(f"own-{d}").snapshot().messages) == list(range(n))
        for k in range(3):
            got = sorted(tuple(x.values()) for x in m.get_conversation_state(f"c{k}").snapshot().messages)
            want = sorted((d, i) for d in range(3) for i in range(n) if i % 3 == k)
            assert got == want
        for out in outs:  # every driver read the others' commits
            seen = out["SEEN"]
            assert seen["n"] == 3 * n and seen["g"] >= 2 * n
            assert sum(len(v) for v in seen["messages"].values()) == 3 * n
    finally:
        m.shutdown()


def test_a_driver_killed_mid_way_changes_nothing_for_the_others_and_reattaches(
    cluster: Any, tmp_path: Path
) -> None:
    """A driver process is SIGKILLed in the middle of a stream of plain and cross-shard batches: the
    shards and this driver carry on, a batch it left half-way is resolved by the shards (presumed
    abort, or committed where global's home decided it), every batch it was told of is there once,
    and a new driver process attaches to the same shards and sees it all."""
    c, _workers = cluster
    path = str(tmp_path / "store")
    m = RayStateManager.open(path, shards=2, hold_timeout=2.0)
    try:
        conv = m.get_conversation_state("k", team_id="kt")
        writer = _driver(c.address, path=path, shards=2, mode="writer")
        assert writer.stdout is not None
        acked = []
        for line in writer.stdout:
            acked.append(int(line.split()[1]))
            if len(acked) == 10:
                break
        writer.send_signal(signal.SIGKILL)
        writer.wait(30)
        for j in range(3):  # the others carry on
            conv.modify(
                lambda s, j=j: (
                    TransitionBatch()
                    .add_message({"i": 1000 + j, "g": 1})
                    .update_state("kg", s.get_state("kg", 0) + 1, scope="global")
                ),
                retries=1000,
            )
        m.settle(60)  # a part the dead driver left prepared is resolved with home
        messages = [dict(x) for x in conv.snapshot().messages]
        seqs = [x["i"] for x in messages]
        assert len(seqs) == len(set(seqs)), "a batch applied twice"
        assert set(acked) <= set(seqs), "an acknowledged batch was lost"
        kg = m.get_global_state().get("kg")
        assert kg == sum(1 for x in messages if "g" in x), "half a cross-shard batch"
        out = _lines(_driver(c.address, path=path, shards=2, mode="reattach"))["STATE"]
        assert [x["i"] for x in out["messages"]] == [*seqs, -1] and out["kg"] == kg + 1
        assert m.stats()["shard_held"] == 0
    finally:
        m.shutdown()


def test_uvicorn_workers_each_connected_to_the_same_shards(cluster: Any, tmp_path: Path) -> None:
    """``uvicorn --workers 3`` in front of Ray shards: examples/deploy_fastapi.py unchanged, each worker
    connected with ``victor_actors.connect("victor-ray:///...")``. Every session is complete and in
    order, a read right after a write (on whichever worker) sees it, and the team counter every worker
    bumps loses no update."""
    c, _workers = cluster
    sys.path.insert(0, str(EXAMPLES))
    try:
        import deploy_fastapi
    finally:
        sys.path.remove(str(EXAMPLES))
    path = str(tmp_path / "store")
    m = RayStateManager.open(path, shards=2)
    uds = str(tmp_path / "web.sock")
    url = f"victor-ray://{path}?shards=2&address={c.address}"
    web = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "deploy_fastapi:app", "--workers", "3", "--uds", uds,
         "--log-level", "warning"],
        cwd=EXAMPLES,
        env={**os.environ, "VICTOR_ACTORS_URL": url},
    )  # fmt: skip
    try:
        deploy_fastapi.wait_until_serving(uds, timeout=120)
        errors: list[str] = []
        pids: set[int] = set()

        def client(n: int) -> None:
            try:
                for i in range(6):
                    wrote = deploy_fastapi.request(uds, "POST", f"/sessions/s{n}/messages", {"content": i})
                    read = deploy_fastapi.request(uds, "GET", f"/sessions/s{n}")
                    pids.update((wrote["pid"], read["pid"]))
                    if read["version"] < wrote["version"] or read["messages"][-1]["content"] != i:
                        errors.append(f"s{n}: a read after write {i} saw {read['version']}")
                    pids.add(deploy_fastapi.request(uds, "POST", "/teams/red/count")["pid"])
            except Exception as exc:
                errors.append(f"s{n}: {type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=client, args=(n,)) for n in range(9)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors[:5]
        assert len(pids) == 3, f"served by {len(pids)} workers"
        for n in range(9):
            messages = m.get_conversation_state(f"s{n}").snapshot().messages
            assert [x["content"] for x in messages] == list(range(6)), n
        assert m.get_team_state("red").get("count") == 9 * 6
    finally:
        web.terminate()
        web.wait(30)
        m.shutdown()


def _tool_results(m: RayStateManager, ref: str, count: int) -> list[Any]:
    """The TOOL_RESULT messages of ``ref`` once ``count`` have landed (read by the driver, 60 s at most)."""
    conv = m.scope(ref)
    end = time.monotonic() + 60
    while True:
        found = [dict(x) for x in conv.snapshot().messages if isinstance(x, dict) or hasattr(x, "get")]
        found = [x for x in found if x.get("role") == "tool"]
        if len(found) >= count or time.monotonic() > end:
            return found
        time.sleep(0.05)  # polling a shard's state from the driver; it orders nothing


def test_a_tool_call_goes_to_a_driver_that_registered_the_tool(pair: tuple[str, Any, Any]) -> None:
    """Regression (issue 24, item 3): a shard handed each tool call to whichever driver polled first,
    and a driver without the tool recorded ``LookupError`` as its result. Now a call goes only to a
    driver that registered the tool; when that driver leaves, the call waits for another one; when
    none comes within the tool's timeout, it is answered with ``ToolUnavailableError``. (On main the
    second driver could not even attach.)"""
    path, _, b = pair
    a = RayStateManager.open(path, shards=2)  # a driver of its own, which leaves half-way
    try:
        ran: list[str] = []
        a.register_tool("lookup", lambda call: (ran.append(call.request_id), {"q": call.arguments["q"]})[1])
        b.register_tool("other", lambda call: "never called")  # b polls every shard for tool calls too
        conv = b.get_conversation_state("tools", team_id="t")
        for i in range(6):
            conv.apply(TransitionBatch().execute_tool("lookup", {"q": i}, request_id=f"r{i}"))
        results = _tool_results(b, "conversation:tools", 6)
        assert [x["error"] for x in results] == [None] * 6
        assert sorted(x["content"]["q"] for x in results) == list(range(6)) and sorted(ran) == sorted(
            f"r{i}" for i in range(6)
        )
        a.close()  # a leaves: a call for its tool waits for a driver that registers it
        conv.apply(TransitionBatch().execute_tool("lookup", {"q": 7}, request_id="late"))
        c = RayStateManager.open(path, shards=2)
        c.register_tool("lookup", lambda call: {"q": call.arguments["q"], "by": "c"}, timeout=1.0)
        late = _tool_results(b, "conversation:tools", 7)[-1]
        assert late["error"] is None and late["content"] == {"q": 7, "by": "c"}
        c.close()  # and with nobody to take it, the call is answered (typed), within the tool's timeout
        conv.apply(TransitionBatch().execute_tool("lookup", {"q": 8}, request_id="orphan"))
        orphan = _tool_results(b, "conversation:tools", 8)[-1]
        assert orphan["error"].startswith("ToolUnavailableError: no client that registered tool 'lookup'")
        assert not conv.snapshot().pending_tool_requests
    finally:
        a.close()


def test_events_reach_every_driver_in_commit_order(pair: tuple[str, Any, Any]) -> None:
    """Two drivers subscribe to one conversation and both write to it: each sees every commit once,
    in order, whoever made it."""
    _, a, b = pair
    conv_a = a.get_conversation_state("ev", team_id="t")
    conv_b = b.get_conversation_state("ev")  # by its id alone
    seen: dict[str, list[int]] = {"a": [], "b": []}
    done = {k: threading.Event() for k in seen}

    def on(key: str) -> Any:
        def callback(event: Any) -> None:
            seen[key].append(event.new_version)
            if event.new_version == 10:
                done[key].set()

        return callback

    subs = [conv_a.subscribe(on("a")), conv_b.subscribe(on("b"))]
    for i in range(10):
        (conv_a if i % 2 else conv_b).add_message(i)
    assert done["a"].wait(60) and done["b"].wait(60)
    for sub in subs:
        sub.close()
    assert seen == {"a": list(range(1, 11)), "b": list(range(1, 11))}
    assert list(conv_a.snapshot().messages) == list(range(10))


def test_a_scope_is_found_by_its_id_alone_and_never_split(pair: tuple[str, Any, Any]) -> None:
    """Regression (issue 24, item 2): opening a conversation by its id alone, without its team, silently
    created a second, empty conversation with the same id on another shard. Failed before the fix
    (version 0, another shard). Now the directory finds it; creating it under another parent is
    refused as it is locally; two drivers creating one id under two teams at once: one wins, the
    other is refused, and both then find the winner's."""
    _, a, b = pair
    created = a.get_conversation_state("s1", team_id="t")
    created.add_message("hi")
    for m in (a, b):
        found = m.get_conversation_state("s1")
        assert (found.ref, found.lineage, found.shard, found.version) == (
            created.ref,
            created.lineage,
            created.shard,
            1,
        )
    with pytest.raises(ScopeAccessError, match="already exists under team:t, not under team:u"):
        b.get_conversation_state("s1", team_id="u")
    wf = a.get_conversation_state("s2", workflow_id="w", team_id="t")
    assert b.get_workflow_state("w").lineage == (ScopeRef("team", "t"), ScopeRef("global", "global"))
    assert b.get_conversation_state("s2", workflow_id="w").address == wf.address
    with pytest.raises(ScopeAccessError):
        b.get_conversation_state("never", create=False)
    for round_ in range(5):  # the same id under two teams from two drivers at once
        barrier = threading.Barrier(2)
        outcome: dict[str, Any] = {}

        def make(m: RayStateManager, team: str, name: str, barrier: Any, outcome: dict[str, Any]) -> None:
            barrier.wait()
            try:
                outcome[team] = m.get_conversation_state(name, team_id=team).address
            except ScopeAccessError as exc:
                outcome[team] = exc

        threads = [
            threading.Thread(target=make, args=(m, t, f"race{round_}", barrier, outcome))
            for m, t in ((a, "ta"), (b, "tb"))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        won = [v for v in outcome.values() if isinstance(v, tuple)]
        assert len(won) == 1, outcome
        for m in (a, b):
            assert m.get_conversation_state(f"race{round_}").address == won[0]


def test_shutdown_stops_the_shards_for_every_driver(cluster: Any, tmp_path: Path) -> None:
    """``close()`` detaches one driver (the shards and the other drivers carry on); ``shutdown()``
    flushes and stops the shards for everyone, and a path is then opened afresh from its stores."""
    path = str(tmp_path / "store")
    a = RayStateManager.open(path, shards=2)
    b = RayStateManager.open(path, shards=2, request_timeout=2.0)
    conv = b.get_conversation_state("kept", team_id="t")
    conv.add_message("before")
    b.close()  # detached: the shards carry on for a
    assert a.get_conversation_state("kept").version == 1
    c = RayStateManager.open(path, shards=2, request_timeout=2.0)
    names = [f"victor-actors-{a._found.token}-shard-{n}" for n in range(2)]
    a.shutdown()
    for name in names:
        with pytest.raises(ValueError):
            ray.get_actor(name, namespace="victor_actors")
    with pytest.raises(ShardUnavailableError) as info:
        c.get_conversation_state("kept").add_message("after")
    assert not info.value.may_have_applied
    c.close()
    d = RayStateManager.open(path, shards=2)  # new shards, from the stores
    assert list(d.get_conversation_state("kept").snapshot().messages) == ["before"]
    d.shutdown()


def test_a_shard_refuses_a_store_another_live_shard_holds(pair: tuple[str, Any, Any]) -> None:
    """Two sets of shards for one path (as two Ray clusters given the same path would start): the
    second is refused with ``StoreLockedError`` naming the holder, and starts nothing."""
    from victor_actors.ray._cluster import Shards

    path, a, _ = pair
    a.get_conversation_state("x").add_message("held")
    holder = ray.get(a.shard_actor(0).ping.remote())["pid"]
    with pytest.raises(StoreLockedError, match=f"held by another live shard \\(pid {holder} on"):
        Shards.attach(path, 2, "an-intruder", {}, max_restarts=0, shard_options=None)
    for n in range(2):
        with pytest.raises(ValueError):  # the refused shards were not left running
            ray.get_actor(f"victor-actors-an-intruder-shard-{n}", namespace="victor_actors")
    assert list(a.get_conversation_state("x").snapshot().messages) == ["held"]


def test_connect_takes_a_ray_target(pair: tuple[str, Any, Any]) -> None:
    """``victor_actors.connect`` with ``victor-ray://`` (not Ray Client's ``ray://``): a driver of the
    store's shards; malformed targets are refused with a typed error before anything starts."""
    import victor_actors

    path, a, _ = pair
    a.get_team_state("t").set("k", 1)
    with victor_actors.connect(f"victor-ray://{path}?shards=2", request_timeout=10) as client:
        assert isinstance(client, RayStateManager) and client.shards == 2
        assert client.get_team_state("t").get("k") == 1
    with victor_actors.connect(f"victor-ray://{path}") as client:  # the count of the running shards
        assert client.shards == 2
    for bad in (
        "victor-ray://relative/path",
        f"victor-ray://{path}?shards=0",
        f"victor-ray://{path}?x=1",
    ):
        with pytest.raises(TransitionValidationError):
            victor_actors.connect(bad)
    with pytest.raises(TransitionValidationError, match="token_file"):
        victor_actors.connect(f"victor-ray://{path}", token_file="/dev/null")


def test_a_shard_on_a_removed_node_restarts_elsewhere_and_drivers_resume(
    cluster: Any, tmp_path: Path
) -> None:
    """A node is removed (runs last: the module's cluster loses it): its shard restarts on another node
    with its state, and both this driver and another driver process resume writing where they were."""
    c, workers = cluster
    gone = workers[1]
    path = str(tmp_path / "cluster")
    on_gone = NodeAffinitySchedulingStrategy(gone.node_id, soft=True)
    m = RayStateManager.open(path, shards=2, shard_options={1: {"scheduling_strategy": on_gone}})
    try:
        actor = m.shard_actor(1)
        for _ in range(40):  # a soft affinity may still pick another node at first: restart until it holds
            if _node(actor) == gone.node_id:
                break
            ray.kill(actor, no_restart=False)
        assert _node(actor) == gone.node_id
        convs = [m.get_conversation_state(f"n{i}") for i in range(40)]
        mine = [h for h in convs if h.shard == 1][:5]
        for i, h in enumerate(mine):
            h.update({"k": i})
            h.add_message(f"before {i}")
        c.remove_node(gone)
        for i, h in enumerate(mine):  # served again once the shard is back, on another node
            h.add_message(f"after {i}")
        assert _node(actor) != gone.node_id
        out = _lines(_driver(c.address, path=path, shards=2, mode="resume", names=[h.ref.id for h in mine]))
        assert out["RESUMED"] == [4] * len(mine)
        for i, h in enumerate(mine):
            snap = h.snapshot()
            assert snap.get_state("k") == i
            assert list(snap.messages) == [f"before {i}", f"after {i}", "from the other driver"]
    finally:
        m.shutdown()
