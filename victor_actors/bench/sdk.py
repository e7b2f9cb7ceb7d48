"""The agent-SDK session stores against each SDK's own: throughput and p50, durable.

    python -m victor_actors.bench.sdk [--quick] [--json FILE]

For each SDK whose package is installed, the same workload on ours (a
``GlobalStateManager`` on an LMDB store, ``sync`` durability) and on the SDK's
own store, in one run, interleaved (ours, theirs, theirs, ours, ...):

- ADK: ``append_event`` of an event whose delta writes one session key, vs
  ADK's ``SqliteSessionService`` (its SQLite-backed store; its
  ``DatabaseSessionService`` needs SQLAlchemy, which the adk extra does not
  bring);
- OpenAI Agents SDK: ``add_items`` of one item, vs ``SQLiteSession`` on a file;
- Claude Agent SDK: ``append`` of two transcript entries, vs the SDK's
  ``InMemorySessionStore`` (its only store: in memory, so not durable, a bound
  rather than a peer).

Each is measured with one writer (sequential calls: throughput and the p50 of
one call) and with 16 sessions written concurrently (16 asyncio tasks:
throughput of the calls that succeeded; calls a store refused under that
contention, such as SQLite's "database is locked", are counted beside it). A
package that is not installed is listed under ``skipped``.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from victor_actors import GlobalStateManager
from victor_actors.bench._common import no_gc, quick_and_json, version_of

CONCURRENT = 16
Op = Callable[[int], Awaitable[Any]]  # one call for step i of one session


async def _one_writer(op: Op, n: int) -> dict[str, float]:
    took: list[float] = []
    start = time.perf_counter()
    for i in range(n):
        t = time.perf_counter()
        await op(i)
        took.append(time.perf_counter() - t)
    wall = time.perf_counter() - start
    return {"per_s": n / wall, "p50_us": statistics.median(took) * 1e6}


async def _many_writers(ops: list[Op], n: int) -> dict[str, Any]:
    """Throughput of the calls that succeeded; a store that refuses some under contention (SQLite's
    "database is locked") is measured on the rest, and its refusals counted, not hidden."""
    failed: list[str] = []

    async def one(op: Op) -> None:
        for i in range(n):
            try:
                await op(i)
            except Exception as exc:  # counted and reported with the figures
                failed.append(f"{type(exc).__name__}: {exc}")

    start = time.perf_counter()
    await asyncio.gather(*(one(op) for op in ops))
    wall = time.perf_counter() - start
    done = len(ops) * n - len(failed)
    return {"per_s": done / wall, "errors": len(failed), "error": failed[0] if failed else None}


# -- the subjects: each makes ops for fresh sessions on a store under ``path`` ---------------------------


async def _adk(path: str, ours: bool, sessions: int) -> tuple[list[Op], Callable[[], Awaitable[None]]]:
    from google.adk.events import Event, EventActions
    from google.adk.sessions.sqlite_session_service import SqliteSessionService

    from victor_actors.adk import VictorActorsSessionService

    manager = GlobalStateManager.open(path) if ours else None
    service: Any = (
        VictorActorsSessionService(manager) if manager is not None else SqliteSessionService(f"{path}.db")
    )
    made = [
        await service.create_session(app_name="bench", user_id="u", session_id=f"s{k}")
        for k in range(sessions)
    ]

    def op_for(session: Any) -> Op:
        async def op(i: int) -> None:
            delta = {"step": i, "note": "checked the quarterly figures"}
            await service.append_event(
                session, Event(author="agent", actions=EventActions(state_delta=delta))
            )

        return op

    async def close() -> None:
        if manager is not None:
            manager.close()

    return [op_for(s) for s in made], close


async def _openai(path: str, ours: bool, sessions: int) -> tuple[list[Op], Callable[[], Awaitable[None]]]:
    from agents import SQLiteSession

    from victor_actors.openai_agents import VictorActorsSession

    manager = GlobalStateManager.open(path) if ours else None
    made: list[Any] = [
        VictorActorsSession(f"s{k}", manager) if manager is not None else SQLiteSession(f"s{k}", f"{path}.db")
        for k in range(sessions)
    ]

    def op_for(session: Any) -> Op:
        async def op(i: int) -> None:
            await session.add_items([{"role": "user", "content": f"turn {i}: checked the quarterly figures"}])

        return op

    async def close() -> None:
        for s in made:
            s.close()
        if manager is not None:
            manager.close()

    return [op_for(s) for s in made], close


async def _claude(path: str, ours: bool, sessions: int) -> tuple[list[Op], Callable[[], Awaitable[None]]]:
    from claude_agent_sdk import InMemorySessionStore

    from victor_actors.claude_agent import VictorActorsSessionStore

    manager = GlobalStateManager.open(path) if ours else None
    store: Any = VictorActorsSessionStore(manager) if manager is not None else InMemorySessionStore()

    def op_for(k: int) -> Op:
        key = {"project_key": "bench", "session_id": f"s{k}"}

        async def op(i: int) -> None:
            asked = {"role": "user", "content": f"turn {i}"}
            said = {"role": "assistant", "content": "ok"}
            await store.append(
                key,
                [
                    {"type": "user", "uuid": f"{k}-{i}-u", "message": asked},
                    {"type": "assistant", "uuid": f"{k}-{i}-a", "message": said},
                ],
            )

        return op

    async def close() -> None:
        if manager is not None:
            manager.close()

    return [op_for(k) for k in range(sessions)], close


# key: (distribution, module, subject, the SDK's own store, whether that store is durable)
SUBJECTS = {
    "adk": ("google-adk", "google.adk", _adk, "SqliteSessionService", True),
    "openai": ("openai-agents", "agents", _openai, "SQLiteSession", True),
    "claude": ("claude-agent-sdk", "claude_agent_sdk", _claude, "InMemorySessionStore", False),
}


async def _measure(make: Any, tmp: str, tag: str, ours: bool, n: int, many: int) -> dict[str, Any]:
    ops, close = await make(os.path.join(tmp, f"{tag}-one"), ours, 1)
    try:
        await ops[0](-1)  # warm: imports, the first scope, the first connection
        with no_gc():
            one = await _one_writer(ops[0], n)
    finally:
        await close()
    ops, close = await make(os.path.join(tmp, f"{tag}-many"), ours, CONCURRENT)
    try:
        with no_gc():
            concurrent = await _many_writers(ops, many)
    finally:
        await close()
    return {"one": one, "many": concurrent}


def main() -> int:
    args = quick_and_json(__doc__)
    rounds, n, many = (1, 30, 5) if args.quick else (2, 300, 40)
    print("victor_actors agent-SDK session stores vs each SDK's own")
    print(f"date: {datetime.now(UTC).isoformat(timespec='seconds')}  python: {platform.python_version()}")
    result: dict[str, Any] = {"rounds": rounds, "n": n, "concurrent": CONCURRENT, "per_session": many,
                              "subjects": {}, "skipped": {}}  # fmt: skip
    import importlib.util

    for key, (dist, module, make, peer, durable) in SUBJECTS.items():
        if importlib.util.find_spec(module) is None:
            result["skipped"][key] = f"{dist} is not installed"
            continue
        sums: dict[str, dict[str, list[float]]] = {"ours": {}, "theirs": {}}
        refused: dict[str, list[str]] = {"ours": [], "theirs": []}
        with tempfile.TemporaryDirectory(prefix=f"va-bench-sdk-{key}-") as tmp:
            for r in range(rounds):
                order = ("ours", "theirs") if r % 2 == 0 else ("theirs", "ours")
                for side in order:
                    got = asyncio.run(_measure(make, tmp, f"{side}{r}", side == "ours", n, many))
                    values = {
                        "one_per_s": got["one"]["per_s"],
                        "one_p50_us": got["one"]["p50_us"],
                        "many_per_s": got["many"]["per_s"],
                    }
                    for what, value in values.items():
                        sums[side].setdefault(what, []).append(value)
                    if got["many"]["errors"]:
                        refused[side] += [got["many"]["error"]] * got["many"]["errors"]
        entry: dict[str, Any] = {"peer": peer, "version": version_of(dist), "peer_durable": durable}
        entry |= {side: {what: statistics.median(v) for what, v in d.items()} for side, d in sums.items()}
        for side, errors in refused.items():  # calls refused with 16 sessions, over every round
            entry[side] |= {"many_errors": len(errors), "many_error": errors[0] if errors else None}
        result["subjects"][key] = entry
        ours, theirs = entry["ours"], entry["theirs"]
        print(f"\n{key} ({dist} {entry['version']}), ours vs {peer}:")
        print(f"  1 writer        {ours['one_per_s']:10.0f} /s  vs {theirs['one_per_s']:10.0f} /s  "
              f"{ours['one_per_s'] / theirs['one_per_s']:6.2f}x")  # fmt: skip
        print(f"  1 writer p50    {ours['one_p50_us']:10.0f} us vs {theirs['one_p50_us']:10.0f} us "
              f"{ours['one_p50_us'] / theirs['one_p50_us']:6.2f}x")  # fmt: skip
        ratio = ours["many_per_s"] / theirs["many_per_s"]
        print(f"  {CONCURRENT} sessions     {ours['many_per_s']:10.0f} /s  vs "
              f"{theirs['many_per_s']:10.0f} /s  {ratio:6.2f}x")  # fmt: skip
        for side in ("ours", "theirs"):
            if entry[side]["many_errors"]:
                print(f"  {side}: {entry[side]['many_errors']} calls refused with {CONCURRENT} sessions "
                      f"(first: {entry[side]['many_error']:.120})")  # fmt: skip
    for key, why in result["skipped"].items():
        print(f"\n{key}: skipped ({why})")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(result, fh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
