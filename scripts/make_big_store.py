"""Write a store with many scopes quickly, to measure the views on it (``victor-actors inspect``).

Usage::

    python scripts/make_big_store.py PATH [--conversations N] [--teams T] [--workflows W] [--chunk C]

PATH must not hold a store yet. The store gets the global scope, ``T``
teams (``team:t0000``...), ``W`` workflows under each team
(``workflow:t0000-w00``...) and ``N`` conversations (``conversation:c0000000``...)
spread over the workflows in turn, every tenth one directly under a team.
Only scope records are written (with their ``children`` index entries), in
write transactions of ``C`` records through the store's own operations
(``Store.op_put_scope``, ``submit(..., wait=True)``): no commits, so every
scope is at version 0. A million scopes take about a minute and some
hundreds of MB.

Then, for example::

    time victor-actors inspect PATH --limit 50
    time victor-actors inspect PATH --level conversation --prefix c00123 --limit 50
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator

from victor_actors import ScopeRef, StateScope
from victor_actors.store import ScopeRecord, Store

GLOBAL = ScopeRef(StateScope.GLOBAL, "global")


def records(conversations: int, teams: int, workflows: int) -> Iterator[ScopeRecord]:
    """The global scope, then the teams, the workflows and the conversations (parents first)."""
    now = time.time()
    yield ScopeRecord(GLOBAL, (), now)
    team_refs = [ScopeRef(StateScope.TEAM, f"t{t:04d}") for t in range(teams)]
    flows: list[tuple[ScopeRef, ScopeRef]] = []
    for team in team_refs:
        yield ScopeRecord(team, (GLOBAL,), now)
    for team in team_refs:
        for w in range(workflows):
            flow = ScopeRef(StateScope.WORKFLOW, f"{team.id}-w{w:02d}")
            flows.append((flow, team))
            yield ScopeRecord(flow, (team, GLOBAL), now)
    width = max(7, len(str(max(conversations - 1, 0))))
    for c in range(conversations):
        ref = ScopeRef(StateScope.CONVERSATION, f"c{c:0{width}d}")
        if c % 10 == 0 or not flows:
            team = team_refs[c % len(team_refs)]
            yield ScopeRecord(ref, (team, GLOBAL), now)
        else:
            flow, team = flows[c % len(flows)]
            yield ScopeRecord(ref, (flow, team, GLOBAL), now)


def build(path: str, *, conversations: int, teams: int, workflows: int, chunk: int) -> int:
    """Write the store at ``path``; return how many scope records it holds."""
    store = Store(path, map_size=max(256, conversations // 1000) * 1024 * 1024)
    written = 0
    try:
        batch = []
        for record in records(conversations, teams, workflows):
            batch.append(store.op_put_scope(record))
            if len(batch) >= chunk:
                store.submit(batch, wait=True)
                written += len(batch)
                batch = []
        if batch:
            store.submit(batch, wait=True)
            written += len(batch)
    finally:
        store.close()
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", metavar="PATH", help="where to write the store (must not hold one)")
    parser.add_argument("--conversations", type=int, default=200_000, metavar="N", help="default 200000")
    parser.add_argument("--teams", type=int, default=20, metavar="T", help="default 20")
    parser.add_argument("--workflows", type=int, default=10, metavar="W", help="per team; default 10")
    parser.add_argument("--chunk", type=int, default=20_000, metavar="C", help="records per transaction")
    args = parser.parse_args(argv)
    if args.conversations < 0 or args.teams < 1 or args.workflows < 0 or args.chunk < 1:
        parser.error("--conversations and --workflows must be >= 0, --teams and --chunk >= 1")
    if os.path.exists(os.path.join(args.path, "data", "data.mdb")):
        parser.error(f"{args.path} already holds a store")
    started = time.perf_counter()
    n = build(
        args.path,
        conversations=args.conversations,
        teams=args.teams,
        workflows=args.workflows,
        chunk=args.chunk,
    )
    print(f"wrote {n} scopes to {args.path} in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
