"""The benchmarks ``victor-actors bench`` knows: their modules, what they need, which run by default."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

__all__ = ["BENCHMARKS", "INSTALL_HINT", "Bench", "distribution", "missing_dependency"]

INSTALL_HINT = "pip install 'victor-actors[bench]'"
# An importable module each optional dependency must provide, and the distribution to name.
_DISTRIBUTIONS = {
    "langgraph": "langgraph",
    "langgraph.checkpoint": "langgraph-checkpoint",
    "langgraph.checkpoint.sqlite": "langgraph-checkpoint-sqlite",
    "langgraph_checkpoint_lmdb": "langgraph-checkpoint-lmdb",
    "matplotlib": "matplotlib",
    "opentelemetry.sdk": "opentelemetry-sdk",
}


@dataclass(frozen=True)
class Bench:
    """One benchmark: ``python -m <module> [--quick] --json FILE`` in a fresh process."""

    name: str
    about: str
    needs: tuple[str, ...] = ()  # modules that must import, or the whole benchmark is skipped
    default: bool = True  # part of a plain ``victor-actors bench``
    timeout: float = 3600.0
    module: str = ""  # default: victor_actors.bench.<name>

    def __post_init__(self) -> None:
        if not self.module:
            object.__setattr__(self, "module", f"victor_actors.bench.{self.name}")


BENCHMARKS: dict[str, Bench] = {
    b.name: b
    for b in (
        Bench("core", "apply round trip vs a pykka echo ask; snapshot at 10 vs 100,000 keys"),
        Bench("pipeline", "pipelined aapply vs raw pykka tell, at 10 and 100,000 keys"),
        Bench("startup", "start-up of 1,000 and 10,000 scope actors vs bare pykka actors"),
        # store and agent measure ours without LangGraph; only their LangGraph peers need the extra
        Bench("store", "durable commits/s vs SqliteSaver puts; bytes on disk after 1,000 steps"),
        Bench("agent", "agent step vs a one-node LangGraph StateGraph with SqliteSaver"),
        Bench(
            "listing",
            "inspector pages (children, level, prefix) and read-only open vs the full scan, 1,000,000 scopes",
            default=False,
        ),
        Bench("groupcommit", "durable commits with many aapply in flight vs in memory and SqliteSaver"),
        Bench(
            "sequential",
            "one durable scope, sequential apply, pinned to one CPU, vs one fdatasync of its bytes and a "
            "bare synced LMDB txn",
        ),
        Bench("simulate", "victor-actors simulate's commits/s on a fixed workload, sync vs async durability"),
        Bench("checkpoints", "bytes put and data.mdb over 1,000 and 10,000 commits vs the final state"),
        Bench("security", "encryption at rest vs plaintext: durable commits/s, reopen time, bytes on disk"),
        Bench(
            "otel",
            "apply p50: the otel extra imported but off vs never imported, and instrumented",
            needs=("opentelemetry.sdk",),
        ),
        Bench("scale", "passivation of 100,000 conversations under a cap", default=False),
        Bench(
            "virtual",
            "virtual scopes: 1,000,000 conversations evicted to the store; memory, creation, reactivation",
            default=False,
        ),
        Bench(
            "langgraph",
            "LangGraph checkpointers side by side (ours, SqliteSaver, LMDBSaver, PostgresSaver when a local "
            "PostgreSQL can be started): put, get_tuple, graph "
            "runs, 50 concurrent graphs, one 2,000-step thread",
            needs=("langgraph", "langgraph.checkpoint.sqlite", "langgraph_checkpoint_lmdb"),
        ),
        Bench(
            "sdk",
            "agent-SDK session stores (ADK, OpenAI Agents, Claude Agent) vs each SDK's own store: "
            "1 writer and 16 sessions, durable (each SDK only if installed)",
            default=False,
        ),
        Bench(
            "ray",
            "scopes on Ray shards: remote apply vs a bare Ray call, pipelined commits/s on 2 and 1 "
            "shards, per-call/shard/scope costs and a paper model (starts a Ray session)",
            needs=("ray",),
            default=False,
        ),
        Bench(
            "remote",
            "one owner process, client processes over a unix socket: pipelined aapply from 1 and 4 clients "
            "and apply latency vs the same in the owner, in memory and LMDB sync; the owner's CPU per commit",
        ),
    )
}


def distribution(module: str) -> str:
    """The distribution that provides ``module`` (or its top-level package's name)."""
    return _DISTRIBUTIONS.get(module) or _DISTRIBUTIONS.get(module.split(".")[0], module.split(".")[0])


def missing_dependency(bench: Bench) -> str | None:
    """Why ``bench`` cannot run here (an optional dependency is missing), or None."""
    for module in bench.needs:
        missing: str | None = None
        try:
            if importlib.util.find_spec(module) is None:
                missing = module
        except ImportError as exc:  # a parent package is missing (or fails to import): name it
            missing = exc.name or module
        except ValueError:
            missing = module
        if missing is not None:
            return f"{distribution(missing)} not installed ({INSTALL_HINT})"
    return None
