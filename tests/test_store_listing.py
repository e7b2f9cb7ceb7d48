"""Listing at scale: the ``children`` index and the bounded page readers of the store.

Every page reader is checked against the full listing (``scope_records()``)
on stores of a few thousand scopes, plaintext and encrypted: consecutive
pages visit every matching scope exactly once, in key order. Also: the index
is written with each scope record, an older store without it still lists
correctly (read-only) and gets it on a writable open, a rekeyed store still
pages, a damaged index entry raises, and a page decodes only its own records.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import lmdb
import pytest

from victor_actors import CheckpointCorruptError, GlobalStateManager, Keyring, ScopeRef, StateScope
from victor_actors.store._codec import ScopeRecord
from victor_actors.store._rekey import rekey
from victor_actors.store._store import Store

GLOBAL = ScopeRef(StateScope.GLOBAL, "global")
KEYRING = Keyring({"k1": bytes(range(32))}, active="k1")
TEAMS = 12
WORKFLOWS = 3  # per team
CONVERSATIONS = 2500

Page = Callable[[ScopeRef | None, int], list[ScopeRecord]]


def tree() -> list[ScopeRecord]:
    """A global scope, teams, workflows and conversations with ids of several lengths."""
    records = [ScopeRecord(GLOBAL, (), 1.0)]
    workflows = []
    for t in range(TEAMS):
        team = ScopeRef(StateScope.TEAM, f"team-{t}")
        records.append(ScopeRecord(team, (GLOBAL,), 1.0))
        for w in range(WORKFLOWS):
            flow = ScopeRef(StateScope.WORKFLOW, f"team-{t}/flow-{w}")
            records.append(ScopeRecord(flow, (team, GLOBAL), 1.0))
            workflows.append((flow, team))
    for c in range(CONVERSATIONS):
        ref = ScopeRef(StateScope.CONVERSATION, f"c{c}" + "x" * (c % 7))  # lengths interleave
        if c % 5 == 0:  # directly under a team
            team = ScopeRef(StateScope.TEAM, f"team-{c % TEAMS}")
            records.append(ScopeRecord(ref, (team, GLOBAL), 1.0))
        else:
            flow, team = workflows[c % len(workflows)]
            records.append(ScopeRecord(ref, (flow, team, GLOBAL), 1.0))
    return records


def build(path: Path, keyring: Keyring | None) -> list[ScopeRecord]:
    records = tree()
    store = Store(path, encryption=keyring)
    try:
        for i in range(0, len(records), 1000):
            store.submit([store.op_put_scope(r) for r in records[i : i + 1000]], wait=True)
    finally:
        store.close()
    return records


@pytest.fixture(scope="module", params=["plain", "encrypted"])
def built(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, Keyring | None, list[ScopeRecord]]]:
    keyring = KEYRING if request.param == "encrypted" else None
    path = tmp_path_factory.mktemp(f"listing-{request.param}") / "store"
    records = build(path, keyring)
    yield path, keyring, records


def walk(page: Page, limit: int) -> list[ScopeRef]:
    """Every scope of consecutive pages of ``limit``, each cursor the last ref of the page before."""
    out: list[ScopeRef] = []
    after = None
    while True:
        rows = page(after, limit)
        assert len(rows) <= limit
        out += [r.ref for r in rows]
        if len(rows) < limit:
            return out
        after = rows[-1].ref


def in_key_order(store: Store, refs: list[ScopeRef]) -> list[ScopeRef]:
    return sorted(refs, key=store.layout.ref_key)


def check_pages(store: Store, records: list[ScopeRecord], limit: int = 37) -> None:
    """Children, level and prefix pages of ``store`` against the records it holds."""
    parent_of = {r.ref: (r.lineage[0] if r.lineage else None) for r in records}
    parents: list[ScopeRef | None] = [None, GLOBAL, ScopeRef(StateScope.TEAM, "team-3")]
    parents.append(ScopeRef(StateScope.WORKFLOW, "team-5/flow-1"))
    parents.append(ScopeRef(StateScope.CONVERSATION, "c1x"))  # a leaf: no children
    for parent in parents:
        expected = in_key_order(store, [ref for ref, up in parent_of.items() if up == parent])
        got = walk(lambda after, n, p=parent: store.children_page(p, after, n), limit)  # type: ignore[misc]
        assert got == expected, parent
    for level in [None, *StateScope]:
        expected = in_key_order(store, [ref for ref in parent_of if level is None or ref.scope == level])
        assert walk(lambda after, n, lv=level: store.level_page(lv, after, n), limit) == expected  # type: ignore[misc]
    for prefix, level in [
        ("c1", None),
        ("c12", StateScope.CONVERSATION),
        ("team-1", None),
        ("", StateScope.TEAM),
    ]:
        expected = in_key_order(
            store,
            [ref for ref in parent_of if ref.id.startswith(prefix) and (level is None or ref.scope == level)],
        )
        got = walk(lambda after, n, p=prefix, lv=level: store.prefix_page(p, lv, after, n), limit)  # type: ignore[misc]
        assert got == expected, (prefix, level)
    assert store.prefix_page("nothing-has-this", None, None, 10) == []


def test_pages_visit_every_scope_once_in_key_order(
    built: tuple[Path, Keyring | None, list[ScopeRecord]],
) -> None:
    path, keyring, records = built
    with_children = {r.lineage[0] for r in records if r.lineage}
    store = Store(path, read_only=True, encryption=keyring)
    try:
        assert store.indexed
        check_pages(store, records)
        check_pages(store, records, limit=1)  # page edges everywhere: every cursor is a boundary
        sample = [r.ref for r in store.level_page(None, None, 200)]
        assert store.with_children(sample) == {ref for ref in sample if ref in with_children}
        # a cursor of another level starts that level's page at its start (or ends it)
        team = ScopeRef(StateScope.TEAM, "team-0")
        assert [r.ref.scope for r in store.level_page(StateScope.CONVERSATION, team, 3)] == [
            StateScope.CONVERSATION
        ] * 3
        assert store.level_page(StateScope.GLOBAL, team, 3) == []
    finally:
        store.close()


def test_the_index_is_written_with_each_scope_record(tmp_path: Path) -> None:
    with GlobalStateManager.open(tmp_path) as manager:
        for t in range(4):
            for c in range(60):
                manager.get_conversation_state(f"t{t}c{c}", team_id=f"t{t}", workflow_id=f"t{t}w{c % 3}")
    store = Store(tmp_path, read_only=True)
    try:
        with store.env.begin() as txn:
            children = txn.stat(store.dbs["children"])["entries"]
        assert children == store.scope_count() == 1 + 4 + 12 + 240
        records = store.scope_records()
        check_pages(store, records, limit=9)
    finally:
        store.close()


def drop_index(path: Path) -> None:
    env = lmdb.open(str(path / "data"), max_dbs=8)
    try:
        with env.begin(write=True) as txn:
            txn.drop(env.open_db(b"children", txn=txn), delete=True)
    finally:
        env.close()


def test_a_store_without_the_index_lists_correctly(
    built: tuple[Path, Keyring | None, list[ScopeRecord]], tmp_path: Path
) -> None:
    path, keyring, records = built
    old = tmp_path / "old"
    shutil.copytree(path, old)
    drop_index(old)
    store = Store(old, read_only=True, encryption=keyring)  # as a store written before the index
    try:
        assert not store.indexed
        check_pages(store, records, limit=101)
    finally:
        store.close()
    Store(old, encryption=keyring).close()  # a writable open builds the index
    store = Store(old, read_only=True, encryption=keyring)
    try:
        assert store.indexed
        check_pages(store, records, limit=101)
    finally:
        store.close()


def test_a_rekeyed_store_still_pages(
    built: tuple[Path, Keyring | None, list[ScopeRecord]], tmp_path: Path
) -> None:
    path, keyring, records = built
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    new = Keyring({"k2": bytes(range(1, 33))}, active="k2")
    rekey(copy, new, keyring)
    store = Store(copy, read_only=True, encryption=new)
    try:
        assert store.indexed
        with store.env.begin() as txn:
            assert txn.stat(store.dbs["children"])["entries"] == len(records)
        check_pages(store, records, limit=211)
    finally:
        store.close()


@pytest.mark.parametrize("damage", ["flip", "swap"])
def test_a_damaged_index_entry_is_reported_never_listed_wrong(
    built: tuple[Path, Keyring | None, list[ScopeRecord]], tmp_path: Path, damage: str
) -> None:
    path, keyring, _records = built
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    team = ScopeRef(StateScope.TEAM, "team-3")
    store = Store(copy, read_only=True, encryption=keyring)
    prefix = store.layout.ref_key(team)
    store.close()
    env = lmdb.open(str(copy / "data"), max_dbs=8)
    with env.begin(write=True, db=env.open_db(b"children")) as txn, txn.cursor() as cur:
        assert cur.set_range(prefix)
        first_key, first = bytes(cur.key()), bytearray(cur.value())
        assert cur.next()
        second_key, second = bytes(cur.key()), bytes(cur.value())
        assert first_key.startswith(prefix) and second_key.startswith(prefix)
        if damage == "flip":
            first[len(first) // 2] ^= 0x01
            txn.put(first_key, bytes(first))
        else:  # two children's entries exchanged: each is a valid record in the wrong place
            txn.put(first_key, second)
            txn.put(second_key, bytes(first))
    env.close()
    store = Store(copy, read_only=True, encryption=keyring)
    try:
        with pytest.raises(CheckpointCorruptError):
            store.children_page(team, None, 10)
        assert len(store.children_page(ScopeRef(StateScope.TEAM, "team-4"), None, 10)) == 10
    finally:
        store.close()


def test_a_page_decodes_only_its_own_records(built: tuple[Path, Keyring | None, list[ScopeRecord]]) -> None:
    path, keyring, _records = built
    store = Store(path, read_only=True, encryption=keyring)
    decoded = []
    real = store.codec.decode_scope

    def counting(raw: bytes, *, ref: object = None, place: bytes | None = None) -> ScopeRecord:
        decoded.append(place)
        return real(raw, ref=ref, place=place)

    store.codec.decode_scope = counting  # type: ignore[method-assign]
    try:
        team = ScopeRef(StateScope.TEAM, "team-3")
        first = store.children_page(team, None, 10)
        assert len(first) == len(decoded) == 10
        decoded.clear()
        assert len(store.children_page(team, first[-1].ref, 10)) == len(decoded) == 10
        decoded.clear()
        assert len(store.level_page(StateScope.CONVERSATION, first[4].ref, 25)) == len(decoded) == 25
        decoded.clear()
        flows = {r.ref for r in first if r.ref.scope == StateScope.WORKFLOW}
        assert store.with_children([r.ref for r in first]) == flows and len(flows) == 3 and decoded == []
        if not store.encrypted:  # a plaintext prefix page reads matching keys only
            assert len(store.prefix_page("c2", StateScope.CONVERSATION, None, 15)) == len(decoded) == 15
    finally:
        store.close()
