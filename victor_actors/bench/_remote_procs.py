"""The ``remote`` benchmark's child processes: an owner and its clients, driven by JSON lines.

    python -m victor_actors.bench._remote_procs owner --socket SOCK [--store DIR]
    python -m victor_actors.bench._remote_procs client --url NAME=URL [--url NAME=URL ...]

The owner opens a manager (in memory, or an LMDB store with ``durability="sync"``)
listening on ``unix://SOCK``, exactly as ``GlobalStateManager.open(path,
listen=...)`` does for a user, and drives the in-process baseline on its own
local handles when told to. A client connects to one or more owners
(``victor_actors.connect``) and drives the same load through the remote
handles. Both take the same commands, one JSON object per line on stdin, and
answer each with one JSON line on stdout (one ``write`` each):

- ``{"do": "rate", "owner": NAME, "tag": T, "commits": N, "convs": K, "inflight": M}``:
  open K fresh conversations (``T-0`` ...), commit once to each (untimed),
  answer ``{"ready": ...}``, wait for the next line (``{"do": "go"}``: the
  barrier), then with gc off apply N one-message batches from M asyncio tasks
  over the K conversations and answer the monotonic clock at the first send
  and after the last reply (CLOCK_MONOTONIC: one clock for every process of
  the machine);
- ``{"do": "latency", "owner": NAME, "tag": T, "calls": N}``: N ``apply`` calls
  one after another on one conversation, each timed alone, gc off; a client
  also times N ``ping`` round trips (the transport and the client's loop
  without a commit);
- ``{"do": "stats", "owner": NAME}``: the manager's ``stats()``;
  ``{"do": "gc", "on": bool}``: gc on or off (the owner, while clients drive it);
- ``{"do": "quit"}``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from victor_actors import GlobalStateManager, TransitionBatch
from victor_actors.remote import connect

__all__ = ["MESSAGE", "clock", "flood", "main"]

MESSAGE = {"role": "user", "content": "one short message of a conversation, about sixty bytes long"}


def clock() -> int:
    """Nanoseconds on CLOCK_MONOTONIC: comparable between the processes of one machine."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def say(obj: Any) -> None:
    os.write(1, (json.dumps(obj) + "\n").encode())  # one write: a reader never sees half a line


def hear() -> dict[str, Any]:
    line = sys.stdin.readline()
    if not line:
        raise SystemExit(0)  # the bench went away: nothing left to do
    out: dict[str, Any] = json.loads(line)
    return out


async def flood(handles: Sequence[Any], commits: int, inflight: int) -> tuple[int, int]:
    """``inflight`` tasks applying ``commits`` one-message batches over ``handles``: (first send, last reply).

    A fixed pool of tasks rather than a semaphore over ``commits`` tasks: the
    driver's own overhead stays small and equal on both sides (see the ray bench).
    """

    async def worker(first: int) -> None:
        for i in range(first, commits, inflight):
            await handles[i % len(handles)].aapply(TransitionBatch().add_message(MESSAGE))

    t0 = clock()
    await asyncio.gather(*(worker(w) for w in range(min(inflight, commits))))
    return t0, clock()


async def _open(manager: Any, tag: str, convs: int) -> list[Any]:
    handles = [manager.get_conversation_state(f"{tag}-{i}") for i in range(convs)]
    await asyncio.gather(*(h.aapply(TransitionBatch().add_message(MESSAGE)) for h in handles))
    return handles


class Driver:
    """One process's side of the benchmark: the managers it drives, by name."""

    def __init__(self, managers: dict[str, Any]) -> None:
        self.managers = managers
        self.runner = asyncio.Runner()

    def rate(self, cmd: dict[str, Any]) -> dict[str, Any]:
        manager = self.managers[cmd["owner"]]
        handles = self.runner.run(_open(manager, cmd["tag"], cmd["convs"]))
        before = self.counters(manager)
        gc.collect()
        say({"ready": True})
        go = hear()
        if go.get("do") != "go":
            raise SystemExit(f"expected go, got {go!r}")
        gc.disable()
        try:
            t0, t1 = self.runner.run(flood(handles, cmd["commits"], cmd["inflight"]))
        finally:
            gc.enable()
        after = self.counters(manager)
        return {"t0": t0, "t1": t1, "commits": cmd["commits"], **{k: after[k] - before[k] for k in after}}

    def counters(self, manager: Any) -> dict[str, int]:
        return {}

    def latency(self, cmd: dict[str, Any]) -> dict[str, Any]:
        handle = self.managers[cmd["owner"]].get_conversation_state(f"{cmd['tag']}-lat")
        for _ in range(20):
            handle.apply(TransitionBatch().add_message(MESSAGE))
        samples = []
        gc.collect()
        gc.disable()
        try:
            for _ in range(cmd["calls"]):
                batch = TransitionBatch().add_message(MESSAGE)
                t0 = time.perf_counter_ns()
                handle.apply(batch)
                samples.append(time.perf_counter_ns() - t0)
        finally:
            gc.enable()
        return {"apply_ns": samples}

    def serve(self) -> None:
        while True:
            cmd = hear()
            do = cmd.get("do")
            if do == "quit":
                return
            if do == "rate":
                say(self.rate(cmd))
            elif do == "latency":
                say(self.latency(cmd))
            elif do == "stats":
                say(dict(self.managers[cmd["owner"]].stats()))
            elif do == "gc":
                (gc.enable if cmd["on"] else gc.disable)()
                if cmd["on"]:
                    gc.collect()
                say({"gc": gc.isenabled()})
            else:
                raise SystemExit(f"unknown command {cmd!r}")


class OwnerDriver(Driver):
    """The owner: its own local handles, and the store's transactions around a timed run."""

    def counters(self, manager: Any) -> dict[str, int]:
        return {"store_transactions": int(manager.stats().get("store_transactions", 0))}


class ClientDriver(Driver):
    """A client process: remote handles; the calls its lanes made around a timed run; ping times."""

    def counters(self, manager: Any) -> dict[str, int]:
        return {"calls": int(manager.stats()["client_calls"])}

    def latency(self, cmd: dict[str, Any]) -> dict[str, Any]:
        out = super().latency(cmd)
        manager = self.managers[cmd["owner"]]
        pings = []
        gc.collect()
        gc.disable()
        try:
            for _ in range(cmd["calls"]):
                t0 = time.perf_counter_ns()
                manager.ping()
                pings.append(time.perf_counter_ns() - t0)
        finally:
            gc.enable()
        return out | {"ping_ns": pings}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="role", required=True)
    o = sub.add_parser("owner")
    o.add_argument("--socket", required=True)
    o.add_argument("--store", help="an LMDB store directory (durability sync); default: in memory")
    c = sub.add_parser("client")
    c.add_argument("--url", action="append", required=True, metavar="NAME=URL")
    args = ap.parse_args(argv)
    driver: Driver
    if args.role == "owner":
        url = "unix://" + os.path.abspath(args.socket)
        manager = GlobalStateManager.open(args.store, durability="sync", listen=url, request_timeout=300.0)
        try:
            driver = OwnerDriver({"owner": manager})
            say({"pid": os.getpid(), "url": url, "durability": manager.durability, "store": args.store})
            driver.serve()
        finally:
            manager.close()
        return 0
    clients = {}
    try:
        for spec in args.url:
            name, _, url = spec.partition("=")
            clients[name] = connect(url, request_timeout=300.0, wait=30.0)
        driver = ClientDriver(clients)
        say({"pid": os.getpid(), "owners": {n: c.info()["pid"] for n, c in clients.items()}})
        driver.serve()
    finally:
        for client in clients.values():
            client.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
