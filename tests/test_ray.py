"""Scopes sharded over a real local Ray session: placement, the API, isolation, 2PC, failover, events.

One Ray session for the module (``ray.init(num_cpus=2, include_dashboard=False)``). Starting a store's
shards is the slow part of a test here (two Ray worker processes), so the tests that only read and write
share one ``RayStateManager`` for the module (``shared``: each uses scope ids of its own, and asserts on
the global scope relative to where it found it); the tests that kill a shard, plant a fault or need a
fresh path open their own (``manager``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")  # the "ray" extra is in the test extra: CI always runs these

from victor_actors import (  # noqa: E402
    ScopeRef,
    TransitionBatch,
    TransitionValidationError,
    VersionConflictError,
    VictorActorsError,
)
from victor_actors._rollback import RunFailedError, RunTimeoutError  # noqa: E402
from victor_actors.ray import (  # noqa: E402
    HOME,
    RayStateManager,
    ShardUnavailableError,
    placement_key,
    shard_for,
)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module", autouse=True)
def ray_session() -> Iterator[None]:
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def shared(ray_session: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayStateManager]:
    m = RayStateManager.open(
        tmp_path_factory.mktemp("shared") / "cluster", shards=2, hold_timeout=5.0, request_timeout=30.0
    )
    yield m
    m.shutdown()


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[RayStateManager]:
    m = RayStateManager.open(tmp_path / "cluster", shards=2, hold_timeout=5.0, request_timeout=30.0)
    yield m
    m.shutdown()  # the shards are detached: close() alone would leave them to the next test


def _on_shard(m: RayStateManager, shard: int, prefix: str, n: int = 1) -> list[Any]:
    """``n`` conversations (directly under global) that hash to ``shard``."""
    out = []
    i = 0
    while len(out) < n:
        h = m.get_conversation_state(f"{prefix}{i}")
        if h.shard == shard:
            out.append(h)
        i += 1
    return out


def _bump_global(conv: Any, message: str, retries: int = 200) -> Any:
    """One batch: a message in ``conv`` and global count + 1, retried on a version conflict."""
    for _ in range(retries):
        snap = conv.snapshot()
        count = snap.get_state("count", 0)
        gv = snap.versions()[ScopeRef("global", "global")]
        batch = TransitionBatch().add_message(message).update_state("count", count + 1, scope="global")
        try:
            return conv.apply(batch, expected_version={"global": gv})
        except VersionConflictError:
            continue
    raise AssertionError("too many conflicts")


# -- placement ---------------------------------------------------------------------------------


def test_placement_keeps_a_team_on_one_shard_and_global_at_home() -> None:
    for shards in (1, 2, 5):
        team = shard_for(("team", "t1", None, None), shards)
        assert shard_for(("workflow", "wf", None, "t1"), shards) == team
        assert shard_for(("conversation", "c", "wf", "t1"), shards) == team
        assert shard_for(("conversation", "c2", None, "t1"), shards) == team
        assert shard_for(("global", "global", None, None), shards) == HOME
        # a workflow under global takes its conversations with it
        assert shard_for(("conversation", "c", "wf9", None), shards) == shard_for(
            ("workflow", "wf9", None, None), shards
        )
    assert placement_key(("conversation", "c", None, None)) == "conversation:c"
    spread = {shard_for(("team", f"t{i}", None, None), 4) for i in range(100)}
    assert spread == {0, 1, 2, 3}
    # adding a shard moves only the keys the new shard wins
    moved = sum(
        shard_for(("team", f"t{i}", None, None), 4) != shard_for(("team", f"t{i}", None, None), 5)
        and shard_for(("team", f"t{i}", None, None), 5) != 4
        for i in range(500)
    )
    assert moved == 0


# -- the API -------------------------------------------------------------------------------------


def test_the_api_from_the_driver(shared: RayStateManager) -> None:
    manager = shared
    conv = manager.get_conversation_state("s1", workflow_id="wf", team_id="t1")
    assert manager.shard_of(conv.ref) == conv.shard == manager.shard_of("team:t1")
    rec = conv.apply(TransitionBatch().add_message({"role": "user", "content": "hi"}), expected_version=None)
    assert (rec.old_version, rec.new_version) == (0, 1)
    conv.update({"k": 1, "j": [1, 2]})
    assert conv.version == 2 and conv.get("k") == 1 and conv.get("missing", 7) == 7
    snap = conv.snapshot()
    assert snap.messages[0] == {"role": "user", "content": "hi"} and snap.state["j"] == (1, 2)
    team = manager.get_team_state("t1")
    team.set("policy", "strict")
    assert conv.get("policy") == "strict"  # read through the ancestors, on the same shard
    wf = manager.get_workflow_state("wf", team_id="t1")
    conv.apply(TransitionBatch().update_state("step", 3, scope="workflow"))
    assert wf.get("step") == 3
    g = manager.get_global_state()
    g.update({"mode": "on"})
    assert conv.snapshot().get_state("mode") == "on"  # the mirror: read-your-writes from this driver

    async def go() -> None:
        r = await conv.aapply(TransitionBatch().add_message("async"))
        assert r.new_version == conv.version
        s = await conv.asnapshot()
        assert s.messages[-1] == "async"
        await conv.aupdate({"z": 1})
        assert await conv.aget("z") == 1

    asyncio.run(go())
    cid = manager.save_checkpoint(conv.ref)
    conv.set("k", 99)
    manager.restore(conv.ref, cid)
    assert conv.get("k") == 1
    assert any(c[0] == cid for c in manager.list_checkpoints(conv.ref))
    stats = manager.stats()
    assert stats["shards"] == 2 and stats["commits"] >= 6 and stats["driver_calls"] >= 6


def test_errors_cross_with_their_type_and_message(shared: RayStateManager) -> None:
    manager = shared
    conv = manager.get_conversation_state("e1")
    conv.add_message("one")
    with pytest.raises(VersionConflictError) as info:
        conv.apply(TransitionBatch().add_message("two"), expected_version=0)
    assert info.value.expected_version == 0 and info.value.current_version == 1
    assert "nothing was applied" in str(info.value)
    with pytest.raises(TransitionValidationError):
        conv.apply(TransitionBatch().update_state("k", object()))
    with pytest.raises(VictorActorsError):
        conv.apply(TransitionBatch().update_state("k", 1, scope="team"))  # no team above it
    assert conv.version == 1
    with pytest.raises(VictorActorsError):
        manager.get_conversation_state("")
    with pytest.raises(VictorActorsError):
        manager.shard_of("conversation:never-opened")


def test_garbage_sent_to_a_shard_is_refused_and_changes_nothing(shared: RayStateManager) -> None:
    manager = shared
    from victor_actors.ray import _wire

    conv = manager.get_conversation_state("g1")
    conv.set("k", 1)
    actor = manager.shard_actor(conv.shard)
    for raw in (b"", b"not a frame", b"VA\x00\x00\x01" + b"\x00" * 20):
        reply = _wire.decode(ray.get(actor.call.remote(raw)))
        assert reply["e"]["e"] == "ScopeFailedError"
    bad_ops = _wire.encode(
        {"ops": ({"k": "apply", "a": ("conversation", 5, None, None), "t": ()}, {"k": "nope"})}
    )
    results = _wire.decode(ray.get(actor.call.remote(bad_ops)))["r"]
    assert [ok for ok, _ in results] == [False, False]
    assert conv.version == 1 and conv.get("k") == 1


def test_a_frame_whose_ops_are_not_a_list_gets_a_typed_error_reply(shared: RayStateManager) -> None:
    """Regression (issue 28, item 10): a frame whose ``ops`` was ``5`` or ``None`` made the shard's
    ``call`` raise a bare ``TypeError`` (iterating it), which reached the caller as Ray's task error.
    Failed before the fix (``ray.get`` raised). Now the reply is a typed error, nothing is applied,
    and the shard keeps serving."""
    manager = shared
    from victor_actors.ray import _wire

    conv = manager.get_conversation_state("g2")
    conv.set("k", 1)
    actor = manager.shard_actor(conv.shard)
    for ops in (5, None, "apply", {"k": "apply"}):
        reply = _wire.decode(ray.get(actor.call.remote(_wire.encode({"ops": ops}))))
        assert reply["r"] == () and reply["e"]["e"] == "ScopeFailedError", reply
        assert "must hold its operations as a list under 'ops'" in reply["e"]["m"]
        assert "nothing was run" in reply["e"]["m"]
    reply = _wire.decode(ray.get(actor.call.remote(_wire.encode({"no ops": ()}))))
    assert reply["e"]["e"] == "ScopeFailedError"
    assert conv.version == 1 and conv.get("k") == 1
    conv.set("k", 2)  # still serving
    assert conv.get("k") == 2


def test_conversations_on_different_shards_are_isolated(shared: RayStateManager) -> None:
    manager = shared
    (a,) = _on_shard(manager, 0, "iso-a")
    (b,) = _on_shard(manager, 1, "iso-b")
    a.set("secret", "a")
    b.set("secret", "b")
    a.add_message("for a")
    assert a.get("secret") == "a" and b.get("secret") == "b"
    assert b.snapshot().messages == () or list(b.snapshot().messages) == []
    assert a.snapshot().versions()[a.ref] == 2 and b.version == 1


# -- cross-shard batches ---------------------------------------------------------------------------


def test_a_cross_shard_batch_is_all_or_nothing(shared: RayStateManager) -> None:
    manager = shared
    (off,) = _on_shard(manager, 1, "x")
    g = manager.get_global_state()
    g0 = g.version
    rec = off.apply(TransitionBatch().add_message("m").update_state("aon", 1, scope="global"))
    assert {r.ref for r in (rec, *rec.related)} == {off.ref, g.ref}
    assert g.get("aon") == 1 and off.snapshot().get_state("aon") == 1
    # the part on the conversation's shard fails: nothing anywhere
    with pytest.raises(VersionConflictError):
        off.apply(
            TransitionBatch().add_message("n").update_state("aon", 2, scope="global"),
            expected_version={"conversation": 0},
        )
    # the part on global's home fails: nothing anywhere
    with pytest.raises(VersionConflictError):
        off.apply(
            TransitionBatch().add_message("n").update_state("aon", 2, scope="global"),
            expected_version={"global": g0},
        )
    assert g.version == g0 + 1 and off.version == 1 and g.get("aon") == 1
    assert manager.stats()["shard_held"] == 0


def test_a_batch_off_home_that_writes_only_global_commits(shared: RayStateManager) -> None:
    """Regression (found while writing the test below): a batch applied to a scope off global's home
    that wrote only the global scope sent a part with nothing to write, and the part's dry run
    failed with a bare ``KeyError`` (a ``ScopeFailedError``: "bad shard request"). Failed before
    the fix; the empty part now votes with its scope's version."""
    manager = shared
    (off,) = _on_shard(manager, 1, "only-global")
    rec = off.apply(TransitionBatch().update_state("total", 5, scope="global"))
    assert {r.ref for r in (rec, *rec.related) if r.committed} == {ScopeRef("global", "global")}
    assert manager.get_global_state().get("total") == 5 and off.version == 0


def test_concurrent_cross_shard_batches_lose_no_update_threads(shared: RayStateManager) -> None:
    """50 conversations on two shards each bump a global counter in one batch with their own message."""
    manager = shared
    convs = _on_shard(manager, 0, "t-a", 25) + _on_shard(manager, 1, "t-b", 25)
    g0 = manager.get_global_state().snapshot()
    errors: list[BaseException] = []

    def work(c: Any) -> None:
        try:
            _bump_global(c, f"hello from {c.ref.id}")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(c,)) for c in convs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    g = manager.get_global_state().snapshot()
    assert g.get_state("count") == g0.get_state("count", 0) + 50 and g.version == g0.version + 50
    for c in convs:
        assert list(c.snapshot().messages) == [f"hello from {c.ref.id}"]
    assert manager.stats()["shard_held"] == 0


def test_concurrent_cross_shard_batches_lose_no_update_asyncio(shared: RayStateManager) -> None:
    manager = shared
    convs = _on_shard(manager, 0, "as-a", 10) + _on_shard(manager, 1, "as-b", 10)
    n0 = manager.get_global_state().get("n", 0)

    async def bump(c: Any) -> None:
        while True:
            snap = await c.asnapshot()
            gv = snap.versions()[ScopeRef("global", "global")]
            batch = (
                TransitionBatch()
                .add_message("m")
                .update_state("n", snap.get_state("n", 0) + 1, scope="global")
            )
            try:
                await c.aapply(batch, expected_version={"global": gv})
                return
            except VersionConflictError:
                continue

    async def go() -> None:
        await asyncio.gather(*(bump(c) for c in convs))

    asyncio.run(go())
    assert manager.get_global_state().get("n") == n0 + 20
    assert all(c.version == 1 for c in convs)


def test_a_run_rolls_back_across_shards(shared: RayStateManager) -> None:
    manager = shared
    (a,) = _on_shard(manager, 0, "run-a")
    (b,) = _on_shard(manager, 1, "run-b")
    a.set("k", "before")
    with pytest.raises(RunFailedError) as info, manager.run("s1") as run:
        a.set("k", "during")
        b.add_message("during")
        raise RuntimeError("the agent failed")
    assert isinstance(info.value.error, RuntimeError) and info.value.run_id == run.id
    assert run.rolled_back and run.rollback_report is not None and not run.rollback_report.conflicts
    assert a.get("k") == "before" and list(b.snapshot().messages) == []
    with pytest.raises(RunTimeoutError), manager.run("s1", timeout=0.0):
        a.set("k", "late")
    assert a.get("k") == "before"


def test_a_run_rolls_back_a_write_whose_reply_was_lost_to_a_shard_kill(manager: RayStateManager) -> None:
    """Regression (issue 29, item 1; ``simulate --ray`` failed "message isolation" and "rollbacks
    accounted for" about one run in two): a write of a run committed, its shard died before
    replying, and the driver's retry found the commit by its batch id. The shard answered with a
    record rebuilt from the log that carried only the transitions, no added messages nor key
    changes, so the run's rollback undid nothing and the message survived. Failed before the fix
    (the message was still there, and the record had no added messages); now the found commit is
    rebuilt in full and undone."""
    (conv,) = _on_shard(manager, 1, "lost")
    conv.set("k", "before")
    ray.get(manager.shard_actor(1).inject.remote("apply_after_commit"))
    records = []
    with pytest.raises(RunFailedError) as info, manager.run("s"):
        records.append(conv.apply(TransitionBatch().add_message("during").update_state("k", "during")))
        raise RuntimeError("the agent failed")
    assert records[0].added_messages == ("during",) and records[0].changed_keys == ("k",)
    assert manager.stats()["shard_deduplicated"] >= 1  # the retry was answered from the log
    assert list(conv.snapshot().messages) == [] and conv.get("k") == "before"
    (scope,) = info.value.rollback_report.scopes
    assert scope.messages_removed == 1 and scope.keys_restored == ("k",) and not scope.conflicts


def test_a_rollback_whose_reply_was_lost_to_a_shard_kill_is_not_done_twice(manager: RayStateManager) -> None:
    """Regression (issue 29, item 1): a run's undo of one scope committed, its shard died before
    replying, and the driver's retry undid the scope again from the same records: it found none of
    them as the run had left them and reported the run's message as "no longer there", a conflict,
    though the run's own rollback had removed it. Failed before the fix (the report's conflicts).
    Now a retried undo finds the run's rollback commit in the scope's log and stops there."""
    (conv,) = _on_shard(manager, 1, "undo")
    conv.add_message("before")
    ray.get(manager.shard_actor(1).inject.remote("rollback_after_commit"))
    with pytest.raises(RunFailedError) as info, manager.run("s"):
        conv.add_message("during")
        raise RuntimeError("the agent failed")
    assert list(conv.snapshot().messages) == ["before"]
    (scope,) = info.value.rollback_report.scopes
    assert scope.conflicts == () and scope.version == 3  # the rollback commit the first attempt made
    assert manager.stats()["shard_rollbacks_deduplicated"] == 1


def test_a_run_write_still_waiting_at_the_runs_timeout_never_outlives_the_run(
    manager: RayStateManager,
) -> None:
    """Regression (issue 29, item 1): ``arun``'s timeout cancelled the body while its write waited on
    the shard (here: behind a cross-shard prepare holding the scope). The run rolled back the commits
    it had replies for (none), and the write applied once the hold was gone: the run's message
    outlived its rollback. Failed before the fix (the messages were ``["late", "after"]``). Now a
    run's writes are bounded by its deadline, tracked until their reply whether or not the caller
    still waits, waited for before the rollback, and refused by a shard once their run is rolled back."""
    from victor_actors.ray import _wire

    (conv,) = _on_shard(manager, 1, "late")
    conv.add_message("before")
    actor = manager.shard_actor(1)

    def call(op: dict[str, Any]) -> Any:
        ((ok, value),) = _wire.decode(ray.get(actor.call.remote(_wire.encode({"ops": (op,)}))))["r"]
        assert ok, value
        return value

    hold = _wire.transitions_to(tuple(TransitionBatch().update_state("held", True)))  # never committed
    call({"k": "prepare", "id": "test-hold", "role": "global", "a": conv.address, "t": hold, "x": None})

    async def agent() -> None:
        async with manager.arun("s", timeout=0.5):
            await conv.aadd_message("late")  # waits behind the hold past the run's timeout

    with pytest.raises(RunTimeoutError):
        asyncio.run(agent())
    call({"k": "abort", "id": "test-hold"})  # the hold goes: a write still waiting would apply now
    conv.add_message("after")
    assert list(conv.snapshot().messages) == ["before", "after"]


def test_a_run_rollback_never_erases_another_writers_commit(shared: RayStateManager) -> None:
    """Regression: the rollback restored whole scopes to their pre-run versions, so another writer's
    commit made during the run (in the same team) was erased, half of its batch with it. Now the
    undo is by value, as locally, and the other write is left and reported (checked: failed before)."""
    manager = shared
    run_conv = manager.get_conversation_state("r-run", team_id="tr")
    other = manager.get_conversation_state("r-other", team_id="tr")
    team = manager.get_team_state("tr")
    with pytest.raises(RunFailedError) as info, manager.run("s1"):
        run_conv.apply(TransitionBatch().add_message("run").update_state("counter", 1, scope="team"))
        # another writer, outside the run (its own thread: the run is the caller's context only)
        t = threading.Thread(
            target=other.apply,
            args=(TransitionBatch().add_message("other").update_state("counter", 2, scope="team"),),
        )
        t.start()
        t.join()
        raise RuntimeError("boom")
    assert team.get("counter") == 2 and list(other.snapshot().messages) == ["other"]
    assert list(run_conv.snapshot().messages) == []
    assert any("counter" in c for c in info.value.rollback_report.conflicts)


def test_pipelined_aapply_and_apply_many_share_calls(shared: RayStateManager) -> None:
    manager = shared
    convs = _on_shard(manager, 0, "p-a", 5) + _on_shard(manager, 1, "p-b", 5)
    before = manager.stats()["driver_calls"]

    async def go() -> None:
        await asyncio.gather(*(c.aadd_message(i) for c in convs for i in range(100)))

    asyncio.run(go())
    calls = manager.stats()["driver_calls"] - before
    assert calls < 1000 / 4, calls  # coalesced: far fewer Ray calls than requests
    for c in convs:
        assert sorted(c.snapshot().messages) == list(range(100))
    results = manager.apply_many([(c, TransitionBatch().update_state("x", 1)) for c in convs])
    assert [getattr(r, "new_version", r) for r in results] == [101] * len(convs)


# -- failover ------------------------------------------------------------------------------------------


def test_a_killed_shard_restarts_and_loses_no_acknowledged_commit(manager: RayStateManager) -> None:
    (conv,) = _on_shard(manager, 1, "kill")
    acked: list[int] = []
    half = threading.Event()
    failures: list[BaseException] = []

    def stream() -> None:
        for i in range(120):
            try:
                conv.add_message(i)
                acked.append(i)
            except ShardUnavailableError as exc:
                failures.append(exc)
            if i == 40:
                half.set()

    t = threading.Thread(target=stream)
    t.start()
    half.wait()
    ray.kill(manager.shard_actor(1), no_restart=False)
    t.join()
    messages = list(conv.snapshot().messages)
    assert len(messages) == len(set(messages)), "a retried commit was applied twice"
    assert set(acked) <= set(messages), "an acknowledged commit was lost"
    assert len(acked) + len(failures) == 120
    assert manager.stats()["driver_retries"] >= 1 or not failures


def test_an_unreachable_shard_raises_shard_unavailable(tmp_path: Path) -> None:
    m = RayStateManager.open(tmp_path / "c", shards=2, request_timeout=1.5)
    (conv,) = _on_shard(m, 1, "gone")
    conv.add_message("kept")
    shard = m.shard_actor(1)
    ray.kill(shard, no_restart=True)
    # ray.kill returns before the actor is gone: a call that reaches it first is still served (the
    # suite's third worker saw "DID NOT RAISE" under load). Wait until a round trip says it is dead.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            ray.get(shard.__ray_ready__.remote(), timeout=10)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            break
    with pytest.raises(ShardUnavailableError) as info:
        conv.add_message("lost")
    assert info.value.shard == 1 and info.value.may_have_applied
    with pytest.raises(ShardUnavailableError) as read:
        conv.snapshot()
    assert not read.value.may_have_applied
    m.shutdown()


@pytest.mark.parametrize("point", ["part_after_prepare", "home_before_commit", "home_after_commit"])
def test_a_shard_killed_mid_2pc_leaves_all_or_nothing(manager: RayStateManager, point: str) -> None:
    """Regression (part_after_prepare): the restarted participant asked home for the outcome while
    home was writing the commit; home answered "aborted", the part was dropped and global kept the
    batch. Home now answers only once a commit it has begun is written (checked: failed before)."""
    (off,) = _on_shard(manager, 1, f"mid-{point}")
    g = manager.get_global_state()
    shard = 1 if point.startswith("part") else HOME
    ray.get(manager.shard_actor(shard).inject.remote(point))
    outcome: Any
    try:
        outcome = off.apply(TransitionBatch().add_message("m").update_state("count", 1, scope="global"))
    except VictorActorsError as exc:
        outcome = exc
    # once both shards are back and in-doubt parts are resolved, the batch is in both or in neither
    manager.settle()
    in_conv = list(off.snapshot().messages) == ["m"]
    in_global = g.get("count") == 1
    assert in_conv == in_global, (point, outcome, in_conv, in_global)
    if isinstance(outcome, VictorActorsError):
        assert not in_conv or point == "home_after_commit"
    else:
        assert in_conv
    assert manager.stats()["shard_held"] == 0


def test_events_reach_the_driver_in_order_across_a_restart(manager: RayStateManager) -> None:
    (conv,) = _on_shard(manager, 1, "ev")
    seen: list[int] = []
    done = threading.Event()

    def on_event(e: Any) -> None:
        seen.append(e.new_version)
        if e.new_version == 10:
            done.set()

    sub = conv.subscribe(on_event)
    for i in range(5):
        conv.add_message(i)
    ray.kill(manager.shard_actor(1), no_restart=False)
    for i in range(5, 10):
        conv.add_message(i)
    assert done.wait(60)
    sub.close()
    assert seen == list(range(1, 11))


def test_snapshots_off_home_are_never_torn_and_never_go_backwards(shared: RayStateManager) -> None:
    """One conversation off home adds a message and bumps global in every batch; readers on other
    threads see, in each snapshot, a global count at least its message count, and a global version
    that never decreases."""
    manager = shared
    (writer,) = _on_shard(manager, 1, "torn-w")
    g0 = manager.get_global_state().version
    stop = threading.Event()
    problems: list[str] = []

    def read() -> None:
        last = -1
        while not stop.is_set():
            snap = writer.snapshot()
            gv = snap.versions()[ScopeRef("global", "global")]
            if gv < last:
                problems.append(f"global went back from {last} to {gv}")
            last = gv
            if snap.get_state("torn", 0) < len(snap.messages):
                problems.append(f"torn: {len(snap.messages)} messages but count {snap.get_state('torn', 0)}")

    readers = [threading.Thread(target=read) for _ in range(3)]
    for t in readers:
        t.start()
    for i in range(30):
        writer.apply(
            TransitionBatch().add_message(i).update_state("torn", i + 1, scope="global"),
            expected_version={"global": g0 + i},  # checked at global's home
        )
    stop.set()
    for t in readers:
        t.join()
    assert not problems, problems[:3]
    assert manager.get_global_state().version == g0 + 30


def test_reopening_with_another_shard_count_is_refused(tmp_path: Path) -> None:
    m = RayStateManager.open(tmp_path / "c", shards=2)
    m.get_conversation_state("a").set("k", 1)
    with pytest.raises(VictorActorsError, match="2 shards, not 3"):  # while its shards run
        RayStateManager.open(tmp_path / "c", shards=3)
    m.shutdown()
    with pytest.raises(VictorActorsError, match="2 shards, not 3"):  # and from its cluster.json
        RayStateManager.open(tmp_path / "c", shards=3)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "cluster.json").write_text("{not json")
    with pytest.raises(VictorActorsError, match="unreadable"):
        RayStateManager.open(tmp_path / "bad", shards=2)
    m = RayStateManager.open(tmp_path / "c", shards=2)  # and the state is where it was
    assert m.get_conversation_state("a").get("k") == 1
    m.shutdown()


def test_shards_starting_at_once_never_read_a_half_written_layout(tmp_path: Path) -> None:
    """Regression: the first shard created ``cluster.json`` and wrote it after; a shard starting at the
    same moment could read it empty and refuse to start ("cluster.json is unreadable"), which failed a
    ``RayStateManager.open`` in this file under load. Failed before the fix (about 250 of 300 rounds of
    6 threads saw the error). Now the file is written whole beside it and linked into place."""
    from victor_actors.ray._shard import check_layout

    for n in range(30):
        root = tmp_path / f"r{n}"
        root.mkdir()
        errors: list[BaseException] = []
        start = threading.Barrier(6)

        def take(root: Path = root, errors: list[BaseException] = errors, start: Any = start) -> None:
            start.wait()
            try:
                check_layout(str(root), 2)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=take) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors[0]
        assert [p.name for p in root.iterdir()] == ["cluster.json"]  # no draft left behind
    with pytest.raises(VictorActorsError, match="cluster of 2 shards, not 3"):
        check_layout(str(tmp_path / "r0"), 3)


def test_the_asyncio_twins_of_the_manager(shared: RayStateManager) -> None:
    manager = shared
    (a,) = _on_shard(manager, 0, "tw-a")
    (b,) = _on_shard(manager, 1, "tw-b")

    async def go() -> None:
        await a.aset("k", "before")
        with pytest.raises(RunFailedError):
            async with manager.arun("s2") as run:
                await a.aset("k", "during")
                await b.aadd_message("during")
                raise RuntimeError("the agent failed")
        assert run.rolled_back
        assert await a.aget("k") == "before" and list((await b.asnapshot()).messages) == []
        cid = await manager.asave_checkpoint(a.ref)
        await a.aset("k", "later")
        await manager.arestore(a.ref, cid)
        assert await a.aget("k") == "before"
        assert cid in [c for c, _ in await manager.alist_checkpoints(a.ref)]
        stats = await manager.astats()
        assert stats["shards"] == 2 and len(await manager.ashard_stats()) == 2

    asyncio.run(go())
    with pytest.raises(TypeError):
        manager.restore(a.ref, 1.5)  # type: ignore[arg-type]


def test_a_damaged_prepare_record_stops_the_shard_with_a_typed_error(tmp_path: Path) -> None:
    """A prepare record that cannot be read can be neither finished nor dropped safely: open refuses."""
    import lmdb

    root = tmp_path / "c"
    m = RayStateManager.open(root, shards=2)
    m.get_conversation_state("a").set("k", 1)
    m.shutdown()
    env = lmdb.open(str(root / "shard-1.2pc"), max_dbs=2)
    with env.begin(write=True, db=env.open_db(b"txn")) as t:
        t.put(b"tx-damaged", b"VA\x00garbage")
    env.close()
    with pytest.raises(VictorActorsError, match="prepare record"):
        RayStateManager.open(root, shards=2)


def _wait_for_result(handle: Any, request_id: str) -> Any:
    """The TOOL_RESULT of ``request_id`` once it has landed (events, not sleeps)."""
    landed = threading.Event()
    sub = handle.subscribe(
        lambda e: (
            landed.set() if any(t.transition_type.value == "tool_result" for t in e.transitions) else None
        )
    )
    if request_id in handle.snapshot().pending_tool_requests:
        assert landed.wait(60), "no tool result arrived"
    sub.close()
    return handle.snapshot()


def test_tool_executors_registered_on_the_driver(shared: RayStateManager) -> None:
    manager = shared
    seen: list[Any] = []
    manager.register_tool("lookup", lambda call: (seen.append(call), {"answer": call.arguments["q"] * 2})[1])
    manager.register_tool("broken", lambda call: 1 / 0)
    (conv,) = _on_shard(manager, 1, "tool")
    conv.apply(TransitionBatch().execute_tool("lookup", {"q": 21}, request_id="r1"))
    snap = _wait_for_result(conv, "r1")
    assert "r1" not in snap.pending_tool_requests
    assert seen and seen[0].request_id == "r1" and seen[0].scope == conv.ref and not seen[0].redelivery
    conv.apply(TransitionBatch().execute_tool("broken", {}, request_id="r2"))
    snap = _wait_for_result(conv, "r2")
    assert "r2" not in snap.pending_tool_requests
    with pytest.raises(TypeError):
        manager.register_tool("x", "not callable")  # type: ignore[arg-type]


def test_a_tool_pending_when_its_shard_restarts_is_delivered_again(manager: RayStateManager) -> None:
    release = threading.Event()
    calls: list[Any] = []

    def slow(call: Any) -> str:
        calls.append(call)
        if not call.redelivery:
            release.wait(30)  # the first delivery is still running when the shard is killed
        return "done"

    manager.register_tool("slow", slow, timeout=40)
    (conv,) = _on_shard(manager, 1, "tool-kill")
    started = threading.Event()
    sub = conv.subscribe(lambda e: started.set())
    conv.apply(TransitionBatch().execute_tool("slow", {}, request_id="k1"))
    assert started.wait(30)
    ray.kill(manager.shard_actor(1), no_restart=False)
    snap = _wait_for_result(conv, "k1")
    release.set()
    sub.close()
    assert "k1" not in snap.pending_tool_requests
    assert [c.redelivery for c in calls][-1] is True  # delivered again, with the same key
    assert {c.request_id for c in calls} == {"k1"}


def test_message_removals_and_their_rollback_on_the_shards(manager: RayStateManager) -> None:
    """Pop, truncate and clear in a conversation off home and in global (at home), a cross-shard batch
    that removes in both, and a run that removes in both rolled back: the shards' rollback puts the
    messages back (docs/adr/0024)."""
    (a,) = _on_shard(manager, 1 - HOME, "rm-a")
    g = manager.get_global_state()
    a.apply(TransitionBatch().add_messages(["a0", "a1", "a2"]))
    g.apply(TransitionBatch().add_messages(["g0", "g1"]))
    assert a.apply(TransitionBatch().pop_message()).removed_messages == ("a2",)
    rec = a.apply(TransitionBatch().truncate_messages(1).pop_message(scope="global"))
    assert {str(r.ref): r.removed_messages for r in (rec, *rec.related)} == {
        str(a.ref): ("a1",),
        "global:global": ("g1",),
    }
    g.apply(TransitionBatch().add_messages(["g2", "g3"]))
    with pytest.raises(RunFailedError) as info, manager.run("s1"):
        a.apply(TransitionBatch().clear_messages().add_message("run").drop_messages(2, scope="global"))
        raise RuntimeError("the agent failed")
    assert not info.value.rollback_report.conflicts
    assert sorted(s.messages_restored for s in info.value.rollback_report.scopes) == [1, 2]
    assert list(a.snapshot().messages) == ["a0"] and list(g.snapshot().messages) == ["g0", "g2", "g3"]


def test_fifty_concurrent_cross_shard_batches_that_write_global_meet_no_deadline(
    shared: RayStateManager,
) -> None:
    """Issue 24, item 4: global's home held the global scope from a batch's prepare to its commit,
    three Ray round trips, so under the issue's contention 50 threads sending cross-shard batches that
    write global failed with ``DeadlineExceededError: global:global stayed held by a cross-shard
    commit until the request's deadline``. That failure depends on the machine's load: checked
    against main at load average 4, this test passed there too, so it guards the outcome (every batch
    commits, global holds every part, no hold is left) rather than failing on main every time. Home
    now decides by committing global's part like any write (nothing held across a round trip), and
    decisions that arrive together share a group commit."""
    manager = shared
    convs = _on_shard(manager, 1, "hot", 50)
    g0 = manager.get_global_state().version
    errors: list[BaseException] = []
    start = threading.Barrier(len(convs))

    def work(c: Any) -> None:
        start.wait()
        for i in range(6):
            try:
                c.apply(
                    TransitionBatch().add_message(i).update_state(f"k-{c.ref.id}", i, scope="global"),
                    timeout=10.0,
                )
            except BaseException as exc:
                errors.append(exc)

    threads = [threading.Thread(target=work, args=(c,)) for c in convs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, [f"{type(e).__name__}: {e}" for e in errors[:3]]
    g = manager.get_global_state().snapshot()
    assert g.version == g0 + 300 and all(g.get_state(f"k-{c.ref.id}") == 5 for c in convs)
    assert all(list(c.snapshot().messages) == list(range(6)) for c in convs)
    assert manager.stats()["shard_held"] == 0
