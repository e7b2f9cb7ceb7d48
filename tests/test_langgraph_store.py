"""VictorActorsStore: LangGraph's long-term store contract, in our words, plus what upstream lacks.

LangGraph's reference tests for stores (``libs/checkpoint/tests/test_store.py``
and the SQLite store's ``test_store.py`` and ``test_ttl.py``, at
langchain-ai/langgraph commit f09cfe8ff) are not shipped in the released
packages; their contract is restated here: every operation, sync and asyncio,
filters (operators, nested fields, dotted paths), pagination, namespace
listing (prefix, suffix, wildcards, depth), batch order, vector search with an
embedding function the test passes, TTL with a clock the test moves.
And beyond upstream: batches atomic across namespaces, item versions, and
``expected_version`` with no lost update under concurrent writers (threads
and asyncio). All new (the store did not exist before).
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_for
from langgraph.store.base import (
    GetOp,
    InvalidNamespaceError,
    ListNamespacesOp,
    MatchCondition,
    PutOp,
    SearchOp,
)
from langgraph.store.memory import InMemoryStore

from victor_actors import GlobalStateManager, TransitionValidationError, VersionConflictError
from victor_actors.langgraph import ItemVersionConflictError, StoreItem, VersionedPutOp, VictorActorsStore


class Clock:
    def __init__(self) -> None:
        self.now = 2_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, minutes: float) -> None:
        self.now += minutes * 60


class Calls:
    """One store, called through its sync methods or their asyncio twins (``calls.put(...)``)."""

    def __init__(self, store: VictorActorsStore, mode: str) -> None:
        self.store, self.mode = store, mode

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if self.mode == "sync":
            return getattr(self.store, name)  # type: ignore[no-any-return]
        twin = getattr(self.store, "a" + name)
        return lambda *a, **k: asyncio.run(twin(*a, **k))


@pytest.fixture
def store(manager: GlobalStateManager) -> Iterator[VictorActorsStore]:
    with VictorActorsStore(manager) as s:
        yield s


@pytest.fixture(params=["sync", "asyncio"])
def calls(request: pytest.FixtureRequest, store: VictorActorsStore) -> Calls:
    return Calls(store, request.param)


# -- every operation -----------------------------------------------------------------


def test_put_get_delete_and_versions(calls: Calls) -> None:
    calls.put(("users", "u1"), "prefs", {"theme": "dark"})
    item = calls.get(("users", "u1"), "prefs")
    assert isinstance(item, StoreItem) and item.value == {"theme": "dark"} and item.version == 1
    assert item.namespace == ("users", "u1") and item.key == "prefs"
    calls.put(("users", "u1"), "prefs", {"theme": "light"})
    again = calls.get(("users", "u1"), "prefs")
    assert again.version == 2 and again.value == {"theme": "light"}
    assert again.created_at == item.created_at and again.updated_at >= item.updated_at
    calls.delete(("users", "u1"), "prefs")
    assert calls.get(("users", "u1"), "prefs") is None
    calls.delete(("users", "u1"), "never there")  # deleting nothing is no error
    calls.put(("users", "u1"), "prefs", {"theme": "new"})
    assert calls.get(("users", "u1"), "prefs").version == 1  # a new item after a delete


def test_search_filters_paginates_and_orders_newest_first(calls: Calls) -> None:
    docs = [
        ("a", {"kind": "note", "score": 3, "meta": {"lang": "en"}, "tags": ["x", "y"]}),
        ("b", {"kind": "note", "score": 7, "meta": {"lang": "fr"}, "tags": ["x"]}),
        ("c", {"kind": "todo", "score": 5, "meta": {"lang": "en"}}),
        ("d", {"kind": "note", "score": "high"}),
    ]
    for key, value in docs:
        calls.put(("docs", "team"), key, value)
    calls.put(("docs",), "root", {"kind": "note", "score": 1})
    calls.put(("other",), "x", {"kind": "note"})

    def keys(**kw: Any) -> list[str]:
        return [i.key for i in calls.search(("docs",), **kw)]

    assert keys(limit=100) == ["root", "d", "c", "b", "a"]  # newest first
    assert keys(limit=2) == ["root", "d"] and keys(limit=2, offset=2) == ["c", "b"]
    assert keys(filter={"kind": "note"}, limit=100) == ["root", "d", "b", "a"]
    assert keys(filter={"score": {"$gt": 3}}) == ["c", "b"]  # "high" is not a number: no match
    assert keys(filter={"score": {"$gte": 3, "$lt": 7}}) == ["c", "a"]
    assert keys(filter={"score": {"$ne": 7}, "kind": "note"}) == ["root", "d", "a"]
    assert keys(filter={"meta": {"lang": "en"}}) == ["c", "a"]  # nested mappings
    assert keys(filter={"meta.lang": "fr"}) == ["b"]  # a dotted path
    assert keys(filter={"tags": ["x"]}) == ["b"]  # a list matches a list
    assert [i.key for i in calls.search(("docs", "team"), filter={"kind": "todo"})] == ["c"]
    assert len(calls.search((), limit=100)) == 6
    assert all(i.score is None and i.version == 1 for i in calls.search(("docs",)))
    with pytest.raises(TransitionValidationError):
        calls.search(("docs",), filter={"score": {"$near": 1}})


def test_list_namespaces_matches_prefix_suffix_wildcards_and_depth(calls: Calls) -> None:
    for ns in [("a", "b", "c"), ("a", "b", "d", "e"), ("a", "x", "c"), ("q",), ("q", "v1")]:
        calls.put(ns, "k", {"v": 1})
    assert calls.list_namespaces() == [
        ("a", "b", "c"),
        ("a", "b", "d", "e"),
        ("a", "x", "c"),
        ("q",),
        ("q", "v1"),
    ]
    assert calls.list_namespaces(prefix=("a", "b")) == [("a", "b", "c"), ("a", "b", "d", "e")]
    assert calls.list_namespaces(suffix=("c",)) == [("a", "b", "c"), ("a", "x", "c")]
    assert calls.list_namespaces(prefix=("a", "*", "c")) == [("a", "b", "c"), ("a", "x", "c")]
    assert calls.list_namespaces(prefix=("a",), suffix=("*", "e")) == [("a", "b", "d", "e")]
    assert calls.list_namespaces(max_depth=2) == [("a", "b"), ("a", "x"), ("q",), ("q", "v1")]
    assert calls.list_namespaces(limit=2, offset=1) == [("a", "b", "d", "e"), ("a", "x", "c")]
    calls.delete(("q", "v1"), "k")
    assert ("q", "v1") not in calls.list_namespaces()  # a namespace is listed while it holds items


def test_a_batch_returns_results_in_order_reads_one_snapshot_and_commits_once(
    store: VictorActorsStore,
) -> None:
    store.put(("n",), "old", {"v": 0})
    version = store.handle.version
    results = store.batch(
        [
            PutOp(("n",), "new", {"v": 1}),
            GetOp(("n",), "old"),
            GetOp(("n",), "new"),  # the batch's reads see the state before its writes
            SearchOp(("n",)),
            PutOp(("m", "deep"), "other", {"v": 2}),
            ListNamespacesOp(match_conditions=(MatchCondition("prefix", ("n",)),)),
            PutOp(("n",), "old", None),
        ]
    )
    assert results[0] is None and results[1].value == {"v": 0} and results[2] is None
    assert [i.key for i in results[3]] == ["old"] and results[4] is None and results[5] == [("n",)]
    assert store.handle.version == version + 1  # three writes across namespaces, one commit
    assert store.get(("n",), "old") is None and store.get(("m", "deep"), "other").value == {"v": 2}


# -- expected_version: optimistic concurrency -----------------------------------------


def test_expected_version_writes_only_an_unmoved_item(calls: Calls) -> None:
    calls.put(("acct",), "balance", {"v": 10}, expected_version=0)  # create only
    with pytest.raises(ItemVersionConflictError) as conflict:
        calls.put(("acct",), "balance", {"v": 99}, expected_version=0)
    assert isinstance(conflict.value, VersionConflictError)
    assert (conflict.value.expected_version, conflict.value.current_version) == (0, 1)
    calls.put(("acct",), "balance", {"v": 11}, expected_version=1)
    with pytest.raises(ItemVersionConflictError):
        calls.put(("acct",), "balance", {"v": 12}, expected_version=1)  # a stale read
    assert calls.get(("acct",), "balance").value == {"v": 11}
    with pytest.raises(ItemVersionConflictError):
        calls.delete(("acct",), "balance", expected_version=1)
    calls.delete(("acct",), "balance", expected_version=2)
    assert calls.get(("acct",), "balance") is None
    with pytest.raises(ItemVersionConflictError):
        calls.put(("acct",), "missing", {"v": 1}, expected_version=3)
    with pytest.raises(TransitionValidationError):
        calls.put(("acct",), "balance", {"v": 1}, expected_version=-1)


def test_a_conflict_anywhere_in_a_batch_writes_nothing_of_it(store: VictorActorsStore) -> None:
    store.put(("a",), "k", {"v": 1})
    version = store.handle.version
    with pytest.raises(ItemVersionConflictError):
        store.batch([PutOp(("b",), "k", {"v": 2}), VersionedPutOp(("a",), "k", {"v": 3}, expected_version=7)])
    assert store.get(("b",), "k") is None and store.get(("a",), "k").value == {"v": 1}
    assert store.handle.version == version


def _increment(store: VictorActorsStore) -> int:
    """Read, add one, write back with the version read; retry on a conflict. The tries it took."""
    for tries in range(1, 10_000):
        item = store.get(("counters",), "hits")
        count, version = (item.value["n"], item.version) if item is not None else (0, 0)
        try:
            store.put(("counters",), "hits", {"n": count + 1}, expected_version=version)
            return tries
        except ItemVersionConflictError:
            continue
    raise AssertionError("never won")


def test_concurrent_increments_with_expected_version_lose_no_update_threads(store: VictorActorsStore) -> None:
    workers, each = 8, 25
    barrier = threading.Barrier(workers)
    tries: list[int] = []

    def run() -> None:
        barrier.wait()
        tries.extend(_increment(store) for _ in range(each))

    threads = [threading.Thread(target=run) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    item = store.get(("counters",), "hits")
    assert item is not None and item.value["n"] == workers * each and item.version == workers * each
    assert len(tries) == workers * each


def test_concurrent_increments_with_expected_version_lose_no_update_asyncio(store: VictorActorsStore) -> None:
    async def increment() -> None:
        while True:
            item = await store.aget(("counters",), "hits")
            count, version = (item.value["n"], item.version) if item is not None else (0, 0)
            try:
                await store.aput(("counters",), "hits", {"n": count + 1}, expected_version=version)
                return
            except ItemVersionConflictError:
                await asyncio.sleep(0)

    async def main() -> None:
        await asyncio.gather(*(increment() for _ in range(60)))

    asyncio.run(main())
    item = store.get(("counters",), "hits")
    assert item is not None and item.value["n"] == 60 and item.version == 60


def test_unconditional_concurrent_puts_all_commit(store: VictorActorsStore) -> None:
    """Many writers of one store at once: no false conflict reaches a caller, every write lands."""
    barrier = threading.Barrier(6)

    def run(w: int) -> None:
        barrier.wait()
        for i in range(20):
            store.put(("w", str(w)), str(i), {"i": i})

    threads = [threading.Thread(target=run, args=(w,)) for w in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(store.search(("w",), limit=1000)) == 120


# -- bad input -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "namespace",
    [(), ("a.b",), ("",), ("a", 3), "ab", ("a\x00",), ("\ud800",), ("langgraph", "x")],
)
def test_a_bad_namespace_is_refused_and_writes_nothing(store: VictorActorsStore, namespace: Any) -> None:
    version = store.handle.version
    with pytest.raises(InvalidNamespaceError) as refused:
        store.put(namespace, "k", {"v": 1})
    assert isinstance(refused.value, (TransitionValidationError, InvalidNamespaceError))
    assert store.handle.version == version


@pytest.mark.parametrize("value", [["not", "a", "mapping"], {"v": object()}, {1: "int key"}, {"t": "\ud800"}])
def test_a_value_the_store_cannot_hold_is_refused_and_writes_nothing(
    store: VictorActorsStore, value: Any
) -> None:
    version = store.handle.version
    with pytest.raises(TransitionValidationError) as refused:
        store.batch([PutOp(("ok",), "good", {"v": 1}), PutOp(("ok",), "bad", value)])
    assert "nothing was written" in str(refused.value)
    assert store.handle.version == version and store.get(("ok",), "good") is None


# -- TTL -----------------------------------------------------------------------------


def test_items_expire_after_their_ttl_and_a_sweep(manager: GlobalStateManager) -> None:
    clock = Clock()
    with VictorActorsStore(manager, ttl={"default_ttl": 10}, clock=clock) as store:
        store.put(("t",), "default", {"v": 1})
        store.put(("t",), "short", {"v": 2}, ttl=1)
        store.put(("t",), "forever", {"v": 3}, ttl=None)
        clock.advance(1)
        assert store.sweep_ttl() == 1 and store.get(("t",), "short") is None
        clock.advance(8.9)
        assert store.sweep_ttl() == 0
        store.put(("t",), "default", {"v": 4})  # a write restarts the clock
        clock.advance(9.9)
        assert store.sweep_ttl() == 0
        clock.advance(0.1)
        assert store.sweep_ttl() == 1 and [i.key for i in store.search(("t",))] == ["forever"]


@pytest.mark.parametrize("refresh_on_read", [True, False])
def test_reads_refresh_ttl_only_when_the_store_says_so(
    manager: GlobalStateManager, refresh_on_read: bool
) -> None:
    clock = Clock()
    ttl = {"default_ttl": 10, "refresh_on_read": refresh_on_read}
    with VictorActorsStore(manager, ttl=ttl, clock=clock) as store:
        for key in ("got", "searched", "not refreshed"):
            store.put(("t",), key, {"k": key})
        clock.advance(6)
        store.get(("t",), "got")
        store.search(("t",), filter={"k": "searched"})
        store.get(("t",), "not refreshed", refresh_ttl=False)
        clock.advance(4)
        gone = 1 if refresh_on_read else 3
        assert store.sweep_ttl() == gone
        assert len(store.search(("t",), refresh_ttl=False)) == 3 - gone


def test_omit_expired_hides_expired_items_before_the_sweep(manager: GlobalStateManager) -> None:
    clock = Clock()
    with VictorActorsStore(manager, ttl={"default_ttl": 1, "omit_expired": True}, clock=clock) as store:
        store.put(("t", "x"), "k", {"v": 1})
        clock.advance(1)
        assert (
            store.get(("t", "x"), "k") is None
            and store.search(("t",)) == []
            and store.list_namespaces() == []
        )


def test_the_background_sweeper_deletes_expired_items(manager: GlobalStateManager) -> None:
    clock = Clock()
    ttl = {"default_ttl": 1, "sweep_interval_minutes": 0.0005}  # a sweep every 30 ms of real time
    with VictorActorsStore(manager, ttl=ttl, clock=clock) as store:
        store.put(("t",), "k", {"v": 1})
        clock.advance(1)
        assert wait_for(lambda: store.get(("t",), "k") is None)
    assert store.stop_ttl_sweeper(5)


@pytest.mark.parametrize("ttl", [{"default_ttl": 0}, {"default_ttl": "1"}, {"strategy": "delete"}])
def test_a_bad_ttl_config_is_refused(manager: GlobalStateManager, ttl: Any) -> None:
    with pytest.raises(TransitionValidationError):
        VictorActorsStore(manager, ttl=ttl)


# -- vector search -------------------------------------------------------------------


def _embed(texts: list[str]) -> list[list[float]]:
    """Letters a, b, c counted: a deterministic embedding the test controls (no model)."""
    return [[t.count("a") + 0.01, t.count("b") + 0.01, t.count("c") + 0.01] for t in texts]


def test_vector_search_ranks_by_similarity_with_the_given_embedding(
    calls: Calls, manager: GlobalStateManager
) -> None:
    store = VictorActorsStore(manager, index={"dims": 3, "embed": _embed, "fields": ["text"]}, name="vectors")
    calls = Calls(store, calls.mode)
    calls.put(("d",), "as", {"text": "aaaa", "n": 1})
    calls.put(("d",), "bs", {"text": "bbbb", "n": 2})
    calls.put(("d",), "cs", {"text": "cccc", "n": 3})
    calls.put(("d",), "unindexed", {"text": "aaaa"}, index=False)
    calls.put(("d",), "by title", {"text": "cccc", "title": "bbbbbb"}, index=["title"])
    found = calls.search(("d",), query="bbb")
    assert [i.key for i in found][:2] in (["bs", "by title"], ["by title", "bs"])
    assert found[0].score == pytest.approx(1.0, abs=1e-3) and found[-1].key == "unindexed"
    assert found[-1].score is None
    ranked = [i.key for i in calls.search(("d",), query="ccc", filter={"n": {"$gte": 2}})]
    assert ranked == ["cs", "bs"]
    full = [i.key for i in found]
    assert [i.key for i in calls.search(("d",), query="bbb", limit=2, offset=1)] == full[1:3]


def test_an_embedding_of_the_wrong_size_is_refused(manager: GlobalStateManager) -> None:
    store = VictorActorsStore(manager, index={"dims": 4, "embed": _embed}, name="wrong")
    with pytest.raises(TransitionValidationError):
        store.put(("d",), "k", {"text": "abc"})
    assert store.get(("d",), "k") is None


def test_an_async_embedding_function_serves_the_asyncio_calls(manager: GlobalStateManager) -> None:
    async def aembed(texts: list[str]) -> list[list[float]]:
        await asyncio.sleep(0)
        return _embed(texts)

    store = VictorActorsStore(manager, index={"dims": 3, "embed": aembed}, name="async")

    async def main() -> list[str]:
        await store.aput(("d",), "a", {"text": "aaa"})
        await store.aput(("d",), "c", {"text": "ccc"})
        return [i.key for i in await store.asearch(("d",), query="cc")]

    assert asyncio.run(main()) == ["c", "a"]


# -- durability, and the same answers as LangGraph's InMemoryStore ----------------------


def test_items_versions_and_vectors_survive_a_reopen(tmp_path: Path) -> None:
    with GlobalStateManager.open(tmp_path / "store") as manager:
        store = VictorActorsStore(manager, index={"dims": 3, "embed": _embed})
        store.put(("p",), "k", {"text": "ccc"})
        store.put(("p",), "k", {"text": "aaa"})
    with GlobalStateManager.open(tmp_path / "store") as manager:
        store = VictorActorsStore(manager, index={"dims": 3, "embed": _embed})
        item = store.get(("p",), "k")
        assert item is not None and item.version == 2 and item.value == {"text": "aaa"}
        assert store.search(("p",), query="a")[0].score == pytest.approx(1.0, abs=1e-3)


def test_a_random_script_reads_as_on_langgraph_in_memory_store(store: VictorActorsStore) -> None:
    """Puts (no deletes: InMemoryStore keeps listing emptied namespaces), gets, filtered searches
    and namespace listings: the same items, compared as sets where the orders differ by design."""
    rng = random.Random(3)
    reference = InMemoryStore()
    namespaces = [("a",), ("a", "b"), ("a", "c"), ("d", "b")]
    for _ in range(150):
        ns, key = rng.choice(namespaces), f"k{rng.randrange(12)}"
        roll = rng.random()
        if roll < 0.5:
            value = {"n": rng.randrange(5), "tag": rng.choice("xy")}
            store.put(ns, key, value)
            reference.put(ns, key, value)
        elif roll < 0.7:
            mine, theirs = store.get(ns, key), reference.get(ns, key)
            assert (mine and (mine.namespace, mine.key, mine.value)) == (
                theirs and (theirs.namespace, theirs.key, theirs.value)
            )
        elif roll < 0.9:
            prefix = rng.choice([(), ("a",), ("a", "b"), ("d",)])
            cond = rng.choice([None, {"tag": "x"}, {"n": {"$gte": 2}}])
            mine = {(i.namespace, i.key) for i in store.search(prefix, filter=cond, limit=1000)}
            theirs = {(i.namespace, i.key) for i in reference.search(prefix, filter=cond, limit=1000)}
            assert mine == theirs
        else:
            depth = rng.choice([None, 1, 2])
            assert store.list_namespaces(max_depth=depth) == reference.list_namespaces(max_depth=depth)
