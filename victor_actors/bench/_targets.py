"""The targets ``victor-actors bench`` checks, and the evaluation of every row and target.

A target is a threshold on one row's ratio, or, for a target the issue gives
as an absolute bound (bytes per conversation, conversations per second, a
latency), on the row's measured value over that bound (``bound``: measured =
ours / bound, threshold 1.0), the row still showing its same-run baseline;
for a target given as an offset from the baseline (a latency at most the
baseline's plus 150 us), on ours / (baseline + margin) (``margin``, threshold
1.0). Targets are for benchmarks, never timed tests: a missed target is
reported (with a one-line why, from the run's own numbers), not failed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from victor_actors.bench._rows import ROWS, Json, RowSpec, lat, pin_note

__all__ = ["TARGETS", "TargetSpec", "evaluate"]


def _f(x: float) -> str:
    return f"{x:,.2f}" if abs(x) < 10 else f"{x:,.1f}" if abs(x) < 100 else f"{x:,.0f}"


def _why_apply(stat: str, label: str) -> Callable[[dict[str, Json]], str]:
    def why(res: dict[str, Json]) -> str:
        r = res["core"]
        apply, call, echo = lat(r, "apply1", stat), lat(r, "apply1_call", stat), lat(r, "echo", stat)
        return (
            f"apply {label} {_f(apply)} us vs echo {_f(echo)} us: {_f(apply - call)} us building (and "
            f"validating) the batch, then the apply call alone is {_f(call)} us, {_f(call - echo)} us more "
            "than a bare ask (request set-up, the reducer, the commit record)"
        )

    return why


def _why_lock(res: dict[str, Json]) -> str:
    r = res["core"]
    apply, call, echo, lock = (lat(r, k, "median_us") for k in ("apply1", "apply1_call", "echo", "lock"))
    return (
        f"apply p50 {_f(apply)} us vs {_f(lock)} us for a lock and a dict update on the caller's thread: "
        f"{_f(apply - call)} us building the batch, {_f(call)} us the apply call; a bare pykka ask, the "
        f"cost of crossing to an actor's thread and back, is {_f(echo)} us here "
        f"({echo / lock:,.0f}x the lock)"
    )


def _why_sequential(stat: str) -> Callable[[dict[str, Json]], str]:
    def why(res: dict[str, Json]) -> str:
        r = res["sequential"]
        lt = r["latency"]
        ours, sync, raw, mem = (lt[k] for k in ("ours", "fdatasync", "lmdb", "memory"))
        size = f"{r['record_bytes']:,} B"
        if stat == "per_s":
            head = (
                f"{ours['per_s']:,.0f} durable commits/s vs {raw['per_s']:,.0f}/s bare synced LMDB txns of "
                f"the same {size} (p50 {_f(ours['median_us'])} vs {_f(raw['median_us'])} us)"
            )
        else:
            head = (
                f"p50 {_f(ours['median_us'])} us per durable apply vs {_f(sync['median_us'])} us for one "
                f"fdatasync of its {size} and {_f(raw['median_us'])} us for a bare synced LMDB txn of them"
            )
        return (
            f"{head}; the same apply in memory takes {_f(mem['median_us'])} us p50, so "
            f"{_f(ours['median_us'] - mem['median_us'])} us of each durable one is the store and the disk "
            f"({pin_note(r)})"
        )

    return why


def _why_snapshot(res: dict[str, Json]) -> str:
    r = res["core"]
    big, small = lat(r, "snap100k", "median_us"), lat(r, "snap10", "median_us")
    p99 = lat(r, "snap100k", "p99_us") / lat(r, "snap10", "p99_us")
    return (
        f"p50 {_f(big)} us at 100,000 keys vs {_f(small)} us at 10 (p99 ratio {p99:.2f}x): "
        f"{(big - small) * 1000:,.0f} ns more on a call that copies nothing (a dict copy of the 100k "
        f"keys takes {lat(r, 'copy_dict', 'median_us'):,.0f} us)"
    )


def _why_pipeline(size: str) -> Callable[[dict[str, Json]], str]:
    def why(res: dict[str, Json]) -> str:
        tp = res["pipeline"]["throughput"]
        us = {k: 1e6 / v["per_s"] for k, v in tp.items()}
        return (
            f"{_f(us['aapply_' + size])} us per pipelined aapply vs {_f(us['tell'])} us per raw tell; "
            f"without asyncio (pykka futures) still {_f(us['futures_' + size])} us, and "
            f"{_f(us['prebuilt_' + size])} us with the batches built beforehand: the work per request "
            "(request set-up, the reducer, the commit record, the reply) dominates, not the mailbox"
        )

    return why


def _why_flat(res: dict[str, Json]) -> str:
    tp = res["pipeline"]["throughput"]
    big, small = tp["aapply_100k"]["per_s"], tp["aapply_10"]["per_s"]
    pre = tp["prebuilt_100k"]["per_s"] / tp["prebuilt_10"]["per_s"]
    fut = tp["futures_100k"]["per_s"] / tp["futures_10"]["per_s"]
    return (
        f"{big:,.0f} ops/s at 100,000 keys vs {small:,.0f} at 10; the same ratio is {pre:.2f}x with "
        f"prebuilt batches and {fut:.2f}x without asyncio"
    )


def _ms(rate: float) -> str:
    return f"{1000 / rate:.2f} ms" if rate else "-"


def _why_durable_floor(res: dict[str, Json]) -> str:
    tp = res["store"]["throughput"]
    ours, raw = tp["sync1"]["rate"], tp["raw_lmdb"]["rate"]
    return (
        f"{_ms(ours)} per durable commit ({ours:,.0f}/s) vs {_ms(raw)} per bare synced LMDB txn of one "
        f"~300 B value: {(1000 / ours - 1000 / raw) * 1000:,.0f} us of work on top of the disk per "
        f"commit (the ask round trip, the reducer, encoding the commit record, the head record, the "
        f"writer's bookkeeping); ours in memory: {tp['mem1']['rate']:,.0f}/s"
    )


def _why_checkpoints(key: str) -> Callable[[dict[str, Json]], str]:
    def why(res: dict[str, Json]) -> str:
        r = res["checkpoints"]
        run = r["runs"][str(r["long"])]
        final, steps = run["final_state_bytes"], run["steps"]
        if key == "data_mdb":
            return (
                f"data.mdb {run['data_mdb']:,} B after {steps:,} steps vs a {final:,} B zstd-encoded final "
                f"state ({run['kept']}): the kept log of up to 300 uncompressed commit records, the message "
                "chunks (the log, compressed) and LMDB's pages and free space"
            )
        log, ckpt, plain = run["log_bytes_put"], run["checkpoint_bytes_put"], run["final_plain_bytes"]
        return (
            f"{run['bytes_put']:,} B put over {steps:,} commits vs a {final:,} B zstd-encoded final state: "
            f"the commit log alone is {log:,} B ({log / final:.2f}x; {log / steps:,.0f} B a commit, each "
            f"record holding its message uncompressed), the checkpoints {ckpt:,} B ({ckpt / final:.2f}x); "
            f"the messages alone as plain msgpack are {plain / final:.2f}x the final state, "
            "so one record per durable commit cannot reach 3x on messages that compress this well"
        )

    return why


def _why_lg(what: str) -> Callable[[dict[str, Json]], str]:
    """Why a LangGraph-saver target missed, from the run's own numbers (profiled: docs/benchmarks.md)."""

    def why(res: dict[str, Json]) -> str:
        r = res["langgraph"]["results"]
        ours, sq, raw = r["victor_actors"], r["sqlite"], r["raw_lmdb"]
        put_us, sq_us, raw_us = (1e6 / x["put_per_s"] for x in (ours, sq, raw))
        if what == "put":
            return (
                f"{put_us:,.0f} us per put vs {sq_us:,.0f} us for SqliteSaver and {raw_us:,.0f} us for a "
                f"bare synced LMDB txn: one put is one durable commit, so it pays the commit path's work on "
                f"top "
                f"of the disk (the actor round trip, the reducer, encoding the commit record) plus the "
                f"saver's own (serializing, building the transitions)"
            )
        if what == "graph":
            steps = res["langgraph"]["meta"]["steps"]
            per = sum(ours["graph_s"]) / len(ours["graph_s"]) / steps * 1e3
            per_sq = sum(sq["graph_s"]) / len(sq["graph_s"]) / steps * 1e3
            store = ours.get("graph_store") or {}
            return (
                f"{per:.2f} ms per step vs {per_sq:.2f} ms ({store.get('commits', 0):,} commits for "
                f"{steps} steps: a step's put_writes and put mostly share one): a durable commit costs "
                f"{put_us:,.0f} us here against SqliteSaver's {sq_us:,.0f} us per put, and a step's writes "
                f"wait up to 0.5 ms for its put to join them"
            )
        if what == "get":
            return (
                f"{ours['get_tuple_per_s']:,.0f}/s vs {sq['get_tuple_per_s']:,.0f}/s: a read decodes the "
                "record, checks every value against the allowlist and decodes it"
            )
        if what == "concurrent":
            store = ours.get("concurrent_store") or {}
            shared = f"{store.get('commits', 0):,} commits in {store.get('transactions', 0):,} transactions"
            mean = {k: sum(v) / len(v) for k, v in (("o", ours["concurrent_s"]), ("s", sq["concurrent_s"]))}
            floor = r.get("memory", {}).get("concurrent_s") or [0.0]
            return (
                f"{mean['o']:.2f} s vs {mean['s']:.2f} s ({shared}); the same graphs on LangGraph's "
                f"InMemorySaver (no disk, no store) take {sum(floor) / len(floor):.2f} s, "
                f"{sum(floor) / len(floor) / mean['s']:.2f}x SqliteSaver's: the run is bound by the CPU "
                "(LangGraph's own step, then ours, on 2 cores under one GIL), not by the disk"
            )
        key = "disk" if what == "disk" else "long_disk"
        return (
            f"{ours[key]['size']:,} B vs {sq[key]['size']:,} B: LMDB's file holds whole pages, the "
            "segment being written (its log and up to 3 full checkpoints) and pages freed but not returned"
        )

    return why


def _why_pg(key: str) -> Callable[[dict[str, Json]], str]:
    """Why a target against PostgresSaver missed: both figures, and what each side syncs."""

    def why(res: dict[str, Json]) -> str:
        r = res["langgraph"]["results"]

        def value(saver: str) -> float:
            v = r[saver][key]
            return sum(v) / len(v) if isinstance(v, list) else float(v)

        ours, pg = value("victor_actors"), value("postgres")
        unit = "/s" if key.endswith("per_s") else " s"
        return (
            f"{ours:,.2f}{unit} vs {pg:,.2f}{unit} for PostgresSaver on a local server (one WAL flush per "
            "commit); ours is one LMDB commit per put, two flushes (the pages, then the meta page)"
        )

    return why


def _why_storage(res: dict[str, Json]) -> str:
    st = res["store"]["storage"]
    ours = st["ours"]
    final, size, scope = ours["final_state_bytes"], ours["data_mdb"]["size"], ours["scope_bytes"]
    return (
        f"data.mdb {size:,} B vs a {final:,} B zstd-encoded final state; the scope's own records "
        f"({ours['kept']}) are {scope:,} B ({scope / final:.1f}x), the other {size - scope:,} B are LMDB "
        f"pages, free space and the other tables; against the {st['plain_msgpack_bytes']:,} B plain msgpack "
        f"state the file is {size / st['plain_msgpack_bytes']:.1f}x"
    )


def _why_groupcommit(res: dict[str, Json]) -> str:
    r = res["groupcommit"]
    x, t = r["results"], r["transactions"]
    return (
        f"1 scope: {x['one_sync']:,.0f}/s durable vs {x['one_mem']:,.0f}/s in memory in {t['one']} "
        f"transactions; 100 scopes: {x['many_sync']:,.0f}/s vs {x['many_mem']:,.0f}/s in {t['many']} "
        "transactions: each group waits for its own synced transaction while the next group queues"
    )


def _why_sdk(key: str) -> Callable[[dict[str, Json]], str]:
    def why(res: dict[str, Json]) -> str:
        e = res["sdk"]["subjects"][key]
        ours, theirs = e["ours"], e["theirs"]
        durable = "" if e.get("peer_durable", True) else " (in memory: nothing reaches a disk)"
        return (
            f"one call {_f(ours['one_p50_us'])} us (a synced LMDB commit, two flushes) vs "
            f"{e['peer']}'s{durable} "
            f"{_f(theirs['one_p50_us'])} us; 16 sessions {_f(ours['many_per_s'])}/s vs "
            f"{_f(theirs['many_per_s'])}/s"
        )

    return why


def _why_security(res: dict[str, Json]) -> str:
    r = res["security"]
    plain, sealed = r["bytes"]["plain"], r["bytes"]["encrypted"]
    records = r["rounds"] * r["commits_per_round"]
    return (
        f"data.mdb {sealed:,} B encrypted vs {plain:,} B plain after {records:,} one-message commits: "
        f"{(sealed - plain) / records:.0f} B more per commit; each sealed record carries a 12-byte nonce, "
        "a 16-byte tag and a header with the key id (about 37 B), and each key a 128-bit id hash, on "
        "records of about 200 B; the overhead is per record, so larger records come closer to 1x"
    )


def _why_security_rate(res: dict[str, Json]) -> str:
    r = res["security"]
    return (
        f"{r['rates']['encrypted']:,.0f} vs {r['rates']['plain']:,.0f} durable commits/s: sealing is "
        "AES-256-GCM per record on the actor's thread, on top of the synced transaction"
    )


def _why_otel(res: dict[str, Json]) -> str:
    d = res["otel"]["disabled"]
    spread = d["plain_p50_spread_us"]
    return (
        f"apply p50 {_f(d['imported_p50_us'])} us with victor_actors.otel imported vs "
        f"{_f(d['plain_p50_us'])} us without; both run the same code (the hook slot is None), and the "
        f"processes without it alone ranged {_f(min(spread))}-{_f(max(spread))} us; normalised by each "
        f"process's echo ask the ratio is {d['ratio_p50_echo_normalised']:.3f}x"
    )


def _mib(b: float) -> str:
    return f"{b / 2**20:,.1f} MiB"


def _why_virtual_bytes(mode: str) -> Callable[[dict[str, Json]], str]:
    def why(res: dict[str, Json]) -> str:
        r = res["virtual"]
        s, mem = r["store"][mode], r["memory"]["evicted"]
        return (
            f"{s['bytes_per_conversation']:,.0f} B per conversation once all {s['conversations']:,} were "
            f"evicted: anon {_mib(s['anon_before'])} -> {_mib(s['anon_after'])} (peak "
            f"{_mib(s['anon_peak'])}), but the second half alone added "
            f"{s['marginal_bytes_per_conversation']:,.0f} B each: the rest is a one-off high-water mark of "
            f"the allocator, not per conversation; without a store {mem['bytes_per_conversation']:,.0f} B, "
            f"of which {mem['encoded_bytes_per_conversation']:,.0f} B encoded state"
        )

    return why


def _why_virtual_create(mode: str) -> Callable[[dict[str, Json]], str]:
    def why(res: dict[str, Json]) -> str:
        r = res["virtual"]
        s, floor, mem = r["store"][mode], r["pykka_floor"], r["memory"]["evicted"]
        d = s["during"]
        return (
            f"{s['create_per_s']:,.0f}/s ({1e6 / s['create_per_s']:,.0f} us each) with {s['tasks']} tasks, "
            f"{s['seq_per_s']:,.0f}/s on one thread, {mem['create_per_s']:,.0f}/s without a store: each new "
            f"conversation starts an actor and, past the cap, another is stopped; a bare pykka start, ask "
            f"and stop alone takes "
            f"{floor['us_each']:,.0f} us here ({floor['per_s']:,.0f}/s); the evictor spent "
            f"{d['eviction_s']:,.1f} s of the {s['create_seconds']:,.1f} s stopping {d['evicted']:,} actors"
        )

    return why


def _why_virtual_touch(stat: str) -> Callable[[dict[str, Json]], str]:
    def why(res: dict[str, Json]) -> str:
        r = res["virtual"]
        t, floor = r["touch"], r["pykka_floor"]
        b = t["baseline"]
        return (
            f"{t['per_s']:,.0f} touches/s vs {b['per_s']:,.0f}/s over live scopes; {t['reactivations']:,} of "
            f"{t['touches']:,} touches started an actor (p50 {t['react_p50_us']:,.0f} us, p99 "
            f"{t['react_p99_us']:,.0f} us, slowest {t['max_us'] / 1e3:,.1f} ms; a live touch: p50 "
            f"{b['p50_us']:,.0f} us, slowest {b['max_us'] / 1e3:,.1f} ms); a bare pykka start, ask and "
            f"stop takes {floor['us_each']:,.0f} us here ({stat})"
        )

    return why


def _why_ray_apply(res: dict[str, Json]) -> str:
    r = res["ray"]
    lt = r["latency"]
    ours, bare = lt["apply"]["median_us"], lt["bare"]["median_us"]
    loop = lt["bare_via_loop"]["median_us"]
    return (
        f"apply p50 {_f(ours)} us vs a bare call {_f(bare)} us with the same {lt['request_bytes']:,} B in "
        f"and {lt['reply_bytes']:,} B out; the bare call awaited on a loop thread, as the driver makes "
        f"it, is {_f(loop)} us: {_f(loop - bare)} us for that shape (the hop to the loop thread, Ray's "
        f"asyncio await), {_f(ours - loop)} us for our own work (framing on both sides, the lane, the "
        "shard's apply)"
    )


def _why_ray_rate(res: dict[str, Json]) -> str:
    r = res["ray"]
    tp = r["throughput"]
    two, one, bare = tp["two"], tp["one"], tp["bare_batched"]
    cpu = ", ".join(f"{k} {v:,.0f} us" for k, v in two["cpu_us_per_commit"].items())
    return (
        f"{two['per_s']:,.0f} commits/s on 2 shards ({two['ops_per_call']:,.0f} ops per call), "
        f"{one['per_s']:,.0f}/s on 1; a bare call carrying 1,000 requests moves {bare['per_s']:,.0f}/s; "
        f"CPU per commit on 2 shards: {cpu}, on {r['meta']['cpus']} cores shared by all of them: the "
        "per-commit work in the driver and the shards bounds the rate, not the Ray calls"
    )


def _why_ray_cross(res: dict[str, Json]) -> str:
    x = res["ray"]["cross_shard"]
    cpu = ", ".join(f"{k} {v:,.0f} us" for k, v in x.get("cpu_us_per_batch", {}).items())
    return (
        f"{x['per_s']:,.0f} batches/s from {x['tasks']} conversations at once, "
        f"{x.get('aborted', 0)} aborted; "
        f"one at a time p50 {_f(x['lone']['median_us'])} us (three shard calls in sequence); CPU per "
        f"batch: {cpu or 'not measured'}, on {res['ray']['meta']['cpus']} cores shared by the driver, "
        "the shards and Ray: the per-batch work bounds the rate, not a hold on global"
    )


def _why_remote_rate(durability: str) -> Callable[[dict[str, Json]], str]:
    def why(res: dict[str, Json]) -> str:
        r = res["remote"]
        rates, cpus = r["rate"][durability], r["meta"]["cpus"]
        four, one, inproc = rates["four"], rates["one"], rates["inproc"]
        owner, clients = four["owner_cpu_us_per_commit"], four["clients_cpu_us_per_commit"]
        return (
            f"{four['per_s']:,.0f} commits/s from 4 clients ({four['ops_per_call']:,.0f} ops per call) and "
            f"{one['per_s']:,.0f}/s from 1, vs {inproc['per_s']:,.0f}/s in the owner (medians of the rounds: "
            f"{four['median_per_s']:,.0f}/s vs {inproc['median_per_s']:,.0f}/s); CPU per commit: the "
            f"owner {_f(owner)} us serving clients vs {_f(inproc['owner_cpu_us_per_commit'])} us running the "
            f"load itself, the clients {_f(clients)} us together: {_f(owner + clients)} us of CPU a commit "
            f"caps {cpus} cores at {cpus * 1e6 / (owner + clients):,.0f}/s, and the owner's share (one "
            f"GIL) at {1e6 / owner:,.0f}/s"
        )

    return why


def _why_remote_p50(durability: str) -> Callable[[dict[str, Json]], str]:
    def why(res: dict[str, Json]) -> str:
        lt = res["remote"]["latency"][durability]
        one, inproc, ping = lt["one"]["median_us"], lt["inproc"]["median_us"], lt["ping"]["median_us"]
        return (
            f"apply p50 {_f(one)} us from a client vs {_f(inproc)} us in the owner: {_f(one - inproc)} us "
            f"more; a ping (the client's loop, the socket both ways, the owner's loop, no commit) takes "
            f"{_f(ping)} us of it, the other {_f(one - inproc - ping)} us is the apply served on the owner's "
            "loop instead of called on a thread (decoding, the hop to the actor and back, encoding)"
        )

    return why


@dataclass(frozen=True)
class TargetSpec:
    id: str
    text: str
    row: str  # the row whose ratio is measured
    op: str  # "<=" or ">="
    threshold: float
    why: Callable[[dict[str, Json]], str] = field(repr=False)
    bound: float | None = None  # an absolute target: measured = the row's value / bound, threshold 1.0
    margin: float | None = None  # an offset target: measured = ours / (baseline + margin), threshold 1.0


TARGETS: tuple[TargetSpec, ...] = (
    TargetSpec("apply_p50", "apply p50 <= 1.0x the pykka echo ask", "apply_p50", "<=", 1.0,
               _why_apply("median_us", "p50")),
    TargetSpec("apply_lock", "apply p50 <= 2x a threading.Lock + dict update", "apply_lock", "<=", 2.0,
               _why_lock),
    TargetSpec("apply_p99", "apply p99 <= 1.5x the pykka echo ask", "apply_p99", "<=", 1.5,
               _why_apply("p99_us", "p99")),
    TargetSpec("pipeline_10", "pipelined aapply >= 0.2x raw tell (10 keys)", "pipeline_10", ">=", 0.2,
               _why_pipeline("10")),
    TargetSpec("pipeline_100k", "pipelined aapply >= 0.2x raw tell (100,000 keys)", "pipeline_100k",
               ">=", 0.2,
               _why_pipeline("100k")),
    TargetSpec("pipeline_flat", "pipelined apply flat to 100,000 keys (>= 0.9x the rate at 10)",
               "pipeline_flat", ">=", 0.9, _why_flat),
    TargetSpec("snapshot", "snapshot at 100,000 keys <= 1.1x at 10 keys (p50)", "snapshot_p50", "<=", 1.1,
               _why_snapshot),
    TargetSpec("durable_floor", "1 scope, sequential apply, sync >= 1.0x a bare synced LMDB txn",
               "durable_raw", ">=", 1.0, _why_durable_floor),
    TargetSpec("seq_fsync", "1 durable scope, sequential apply p50 <= 1.5x one fdatasync of its bytes",
               "seq_fsync", "<=", 1.5, _why_sequential("median_us")),
    TargetSpec("seq_lmdb", "1 durable scope, sequential commits/s >= 1.0x a bare synced LMDB txn (pinned)",
               "seq_lmdb", ">=", 1.0, _why_sequential("per_s")),
    TargetSpec("lg_put", "LangGraph put/s >= 0.9x SqliteSaver's", "lg_put", ">=", 0.9, _why_lg("put")),
    TargetSpec("lg_put_raw", "LangGraph put/s >= 0.9x a bare synced LMDB txn", "lg_put_raw", ">=", 0.9,
               _why_lg("put")),
    TargetSpec("lg_get", "LangGraph get_tuple/s >= 1x SqliteSaver's", "lg_get", ">=", 1.0, _why_lg("get")),
    TargetSpec("lg_graph", "200-step graph run <= 1.1x SqliteSaver's time", "lg_graph", "<=", 1.1,
               _why_lg("graph")),
    TargetSpec("lg_disk", "bytes on disk after the graph run <= 0.5x SqliteSaver's", "lg_disk", "<=", 0.5,
               _why_lg("disk")),
    TargetSpec("lg_concurrent", "50 graphs on 50 threads: wall time <= 0.33x SqliteSaver's", "lg_concurrent",
               "<=", 0.33, _why_lg("concurrent")),
    TargetSpec("lg_long_disk", "one 2,000-step thread: disk <= 0.1x SqliteSaver's", "lg_long_disk", "<=", 0.1,
               _why_lg("long_disk")),
    TargetSpec("lg_put_pg", "LangGraph put/s >= 1x PostgresSaver's", "lg_put_pg", ">=", 1.0,
               _why_pg("put_per_s")),
    TargetSpec("lg_get_pg", "LangGraph get_tuple/s >= 1x PostgresSaver's", "lg_get_pg", ">=", 1.0,
               _why_pg("get_tuple_per_s")),
    TargetSpec("lg_graph_pg", "200-step graph run <= 1x PostgresSaver's time", "lg_graph_pg", "<=", 1.0,
               _why_pg("graph_s")),
    TargetSpec("lg_concurrent_pg", "50 graphs on 50 threads: wall time <= 1x PostgresSaver's",
               "lg_concurrent_pg", "<=", 1.0, _why_pg("concurrent_s")),
    TargetSpec("storage", "bytes on disk after 1,000 steps <= 3x the final state", "storage", "<=", 3.0,
               _why_storage),
    TargetSpec("bytes_written", "bytes handed to LMDB over 10,000 one-message commits <= 3x the final state",
               "ckpt_bytes", "<=", 3.0, _why_checkpoints("bytes_put")),
    TargetSpec("disk_10k", "data.mdb after 10,000 steps <= 3x the final state", "ckpt_disk_10k", "<=", 3.0,
               _why_checkpoints("data_mdb")),
    TargetSpec("groupcommit_one_rate", "1 scope, 1,000 in flight, sync >= 10,000 commits/s",
               "groupcommit_one", ">=", 1.0, _why_groupcommit, bound=10_000.0),
    TargetSpec("groupcommit_one", "1 scope, 1,000 in flight, sync >= 0.5x in memory", "groupcommit_one", ">=",
               0.5, _why_groupcommit),
    TargetSpec("groupcommit_many", "100 scopes, 10,000 in flight, sync >= 0.5x in memory", "groupcommit_many",
               ">=", 0.5, _why_groupcommit),
    TargetSpec("groupcommit_sqlite", "100 scopes, 10,000 in flight, sync >= 5x SqliteSaver puts",
               "groupcommit_sqlite", ">=", 5.0, _why_groupcommit),
    TargetSpec("security_commits", "durable commits, encrypted >= 0.9x plaintext", "security_commits", ">=",
               0.9, _why_security_rate),
    TargetSpec("security_reopen", "reopen, encrypted >= 0.9x plaintext (time: <= 1/0.9)", "security_reopen",
               "<=", 1 / 0.9, _why_security_rate),
    TargetSpec("security_bytes", "bytes on disk, encrypted <= 1.05x plaintext", "security_bytes", "<=",
               1.05, _why_security),
    TargetSpec("otel_disabled", "apply p50, otel extra installed but not enabled <= 1.02x without it",
               "otel_disabled", "<=", 1.02, _why_otel),
    TargetSpec("virtual_bytes", "anon B per evicted conversation, store async <= 300 B (ours / 300 B)",
               "virtual_bytes", "<=", 1.0, _why_virtual_bytes("async"), bound=300.0),
    TargetSpec("virtual_bytes_sync", "anon B per evicted conversation, store sync <= 300 B (ours / 300 B)",
               "virtual_bytes_sync", "<=", 1.0, _why_virtual_bytes("sync"), bound=300.0),
    TargetSpec("virtual_create", "new conversations, store async >= 5,000/s (ours / 5,000/s)",
               "virtual_create", ">=", 1.0, _why_virtual_create("async"), bound=5000.0),
    TargetSpec("virtual_create_sync", "new conversations, store sync >= 2,000/s (ours / 2,000/s)",
               "virtual_create_sync", ">=", 1.0, _why_virtual_create("sync"), bound=2000.0),
    TargetSpec("virtual_touch", "random touches over N evicted >= 0.5x over 2,000 live", "virtual_touch",
               ">=", 0.5, _why_virtual_touch("throughput")),
    TargetSpec("virtual_react_p50", "reactivation p50 <= 300 us (ours / 300 us)", "virtual_react_p50", "<=",
               1.0, _why_virtual_touch("reactivation p50"), bound=300.0),
    TargetSpec("virtual_react_p99", "reactivation p99 <= 3 ms (ours / 3 ms)", "virtual_react_p99", "<=",
               1.0, _why_virtual_touch("reactivation p99"), bound=3000.0),
    TargetSpec("virtual_slowest", "slowest touch <= 100 ms (ours / 100 ms)", "virtual_slowest", "<=", 1.0,
               _why_virtual_touch("slowest request"), bound=100_000.0),
    *(
        TargetSpec(f"sdk_{key}_{what}", f"{name} {label} ahead of the SDK's own store", f"sdk_{key}_{what}",
                   ">=" if what != "p50" else "<=", 1.0, _why_sdk(key))
        for key, name in (("adk", "ADK"), ("openai", "OpenAI Agents"), ("claude", "Claude Agent"))
        for what, label in (("one", "1 writer"), ("p50", "1 writer p50"), ("many", "16 sessions"))
    ),
    TargetSpec("ray_apply_p50", "remote apply p50 <= 1.5x a bare Ray call with the same bytes",
               "ray_apply_p50", "<=", 1.5, _why_ray_apply),
    TargetSpec("ray_pipeline_rate", "pipelined aapply to 2 shards >= 20,000 commits/s (ours / 20,000/s)",
               "ray_pipeline", ">=", 1.0, _why_ray_rate, bound=20_000.0),
    TargetSpec("ray_cross_rate", "cross-shard batches writing global, 50 at once >= 1,000/s (ours / 1,000/s)",
               "ray_cross_rate", ">=", 1.0, _why_ray_cross, bound=1_000.0),
    TargetSpec("remote_four_sync", "4 client processes >= 0.7x the owner's own rate, LMDB sync",
               "remote_four_sync", ">=", 0.7, _why_remote_rate("sync")),
    TargetSpec("remote_p50_sync",
               "client apply p50 <= the owner's + 150 us, LMDB sync (ours / (owner's + 150 us))",
               "remote_p50_sync", "<=", 1.0, _why_remote_p50("sync"), margin=150.0),
    TargetSpec("remote_four_mem", "4 client processes >= 0.7x the owner's own rate, in memory",
               "remote_four_mem", ">=", 0.7, _why_remote_rate("mem")),
    TargetSpec("remote_p50_mem",
               "client apply p50 <= the owner's + 150 us, in memory (ours / (owner's + 150 us))",
               "remote_p50_mem", "<=", 1.0, _why_remote_p50("mem"), margin=150.0),
)  # fmt: skip


def _row(spec: RowSpec, results: dict[str, Json], status: dict[str, str]) -> dict[str, Any]:
    row: dict[str, Any] = {"id": spec.id, "bench": spec.bench, "what": spec.what, "unit": spec.unit}
    row |= {"better": spec.better, "ours": None, "baseline": None, "ratio": None, "note": ""}
    if spec.bench not in results:
        row["note"] = status.get(spec.bench, "not run")
        return row
    skipped = (results[spec.bench].get("skipped") or {}).get(spec.peer) if spec.peer else None
    if skipped:  # the benchmark ran ours, but could not run this row's baseline
        row["note"] = skipped
        return row
    try:
        ours, base, note = spec.values(results[spec.bench])
    except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError) as exc:
        row["note"] = f"not in this run's JSON ({type(exc).__name__}: {exc})"
        return row
    row |= {"ours": ours, "baseline": base, "ratio": ours / base if base else None, "note": note}
    return row


def evaluate(
    results: dict[str, Json], status: dict[str, str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Rows and target verdicts from each benchmark's JSON (``status``: why a bench has none)."""
    rows = [_row(spec, results, status) for spec in ROWS]
    by_id = {row["id"]: row for row in rows}
    targets = []
    for t in TARGETS:
        row = by_id[t.row]
        out: dict[str, Any] = {"id": t.id, "target": t.text, "op": t.op, "threshold": t.threshold}
        measured = row["ratio"]
        if t.bound is not None:  # an absolute target: the value against the bound, not the baseline
            measured = None if row["ours"] is None else row["ours"] / t.bound
            out["bound"] = t.bound
        elif t.margin is not None:  # an offset target: the value against the baseline plus the margin
            measured = None if row["ours"] is None else row["ours"] / (row["baseline"] + t.margin)
            out["margin"] = t.margin
        out |= {"bench": row["bench"], "row": t.row, "measured": measured, "why": ""}
        if measured is None:
            out["verdict"] = "NOT RUN"
            out["why"] = row["note"]
        else:
            met = measured <= t.threshold if t.op == "<=" else measured >= t.threshold
            out["verdict"] = "MET" if met else "MISSED"
            if not met:
                try:
                    out["why"] = t.why(results)
                except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
                    out["why"] = f"(no explanation: {type(exc).__name__}: {exc})"
        targets.append(out)
    return rows, targets
