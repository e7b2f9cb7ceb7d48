"""Scopes sharded over Ray: remote apply, pipelined throughput, and the costs a paper model needs.

    python -m victor_actors.bench.ray [--quick] [--json FILE]

Issues 17 and 24's benchmark, in one Ray session (``ray.init(num_cpus=2,
include_dashboard=False)``), every figure against a baseline in the same run:

- remote ``apply`` p50 and p99 from the driver, one request at a time, on a
  2-shard in-memory manager, against a bare async Ray actor whose method takes
  bytes the size of our encoded request and returns bytes the size of our
  encoded reply (the request and reply are sized with ``victor_actors.ray._wire``);
- pipelined ``aapply`` from one asyncio driver (10,000 one-message commits over
  100 conversations, 2,000 in flight) to 2 shards and to 1 shard, in memory,
  against the bare actor fed one call carrying 1,000 requests at a time;
- cross-shard batches that write global (issue 24): one at a time, then 50
  conversations at once, with the CPU per batch in the driver and each shard;
- the directory (issue 24): opening a scope another driver created (a miss)
  against a cached open and a one-message apply;
- the costs: a bare Ray call with many in flight (the per-call cost), a shard
  process's memory against a bare Ray actor's, memory per conversation in a
  shard against the same conversations in a local manager, and the Ray
  session's own memory; then a paper model of 10 and 100 nodes from them.

Rounds alternate 2 shards, 1 shard and the bare actor so drift on the shared
machine hits all three; each keeps its best round. Memory is read from /proc:
``Pss`` (``smaps_rollup``) for whole processes, so pages shared between Ray's
processes are counted once, and ``RssAnon`` deltas for per-conversation costs.
"""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from victor_actors import GlobalStateManager, TransitionBatch
from victor_actors.bench._common import cpu_seconds, ns, run_module

__all__ = ["main", "paper_model"]

NUM_CPUS = 2
NODES = (10, 100)
# The paper model's assumptions (printed with it and written to docs/ray.md).
SHARDS_PER_NODE = 2  # one shard per core on a node like this one (2 cores), as measured
CONVERSATIONS_PER_NODE = 100_000  # live conversations resident per node
MAX_OPS = 1000  # the driver's cap on operations per Ray call (victor_actors.ray._driver.MAX_OPS)
IN_FLIGHT_CALLS = 2  # Ray calls outstanding per shard lane (victor_actors.ray._driver.IN_FLIGHT)
MESSAGE = {"role": "user", "content": "one short message of a conversation, about sixty bytes long"}


def _ray() -> Any:
    import ray

    return ray


class _Echo:
    """The bare baseline: an async Ray actor whose method takes bytes and returns a fixed reply."""

    def __init__(self) -> None:
        self._reply = b""

    async def reply_size(self, size: int) -> int:
        self._reply = bytes(size)
        return size

    async def call(self, raw: bytes) -> bytes:
        return self._reply

    async def ping(self) -> int:
        return os.getpid()


# -- /proc -------------------------------------------------------------------------------------------


def _status(pid: int, field: str) -> int:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def pss_bytes(pid: int) -> int:
    """A process's proportional set size (its share of shared pages), or its RSS if Pss is unreadable."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return _status(pid, "VmRSS")


def anon_bytes(pid: int) -> int:
    """A process's anonymous resident memory (heap, stacks; no mapped files)."""
    return _status(pid, "RssAnon")


def descendants(root: int) -> list[int]:
    """Every live process under ``root``: Ray's GCS, raylet and workers, under the driver that started."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as fh:
                stat = fh.read()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(name))
    out: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def actor_pid(handle: Any) -> int | None:
    """The pid of a Ray actor's process, from the GCS actor table, or None.

    The table is ``ray._private.state.actors()`` and the actor's id is
    ``handle._actor_id``: both private to Ray (the public state API needs the
    dashboard, which this session does not start). Only memory figures use it;
    without it they are reported as missing, not guessed.
    """
    try:
        table = _ray()._private.state.actors()
        entry = table.get(handle._actor_id.hex())
        return int(entry["Pid"]) if entry and entry.get("Pid") else None
    except Exception:
        return None


# -- measures ----------------------------------------------------------------------------------------


def _pct(samples: list[int]) -> dict[str, float]:
    s = sorted(samples)
    return {
        "n": len(s),
        "median_us": s[len(s) // 2] / 1e3,
        "p99_us": s[min(len(s) - 1, int(len(s) * 0.99))] / 1e3,
        "mean_us": sum(s) / len(s) / 1e3,
    }


def _wire_sizes(record: Any, address: Any, ops: int) -> tuple[bytes, int]:
    """Our encoded request for ``ops`` one-message applies, and the size of the encoded reply.

    Each op differs as a lane's do (its batch id, conversation, message; each
    reply its commit id and versions): frames above 2 KiB are compressed, and
    identical ops would shrink to almost nothing.
    """
    from victor_actors.ray import _wire as w

    level, ident, wf, team = address
    out, back = [], []
    wire_record = dict(w.record_to(record))
    for i in range(ops):
        message = {**MESSAGE, "content": f"{MESSAGE['content']} {i}"}
        steps = w.transitions_to(TransitionBatch().add_message(message).transitions)
        where = address if i == 0 else (level, f"pipe-{i % 100}", wf, team)
        out.append({"k": "apply", "a": where, "t": steps, "x": None, "b": uuid.uuid4().hex, "to": 30.0})
        if i == 0:  # the real reply, as measured
            back.append((True, wire_record))
            continue
        rec = {**wire_record, "id": uuid.uuid4().hex, "ov": i, "nv": i + 1, "t": steps}
        rec["r"] = str(record.ref).replace(ident, f"pipe-{i % 100}")
        back.append((True, rec))
    request = w.encode({"ops": tuple(out)})
    reply = w.encode({"r": tuple(back)})
    return request, len(reply)


def latency(manager: Any, echo: Any, calls: int, rounds: int) -> dict[str, Any]:
    """Remote apply one at a time vs the bare actor carrying the same bytes, interleaved in rounds."""
    ray = _ray()
    conv = manager.get_conversation_state("latency-0")
    first = conv.apply(TransitionBatch().add_message(MESSAGE))
    request, reply_size = _wire_sizes(first, conv.address, 1)
    ray.get(echo.reply_size.remote(reply_size))
    ours: list[int] = []
    bare: list[int] = []
    warm = max(20, calls // 10)
    for _ in range(warm):  # both paths warm (Ray's workers, the shard's scope actor)
        conv.apply(TransitionBatch().add_message(MESSAGE))
        ray.get(echo.call.remote(request))
    for _ in range(rounds):
        gc.collect()
        for _ in range(calls):
            batch = TransitionBatch().add_message(MESSAGE)
            t0 = ns()
            conv.apply(batch)
            ours.append(ns() - t0)
        for _ in range(calls):
            t0 = ns()
            ray.get(echo.call.remote(request))
            bare.append(ns() - t0)
    via_loop = _bare_via_loop(echo, request, calls * rounds)
    return {
        "apply": _pct(ours),
        "bare": _pct(bare),
        "bare_via_loop": _pct(via_loop),
        "request_bytes": len(request),
        "reply_bytes": reply_size,
    }


def _bare_via_loop(echo: Any, request: bytes, calls: int) -> list[int]:
    """The bare call as our driver makes it: awaited on a private event loop thread, asked from this one.

    Splits our p50 into what the shape costs (the hop to a loop thread and
    Ray's asyncio await) and what our own code adds (not a baseline row: a breakdown).
    """
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="bench-ray-loop", daemon=True)
    thread.start()

    async def one() -> bytes:
        out: bytes = await echo.call.remote(request)
        return out

    try:
        for _ in range(20):
            asyncio.run_coroutine_threadsafe(one(), loop).result()
        samples = []
        for _ in range(calls):
            t0 = ns()
            asyncio.run_coroutine_threadsafe(one(), loop).result()
            samples.append(ns() - t0)
        return samples
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        loop.close()


async def _flood(manager: Any, tag: str, commits: int, convs: int, inflight: int) -> float:
    """``inflight`` tasks, each applying its share of ``commits`` one after another (no semaphore).

    An ``asyncio.Semaphore`` with thousands of waiters cost the driver's main
    thread more than the requests did (profiled); a fixed pool of tasks keeps
    as many in flight for almost nothing.
    """
    handles = [manager.get_conversation_state(f"{tag}-{i}") for i in range(convs)]

    async def worker(first: int) -> None:
        for i in range(first, commits, inflight):
            await handles[i % convs].aapply(TransitionBatch().add_message(MESSAGE))

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(min(inflight, commits))))
    return time.perf_counter() - t0


def pipelined(manager: Any, tag: str, commits: int, convs: int, inflight: int) -> dict[str, Any]:
    """One pipelined run: commits/s, the Ray calls the driver made, and CPU per commit in each process."""
    before = manager.stats()
    procs = _processes(manager)
    gc.collect()
    gc.disable()
    cpu0 = {k: cpu_seconds(p) for k, p in procs.items()}
    try:
        seconds = asyncio.run(_flood(manager, tag, commits, convs, inflight))
    finally:
        cpu = {k: cpu_seconds(p) - cpu0[k] for k, p in procs.items()}
        gc.enable()
    after = manager.stats()
    calls = after["driver_calls"] - before["driver_calls"]
    return {
        "per_s": commits / seconds,
        "seconds": seconds,
        "commits": commits,
        "calls": calls,
        "ops_per_call": commits / calls if calls else None,
        "shard_commits": after["commits"] - before["commits"],
        "cpu_us_per_commit": {k: v / commits * 1e6 for k, v in cpu.items()},
    }


def cross_shard(manager: Any, lone: int, commits: int, tasks: int) -> dict[str, Any]:
    """Batches writing a conversation off the global scope's shard and global itself (two-phase commit).

    ``lone``: one at a time, their latency; then ``commits`` from ``tasks``
    conversations at once (issue 24's "50 at once"): each is a prepare on the
    conversation's shard, a decision on home (global's commit, shared with the
    decisions that arrive together) and a commit on the conversation's shard;
    with the CPU per batch in the driver and each shard over that part.
    """
    from victor_actors.ray import HOME

    convs = [
        h for h in (manager.get_conversation_state(f"x-{i}") for i in range(tasks * 4)) if h.shard != HOME
    ]
    convs = convs[:tasks]
    conv = convs[0]

    def batch(i: int) -> TransitionBatch:
        return TransitionBatch().add_message(MESSAGE).update_state(f"k{i % tasks}", i, scope="global")

    for i in range(5):
        conv.apply(batch(i))
    samples = []
    for i in range(lone):
        b = batch(i)
        t0 = ns()
        conv.apply(b)
        samples.append(ns() - t0)

    async def worker(w: int) -> None:
        for i in range(w, commits, len(convs)):
            await convs[w].aapply(batch(i))

    async def flood() -> float:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(len(convs))))
        return time.perf_counter() - t0

    procs = _processes(manager)
    before = manager.stats()
    cpu0 = {k: cpu_seconds(p) for k, p in procs.items()}
    seconds = asyncio.run(flood())
    cpu = {k: cpu_seconds(p) - cpu0[k] for k, p in procs.items()}
    after = manager.stats()
    return {
        "lone": _pct(samples),
        "per_s": commits / seconds,
        "commits": commits,
        "tasks": len(convs),
        "cross_shard": after["driver_cross_shard"] - before["driver_cross_shard"],
        "aborted": after["driver_cross_shard_aborted"] - before["driver_cross_shard_aborted"],
        "cpu_us_per_batch": {k: v / commits * 1e6 for k, v in cpu.items()},
    }


def directory(manager: Any, scopes: int) -> dict[str, Any]:
    """What finding a scope by its id costs a driver: a miss against a hit, one open at a time.

    ``new``: the first open of a conversation anywhere (a miss that writes its
    directory entry, then the shard creates it on the first write; only the
    open is timed). ``known``: the open of a conversation another driver
    created, by a driver that has not seen it (this driver with its cache
    emptied: a miss that reads the entry). ``hit``: the open of a scope the
    driver has seen (its cache, no call). ``apply``: a one-message apply to an
    open conversation, the unit a miss is compared with.
    """
    tag = uuid.uuid4().hex[:8]
    names = [f"dir-{tag}-{i}" for i in range(scopes)]
    new, known, hit, apply = [], [], [], []
    for name in names:
        t0 = ns()
        h = manager.get_conversation_state(name)
        new.append(ns() - t0)
        b = TransitionBatch().add_message(MESSAGE)
        t0 = ns()
        h.apply(b)
        apply.append(ns() - t0)
    misses0 = manager._directory.misses
    manager._directory.cache.clear()
    for name in names:
        t0 = ns()
        manager.get_conversation_state(name)
        known.append(ns() - t0)
    for name in names:
        t0 = ns()
        manager.get_conversation_state(name)
        hit.append(ns() - t0)
    return {
        "new": _pct(new),
        "known": _pct(known),
        "hit": _pct(hit),
        "apply": _pct(apply),
        "misses": manager._directory.misses - misses0,
        "scopes": scopes,
    }


def _processes(manager: Any) -> dict[str, int]:
    pids = [actor_pid(manager.shard_actor(n)) for n in range(manager.shards)]
    return {"driver": os.getpid(), **{f"shard_{n}": p for n, p in enumerate(pids) if p}}


def _local_pipelined(manager: GlobalStateManager, tag: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """The pipelined workload on a local manager: commits/s and this process's CPU per commit."""
    asyncio.run(_flood(manager, f"{tag}-warm", cfg["commits"] // 4, cfg["conversations"], cfg["inflight"]))
    gc.collect()
    gc.disable()
    cpu0 = cpu_seconds(os.getpid())
    try:
        seconds = asyncio.run(_flood(manager, tag, cfg["commits"], cfg["conversations"], cfg["inflight"]))
    finally:
        cpu = cpu_seconds(os.getpid()) - cpu0
        gc.enable()
    commits = cfg["commits"]
    return {
        "per_s": commits / seconds,
        "seconds": seconds,
        "commits": commits,
        "cpu_us_per_commit": {"process": cpu / commits * 1e6},
    }


def bare_batched(echo: Any, request: bytes, reply_size: int, ops: int, calls: int) -> dict[str, Any]:
    """The bare actor fed one call carrying ``ops`` requests at a time: requests/s."""
    ray = _ray()
    ray.get(echo.reply_size.remote(reply_size))
    ray.get(echo.call.remote(request))
    samples = []
    for _ in range(calls):
        t0 = ns()
        ray.get(echo.call.remote(request))
        samples.append(ns() - t0)
    total = sum(samples) / 1e9
    return {"per_s": ops * calls / total, "ops_per_call": ops, "calls": calls, "call": _pct(samples)}


def call_rate(echo: Any, request: bytes, reply_size: int, calls: int) -> dict[str, Any]:
    """Bare Ray calls of one small request with all of them in flight: calls/s, the per-call cost."""
    ray = _ray()
    ray.get(echo.reply_size.remote(reply_size))
    ray.get([echo.call.remote(request) for _ in range(50)])
    t0 = time.perf_counter()
    ray.get([echo.call.remote(request) for _ in range(calls)])
    seconds = time.perf_counter() - t0
    return {"per_s": calls / seconds, "us_each": seconds / calls * 1e6, "calls": calls}


async def _create(handles: list[Any], tasks: int = 500) -> None:
    async def worker(first: int) -> None:
        for h in handles[first::tasks]:
            await h.aapply(TransitionBatch().add_message(MESSAGE))

    await asyncio.gather(*(worker(w) for w in range(min(tasks, len(handles)))))


def scope_memory(manager: Any, conversations: int) -> dict[str, Any]:
    """Anonymous memory per conversation on a 1-shard manager's shard, and in a local in-memory manager."""
    pid = actor_pid(manager.shard_actor(0))
    out: dict[str, Any] = {"conversations": conversations, "shard_pid": pid}
    warm = [manager.get_conversation_state(f"mem-warm-{i}") for i in range(200)]
    asyncio.run(_create(warm))
    if pid is not None:
        before = anon_bytes(pid)
        handles = [manager.get_conversation_state(f"mem-{i}") for i in range(conversations)]
        asyncio.run(_create(handles))
        manager.stats()  # the shard has answered everything
        after = anon_bytes(pid)
        out["shard"] = {"anon_before": before, "anon_after": after}
        out["shard"]["bytes_per_conversation"] = (after - before) / conversations
        out["shard_stats"] = {k: v for k, v in manager.stats().items() if k in ("scopes", "live_actors")}
    me = os.getpid()
    with GlobalStateManager.open(None) as local:
        warm_local = [local.get_conversation_state(f"mem-warm-{i}") for i in range(200)]
        asyncio.run(_create(warm_local))
        gc.collect()
        before = anon_bytes(me)
        local_handles = [local.get_conversation_state(f"mem-{i}") for i in range(conversations)]
        asyncio.run(_create(local_handles))
        gc.collect()
        after = anon_bytes(me)
        out["local"] = {"anon_before": before, "anon_after": after}
        out["local"]["bytes_per_conversation"] = (after - before) / conversations
        out["local_stats"] = {k: v for k, v in local.stats().items() if k in ("scopes", "live_actors")}
    return out


def process_memory(manager: Any, echo: Any) -> dict[str, Any]:
    """Pss of a fresh shard process and of the bare actor's, and of the whole Ray session."""
    shard_pid, echo_pid = actor_pid(manager.shard_actor(0)), actor_pid(echo)
    me = os.getpid()
    pids = descendants(me)
    session = sum(pss_bytes(p) for p in pids)
    out: dict[str, Any] = {
        "shard_pss": pss_bytes(shard_pid) if shard_pid else None,
        "shard_rss": _status(shard_pid, "VmRSS") if shard_pid else None,
        "bare_pss": pss_bytes(echo_pid) if echo_pid else None,
        "bare_rss": _status(echo_pid, "VmRSS") if echo_pid else None,
        "session_pss": session,
        "session_processes": len(pids),
        "driver_pss": pss_bytes(me),
    }
    actors = [p for p in (shard_pid, echo_pid) if p]
    out["node_pss"] = session - sum(pss_bytes(p) for p in actors)  # Ray's own processes and idle workers
    return out


# -- the paper model ------------------------------------------------------------------------------------


def paper_model(res: dict[str, Any]) -> dict[str, Any]:
    """Throughput and memory at 10 and 100 nodes from one run's measured costs (see the assumptions).

    Per node (2 cores, 2 shards, one driver), time per commit is ``t_op +
    t_call / k``: ``t_call`` the measured per-call cost of a bare Ray call,
    ``k`` operations per call, and ``t_op`` what is left of the measured
    2-shard time per commit at its measured ``k``. Two cases: traffic routed
    to the node hosting its conversation (``k`` as measured, so the cluster is
    N nodes at the measured rate), and every driver spreading its requests over
    every shard (each lane gets in-flight / shards, so ``k`` falls with N).
    Memory per node: Ray's own processes, the shards, the driver, and the
    conversations at their measured cost each.
    """
    tp, mem, cfg = res["throughput"], res["memory"], res["config"]
    two = tp["two"]
    t_call = res["call_rate"]["us_each"] / 1e6
    k2 = two["ops_per_call"] or 1.0
    t_op = max(1.0 / two["per_s"] - t_call / k2, 0.0)
    inflight = cfg["inflight"]
    per_conv = mem["scopes"].get("shard", {}).get("bytes_per_conversation")
    shard_bytes = mem["process"]["shard_pss"] or 0
    node_fixed = mem["process"]["node_pss"] + mem["process"]["driver_pss"]
    rows = {}
    for n in NODES:
        shards = SHARDS_PER_NODE * n
        k_spread = min(float(MAX_OPS), max(1.0, inflight / (IN_FLIGHT_CALLS * shards)))
        node_mem = node_fixed + SHARDS_PER_NODE * shard_bytes + CONVERSATIONS_PER_NODE * (per_conv or 0.0)
        rows[str(n)] = {
            "nodes": n,
            "shards": shards,
            "local_per_s": n * two["per_s"],
            "spread_ops_per_call": k_spread,
            "spread_per_s": n / (t_op + t_call / k_spread),
            "conversations": n * CONVERSATIONS_PER_NODE,
            "memory_bytes": n * node_mem,
            "node_memory_bytes": node_mem,
        }
    return {
        "assumptions": {
            "cores_per_node": NUM_CPUS,
            "shards_per_node": SHARDS_PER_NODE,
            "drivers_per_node": 1,
            "in_flight_per_driver": inflight,
            "conversations_per_node": CONVERSATIONS_PER_NODE,
            "max_ops_per_call": MAX_OPS,
            "calls_in_flight_per_lane": IN_FLIGHT_CALLS,
        },
        "t_call_us": t_call * 1e6,
        "t_op_us": t_op * 1e6,
        "measured_ops_per_call": k2,
        "global_home_per_s": tp["one"]["per_s"],
        "cross_shard_per_s": res["cross_shard"]["per_s"],
        "nodes": rows,
    }


# -- the run --------------------------------------------------------------------------------------------


def _best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    best = dict(max(runs, key=lambda r: r["per_s"]))
    best["rounds"] = [r["per_s"] for r in runs]
    return best


def _round_robin(parts: list[Callable[[], None]], rounds: int) -> None:
    for r in range(rounds):
        for part in parts[r % len(parts) :] + parts[: r % len(parts)]:
            part()


def run(quick: bool) -> dict[str, Any]:
    from victor_actors.ray import RayStateManager

    ray = _ray()
    cfg: dict[str, Any] = {
        "quick": quick,
        "latency_calls": 100 if quick else 400,
        "latency_rounds": 2 if quick else 5,
        "commits": 2_000 if quick else 10_000,
        "conversations": 100,
        "inflight": 500 if quick else 2_000,
        "pipeline_rounds": 1 if quick else 3,
        "batched_calls": 5 if quick else 30,
        "rate_calls": 500 if quick else 3_000,
        "scope_conversations": 500 if quick else 5_000,
        "cross_lone": 30 if quick else 200,
        "cross_commits": 100 if quick else 1_000,
        "directory_scopes": 50 if quick else 500,
    }
    t0 = time.perf_counter()
    # address="local": a new session even when another cluster on this machine would be joined
    ray.init(address="local", num_cpus=NUM_CPUS, include_dashboard=False, log_to_driver=False)
    res: dict[str, Any] = {"config": cfg, "ray_init_s": time.perf_counter() - t0}
    try:
        echo = ray.remote(_Echo).options(num_cpus=0, max_concurrency=1000).remote()
        ray.get(echo.ping.remote())
        one = RayStateManager.open(None, shards=1)
        res["process_before"] = process_memory(one, echo)  # before the 2-shard manager's processes exist
        t0 = time.perf_counter()
        two = RayStateManager.open(None, shards=2)
        res["open_2_shards_s"] = time.perf_counter() - t0
        try:
            res["latency"] = latency(two, echo, cfg["latency_calls"], cfg["latency_rounds"])
            conv = two.get_conversation_state("latency-0")
            record = conv.apply(TransitionBatch().add_message(MESSAGE))
            batch_req, batch_reply = _wire_sizes(record, conv.address, MAX_OPS)
            small_req, small_reply = _wire_sizes(record, conv.address, 1)
            runs: dict[str, list[dict[str, Any]]] = {"two": [], "one": [], "bare": [], "local": []}
            n = {"round": 0}

            def part(name: str, manager: Any) -> Callable[[], None]:
                def go() -> None:
                    n["round"] += 1
                    args = (f"p{n['round']}", cfg["commits"], cfg["conversations"], cfg["inflight"])
                    runs[name].append(pipelined(manager, *args))

                return go

            def local() -> None:  # the same workload on a local in-memory manager, in this process
                with GlobalStateManager.open(None) as manager:
                    n["round"] += 1
                    pipelined_local = _local_pipelined(manager, f"p{n['round']}", cfg)
                runs["local"].append(pipelined_local)

            def bare() -> None:
                runs["bare"].append(bare_batched(echo, batch_req, batch_reply, MAX_OPS, cfg["batched_calls"]))

            warm = ("warm", cfg["commits"] // 4, cfg["conversations"], cfg["inflight"])
            pipelined(two, *warm)
            pipelined(one, *warm)
            _round_robin([part("two", two), part("one", one), bare, local], cfg["pipeline_rounds"])
            res["throughput"] = {
                "two": _best(runs["two"]),
                "one": _best(runs["one"]),
                "bare_batched": _best(runs["bare"]),
                "local": _best(runs["local"]),
                "request_bytes_per_call": len(batch_req),
                "reply_bytes_per_call": batch_reply,
            }
            res["call_rate"] = call_rate(echo, small_req, small_reply, cfg["rate_calls"])
            res["cross_shard"] = cross_shard(two, cfg["cross_lone"], cfg["cross_commits"], 50)
            res["directory"] = directory(two, cfg["directory_scopes"])
        finally:
            two.close()
        try:
            scopes = scope_memory(one, cfg["scope_conversations"])
            res["memory"] = {"process": res.pop("process_before"), "scopes": scopes}
        finally:
            one.close()
    finally:
        ray.shutdown()
    res["model"] = paper_model(res)
    return res


# -- the report -----------------------------------------------------------------------------------------


def _mib(b: float | None) -> str:
    return "-" if b is None else f"{b / 2**20:,.0f} MiB"


def _gib(b: float) -> str:
    return f"{b / 2**30:,.1f} GiB"


def model_lines(res: dict[str, Any]) -> list[str]:
    """The paper model as text lines (the bench prints them; docs/ray.md holds one run's)."""
    m = res["model"]
    a = m["assumptions"]
    mem = res["memory"]
    per_conv = mem["scopes"].get("shard", {}).get("bytes_per_conversation")
    lines = [
        f"assumptions: nodes like this one ({a['cores_per_node']} cores), {a['shards_per_node']} shards and "
        f"one driver per node, {a['in_flight_per_driver']:,} requests in flight per driver, "
        f"{a['conversations_per_node']:,} live conversations per node, one-message batches, no cross-shard "
        "batches; on one box, so no network time (coalesced calls amortise it)",
        f"costs: a bare Ray call {m['t_call_us']:,.0f} us of the box (many in flight); the rest of a commit "
        f"{m['t_op_us']:,.1f} us at {m['measured_ops_per_call']:,.0f} ops per call; a shard process "
        f"{_mib(mem['process']['shard_pss'])} Pss; Ray's own processes {_mib(mem['process']['node_pss'])}; "
        f"a conversation in a shard {per_conv or 0:,.0f} B",
        f"{'nodes':>6}{'shards':>8}{'routed to node':>16}{'spread':>12}{'ops/call':>10}"
        f"{'conversations':>15}{'memory':>11}",
    ]
    for row in m["nodes"].values():
        lines.append(
            f"{row['nodes']:>6}{row['shards']:>8}{row['local_per_s']:>14,.0f}/s{row['spread_per_s']:>10,.0f}/s"
            f"{row['spread_ops_per_call']:>10,.1f}{row['conversations']:>15,}{_gib(row['memory_bytes']):>11}"
        )
    lines.append(
        f"the global scope lives on one shard: its writes stay near one shard's rate "
        f"({m['global_home_per_s']:,.0f}/s measured) whatever the number of nodes, and batches writing it "
        f"from another shard (two-phase commit, decided by global's commits at home) near "
        f"{m['cross_shard_per_s']:,.0f}/s"
    )
    return lines


def print_report(res: dict[str, Any]) -> None:
    from victor_actors.bench._table import print_rows, print_targets

    print_rows("ray", res)
    print_targets("ray", res)
    lt, tp = res["latency"], res["throughput"]
    print(
        f"\nbreakdown: the bare call awaited on a loop thread (our driver's shape) p50 "
        f"{lt['bare_via_loop']['median_us']:,.0f} us, p99 {lt['bare_via_loop']['p99_us']:,.0f} us"
    )
    x = res["cross_shard"]
    print(
        f"cross-shard batches (a conversation off shard 0 and global): lone p50 "
        f"{x['lone']['median_us']:,.0f} us, {x['per_s']:,.0f}/s from {x['tasks']} conversations at once "
        f"({x['aborted']} aborted); CPU per batch: "
        + ", ".join(f"{k} {v:,.0f} us" for k, v in x["cpu_us_per_batch"].items())
    )
    d = res["directory"]
    print(
        f"directory (one open at a time, {d['scopes']:,} conversations): a new scope's open p50 "
        f"{d['new']['median_us']:,.0f} us, a scope another driver created p50 "
        f"{d['known']['median_us']:,.0f} us (a miss), a cached open p50 {d['hit']['median_us']:,.1f} us; "
        "a one-message apply p50 "
        f"{d['apply']['median_us']:,.0f} us"
    )
    for name in ("two", "one", "local"):
        cpu = ", ".join(f"{k} {v:,.0f} us" for k, v in tp[name]["cpu_us_per_commit"].items())
        calls = f"; {tp[name]['calls']:,} Ray calls" if "calls" in tp[name] else " (no Ray)"
        print(f"CPU per commit, {name}: {cpu}{calls}")
    print("\nPAPER MODEL")
    for line in model_lines(res):
        print(line)


def main() -> int:
    title = "victor_actors Ray benchmark (issues 17 and 24): shards in memory, one local Ray session"
    return run_module(__doc__, title, run, print_report, ("ray",))


if __name__ == "__main__":
    raise SystemExit(main())
