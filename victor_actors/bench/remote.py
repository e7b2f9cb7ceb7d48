"""One state, many processes: pipelined aapply and apply latency from client processes vs in the owner.

    python -m victor_actors.bench.remote [--quick] [--json FILE]

Issue 23's benchmark. Every process is real, and every figure has its
baseline from the same run, measured in interleaved rounds:

- two owner processes started by the benchmark
  (``victor_actors.bench._remote_procs owner``: ``GlobalStateManager.open(path,
  listen="unix://...")``), one in memory and one on an LMDB store in a
  temporary directory with ``durability="sync"`` (every commit on disk before
  it is acknowledged: what a deployment runs), and four client processes,
  each connected to both (``victor_actors.connect``);
- the load: 10,000 one-message commits (``--quick``: 2,000) from 1,000
  ``aapply`` in flight (a fixed pool of asyncio tasks) over 100 fresh
  conversations, each committed to once before the clock starts;
- in the owner (the baseline): the owner process runs that load on its own
  local handles; from one client: one client process runs all of it; from 4
  clients: each runs a quarter (250 in flight over 25 conversations of its
  own), released together on a barrier (each answers "ready" on its pipe, then
  all are sent "go"), and the rate is all commits over the wall time from the
  first send to the last reply, read on CLOCK_MONOTONIC, one clock for every
  process;
- latency: ``apply`` one at a time on one conversation, in the owner on its
  local handle, and from one client (which also times ``ping``, the round trip
  through the client and the socket without a commit);
- the owner's CPU per commit: user + system time of the owner process
  (``/proc/PID/stat``) over the timed window, divided by its commits; for the
  baseline that is the owner running the load itself, the driver's work
  included; the clients' CPU is read the same way.

gc is off while timed in every process that takes part (the owner included,
when clients drive it). Each rate keeps its best round; latencies pool every
round's samples; CPU per commit sums every round. On a shared machine a short
run (the owner's own, the fastest) is likelier to fall in a quiet moment than a
long one, which favours the baseline's best round: each rate row also gives the
ratio of the medians of the rounds.
"""

from __future__ import annotations

import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from victor_actors.bench._common import cpu_seconds, run_module

__all__ = ["CLIENTS", "DURABILITIES", "main", "run"]

CHILD = "victor_actors.bench._remote_procs"
CLIENTS = 4
DURABILITIES = ("sync", "mem")  # the LMDB store with durability "sync", and an owner in memory
KINDS = ("inproc", "one", "four")


class Child:
    """A child process of this benchmark, spoken to in JSON lines (see ``_remote_procs``)."""

    def __init__(self, name: str, args: list[str]) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, "-m", CHILD, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0
        )
        self.pid = self.proc.pid
        self._buf = b""
        self.hello: dict[str, Any] = {}

    def send(self, obj: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(obj) + "\n").encode())

    def recv(self, timeout: float = 900.0) -> dict[str, Any]:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{self.name} did not answer within {timeout:g} s")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    raise RuntimeError(f"{self.name} exited (status {self.proc.wait(5)})")
                self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        out: dict[str, Any] = json.loads(line)
        return out

    def ask(self, obj: dict[str, Any], timeout: float = 900.0) -> dict[str, Any]:
        self.send(obj)
        return self.recv(timeout)

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.send({"do": "quit"})
            self.proc.wait(60)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(10)


def _pct(samples: list[int]) -> dict[str, float]:
    s = sorted(samples)
    return {
        "n": len(s),
        "median_us": s[len(s) // 2] / 1e3,
        "p99_us": s[min(len(s) - 1, int(len(s) * 0.99))] / 1e3,
        "mean_us": sum(s) / len(s) / 1e3,
    }


class Run:
    """The processes of one run and what they measured."""

    def __init__(self, cfg: dict[str, Any], tmp: str) -> None:
        self.cfg = cfg
        self.owners: dict[str, Child] = {}
        self.clients: list[Child] = []
        self.runs: dict[str, dict[str, list[dict[str, Any]]]] = {
            d: {k: [] for k in KINDS} for d in DURABILITIES
        }
        self.samples: dict[str, dict[str, list[int]]] = {
            d: {"inproc": [], "one": [], "ping": []} for d in DURABILITIES
        }
        self.tags = iter(range(1, 1 << 30))
        try:
            store = ["--store", os.path.join(tmp, "store")]
            for d, label in (("sync", "the owner (sync)"), ("mem", "the owner (in memory)")):
                sock = ["--socket", os.path.join(tmp, f"{d}.sock")]
                self.owners[d] = Child(label, ["owner", *sock, *(store if d == "sync" else [])])
            for owner in self.owners.values():
                owner.hello = owner.recv(120)
            urls = [f"--url={d}={o.hello['url']}" for d, o in self.owners.items()]
            self.clients = [Child(f"client {i}", ["client", *urls]) for i in range(CLIENTS)]
            for client in self.clients:
                client.hello = client.recv(120)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for child in (*self.clients, *self.owners.values()):
            child.close()

    def rate(self, durability: str, kind: str, scale: float = 1.0) -> dict[str, Any]:
        """One timed pipelined run: commits/s, and CPU and calls over its window."""
        cfg, owner = self.cfg, self.owners[durability]
        drivers = (
            [(owner, "owner")]
            if kind == "inproc"
            else [(c, durability) for c in self.clients[: 1 if kind == "one" else CLIENTS]]
        )
        n = len(drivers)
        tag = f"r{next(self.tags)}"
        for i, (child, name) in enumerate(drivers):
            child.send({"do": "rate", "owner": name, "tag": f"{tag}-{i}",
                        "commits": int(cfg["commits"] * scale) // n, "convs": cfg["conversations"] // n,
                        "inflight": cfg["inflight"] // n})  # fmt: skip
        for child, _ in drivers:
            child.recv()  # ready: conversations open, each committed to once
        remote = kind != "inproc"
        pids = {"owner": owner.pid}
        if remote:  # the clients' CPU too, and the owner's gc off while timed, as the in-process run has it
            pids |= {f"client_{i}": c.pid for i, (c, _) in enumerate(drivers)}
            owner.ask({"do": "gc", "on": False})
            txns0 = owner.ask({"do": "stats", "owner": "owner"}).get("store_transactions", 0)
        cpu0 = {k: cpu_seconds(p) for k, p in pids.items()}
        for child, _ in drivers:
            child.send({"do": "go"})
        results = [child.recv() for child, _ in drivers]
        cpu = {k: cpu_seconds(p) - cpu0[k] for k, p in pids.items()}
        if remote:
            txns = owner.ask({"do": "stats", "owner": "owner"}).get("store_transactions", 0) - txns0
            owner.ask({"do": "gc", "on": True})
        else:
            txns = results[0]["store_transactions"]
        commits = sum(r["commits"] for r in results)
        ns = max(r["t1"] for r in results) - min(r["t0"] for r in results)
        out = {"per_s": commits / (ns / 1e9), "seconds": ns / 1e9, "commits": commits, "drivers": n}
        out |= {"store_transactions": txns, "owner_cpu_s": cpu["owner"]}
        if remote:
            out |= {"calls": sum(r["calls"] for r in results)}
            out |= {"clients_cpu_s": sum(v for k, v in cpu.items() if k != "owner")}
        return out

    def latency(self, durability: str, kind: str, calls: int) -> None:
        """``calls`` applies one at a time, in the owner or from client 0; their samples are pooled."""
        tag = f"l{next(self.tags)}"
        if kind == "inproc":
            got = self.owners[durability].ask({"do": "latency", "owner": "owner", "tag": tag, "calls": calls})
        else:
            got = self.clients[0].ask({"do": "latency", "owner": durability, "tag": tag, "calls": calls})
            self.samples[durability]["ping"] += got["ping_ns"]
        self.samples[durability][kind] += got["apply_ns"]

    def parts(self) -> list[Callable[[], None]]:
        def rate(d: str, k: str) -> Callable[[], None]:
            return lambda: self.runs[d][k].append(self.rate(d, k))

        def lat(d: str, k: str) -> Callable[[], None]:
            return lambda: self.latency(d, k, self.cfg["latency_calls"])

        out = []
        for d in DURABILITIES:
            out += [rate(d, k) for k in KINDS] + [lat(d, "inproc"), lat(d, "one")]
        return out

    def warm(self) -> None:
        """Every path once, untimed: imports, threads, connections, the store's first pages."""
        for d in DURABILITIES:
            for k in KINDS:
                self.rate(d, k, scale=0.25)
            for k in ("inproc", "one"):
                self.latency(d, k, 50)
        for d in DURABILITIES:
            self.samples[d] = {"inproc": [], "one": [], "ping": []}

    def result(self) -> dict[str, Any]:
        rate: dict[str, Any] = {}
        for d, kinds in self.runs.items():
            rate[d] = {}
            for k, runs in kinds.items():
                best = dict(max(runs, key=lambda r: r["per_s"]))
                commits = sum(r["commits"] for r in runs)
                best["rounds"] = [r["per_s"] for r in runs]
                best["median_per_s"] = statistics.median(best["rounds"])
                best["owner_cpu_us_per_commit"] = sum(r["owner_cpu_s"] for r in runs) / commits * 1e6
                best["commits_per_transaction"] = (
                    commits / txns if (txns := sum(r["store_transactions"] for r in runs)) else None
                )
                if k != "inproc":
                    best["clients_cpu_us_per_commit"] = sum(r["clients_cpu_s"] for r in runs) / commits * 1e6
                    best["ops_per_call"] = commits / max(1, sum(r["calls"] for r in runs))
                rate[d][k] = best
        latency = {d: {k: _pct(v) for k, v in s.items()} for d, s in self.samples.items()}
        return {"rate": rate, "latency": latency}


def run(quick: bool) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "quick": quick,
        "clients": CLIENTS,
        "commits": 2_000 if quick else 10_000,
        "conversations": 100,
        "inflight": 1_000,
        "rounds": 1 if quick else 4,
        "latency_calls": 100 if quick else 500,
    }
    with tempfile.TemporaryDirectory(prefix="va-bench-remote-") as tmp:
        t0 = time.perf_counter()
        bench = Run(cfg, tmp)
        try:
            start_s = time.perf_counter() - t0
            bench.warm()
            parts = bench.parts()
            for r in range(cfg["rounds"]):  # interleaved: each round starts one part later
                for part in parts[r % len(parts) :] + parts[: r % len(parts)]:
                    part()
            res = bench.result()
        finally:
            bench.close()
    return {"config": cfg, "start_s": start_s, **res}


def print_report(res: dict[str, Any]) -> None:
    from victor_actors.bench._table import print_rows, print_targets

    print_rows("remote", res)
    print_targets("remote", res)
    print()
    for d in DURABILITIES:
        lt, rt = res["latency"][d], res["rate"][d]
        label = "LMDB sync" if d == "sync" else "in memory"
        print(
            f"{label}: ping from a client p50 {lt['ping']['median_us']:,.0f} us (no commit); "
            f"apply p50 in the owner {lt['inproc']['median_us']:,.0f} us, from a client "
            f"{lt['one']['median_us']:,.0f} us"
        )
        for k in KINDS:
            r = rt[k]
            extra = (
                f", clients {r['clients_cpu_us_per_commit']:,.0f} us, {r['ops_per_call']:,.0f} ops per call"
                if k != "inproc"
                else " (the load's own driver included)"
            )
            txn = r["commits_per_transaction"]
            rounds = ", ".join(f"{x:,.0f}" for x in r["rounds"])
            print(
                f"    {k:<7} {r['per_s']:>9,.0f} commits/s (rounds: {rounds}); "
                f"CPU per commit: owner {r['owner_cpu_us_per_commit']:,.0f} us{extra}"
                + (f"; {txn:,.1f} commits per transaction" if txn else "")
            )


def main() -> int:
    title = "victor_actors remote benchmark (issue 23): one owner, client processes over a unix socket"
    return run_module(__doc__, title, run, print_report, ())


if __name__ == "__main__":
    raise SystemExit(main())
