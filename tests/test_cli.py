"""The victor-actors command line on real LMDB stores: in-process, and beside a live writer."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from victor_actors import GlobalStateManager, ScopeRef, TransitionBatch
from victor_actors.cli import main
from victor_actors.store import versioned_key

BLOB = b"\x00\x01\xff"
ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """global, team t1, workflow wf1 under t1, conversation c1 under wf1, c2 under t1."""
    path = tmp_path_factory.mktemp("store")
    with GlobalStateManager.open(path, checkpoint_every=5) as m:
        m.get_global_state().set("model", "m1")
        m.get_team_state("t1").update({"goal": "ship", "owner": "ana"})
        m.get_workflow_state("wf1", team_id="t1").set("step", 1)
        c1 = m.get_conversation_state("c1", workflow_id="wf1", team_id="t1")
        batch = TransitionBatch().add_message({"role": "user", "content": "hi"})
        c1.apply(batch.update_state("draft", "v1").update_state("scratch", "tmp"))  # v1
        c1.apply(TransitionBatch().update_capability("web_search").update_stage("drafting"))  # v2
        c1.add_message({"role": "assistant", "content": "a draft"})  # v3
        edit = TransitionBatch().update_state("draft", "v2").delete_state("scratch")
        c1.apply(edit.update_state("blob", BLOB))  # v4
        c1.apply(TransitionBatch().add_messages([{"role": "user", "content": "shorter"}, "ok"]))  # v5
        c1.set("draft", "v3")  # v6
        c2 = m.get_conversation_state("c2", team_id="t1")
        for i in range(20):  # checkpoints at 10, 15, 20 kept; log from v11 on
            c2.set("turn", i)
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def row(out: str, ref: str) -> str:
    (line,) = [line for line in out.splitlines() if line.strip().startswith(ref + " ")]
    return line


def test_inspect_prints_the_tree_with_versions_checkpoints_and_bytes(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "inspect", str(store))
    assert code == 0 and err == ""
    assert "5 scopes" in out.splitlines()[0]
    refs = ("global:global", "team:t1", "workflow:wf1", "conversation:c1", "conversation:c2")
    indents = {ref: len(row(out, ref)) - len(row(out, ref).lstrip()) for ref in refs}
    assert indents == {
        "global:global": 0,
        "team:t1": 2,
        "workflow:wf1": 4,
        "conversation:c1": 6,
        "conversation:c2": 4,
    }
    lines = out.splitlines()
    assert lines.index(row(out, "team:t1")) < lines.index(row(out, "workflow:wf1"))
    assert lines.index(row(out, "workflow:wf1")) < lines.index(row(out, "conversation:c1"))
    assert row(out, "conversation:c1").split()[1:5] == ["6", "1", "(newest", "v5)"]
    assert row(out, "conversation:c2").split()[1:5] == ["20", "3", "(newest", "v20)"]
    assert row(out, "team:t1").split()[1:3] == ["1", "0"]
    assert int(row(out, "conversation:c1").split()[-1]) > int(row(out, "team:t1").split()[-1]) > 0
    assert "recovery: every scope loaded cleanly" in out


def test_history_lists_commits_with_summaries_and_checkpoints(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "history", str(store), "conversation:c1")
    assert code == 0
    head, *lines = out.splitlines()
    assert head == "conversation:c1: 6 commit(s) in the log (v1..v6); checkpoints: v5"
    assert [line.split()[0] for line in lines] == [f"v{v}" for v in range(1, 7)]
    assert all(ISO.search(line) and " batch " in line for line in lines)
    assert "add_message x1; update_state x2 (draft, scratch)" in lines[0]
    assert "update_capability x1; update_stage x1" in lines[1]
    assert "update_state x2 (draft, blob); delete_state x1 (scratch)" in lines[3]
    assert lines[4].endswith("add_messages x1  [checkpoint]")
    assert "[checkpoint]" not in "".join(lines[:4] + lines[5:])

    code, out, _ = run(capsys, "history", str(store), "conversation:c2")
    head, first, *rest = out.splitlines()
    assert head == "conversation:c2: 10 commit(s) in the log (v11..v20); checkpoints: v10, v15, v20"
    assert first == "v10   (commit no longer in the log)  [checkpoint]"
    assert rest[0].startswith("v11 ") and rest[-1].startswith("v20 ") and rest[-1].endswith("[checkpoint]")


def test_history_calls_a_rollback_a_rollback_and_a_restore_a_restore(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (issue 29, item 8): a run's rollback was listed as ``reset`` with "restore or
    rollback", where the inspector says ``rollback``; a restore and a rollback read the same.
    This failed before the fix."""
    from victor_actors import RunFailedError

    with GlobalStateManager.open(tmp_path) as m:
        conv = m.get_conversation_state("c")
        conv.set("k", 1)  # v1
        with pytest.raises(RunFailedError), m.run("sess") as failed:
            conv.set("k", 2)  # v2, the run's
            raise RuntimeError("the run fails")  # v3: its rollback
        m.restore(conv.ref, 1)  # v4: a restore, made by no run
    code, out, _ = run(capsys, "history", str(tmp_path), "conversation:c")
    assert code == 0
    _head, *lines = out.splitlines()
    fields = [line.split() for line in lines]
    assert [f[0] for f in fields] == ["v1", "v2", "v3", "v4"]
    assert [f[4] for f in fields] == ["batch", "batch", "rollback", "restore"]
    assert fields[1][3] == fields[2][3] == f"run={failed.id}" and fields[3][3] == "-"
    assert "the run's writes undone" in lines[2] and "restored" in lines[3]

    code, out, _ = run(capsys, "export", str(tmp_path), "conversation:c")
    log = json.loads(out)["scopes"][0]["log"]
    assert [(c["kind"], c["rollback"]) for c in log] == [
        ("batch", False),
        ("batch", False),
        ("reset", True),
        ("reset", False),
    ]


def test_show_prints_state_as_json_now_and_at_a_version(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "show", str(store), "conversation:c1")
    assert code == 0
    doc = json.loads(out)
    assert doc["ref"] == "conversation:c1" and doc["version"] == 6
    assert doc["state"] == {"draft": "v3", "blob": {"$bytes": base64.b64encode(BLOB).decode()}}
    assert doc["messages"][-1] == "ok" and len(doc["messages"]) == 4
    assert doc["capabilities"] == {"web_search": True} and doc["conversation_stage"] == "drafting"

    code, out, _ = run(capsys, "show", str(store), "conversation:c1", "--version", "1")
    doc = json.loads(out)
    assert code == 0 and doc["version"] == 1
    assert doc["state"] == {"draft": "v1", "scratch": "tmp"}
    assert doc["messages"] == [{"role": "user", "content": "hi"}] and doc["capabilities"] == {}


def test_diff_shows_keys_messages_capabilities_and_stage(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "diff", str(store), "conversation:c1", "1", "6")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "conversation:c1: v1 -> v6"
    assert '  + blob = {"$bytes": "AAH/"}' in lines
    assert '  ~ draft: "v1" -> "v3"' in lines
    assert '  - scratch (was "tmp")' in lines
    assert "messages: 3 added (1 -> 4)" in lines
    assert '  + {"role": "assistant", "content": "a draft"}' in lines and '  + "ok"' in lines
    assert "  + web_search = true" in lines
    assert "stage: initial -> drafting" in lines

    code, out, _ = run(capsys, "diff", str(store), "conversation:c2", "12", "12")
    assert code == 0 and "state: no changes" in out and "stage: unchanged (initial)" in out


def test_export_one_scope_or_all(store: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = run(capsys, "export", str(store), "--json")
    assert code == 0
    doc = json.loads(out)
    refs = [s["ref"] for s in doc["scopes"]]
    assert refs[0] == "global:global" and len(refs) == 5
    assert set(refs) == {"global:global", "team:t1", "workflow:wf1", "conversation:c1", "conversation:c2"}
    assert doc["recovery_reports"] == []

    target = tmp_path / "c1.json"
    code, out, _ = run(capsys, "export", str(store), "conversation:c1", "--output", str(target))
    assert code == 0 and out.strip() == f"wrote 1 scope(s) to {target}"
    (c1,) = json.loads(target.read_text())["scopes"]
    assert c1["version"] == 6 and c1["parent"] == "workflow:wf1"
    assert c1["lineage"] == ["workflow:wf1", "team:t1", "global:global"]
    assert c1["state"]["draft"] == "v3"
    assert [c["id"] for c in c1["checkpoints"]] == ["conversation:c1@5"]
    assert [e["version"] for e in c1["log"]] == [1, 2, 3, 4, 5, 6]
    assert c1["log"][3]["keys"] == {"update_state": ["draft", "blob"], "delete_state": ["scratch"]}
    assert c1["log"][0]["transitions"] == {"add_message": 1, "update_state": 2}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["show", "{store}", "conversation:nope"], "no scope conversation:nope exists"),
        (["history", "{store}", "team:nope"], "no scope team:nope exists"),
        (["inspect", "{store}/missing"], "no victor_actors store at"),
        (["show", "{store}", "conversation:c2", "--version", "3"], "version 3 is no longer stored"),
        (["diff", "{store}", "conversation:c2", "12", "99"], "has no version 99; its newest is 20"),
    ],
)
def test_errors_are_one_line_and_exit_2(
    store: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run(capsys, *[a.format(store=store) for a in argv])
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("victor-actors: error: ") and message in err


def test_a_bad_scope_ref_is_a_usage_error(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "show", str(store), "c1")
    assert code == 2 and "expected 'scope:id'" in err and "Traceback" not in err


def test_a_corrupt_commit_is_reported_not_raised(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import lmdb

    with GlobalStateManager.open(tmp_path, checkpoint_every=5) as m:
        for i in range(4):
            m.get_conversation_state("c").set("i", i)
        for i in range(11):
            m.get_conversation_state("d").set("i", i)
    env = lmdb.open(str(tmp_path / "data"), max_dbs=8)
    for db, ref, version in (("log", "conversation:c", 2), ("ckpt", "conversation:d", 10)):
        with env.begin(write=True, db=env.open_db(db.encode())) as txn:
            key = versioned_key(ScopeRef.parse(ref), version)
            stored = txn.get(key)
            assert stored is not None
            raw = bytearray(stored)
            raw[len(raw) // 2] ^= 0xFF
            txn.put(key, bytes(raw))
    env.close()
    code, out, err = run(capsys, "inspect", str(tmp_path))
    assert code == 0 and row(out, "conversation:c").split()[1] == "1"
    assert "conversation:c: loaded at v1 from no checkpoint + 1 replayed commits, newest stored v4" in out
    assert "skipped commit v2" in out and "checksum mismatch" in out
    code, out, err = run(capsys, "history", str(tmp_path), "conversation:c")
    assert code == 2 and "v2    UNREADABLE:" in out and out.splitlines()[-1].startswith("v4 ")
    assert err.count("\n") == 1 and "1 stored commit(s) are unreadable" in err
    code, out, err = run(capsys, "export", str(tmp_path))
    assert code == 2 and out == "" and "checksum mismatch" in err
    code, out, _ = run(capsys, "export", str(tmp_path), "conversation:d")  # fell back to checkpoint v5
    (report,) = json.loads(out)["recovery_reports"]
    assert code == 0 and report["ref"] == "conversation:d" and report["checkpoint_version"] == 5
    assert report["version"] == 11 and report["replayed"] == 6 and "checkpoint v10" in report["skipped"][0]


def test_inspect_in_a_subprocess_while_a_writer_owns_the_store(tmp_path: Path) -> None:
    with GlobalStateManager.open(tmp_path, checkpoint_every=5) as m:
        conv = m.get_conversation_state("live", team_id="t")
        for i in range(7):
            conv.set("i", i)
        proc = subprocess.run(
            [sys.executable, "-m", "victor_actors", "inspect", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        assert row(proc.stdout, "conversation:live").split()[1:5] == ["7", "1", "(newest", "v5)"]
        assert conv.set("i", 7).version == 8  # the writer is untouched
