"""Virtual scopes: a passivated scope leaves memory, and comes back exactly as it was.

Each test names what it guards. The eviction tests fail on the code before
virtual scopes (commit 8d3535b's parent), where every scope ever touched kept
its cell and state in memory: the weakrefs below stayed alive there.
"""

from __future__ import annotations

import asyncio
import gc
import os
import random
import signal
import subprocess
import sys
import threading
import weakref
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from victor_actors import (
    GlobalStateManager,
    ScopeAccessError,
    ScopeRef,
    StateChanged,
    StateScope,
    TransitionBatch,
)
from victor_actors.testing import Recorder, assert_commit_order
from victor_actors.testing._hooks import kernel_of  # what is resident is the kernel's registry


def _cell_and_state(manager: GlobalStateManager, ref: ScopeRef) -> tuple[weakref.ref[Any], weakref.ref[Any]]:
    cell = kernel_of(manager).cells[ref]
    return weakref.ref(cell), weakref.ref(cell.state)


def _gone(*refs: weakref.ref[Any]) -> bool:
    gc.collect()
    return all(r() is None for r in refs)


@pytest.fixture(params=["store", "memory"])
def manager(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    path = tmp_path / "db" if request.param == "store" else None
    with GlobalStateManager.open(path, durability="async", max_live_actors=None) as m:
        yield m


# -- eviction and reactivation ------------------------------------------------------------------


def test_an_evicted_scope_leaves_nothing_reachable_and_comes_back_as_it_was(
    manager: GlobalStateManager,
) -> None:
    """Guards item 1/2 of issue 14: the cell and the state of a passivated scope are freed."""
    conv = manager.get_conversation_state("c", workflow_id="wf", team_id="t")
    conv.apply(TransitionBatch().add_message({"role": "user", "content": "hi"}).update_state("k", 1))
    conv.set("k", 2)
    snap = conv.snapshot()
    before = (snap.version, snap.to_dict(), tuple(snap.messages))
    del snap  # a snapshot holds the state it was taken of: the test must not
    cell, state = _cell_and_state(manager, conv.ref)
    assert manager.passivate_idle(0) >= 1
    assert conv.ref not in kernel_of(manager).cells
    assert _gone(cell, state), "the evicted scope's cell or state is still reachable"
    stats = manager.stats()
    assert stats["evicted_scopes"] >= 4 and stats["resident_scopes"] == 0
    # the handle taken before the eviction still works, and sees exactly what was there
    after = conv.snapshot()
    assert (after.version, after.to_dict(), tuple(after.messages)) == before
    assert after.version == 2
    assert conv.parent == ScopeRef(StateScope.WORKFLOW, "wf")
    assert manager.get_workflow_state("wf").parent == ScopeRef(StateScope.TEAM, "t")
    record = conv.set("k", 3)
    assert (record.old_version, record.new_version) == (2, 3)


def test_without_a_store_an_evicted_state_is_kept_encoded() -> None:
    """Guards item 2: without a store the evicted state is bytes, counted in bytes_resident."""
    with GlobalStateManager.open(max_live_actors=None) as m:
        conv = m.get_conversation_state("c")
        conv.apply(TransitionBatch().add_messages([{"n": i} for i in range(50)]).update_state("k", "v"))
        m.passivate_idle(0)
        stats = m.stats()
        assert stats["evicted_scopes"] == 2 and stats["bytes_resident"] > 0
        assert conv.get("k") == "v" and len(conv.snapshot().messages) == 50
        assert m.stats()["activations_memory"] == 0  # reading brings the cell back, not an actor
        conv.set("k", "w")
        assert m.stats()["activations_memory"] == 1


def test_children_are_listed_and_keep_their_parent_across_eviction(manager: GlobalStateManager) -> None:
    team = manager.get_team_state("t")
    for i in range(3):
        manager.get_conversation_state(f"c{i}", team_id="t").set("i", i)
    manager.flush()
    manager.passivate_idle(0)
    assert ScopeRef(StateScope.TEAM, "t") not in kernel_of(manager).cells
    refs = set(manager.scopes())
    assert {ScopeRef(StateScope.CONVERSATION, f"c{i}") for i in range(3)} <= refs
    assert team.version == 0
    with pytest.raises(ScopeAccessError):  # a conversation keeps the parent it was created under
        manager.get_conversation_state("c1", team_id="other")
    assert manager.get_conversation_state("c2", team_id="t").get("i") == 2


def test_a_resident_child_keeps_its_parent_resident() -> None:
    """A child's cell holds its parent's as an ancestor: the parent may not go before it."""
    with GlobalStateManager.open(max_live_actors=None) as m:
        conv = m.get_conversation_state("c", team_id="t")
        conv.set("k", 1)
        sub = m.get_team_state("t")
        sub.set("goal", "g")
        kernel = kernel_of(m)
        with kernel.lock:  # a resident child pins the team, so evicting the team alone fails
            team_cell = kernel.cells[sub.ref]
        m.passivate_idle(0)
        assert team_cell.evicted  # both went: the child first, then the parent
        assert conv.get("goal") == "g"  # read through the rebuilt ancestors


def test_subscriptions_survive_eviction_in_order(manager: GlobalStateManager) -> None:
    """A subscription pins nothing, and its events keep coming, in commit order, none lost or doubled."""
    conv = manager.get_conversation_state("c")
    seen: list[StateChanged] = []
    sub = conv.subscribe(seen.append)
    for i in range(10):
        conv.set("k", i)
        manager.passivate_idle(0)
        assert conv.ref not in kernel_of(manager).cells
    manager.quiesce()
    assert [(e.old_version, e.new_version) for e in seen] == [(i, i + 1) for i in range(10)]
    assert manager.stats()["subscribed_scopes"] == 1
    sub.close()
    conv.set("k", 99)
    manager.quiesce()
    assert len(seen) == 10 and manager.stats()["subscribed_scopes"] == 0


def test_pending_tools_and_runs_pin_a_scope(manager: GlobalStateManager) -> None:
    release = threading.Event()
    started = threading.Event()

    def slow(call: Any) -> str:
        started.set()
        release.wait(10.0)
        return "done"

    manager.register_tool("slow", slow)
    tooled = manager.get_conversation_state("tooled")
    tooled.apply(TransitionBatch().execute_tool("slow", {}, request_id="r1"))
    assert started.wait(10.0)
    running = manager.get_conversation_state("running")
    with manager.run("running") as _run:
        running.set("k", 1)
        manager.passivate_idle(0)
        cells = kernel_of(manager).cells
        assert tooled.ref in cells, "a scope with a pending tool request was evicted"
        assert running.ref in cells, "a scope touched by a run in progress was evicted"
    release.set()
    manager.quiesce()
    assert not tooled.snapshot().pending_tool_requests
    manager.passivate_idle(0)
    assert tooled.ref not in kernel_of(manager).cells and running.ref not in kernel_of(manager).cells


def test_a_run_rolls_back_a_scope_that_was_evicted_before_it_began(manager: GlobalStateManager) -> None:
    conv = manager.get_conversation_state("c")
    conv.set("k", "before")
    manager.passivate_idle(0)
    with pytest.raises(Exception, match="boom"), manager.run("c"):
        conv.set("k", "inside")
        raise RuntimeError("boom")
    assert conv.get("k") == "before"


# -- the live-actor cap, under concurrency -----------------------------------------------------


def test_many_threads_under_the_cap_lose_no_update_and_no_scope_has_two_actors(tmp_path: Path) -> None:
    """Threads hammer 60 scopes with a cap of 4 live actors: every increment lands exactly once.

    Two actors serving one scope would commit the same version twice; the
    recorder's commit-order check catches that (it caught the bug where a
    cross-scope commit published into an evicted cell).
    """
    with (
        GlobalStateManager.open(tmp_path / "db", durability="async", max_live_actors=4) as m,
        Recorder(m) as rec,
    ):
        refs = [m.get_conversation_state(f"c{i}", team_id=f"t{i % 3}").ref for i in range(60)]
        per_thread = 40

        def work(seed: int) -> None:
            rnd = random.Random(seed)
            for _ in range(per_thread):
                ref = rnd.choice(refs)
                h = m.scope(ref)
                batch = lambda s: TransitionBatch().update_state("n", (s.get_state("n") or 0) + 1)  # noqa: E731
                h.modify(batch, retries=1000)
                if rnd.random() < 0.2:  # and cross-scope batches into the team, through the 2PC
                    h.modify(
                        lambda s: TransitionBatch().update_state(
                            "t", (s.get_state("t") or 0) + 1, scope="team"
                        ),
                        retries=1000,
                    )

        threads = [threading.Thread(target=work, args=(s,)) for s in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        m.quiesce()
        total = sum(m.scope(r).snapshot().state.get("n", 0) for r in refs)
        assert total == 6 * per_thread
        assert m.stats()["evicted"] > 0, "the cap never evicted: the test exercised nothing"
        assert_commit_order(rec)


def test_asyncio_callers_under_the_cap_lose_no_update(tmp_path: Path) -> None:
    async def main(m: GlobalStateManager) -> int:
        handles = [m.get_conversation_state(f"a{i}") for i in range(40)]

        async def worker(seed: int) -> None:  # 8 callers at once, each over every scope
            rnd = random.Random(seed)
            for _ in range(50):
                h = rnd.choice(handles)
                await h.amodify(lambda s: TransitionBatch().update_state("n", (s.get_state("n") or 0) + 1))

        await asyncio.gather(*(worker(s) for s in range(8)))
        return sum(h.get("n") or 0 for h in handles)

    with GlobalStateManager.open(tmp_path / "db", durability="sync", max_live_actors=3) as m:
        assert asyncio.run(main(m)) == 8 * 50
        assert m.stats()["evicted"] > 0


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("set"), st.integers(0, 4), st.integers(0, 100)),
            st.tuples(st.just("evict"), st.just(0), st.just(0)),
            st.tuples(st.just("read"), st.integers(0, 4), st.just(0)),
        ),
        max_size=30,
    )
)
def test_eviction_is_invisible_to_a_model(ops: list[tuple[str, int, int]]) -> None:
    """Any interleaving of writes, reads and evictions reads like a plain dict of versions and values."""
    with GlobalStateManager.open(max_live_actors=2) as m:
        model: dict[int, tuple[int, int | None]] = {}
        handles = {i: m.get_conversation_state(f"h{i}") for i in range(5)}
        for op, i, v in ops:
            if op == "set":
                handles[i].set("v", v)
                version, _ = model.get(i, (0, None))
                model[i] = (version + 1, v)
            elif op == "evict":
                m.passivate_idle(0)
            else:
                version, value = model.get(i, (0, None))
                assert (handles[i].version, handles[i].get("v")) == (version, value)
        for i, (version, value) in model.items():
            assert (m.scope(handles[i].ref).version, handles[i].get("v")) == (version, value)


# -- the store as the registry ------------------------------------------------------------------


def test_a_big_store_reopens_lazily(tmp_path: Path) -> None:
    path = tmp_path / "db"
    with GlobalStateManager.open(path, durability="async", max_live_actors=50) as m:
        for i in range(2000):
            m.get_conversation_state(f"c{i}", workflow_id=f"w{i % 10}").set("i", i)
    with GlobalStateManager.open(path, max_live_actors=50) as m:
        assert m.stats()["resident_scopes"] == 1  # only global, which opening a manager ensures
        assert m.stats()["evicted_scopes"] == 2010
        assert m.get_conversation_state("c1234").get("i") == 1234
        assert m.stats()["resident_scopes"] == 3  # the scope and its ancestors, nothing else
        assert m.stats()["activations_store"] == 0
        assert sum(1 for _ in m.scopes()) == 2011


_CRASH = """
import os, sys
from victor_actors import GlobalStateManager, TransitionBatch
m = GlobalStateManager.open(sys.argv[1], durability="sync", flush_interval=30.0)
m.get_conversation_state("committed").set("k", 1)
m.get_conversation_state("created-only")
print("ready", flush=True)
sys.stdin.readline()
"""


def test_a_crash_after_creation_before_the_first_commit(tmp_path: Path) -> None:
    """Creation costs no synced transaction: a never-committed scope may be gone after a crash,
    an acknowledged commit never is, and the store is clean either way."""
    path = tmp_path / "db"
    proc = subprocess.Popen(
        [sys.executable, "-c", _CRASH, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    with GlobalStateManager.open(path) as m:
        assert m.get_conversation_state("committed", create=False).get("k") == 1
        refs = set(m.scopes())
        created = ScopeRef(StateScope.CONVERSATION, "created-only")
        if created in refs:
            assert m.scope(created).version == 0
        assert not m.recovery_reports
        again = m.get_conversation_state("created-only")  # created afresh (or found), and usable
        again.set("k", 2)
    with GlobalStateManager.open(path) as m:
        assert m.get_conversation_state("created-only", create=False).get("k") == 2


def test_a_request_sent_through_an_evicted_cell_commits_in_the_scope_s_new_cell(
    manager: GlobalStateManager,
) -> None:
    """Whoever still holds an evicted cell (a coordinator between looking a scope up and sending
    to it) reaches the scope's new cell, and the commit is published there, not into the old one.

    Regression: the cross-scope coordinator published each part into the cell it had looked up;
    when that cell had been evicted meanwhile, the new cell never saw the commit, and the next
    commit started again from the old version (found by the testing kit's commit-order check).
    """
    import time

    from victor_actors._messages import ApplyRequest
    from victor_actors._txn import apply_across, split_by_scope

    kernel = kernel_of(manager)
    conv = manager.get_conversation_state("c", team_id="t")
    conv.set("n", 1)
    stale = kernel.cells[conv.ref]  # held across the eviction, as a coordinator would
    manager.passivate_idle(0)
    assert stale.evicted
    # one scope: the kernel sends to the new cell
    batch = tuple(TransitionBatch().update_state("n", 2).transitions)
    record = kernel.ask(stale, ApplyRequest(batch, None, time.monotonic() + 10.0), 10.0)
    assert record.new_version == 2 and conv.get("n") == 2
    # across scopes: the vote names the cell its actor serves, and that is where the state goes
    manager.passivate_idle(0)
    cross = tuple(TransitionBatch().update_state("n", 3).update_state("m", 1, scope="team").transitions)
    stale = kernel.resolve(conv.ref)
    parts = split_by_scope(stale, cross)
    assert parts is not None
    manager.passivate_idle(0)  # evicted between the lookup and the sending
    assert stale.evicted
    record = apply_across(kernel, stale, parts, None, time.monotonic() + 10.0)
    assert record.new_version == 3
    assert conv.version == 3 and conv.get("n") == 3 and conv.get("m") == 1
    assert conv.set("n", 4).old_version == 3


def test_a_scope_in_manual_durability_is_never_evicted(tmp_path: Path) -> None:
    """Its commits live in memory until a checkpoint: evicting it would lose them."""
    with GlobalStateManager.open(tmp_path / "db", durability="manual", max_live_actors=None) as m:
        conv = m.get_conversation_state("c")
        conv.set("k", 1)
        m.passivate_idle(0)
        assert conv.ref in kernel_of(m).cells
        assert conv.get("k") == 1 and conv.version == 1


def test_bringing_an_evicted_scope_back_reads_the_store_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lookup of an evicted scope reads its scope record and everything its state is built from in
    one read transaction, and so does each evicted ancestor it brings back first (issue 30, item 3).
    Before ``probe_rows`` each scope took two: the probe (or the scope record), then the load; this
    lookup (a conversation, its workflow and the global scope) took six."""
    with GlobalStateManager.open(tmp_path / "s") as manager:
        conv = manager.get_conversation_state("c", workflow_id="w")
        for i in range(5):
            conv.add_message({"role": "user", "content": f"m{i}"})
        manager.save_checkpoint(conv.ref)
        conv.add_message({"role": "user", "content": "after the checkpoint"})
        want = conv.snapshot()
        assert manager.passivate_idle(0) >= 1
        assert kernel_of(manager).cell(conv.ref) is None
        store = kernel_of(manager).store
        assert store is not None
        reads: list[int] = []
        real = store._read

        def counted(fn: Any) -> Any:
            reads.append(1)
            return real(fn)

        monkeypatch.setattr(store, "_read", counted)
        again = manager.get_conversation_state("c")
        assert len(reads) == 3  # the conversation, its workflow, the global scope: once each
        got = again.snapshot()
        assert got.version == want.version and tuple(got.messages) == tuple(want.messages)
