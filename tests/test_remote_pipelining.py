"""Many requests in flight through one client: each answer reaches its own caller, batch ids never repeat.

The client hands a burst of requests from a caller's event loop to its own
loop with one wake-up, and the replies that arrive together back with one
wake-up per caller's loop (``_client.py``). These tests drive that from two
callers' loops at once, on a real owner over a real unix socket, and check
that every caller gets exactly its own commits. Batch ids (the owner's key
for applying a retried batch at most once) come from a per-process prefix
and a count: a forked child must draw its own prefix.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import victor_actors
from victor_actors import GlobalStateManager, TransitionBatch
from victor_actors.remote import _client

BURST = 300


@pytest.fixture
def owner(tmp_path: Path) -> Iterator[tuple[GlobalStateManager, str]]:
    url = f"unix://{tmp_path}/owner.sock"
    manager = GlobalStateManager.open(tmp_path / "store", listen=url)
    try:
        yield manager, url
    finally:
        manager.close()


def test_callers_on_two_loops_pipelining_through_one_client_each_get_their_own_commits(owner) -> None:
    manager, url = owner
    client = victor_actors.connect(url)
    results: dict[str, Any] = {}
    start = threading.Barrier(2)

    async def burst(name: str) -> list[Any]:
        conv = await client.aget_conversation_state(name)
        return await asyncio.gather(
            *(conv.aapply(TransitionBatch().add_message({"role": "user", "content": f"{name} {i}"}))
              for i in range(BURST))
        )  # fmt: skip

    def caller(name: str) -> None:
        start.wait()
        try:
            results[name] = asyncio.run(burst(name))
        except BaseException as exc:  # reported below, in the test's own thread
            results[name] = exc

    try:
        threads = [threading.Thread(target=caller, args=(n,)) for n in ("a", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for name in ("a", "b"):
            records = results[name]
            assert not isinstance(records, BaseException), records
            # each answer is the commit of the batch it was asked for, in the caller's own scope
            assert [r.added_messages[0]["content"] for r in records] == [f"{name} {i}" for i in range(BURST)]
            assert {str(r.ref) for r in records} == {f"conversation:{name}"}
            assert sorted(r.new_version for r in records) == list(range(1, BURST + 1))
            local = manager.get_conversation_state(name).snapshot()
            assert local.version == BURST and len(local.messages) == BURST
    finally:
        client.close()


def test_batch_ids_never_repeat_and_a_forked_child_draws_its_own_prefix() -> None:
    ids = [_client.batch_id() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=lambda: out.put(_client.batch_id()))
    child.start()
    theirs = out.get(timeout=30)
    child.join(30)
    mine = _client.batch_id()
    # the count carries over a fork; only a fresh prefix keeps the child's ids apart from the parent's
    assert theirs[:20] != mine[:20] and theirs not in ids and theirs != mine
