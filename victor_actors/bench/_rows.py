"""The rows of ``victor-actors bench``'s table: a measured value against its same-run baseline.

Each row reads one benchmark's JSON and returns ``(ours, baseline, note)``;
its ratio is ours / baseline. A row whose baseline is a LangGraph peer names
it (``peer="langgraph"``): when the benchmark could not run that peer (the
bench extra is missing) it lists it under ``skipped`` in its JSON, and the
row says why instead of a ratio.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["LANGGRAPH", "ROWS", "Json", "RowSpec", "lat", "pin_note"]

Json = Any
LANGGRAPH = "langgraph"  # the peer subject of the store and agent benchmarks


@dataclass(frozen=True)
class RowSpec:
    """One line of the table: ``ours`` against ``baseline``, ratio = ours / baseline."""

    id: str
    bench: str
    what: str
    unit: str  # of ours and baseline: "us", "ops/s", "B", "s", "steps/s"
    better: str  # "lower" or "higher": which way the ratio is good
    values: Callable[[Json], tuple[float, float, str]]  # the bench's JSON -> (ours, baseline, note)
    peer: str | None = None  # the baseline is this peer subject (see ``skipped`` in the bench's JSON)


def lat(r: Json, key: str, stat: str) -> float:
    return float(r["latency"][key][stat])


def pin_note(r: Json) -> str:
    """Where a latency was measured: the process pinned to one CPU, or why not (older JSON: unknown)."""
    pin = r.get("pinned")
    return str(pin["how"]) if pin else "pinning not recorded"


def _core_apply(stat: str) -> Callable[[Json], tuple[float, float, str]]:
    def values(r: Json) -> tuple[float, float, str]:
        n = r["latency"]["apply1"]["n"]
        note = f"{n:,} calls; of which the apply call {lat(r, 'apply1_call', stat):.1f} us; {pin_note(r)}"
        return lat(r, "apply1", stat), lat(r, "echo", stat), note

    return values


def _core_lock(r: Json) -> tuple[float, float, str]:
    note = f"the lock and the update on the caller's thread, timer included; {pin_note(r)}"
    return lat(r, "apply1", "median_us"), lat(r, "lock", "median_us"), note


def _sequential(base: str, stat: str) -> Callable[[Json], tuple[float, float, str]]:
    """One durable scope, sequential: ours against ``base`` (fdatasync, lmdb, memory) on ``stat``."""

    def values(r: Json) -> tuple[float, float, str]:
        lt = r["latency"]
        ours, other = lt["ours"], lt[base]
        note = (
            f"{r['record_bytes']:,} B a commit; p50 {ours['median_us']:,.0f} vs "
            f"{other['median_us']:,.0f} us, "
            f"{ours['per_s']:,.0f} vs {other['per_s']:,.0f}/s; {pin_note(r)}"
        )
        return float(ours[stat]), float(other[stat]), note

    return values


def _simulate(ours: str, base: str) -> Callable[[Json], tuple[float, float, str]]:
    def values(r: Json) -> tuple[float, float, str]:
        cfg, rates = r["config"], r["rates"]
        note = (
            f"{cfg['agents']} agents x {cfg['steps']} turns, seed {cfg['seed']}, {cfg['rounds']} round(s), "
            f"{rates[ours]['commits']:,} commits; {pin_note(r)}"
        )
        failed = {k: rates[k].get("failed_runs", 0) for k in (ours, base)}
        if any(failed.values()):  # a run whose invariants did not all hold: its rate is shown, and so is that
            note += f"; runs that FAILED their invariants: {ours} {failed[ours]}, {base} {failed[base]}"
        return float(rates[ours]["commits_per_s"]), float(rates[base]["commits_per_s"]), note

    return values


def _core_aapply(r: Json) -> tuple[float, float, str]:
    note = f"asyncio twin, one at a time; {pin_note(r)}"
    return lat(r, "aapply1", "median_us"), lat(r, "echo", "median_us"), note


def _core_snapshot(stat: str) -> Callable[[Json], tuple[float, float, str]]:
    def values(r: Json) -> tuple[float, float, str]:
        copy = lat(r, "copy_dict", "median_us")
        return lat(r, "snap100k", stat), lat(r, "snap10", stat), f"a dict copy of 100k keys: {copy:,.0f} us"

    return values


def _pipe(key: str, base: str = "tell") -> Callable[[Json], tuple[float, float, str]]:
    def values(r: Json) -> tuple[float, float, str]:
        note = f"{r['in_flight']:,} in flight x {r['rounds']} rounds"
        return float(r["throughput"][key]["per_s"]), float(r["throughput"][base]["per_s"]), note

    return values


def _store_rate(key: str, base: str = "sqlite_put") -> Callable[[Json], tuple[float, float, str]]:
    def values(r: Json) -> tuple[float, float, str]:
        acc = r["throughput"][key]
        note = f"{acc['store_commits'] / acc['store_txns']:.1f} commits/txn" if acc.get("store_txns") else ""
        if base == "raw_lmdb":  # a rate over interleaved blocks, some of them 100 threads: not pinned
            note = ", ".join(p for p in (note, "not pinned (the pinned figure: sequential)") if p)
        return float(acc["rate"]), float(r["throughput"][base]["rate"]), note

    return values


def _storage_vs_final(r: Json) -> tuple[float, float, str]:
    st = r["storage"]
    ours = st["ours"]
    note = f"{st['steps']:,} steps; {ours['kept']}"
    return float(ours["data_mdb"]["size"]), float(ours["final_state_bytes"]), note


def _storage_scope(r: Json) -> tuple[float, float, str]:
    ours = r["storage"]["ours"]
    return float(ours["scope_bytes"]), float(ours["final_state_bytes"]), "size_of(scope): its own records"


def _storage_vs_plain(r: Json) -> tuple[float, float, str]:
    st = r["storage"]
    return (
        float(st["ours"]["data_mdb"]["size"]),
        float(st["plain_msgpack_bytes"]),
        "final state, plain msgpack",
    )


def _storage_vs_sqlite(r: Json) -> tuple[float, float, str]:
    st = r["storage"]
    note = f"SqliteSaver's final state {st['sqlite']['final_state_bytes']:,} B"
    return float(st["ours"]["data_mdb"]["size"]), float(st["sqlite"]["file"]["size"]), note


def _agent(key: str, base: str = "langgraph_sqlite") -> Callable[[Json], tuple[float, float, str]]:
    def values(r: Json) -> tuple[float, float, str]:
        note = f"{r['rounds']} rounds x {r['steps']} steps from 100 messages"
        return float(r["rates"][key]), float(r["rates"][base]), note

    return values


def _lg(key: str, base: str = "sqlite") -> Callable[[Json], tuple[float, float, str]]:
    """A LangGraph-saver row: ours against ``base`` (a saver, or ``raw_lmdb``) on one measure."""

    def pick(res: Json, subject: str) -> float:
        if subject not in res:
            raise KeyError(f"{subject} was not measured in this run (see the benchmark's 'skipped')")
        value = res[subject][key]
        if isinstance(value, list):  # timed runs, one per round: their mean
            return sum(value) / len(value)
        if isinstance(value, dict):  # bytes on disk
            return float(value["size"])
        return float(value)

    def values(r: Json) -> tuple[float, float, str]:
        res, meta = r["results"], r["meta"]
        note = f"{meta['rounds']} interleaved round(s)"
        if key == "concurrent_s":
            store = res["victor_actors"].get("concurrent_store") or {}
            note = f"{meta['graphs']} graphs x {meta['graph_steps']} steps on as many threads"
            if store:
                note += f"; ours: {store['commits']:,} commits in {store['transactions']:,} transactions"
        elif key == "long_disk":
            note = f"one {meta['long_steps']:,}-step thread"
        elif key == "graph_s":
            note = f"a {meta['steps']}-step StateGraph, durability 'sync', {meta['rounds']} round(s)"
        return pick(res, "victor_actors"), pick(res, base), note

    return values


def _groupcommit(ours: str, base: str) -> Callable[[Json], tuple[float, float, str]]:
    def values(r: Json) -> tuple[float, float, str]:
        res, txns = r["results"], r["transactions"]
        rounds = len(r["rounds"]["one_sync"])
        note = f"best of {rounds} rounds; transactions: 1 scope {txns['one']}, 100 scopes {txns['many']}"
        if res.get(base) is None:
            raise KeyError(f"{base} was not measured (langgraph-checkpoint-sqlite is not installed)")
        return float(res[ours]), float(res[base]), note

    return values


def _checkpoints(steps: str | None, key: str) -> Callable[[Json], tuple[float, float, str]]:
    def values(r: Json) -> tuple[float, float, str]:
        run = r["runs"][str(r["long"]) if steps is None else steps]
        final = run["final_state_bytes"]
        note = (
            f"{run['steps']:,} steps; commit log {run['log_bytes_put'] / final:.2f}x, checkpoints "
            f"{run['checkpoint_bytes_put'] / final:.2f}x; messages as plain msgpack "
            f"{run['final_plain_bytes'] / final:.2f}x"
        )
        if key == "reload_seconds":
            note = f"{run['steps']:,} steps; a bare open {run['open_seconds'] * 1e3:.1f} ms"
            return float(run[key]), float(run["decode_full_seconds"]), note
        return float(run[key]), float(final), note

    return values


def _security(key: str) -> Callable[[Json], tuple[float, float, str]]:
    def values(r: Json) -> tuple[float, float, str]:
        note = f"{r['rounds']} interleaved rounds x {r['commits_per_round']} commits"
        table = {"rates": r["rates"], "reopen_seconds": r["reopen_seconds"], "bytes": r["bytes"]}[key]
        return float(table["encrypted"]), float(table["plain"]), note

    return values


def _otel_disabled(r: Json) -> tuple[float, float, str]:
    d = r["disabled"]
    note = (
        f"{d['processes_per_side']} processes each, alternating; "
        f"echo-normalised {d['ratio_p50_echo_normalised']:.3f}x"
    )
    return float(d["imported_p50_us"]), float(d["plain_p50_us"]), note


def _otel_enabled(key: str, what: str) -> Callable[[Json], tuple[float, float, str]]:
    def values(r: Json) -> tuple[float, float, str]:
        e = r["enabled"]
        return float(e[key]["median_us"]), float(e["off"]["median_us"]), what

    return values


def _startup_sizes(r: Json) -> list[str]:
    return sorted(r["sizes"], key=int)


def _startup(which: int) -> Callable[[Json], tuple[float, float, str]]:
    def values(r: Json) -> tuple[float, float, str]:
        size = r["sizes"][_startup_sizes(r)[which]]
        ours, bare = size["ours"], size["bare"]
        kib = (
            f"{ours['rss_per_actor_bytes'] / 1024:.1f} vs {bare['rss_per_actor_bytes'] / 1024:.1f} KiB/actor"
        )
        rounds = size["rounds"]
        note = f"{size['actors']:,} actors, {rounds} round{'' if rounds == 1 else 's'}; {kib}"
        return float(ours["start_s"]), float(bare["start_s"]), note

    return values


def _virtual_bytes(mode: str) -> Callable[[Json], tuple[float, float, str]]:
    def values(r: Json) -> tuple[float, float, str]:
        s = r["store"][mode]
        live = r["memory"]["live"]
        note = (
            f"{s['conversations']:,} evicted; second half {s['marginal_bytes_per_conversation']:,.0f} B "
            f"each; peak anon {s['anon_peak'] / 2**20:,.0f} MiB; baseline: {live['conversations']:,} live"
        )
        return float(s["bytes_per_conversation"]), float(live["bytes_per_conversation"]), note

    return values


def _virtual_bytes_memory(r: Json) -> tuple[float, float, str]:
    m, live = r["memory"]["evicted"], r["memory"]["live"]
    note = (
        f"{m['conversations']:,} evicted, {m['encoded_bytes_per_conversation']:,.0f} B encoded each, "
        f"second half {m['marginal_bytes_per_conversation']:,.0f} B each; "
        f"old code ~{r['quoted']['bytes']:,} B (quoted)"
    )
    return float(m["bytes_per_conversation"]), float(live["bytes_per_conversation"]), note


def _virtual_create(mode: str) -> Callable[[Json], tuple[float, float, str]]:
    def values(r: Json) -> tuple[float, float, str]:
        s = r["store"][mode]
        d = s["during"]
        note = (
            f"{s['conversations']:,} by {s['tasks']} tasks; {d['evicted']:,} evicted in "
            f"{d['eviction_rounds']:,} rounds ({d['eviction_s']:,.1f} s on the evictor)"
        )
        return float(s["create_per_s"]), float(r["memory"]["evicted"]["create_per_s"]), note

    return values


def _virtual_create_seq(r: Json) -> tuple[float, float, str]:
    s, floor = r["store"]["async"], r["pykka_floor"]
    note = f"{s['seq_conversations']:,} conversations; sync: {r['store']['sync']['seq_per_s']:,.0f}/s"
    return float(s["seq_per_s"]), float(floor["per_s"]), note


def _virtual_touch(key: str, base: str | None = None) -> Callable[[Json], tuple[float, float, str]]:
    def values(r: Json) -> tuple[float, float, str]:
        t = r["touch"]
        note = (
            f"{t['touches']:,} touches over {r['conversations']:,}, {t['reactivations']:,} reactivations; "
            f"{t['rounds']} interleaved rounds; {pin_note(t)}"
        )
        return float(t[key]), float(t["baseline"][base or key]), note

    return values


def _ray_apply(stat: str) -> Callable[[Json], tuple[float, float, str]]:
    def values(r: Json) -> tuple[float, float, str]:
        lt = r["latency"]
        note = (
            f"{lt['apply']['n']:,} calls, 2 shards in memory; bare call carries {lt['request_bytes']:,} B, "
            f"returns {lt['reply_bytes']:,} B"
        )
        return float(lt["apply"][stat]), float(lt["bare"][stat]), note

    return values


def _ray_rate(ours: str, base: str) -> Callable[[Json], tuple[float, float, str]]:
    def values(r: Json) -> tuple[float, float, str]:
        tp, cfg = r["throughput"], r["config"]
        o = tp[ours]
        note = (
            f"{cfg['commits']:,} over {cfg['conversations']} conversations, {cfg['inflight']:,} in flight; "
            f"{o['ops_per_call']:,.0f} ops per Ray call; best of {len(o['rounds'])}"
        )
        return float(o["per_s"]), float(tp[base]["per_s"]), note

    return values


def _ray_cross(r: Json) -> tuple[float, float, str]:
    x = r["cross_shard"]
    note = f"{x['lone']['n']:,} one at a time; {x['per_s']:,.0f}/s from {x['tasks']} conversations at once"
    return float(x["lone"]["median_us"]), float(r["latency"]["apply"]["median_us"]), note


def _ray_cross_rate(r: Json) -> tuple[float, float, str]:
    x = r["cross_shard"]
    note = f"{x['commits']:,} batches from {x['tasks']} conversations at once; {x.get('aborted', 0)} aborted"
    return float(x["per_s"]), 1e6 / float(x["lone"]["median_us"]), note


def _ray_directory(r: Json) -> tuple[float, float, str]:
    d = r["directory"]
    note = (
        f"{d['scopes']:,} conversations opened by id by a driver that had not seen them; "
        f"a cached open {d['hit']['median_us']:,.1f} us"
    )
    return float(d["known"]["median_us"]), float(d["apply"]["median_us"]), note


def _ray_shard_memory(r: Json) -> tuple[float, float, str]:
    p = r["memory"]["process"]
    note = f"Pss of fresh processes; RSS {p['shard_rss'] / 2**20:,.0f} vs {p['bare_rss'] / 2**20:,.0f} MiB"
    return float(p["shard_pss"]), float(p["bare_pss"]), note


def _ray_scope_memory(r: Json) -> tuple[float, float, str]:
    s = r["memory"]["scopes"]
    note = f"{s['conversations']:,} one-message conversations; RssAnon deltas"
    return float(s["shard"]["bytes_per_conversation"]), float(s["local"]["bytes_per_conversation"]), note


def _sdk(key: str, what: str) -> Callable[[Json], tuple[float, float, str]]:
    def values(r: Json) -> tuple[float, float, str]:
        e = r["subjects"][key]
        note = f"vs {e['peer']} ({e['version']}); median of {r['rounds']} interleaved rounds"
        refused = {side: e[side].get("many_errors", 0) for side in ("ours", "theirs")}
        if what.startswith("many") and any(refused.values()):
            note += f"; calls refused (ours, theirs): {refused['ours']}, {refused['theirs']}"
        return float(e["ours"][what]), float(e["theirs"][what]), note

    return values


_REMOTE_LABEL = {"sync": "LMDB sync", "mem": "in memory"}


def _remote_rate(kind: str, durability: str) -> Callable[[Json], tuple[float, float, str]]:
    def values(r: Json) -> tuple[float, float, str]:
        cfg, rates = r["config"], r["rate"][durability]
        o, base = rates[kind], rates["inproc"]
        median = o["median_per_s"] / base["median_per_s"]
        note = (
            f"{cfg['commits']:,} commits over {cfg['conversations']} conversations, {cfg['inflight']:,} in "
            f"flight; {o['ops_per_call']:,.0f} ops per call; best of {len(o['rounds'])} "
            f"(medians: {median:.2f}x)"
        )
        return float(o["per_s"]), float(base["per_s"]), note

    return values


def _remote_apply(stat: str, durability: str) -> Callable[[Json], tuple[float, float, str]]:
    def values(r: Json) -> tuple[float, float, str]:
        lt = r["latency"][durability]
        ping = lt["ping"]["median_us"]
        note = f"{lt['one']['n']:,} calls each; a client's ping (no commit) p50 {ping:,.0f} us"
        return float(lt["one"][stat]), float(lt["inproc"][stat]), note

    return values


def _remote_cpu(durability: str) -> Callable[[Json], tuple[float, float, str]]:
    def values(r: Json) -> tuple[float, float, str]:
        rates = r["rate"][durability]
        four = rates["four"]
        note = (
            f"with 1 client the owner's is {rates['one']['owner_cpu_us_per_commit']:,.0f} us; the 4 "
            f"clients' own {four['clients_cpu_us_per_commit']:,.0f} us"
        )
        return float(four["owner_cpu_us_per_commit"]), float(rates["inproc"]["owner_cpu_us_per_commit"]), note

    return values


def _remote_rows() -> tuple[RowSpec, ...]:
    rows = []
    for d in ("sync", "mem"):
        label = _REMOTE_LABEL[d]
        rows += [
            RowSpec(f"remote_one_{d}", "remote",
                    f"pipelined aapply, 1 client process / in the owner, {label}", "ops/s", "higher",
                    _remote_rate("one", d)),
            RowSpec(f"remote_four_{d}", "remote",
                    f"pipelined aapply, 4 client processes / in the owner, {label}", "ops/s", "higher",
                    _remote_rate("four", d)),
            RowSpec(f"remote_p50_{d}", "remote", f"apply p50 from a client / in the owner, {label}", "us",
                    "lower", _remote_apply("median_us", d)),
            RowSpec(f"remote_p99_{d}", "remote", f"apply p99 from a client / in the owner, {label}", "us",
                    "lower", _remote_apply("p99_us", d)),
            RowSpec(f"remote_cpu_{d}", "remote",
                    f"owner CPU per commit, 4 clients / the owner running the load, {label}", "us", "lower",
                    _remote_cpu(d)),
        ]  # fmt: skip
    return tuple(rows)


_R = RowSpec
ROWS: tuple[RowSpec, ...] = (
    _R("apply_p50", "core", "apply round trip p50 / pykka echo ask p50", "us", "lower",
       _core_apply("median_us")),
    _R("apply_p99", "core", "apply round trip p99 / pykka echo ask p99", "us", "lower",
       _core_apply("p99_us")),
    _R("apply_lock", "core", "apply round trip p50 / threading.Lock + dict update p50", "us", "lower",
       _core_lock),
    _R("aapply_p50", "core", "aapply round trip p50 / pykka echo ask p50", "us", "lower", _core_aapply),
    _R("snapshot_p50", "core", "snapshot() p50 at 100,000 keys / at 10 keys", "us", "lower",
       _core_snapshot("median_us")),
    _R("snapshot_p99", "core", "snapshot() p99 at 100,000 keys / at 10 keys", "us", "lower",
       _core_snapshot("p99_us")),
    _R("pipeline_10", "pipeline", "pipelined aapply, 10-key scope / raw pykka tell", "ops/s", "higher",
       _pipe("aapply_10")),
    _R("pipeline_100k", "pipeline", "pipelined aapply, 100,000-key scope / raw pykka tell", "ops/s", "higher",
       _pipe("aapply_100k")),
    _R("pipeline_flat", "pipeline", "pipelined aapply at 100,000 keys / at 10 keys", "ops/s", "higher",
       _pipe("aapply_100k", "aapply_10")),
    _R("pipeline_futures", "pipeline", "sync pipelined apply (pykka futures) / raw tell", "ops/s", "higher",
       _pipe("futures_10")),
    _R("durable_1", "store", "durable commits/s, 1 scope / SqliteSaver put", "ops/s", "higher",
       _store_rate("sync1"), LANGGRAPH),
    _R("durable_100", "store", "durable commits/s, 100 scopes / SqliteSaver put", "ops/s", "higher",
       _store_rate("sync100"), LANGGRAPH),
    _R("durable_raw", "store", "durable commits/s, 1 scope / raw LMDB synced txn", "ops/s", "higher",
       _store_rate("sync1", "raw_lmdb")),
    _R("seq_fsync", "sequential", "1 durable scope, sequential apply p50 / pwrite + fdatasync of its bytes",
       "us", "lower", _sequential("fdatasync", "median_us")),
    _R("seq_lmdb", "sequential", "1 durable scope, sequential commits/s / bare synced LMDB txn of its bytes",
       "ops/s", "higher", _sequential("lmdb", "per_s")),
    _R("seq_memory", "sequential", "1 scope, sequential apply p50, durable / in memory (no store)", "us",
       "lower", _sequential("memory", "median_us")),
    _R("storage", "store", "bytes on disk after the conversation / final state", "B", "lower",
       _storage_vs_final),
    _R("storage_scope", "store", "the scope's stored records / final state", "B", "lower", _storage_scope),
    _R("storage_plain", "store", "bytes on disk / final state as plain msgpack", "B", "lower",
       _storage_vs_plain),
    _R("storage_sqlite", "store", "bytes on disk / SqliteSaver's file, same run", "B", "lower",
       _storage_vs_sqlite, LANGGRAPH),
    _R("agent", "agent", "agent step, durable / LangGraph 1-node StateGraph", "steps/s", "higher",
       _agent("ours_sync"), LANGGRAPH),
    _R("agent_memory", "agent", "agent step, in memory / LangGraph 1-node StateGraph", "steps/s", "higher",
       _agent("ours_memory"), LANGGRAPH),
    _R("agent_durable", "agent", "agent step, durable / the same in memory (no store)", "steps/s", "higher",
       _agent("ours_sync", "ours_memory")),
    _R("lg_put", "langgraph", "LangGraph put/s, ours / SqliteSaver", "ops/s", "higher", _lg("put_per_s")),
    _R("lg_put_raw", "langgraph", "LangGraph put/s, ours / a bare synced LMDB txn of the checkpoint", "ops/s",
       "higher", _lg("put_per_s", "raw_lmdb")),
    _R("lg_get", "langgraph", "LangGraph get_tuple/s, ours / SqliteSaver", "ops/s", "higher",
       _lg("get_tuple_per_s")),
    _R("lg_graph", "langgraph", "200-step graph run time, ours / SqliteSaver", "s", "lower", _lg("graph_s")),
    _R("lg_disk", "langgraph", "bytes on disk after the 200-step run, ours / SqliteSaver", "B", "lower",
       _lg("disk")),
    _R("lg_concurrent", "langgraph", "50 graphs on 50 threads, wall time, ours / SqliteSaver", "s", "lower",
       _lg("concurrent_s")),
    _R("lg_long_disk", "langgraph", "bytes on disk after one 2,000-step thread, ours / SqliteSaver", "B",
       "lower", _lg("long_disk")),
    _R("lg_put_pg", "langgraph", "LangGraph put/s, ours / PostgresSaver (a local PostgreSQL)", "ops/s",
       "higher", _lg("put_per_s", "postgres")),
    _R("lg_get_pg", "langgraph", "LangGraph get_tuple/s, ours / PostgresSaver", "ops/s", "higher",
       _lg("get_tuple_per_s", "postgres")),
    _R("lg_graph_pg", "langgraph", "200-step graph run time, ours / PostgresSaver", "s", "lower",
       _lg("graph_s", "postgres")),
    _R("lg_concurrent_pg", "langgraph", "50 graphs on 50 threads, wall time, ours / PostgresSaver", "s",
       "lower", _lg("concurrent_s", "postgres")),
    _R("groupcommit_one", "groupcommit", "1 scope, 1,000 aapply in flight: sync / in memory", "ops/s",
       "higher", _groupcommit("one_sync", "one_mem")),
    _R("groupcommit_many", "groupcommit", "100 scopes, 10,000 aapply in flight: sync / in memory", "ops/s",
       "higher", _groupcommit("many_sync", "many_mem")),
    _R("groupcommit_sqlite", "groupcommit", "100 scopes, 10,000 in flight, sync / SqliteSaver puts", "ops/s",
       "higher", _groupcommit("many_sync", "sqlite_puts")),
    _R("simulate", "simulate", "victor-actors simulate commits/s, sync / async durability", "ops/s",
       "higher", _simulate("sync", "async")),
    _R("simulate_clean", "simulate", "simulate commits/s without faults, sync / async durability", "ops/s",
       "higher", _simulate("sync_clean", "async_clean")),
    _R("ckpt_bytes", "checkpoints", "bytes handed to LMDB over 10,000 one-message commits / final state",
       "B", "lower", _checkpoints(None, "bytes_put")),
    _R("ckpt_disk_1k", "checkpoints", "data.mdb after 1,000 one-message commits / final state", "B", "lower",
       _checkpoints("1000", "data_mdb")),
    _R("ckpt_disk_10k", "checkpoints", "data.mdb after 10,000 one-message commits / final state", "B",
       "lower", _checkpoints(None, "data_mdb")),
    _R("ckpt_reload", "checkpoints", "reload after 10,000 commits / decoding one full state record", "s",
       "lower", _checkpoints(None, "reload_seconds")),
    _R("security_commits", "security", "durable commits/s, encrypted / plaintext", "ops/s", "higher",
       _security("rates")),
    _R("security_reopen", "security", "reopen and read every scope, encrypted / plaintext", "s", "lower",
       _security("reopen_seconds")),
    _R("security_bytes", "security", "data.mdb bytes, encrypted / plaintext", "B", "lower",
       _security("bytes")),
    _R("otel_disabled", "otel", "apply p50, otel extra imported but off / never imported", "us", "lower",
       _otel_disabled),
    _R("otel_enabled", "otel", "apply p50, instrumented (OTel SDK) / not instrumented", "us", "lower",
       _otel_enabled("sdk", "same process; batched span export, a metric reader")),
    _R("otel_noop", "otel", "apply p50, instrumented (no-op providers) / not instrumented", "us", "lower",
       _otel_enabled("noop", "same process; the hooks' own cost")),
    _R("startup_small", "startup", "start N scope actors / N bare pykka actors (smaller N)", "s", "lower",
       _startup(0)),
    _R("startup_large", "startup", "start N scope actors / N bare pykka actors (larger N)", "s", "lower",
       _startup(1)),
    _R("virtual_bytes", "virtual", "anon B per evicted conversation, store async / one live, no store", "B",
       "lower", _virtual_bytes("async")),
    _R("virtual_bytes_sync", "virtual", "anon B per evicted conversation, store sync / one live, no store",
       "B", "lower", _virtual_bytes("sync")),
    _R("virtual_bytes_memory", "virtual", "anon B per evicted conversation, no store / one live", "B",
       "lower", _virtual_bytes_memory),
    _R("virtual_create", "virtual", "new conversations/s, store async / no store, same cap and driver",
       "ops/s", "higher", _virtual_create("async")),
    _R("virtual_create_sync", "virtual", "new conversations/s, store sync / no store, same cap and driver",
       "ops/s", "higher", _virtual_create("sync")),
    _R("virtual_create_seq", "virtual", "new conversations/s, one thread, store async / bare pykka actor",
       "ops/s", "higher", _virtual_create_seq),
    _R("virtual_touch", "virtual", "random touches/s over N mostly evicted / over 2,000 live", "ops/s",
       "higher", _virtual_touch("per_s")),
    _R("virtual_touch_p50", "virtual", "touch p50, N mostly evicted / 2,000 live", "us", "lower",
       _virtual_touch("p50_us")),
    _R("virtual_touch_p99", "virtual", "touch p99, N mostly evicted / 2,000 live", "us", "lower",
       _virtual_touch("p99_us")),
    _R("virtual_react_p50", "virtual", "reactivating touch p50 / touch of a live scope p50", "us", "lower",
       _virtual_touch("react_p50_us", "p50_us")),
    _R("virtual_react_p99", "virtual", "reactivating touch p99 / touch of a live scope p99", "us", "lower",
       _virtual_touch("react_p99_us", "p99_us")),
    _R("virtual_slowest", "virtual", "slowest touch, N mostly evicted / 2,000 live", "us", "lower",
       _virtual_touch("max_us")),
    _R("sdk_adk_one", "sdk", "ADK append_event/s, 1 writer, durable / ADK's SqliteSessionService", "ops/s",
       "higher", _sdk("adk", "one_per_s"), "adk"),
    _R("sdk_adk_p50", "sdk", "ADK append_event p50, 1 writer / ADK's SqliteSessionService", "us", "lower",
       _sdk("adk", "one_p50_us"), "adk"),
    _R("sdk_adk_many", "sdk", "ADK append_event/s, 16 sessions / ADK's SqliteSessionService", "ops/s",
       "higher", _sdk("adk", "many_per_s"), "adk"),
    _R("sdk_openai_one", "sdk", "OpenAI add_items/s, 1 writer, durable / SQLiteSession (WAL, FULL)", "ops/s",
       "higher", _sdk("openai", "one_per_s"), "openai"),
    _R("sdk_openai_p50", "sdk", "OpenAI add_items p50, 1 writer / SQLiteSession", "us", "lower",
       _sdk("openai", "one_p50_us"), "openai"),
    _R("sdk_openai_many", "sdk", "OpenAI add_items/s, 16 sessions / SQLiteSession", "ops/s", "higher",
       _sdk("openai", "many_per_s"), "openai"),
    _R("sdk_claude_one", "sdk", "Claude append/s, 1 writer, durable / InMemorySessionStore (not durable)",
       "ops/s", "higher", _sdk("claude", "one_per_s"), "claude"),
    _R("sdk_claude_p50", "sdk", "Claude append p50, 1 writer / InMemorySessionStore", "us", "lower",
       _sdk("claude", "one_p50_us"), "claude"),
    _R("sdk_claude_many", "sdk", "Claude append/s, 16 sessions / InMemorySessionStore", "ops/s", "higher",
       _sdk("claude", "many_per_s"), "claude"),
    _R("ray_apply_p50", "ray", "remote apply p50 / a bare Ray actor call carrying the same bytes", "us",
       "lower", _ray_apply("median_us")),
    _R("ray_apply_p99", "ray", "remote apply p99 / a bare Ray actor call carrying the same bytes", "us",
       "lower", _ray_apply("p99_us")),
    _R("ray_pipeline", "ray", "pipelined aapply, 2 shards / a bare Ray call carrying 1,000 requests",
       "ops/s", "higher", _ray_rate("two", "bare_batched")),
    _R("ray_pipeline_1", "ray", "pipelined aapply, 1 shard / a bare Ray call carrying 1,000 requests",
       "ops/s", "higher", _ray_rate("one", "bare_batched")),
    _R("ray_shards", "ray", "pipelined aapply, 2 shards / 1 shard", "ops/s", "higher",
       _ray_rate("two", "one")),
    _R("ray_vs_local", "ray", "pipelined aapply, 2 shards / a local in-memory manager (no Ray)", "ops/s",
       "higher", _ray_rate("two", "local")),
    _R("ray_cross_p50", "ray", "cross-shard batch (conversation + global) p50 / one-shard apply p50", "us",
       "lower", _ray_cross),
    _R("ray_cross_rate", "ray", "cross-shard batches writing global, 50 at once / the same one at a time",
       "ops/s", "higher", _ray_cross_rate),
    _R("ray_directory_miss", "ray", "directory miss (a scope another driver created) p50 / apply p50", "us",
       "lower", _ray_directory),
    _R("ray_shard_memory", "ray", "a shard process's memory / a bare Ray actor's", "B", "lower",
       _ray_shard_memory),
    _R("ray_scope_memory", "ray", "anon B per conversation in a shard / in a local manager", "B", "lower",
       _ray_scope_memory),
    *_remote_rows(),
)  # fmt: skip
