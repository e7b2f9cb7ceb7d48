"""History checks over the recording: blind writes, what a run left, writes that belong together.

Issue 31, item 2. Real managers and actors; each check is shown passing on
the right way to write it and failing, with commit ids, scopes and call
sites, on the wrong one.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from victor_actors import GlobalStateManager, RunFailedError, TransitionBatch
from victor_actors.testing import (
    ReadCall,
    Recorder,
    RunMark,
    Write,
    WriteCall,
    assert_committed_together,
    assert_no_blind_writes,
    assert_run_left_nothing,
)


def _bump(snap: object) -> TransitionBatch:
    return TransitionBatch().update_state("n", snap.get_state("n") + 1, scope="team")  # type: ignore[attr-defined]


def test_the_recorder_keeps_reads_writes_and_runs_with_callers_and_sites() -> None:
    with GlobalStateManager.open() as manager, Recorder(manager) as recorder:
        conv = manager.get_conversation_state("c", team_id="t")
        conv.get("x")
        conv.set("x", 1)
        with pytest.raises(RunFailedError), manager.run("c") as run:
            raise ValueError("boom")
        calls = recorder.calls()
    read, write, start, end = calls
    assert isinstance(read, ReadCall) and read.ref == conv.ref and read.caller == "thread 'MainThread'"
    assert read.site is not None and read.site.startswith("tests/test_kit_history.py:")
    assert isinstance(write, WriteCall) and write.via == "apply" and write.record is not None
    assert write.records()[0].commit_id == write.record.commit_id
    assert isinstance(start, RunMark) and (start.event, start.run_id) == ("start", run.id)
    assert isinstance(end, RunMark) and end.event == "end" and end.report is run.rollback_report


def test_blind_writes_are_reported_and_checked_writes_are_not() -> None:
    with GlobalStateManager.open() as manager, Recorder(manager) as recorder:
        team = manager.get_team_state("t")
        conv = manager.get_conversation_state("c", team_id="t")
        team.set("n", 0)
        conv.modify(_bump)  # reads, then writes with the versions it read
        conv.transact(_bump, lock=["team"])  # locks
        snap = conv.snapshot()
        conv.apply(_bump(snap), expected_version={"team": snap.versions()[team.ref]})
        conv.set("mine", conv.get("mine", 0) + 1)  # a conversation only this caller writes
        team.set("status", "busy")  # not read first: not a read-modify-write
        assert_no_blind_writes(recorder)

        n = team.get("n")
        record = conv.apply(TransitionBatch().update_state("n", n + 1, scope="team"))
        with pytest.raises(AssertionError) as info:
            assert_no_blind_writes(recorder, settle=0)
        assert_no_blind_writes(recorder, ignore_keys=["n"])
        assert_no_blind_writes(recorder, "conversation:c")  # limited to a scope it did not write blind
    text = str(info.value)
    commit = record.related[0].commit_id
    assert f"commit {commit} in team:t: apply by thread 'MainThread' at tests/test_kit_history.py:" in text
    assert "wrote 'n' = 4 after reading team:t at v" in text and "('n' was 3)" in text
    assert "no expected_version for team:t" in text and "an update was lost" not in text


def test_a_blind_write_that_lost_an_update_says_so() -> None:
    with GlobalStateManager.open() as manager, Recorder(manager) as recorder:
        team = manager.get_team_state("t")
        team.set("n", 0)
        read_done, other_done = threading.Event(), threading.Event()

        def other() -> None:
            read_done.wait(5)
            team.set("n", 5)  # another writer, between the read and the write
            other_done.set()

        thread = threading.Thread(target=other)
        thread.start()
        n = team.get("n")
        read_done.set()
        other_done.wait(5)
        team.set("n", n + 1)
        thread.join(5)
        with pytest.raises(AssertionError, match=r"an update was lost: it overwrote 5"):
            assert_no_blind_writes(recorder, settle=0)


def test_asyncio_callers_are_told_apart_by_task() -> None:
    async def agent(manager: GlobalStateManager, name: str) -> None:
        conv = manager.get_conversation_state(name, team_id="t")
        snap = await conv.asnapshot()
        await conv.aapply(TransitionBatch().update_state("n", snap.get_state("n") + 1, scope="team"))

    async def main(manager: GlobalStateManager) -> None:
        await asyncio.gather(agent(manager, "a"), agent(manager, "b"))

    with GlobalStateManager.open() as manager, Recorder(manager) as recorder:
        manager.get_team_state("t").set("n", 0)
        asyncio.run(main(manager))
        with pytest.raises(AssertionError) as info:
            assert_no_blind_writes(recorder, settle=0)
    assert str(info.value).count("aapply by task") == 2


def test_a_run_that_kept_to_its_tag_left_nothing() -> None:
    with GlobalStateManager.open() as manager, Recorder(manager) as recorder:
        conv = manager.get_conversation_state("c", team_id="t")
        with pytest.raises(RunFailedError), manager.run("c") as run:
            step = run.thread(conv.apply, TransitionBatch().add_message("draft").update_state("k", 1))
            step.start()
            step.join(5)
            raise ValueError("the model went away")
        assert conv.snapshot().messages == ()
        assert_run_left_nothing(recorder, run)
        assert_run_left_nothing(recorder, run.id)


def test_a_step_in_a_plain_thread_escapes_the_run_and_is_reported() -> None:
    with GlobalStateManager.open() as manager, Recorder(manager) as recorder:
        conv = manager.get_conversation_state("c", team_id="t")
        with pytest.raises(RunFailedError), manager.run("c") as run:
            batch = TransitionBatch().add_message("draft").update_state("found", 1, scope="team")
            step = threading.Thread(target=conv.apply, args=(batch,), name="worker")
            step.start()
            step.join(5)
            raise ValueError("the model went away")
        assert conv.snapshot().messages == ("draft",)  # the rollback did not see it
        with pytest.raises(AssertionError) as info:
            assert_run_left_nothing(recorder, run, settle=0)
    text = str(info.value)
    assert f"run {run.id} left writes behind" in text
    assert "in conversation:c during the run carries no run tag: apply by thread 'worker'" in text
    assert "in team:t by the same caller during the run, untagged" in text


def test_a_rollback_that_could_not_undo_is_reported() -> None:
    with GlobalStateManager.open() as manager, Recorder(manager) as recorder:
        conv = manager.get_conversation_state("c", team_id="t")
        team = manager.get_team_state("t")
        with pytest.raises(RunFailedError), manager.run("c") as run:
            conv.apply(TransitionBatch().update_state("n", 1, scope="team"))
            other = threading.Thread(target=team.set, args=("n", 2))  # another writer, not the run
            other.start()
            other.join(5)
            raise ValueError("boom")
        with pytest.raises(AssertionError, match=r"its rollback left team:t as it was: key 'n'"):
            assert_run_left_nothing(recorder, run, settle=0)
        with pytest.raises(AssertionError, match="never saw run nope start"):
            assert_run_left_nothing(recorder, "nope", settle=0)


def test_writes_that_belong_together_must_share_a_commit() -> None:
    def unit(write: Write) -> str | None:
        if write.kind == "message" and "answer" in str(write.value):
            return str(write.value).split()[-1]
        if write.kind == "set" and (write.key or "").startswith("finding:"):
            return write.key.split(":")[1]  # type: ignore[union-attr]
        return None

    with GlobalStateManager.open() as manager, Recorder(manager) as recorder:
        conv = manager.get_conversation_state("c", team_id="t")
        conv.apply(TransitionBatch().add_message("answer q1").update_state("finding:q1", "x", scope="team"))
        assert_committed_together(recorder, unit)
        first = conv.add_message("answer q2")
        second = conv.apply(TransitionBatch().update_state("finding:q2", "y", scope="team"))
        with pytest.raises(AssertionError) as info:
            assert_committed_together(recorder, unit, settle=0)
    text = str(info.value)
    assert "'q2' was split over 2 commits" in text and "q1" not in text
    assert f"commit {first.commit_id} (message 'answer q2' in conversation:c; apply by thread" in text
    assert f"commit {second.related[0].commit_id} (finding:q2='y' in team:t; apply by" in text


def test_the_history_checks_need_a_recorder() -> None:
    with GlobalStateManager.open() as manager:
        for check in (assert_no_blind_writes, lambda m: assert_run_left_nothing(m, "r")):
            with pytest.raises(TypeError, match="needs a Recorder"):
                check(manager)
        with pytest.raises(TypeError, match="needs a Recorder"):
            assert_committed_together(manager, lambda w: None)
