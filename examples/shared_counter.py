"""Shared team state under concurrent agents: victor_actors beside LangGraph's AsyncSqliteStore.

Run it with ``python examples/shared_counter.py``. Three teams of five asyncio agents; each agent
"thinks" (a short, seeded sleep standing in for a model call), then adds one to its team's counter,
three times. Every team should end at 15. The same agents run twice, each time on a durable store
in a temporary directory:

- on victor_actors, each agent owns a conversation under its team and increments the team's counter
  with ``atransact``: the read and the write are one step, taken under the team scope's lock;
- on LangGraph's ``AsyncSqliteStore`` (``pip install langgraph-checkpoint-sqlite``), each agent reads
  the counter with ``aget`` and writes it back with ``aput``, the read-modify-write that store
  offers (it has no compare-and-set and no transaction across a read and a write).

The program checks that every victor_actors team ends at 15 of 15, reopening the store to check it
was durable, and exits non-zero if not. It prints what the LangGraph store ended at, as measured:
agents that read the same value before either wrote it each write the same next value, and updates
are lost; how many depends on the timing of the run. It checks nothing about the peer.

The lesson is not that LangGraph is careless: its store is a key-value store, and a blind ``aput``
is what a key-value store does. Reading state in one call and writing it in another loses updates
on any store, victor_actors included (``await conv.asnapshot()`` then ``await team.aset(...)``
would lose them too). What victor_actors adds is a writer per scope that can take the read and the
write as one step: ``transact`` (pessimistic, shown here), ``modify`` (optimistic, retried on a
conflict) or ``apply(..., expected_version=...)``.
"""

from __future__ import annotations

import asyncio
import random
import sys
import tempfile
from collections.abc import Awaitable, Callable

from _checks import check, verdict

from victor_actors import GlobalStateManager, TransitionBatch

TEAMS, AGENTS, INCREMENTS = 3, 5, 3
EXPECTED = AGENTS * INCREMENTS  # 15 per team


def think_time(team: int, agent: int) -> Callable[[], Awaitable[None]]:
    """The agent's stand-in for a model call: a seeded sleep of 0 to 5 ms, the same on both stores."""
    rng = random.Random(f"{team}-{agent}")

    async def think() -> None:
        await asyncio.sleep(rng.uniform(0.0, 0.005))

    return think


# -- victor_actors ---------------------------------------------------------------------------------


async def ours_agent(manager: GlobalStateManager, team: int, agent: int) -> None:
    conv = manager.get_conversation_state(f"t{team}-agent{agent}", team_id=f"t{team}")
    think = think_time(team, agent)
    for _ in range(INCREMENTS):
        await think()
        await conv.atransact(
            lambda snap: TransitionBatch().update_state("count", snap.get_state("count", 0) + 1, scope="team"),
            lock=["team"],
        )


async def ours(path: str) -> list[int]:
    with GlobalStateManager.open(path) as manager:
        agents = [ours_agent(manager, t, a) for t in range(TEAMS) for a in range(AGENTS)]
        await asyncio.gather(*agents)
    with GlobalStateManager.open(path, read_only=True) as reopened:  # durable: read back from disk
        return [reopened.get_team_state(f"t{t}").get("count", 0) for t in range(TEAMS)]


# -- LangGraph's AsyncSqliteStore ---------------------------------------------------------------------


async def peer_agent(store: object, team: int, agent: int) -> None:
    namespace = ("teams", f"t{team}")
    think = think_time(team, agent)
    for _ in range(INCREMENTS):
        await think()
        item = await store.aget(namespace, "counter")  # type: ignore[attr-defined]
        count = item.value["count"] if item is not None else 0
        await store.aput(namespace, "counter", {"count": count + 1})  # type: ignore[attr-defined]


async def peer(path: str) -> list[int] | str:
    try:
        from langgraph.store.sqlite.aio import AsyncSqliteStore
    except ImportError:
        return "not run: pip install langgraph-checkpoint-sqlite"
    async with AsyncSqliteStore.from_conn_string(path) as store:
        await store.setup()
        agents = [peer_agent(store, t, a) for t in range(TEAMS) for a in range(AGENTS)]
        await asyncio.gather(*agents)
        counts = []
        for t in range(TEAMS):
            item = await store.aget(("teams", f"t{t}"), "counter")
            counts.append(item.value["count"] if item is not None else 0)
        return counts


def show(name: str, counts: list[int] | str) -> str:
    if isinstance(counts, str):
        return f"{name:<34}{counts}"
    teams = ", ".join(f"{c} of {EXPECTED}" for c in counts)
    return f"{name:<34}{teams}   (lost: {TEAMS * EXPECTED - sum(counts)} of {TEAMS * EXPECTED})"


def main() -> int:
    print(f"{TEAMS} teams x {AGENTS} asyncio agents, each adding 1 to its team's counter {INCREMENTS} times")
    with tempfile.TemporaryDirectory(prefix="victor-actors-counter-") as root:
        counts = asyncio.run(ours(f"{root}/victor-actors-store"))
        theirs = asyncio.run(peer(f"{root}/langgraph-store.sqlite"))
    print(show("victor_actors (atransact):", counts))
    print(show("LangGraph AsyncSqliteStore:", theirs))
    check(counts == [EXPECTED] * TEAMS, f"every victor_actors team at {EXPECTED}, durable: {counts}")
    return verdict()


if __name__ == "__main__":
    sys.exit(main())
