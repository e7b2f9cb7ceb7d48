"""The web inspector: its routes on a real store made by ``simulate``, served by a real server on
127.0.0.1, and its page driven in a real headless Chromium.

Two servers: ``victor-actors serve`` in a child process over the simulated store (so the store
is read while this process owns it for writing, in one test), and ``serve_manager`` over a
running manager in this process (live mode). The browser is Debian's ``chromium`` with its own
``chromedriver`` (``scripts/install_browser.sh``, the first step of README's test command,
installs both); without them the browser tests fail, they do not skip. Screenshots go to pytest's
temporary directory, and also to ``$VICTOR_ACTORS_SCREENSHOTS`` when it names a directory (that
is how ``docs/inspector.png`` was made).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import lmdb
import pytest

import victor_actors
from victor_actors import (
    GlobalStateManager,
    RunFailedError,
    ScopeFailedError,
    ScopeRef,
    TransitionBatch,
)
from victor_actors.sim import QUICK, SimConfig, simulate
from victor_actors.store import versioned_key
from victor_actors.store._keys import ref_key
from victor_actors.testing import inject_fault
from victor_actors.web import InspectorServer, open_read_only, serve_manager

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
BLOB = b"\x00\x01\xff"
DEMO = "conversation:demo"
ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # 127.0.0.1 only, never a proxy


def fetch(url: str, *, method: str = "GET", headers: dict[str, str] | None = None) -> tuple[int, Any, Any]:
    """(status, headers, JSON body) of one request; HTTP errors are answers too."""
    request = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with _OPENER.open(request, timeout=10) as response:
            raw = response.read()
            status, head = response.status, response.headers
    except urllib.error.HTTPError as exc:
        raw, status, head = exc.read(), exc.code, exc.headers
    body = json.loads(raw) if raw and head.get("content-type", "").startswith("application/json") else raw
    return status, head, body


def api(base: str, path: str, **params: Any) -> Any:
    query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
    status, _head, body = fetch(f"{base}api/{path}" + (f"?{query}" if query else ""))
    assert status == 200, body
    return body


# -- the store and the servers ---------------------------------------------------------------


@pytest.fixture(scope="module")
def sim_store(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A store made by ``simulate --quick`` (shortened), plus one conversation written by hand.

    ``conversation:demo`` (under team:t0): v1 a user message, draft=v1, scratch=tmp; v2 an
    assistant message, a capability, a stage; v3 draft=v2, scratch deleted, blob=bytes; v4 two
    more messages. ``conversation:long`` (under workflow:t0w1): 20 commits with a checkpoint every
    5 (10, 15 and 20 kept, the log from 11 on), then a run that wrote v21 and was rolled back (v22).
    """
    path = tmp_path_factory.mktemp("web") / "store"
    report = simulate(SimConfig(**{**QUICK, "seconds": 1.0}), store=str(path))
    assert report["verdict"] == "PASS", report["failed"]
    with GlobalStateManager.open(path, checkpoint_every=5) as m:
        long = m.get_conversation_state("long", workflow_id="t0w1", team_id="t0")
        for i in range(20):
            long.set("i", i)
        with pytest.raises(RunFailedError), m.run("long-run"):
            long.set("i", "inside a run")
            raise RuntimeError("the run fails")
        c = m.get_conversation_state("demo", team_id="t0")
        first = TransitionBatch().add_message({"role": "user", "content": "draft the intro"})
        c.apply(first.update_state("draft", "v1").update_state("scratch", "tmp"))
        reply = TransitionBatch().add_message({"role": "assistant", "content": "here is a first draft"})
        c.apply(reply.update_capability("web_search").update_stage("drafting"))
        c.apply(
            TransitionBatch().update_state("draft", "v2").delete_state("scratch").update_state("blob", BLOB)
        )
        c.apply(
            TransitionBatch().add_messages(
                [{"role": "user", "content": "shorter, please"}, {"role": "assistant", "content": "done"}]
            )
        )
        versions = {str(ref): m.scope(ref).version for ref in m.scopes()}
        parents = {str(ref): m.scope(ref).snapshot().parent for ref in m.scopes()}
    return {"path": path, "versions": versions, "parents": parents}


@pytest.fixture(scope="module")
def store_url(sim_store: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``victor-actors serve STORE --port 0`` in a child process; its URL. Stopped with SIGINT (exit 0)."""
    errors = tmp_path_factory.mktemp("serve") / "stderr.txt"
    with errors.open("w") as sink:
        child = subprocess.Popen(
            [sys.executable, "-m", "victor_actors", "serve", str(sim_store["path"]), "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=sink,
            text=True,
        )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()  # printed once the socket listens
        found = re.search(r"read-only at (http://127\.0\.0\.1:\d+/)", line)
        assert found, (line, errors.read_text())
        yield found.group(1)
    finally:
        child.send_signal(signal.SIGINT)
        code = child.wait(10)
    assert code == 0, errors.read_text()
    assert "Traceback" not in errors.read_text()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GlobalStateManager, InspectorServer]]:
    """A running manager on its own store, served in live mode on an ephemeral port."""
    manager = GlobalStateManager.open(tmp_path_factory.mktemp("live") / "store")
    manager.get_conversation_state("talk", team_id="crew").add_message({"role": "user", "content": "hi"})
    server = serve_manager(manager, port=0)
    try:
        yield manager, server
    finally:
        server.close()
        manager.close()


# -- the routes, on the simulated store ----------------------------------------------------------


def test_info_says_what_is_served(store_url: str, sim_store: dict[str, Any]) -> None:
    info = api(store_url, "info")
    assert info["mode"] == "store" and info["read_only"] and info["owner_read_only"]
    assert info["store"] == os.path.abspath(sim_store["path"])


def test_the_tree_is_paged_by_parent_with_versions_sizes_and_times(
    store_url: str, sim_store: dict[str, Any]
) -> None:
    roots = api(store_url, "scopes", parent="none")
    assert [r["ref"] for r in roots["items"]] == ["global:global"] and roots["next"] is None
    assert roots["items"][0]["has_children"]
    seen: dict[str, dict[str, Any]] = {}
    todo = ["global:global"]
    while todo:  # walk the whole tree, two children at a time
        parent, after = todo.pop(), None
        while True:
            page = api(store_url, "scopes", parent=parent, limit=2, after=after)
            for row in page["items"]:
                assert row["parent"] == parent
                seen[row["ref"]] = row
                if row["has_children"]:
                    todo.append(row["ref"])
            after = page["next"]
            if after is None:
                break
    expected = {ref for ref in sim_store["versions"] if ref != "global:global"}
    assert set(seen) == expected
    for ref, row in seen.items():
        assert row["version"] == sim_store["versions"][ref]
        assert str(sim_store["parents"][ref]) == row["parent"]
        if row["version"]:
            assert ISO.match(row["last_commit"]) and row["size"] > 0
    assert seen[DEMO]["parent"] == "team:t0" and seen[DEMO]["version"] == 4


def test_paging_with_a_cursor_visits_every_scope_once_in_order(
    store_url: str, sim_store: dict[str, Any]
) -> None:
    refs: list[str] = []
    after = None
    while True:
        page = api(store_url, "scopes", limit=3, after=after)
        assert len(page["items"]) <= 3
        refs += [r["ref"] for r in page["items"]]
        after = page["next"]
        if after is None:
            break
    assert refs == sorted(sim_store["versions"], key=lambda r: ref_key(ScopeRef.parse(r)))  # key order
    assert api(store_url, "scopes", after=refs[-1])["items"] == []


def test_search_filters_by_id_prefix_and_level(store_url: str, sim_store: dict[str, Any]) -> None:
    found = [r["ref"] for r in api(store_url, "scopes", prefix="t0w1")["items"]]
    assert found == sorted(
        (r for r in sim_store["versions"] if r.split(":", 1)[1].startswith("t0w1")),
        key=lambda r: ref_key(ScopeRef.parse(r)),
    )
    assert found and all(r.split(":", 1)[1].startswith("t0w1") for r in found)
    conversations = api(store_url, "scopes", level="conversation", prefix="t0w1")["items"]
    assert conversations and all(r["level"] == "conversation" for r in conversations)
    assert api(store_url, "scopes", prefix="no-such-id")["items"] == []


def test_one_scope_and_its_history(store_url: str, sim_store: dict[str, Any]) -> None:
    scope = api(store_url, "scope", ref=DEMO)
    assert scope["version"] == 4 and scope["parent"] == "team:t0"
    assert scope["lineage"] == ["team:t0", "global:global"]
    assert scope["log"] == {"count": 4, "first": 1, "last": 4} and scope["checkpoints"] == 0
    history = api(store_url, "history", ref=DEMO)
    assert [row["version"] for row in history["items"]] == [4, 3, 2, 1]  # newest first
    v3 = history["items"][1]
    assert v3["transitions"] == {"update_state": 2, "delete_state": 1}
    assert v3["changed_keys"] == ["blob", "draft", "scratch"] and ISO.match(v3["time"])
    assert v3["run_id"] is None and v3["kind"] == "batch" and not v3["rollback"]
    older = api(store_url, "history", ref=DEMO, limit=3)
    assert [r["version"] for r in older["items"]] == [4, 3, 2] and older["next_before"] == 2
    rest = api(store_url, "history", ref=DEMO, limit=3, before=older["next_before"])
    assert [r["version"] for r in rest["items"]] == [1] and rest["next_before"] is None


def test_history_marks_checkpoints_and_rolled_back_runs(store_url: str, sim_store: dict[str, Any]) -> None:
    history = api(store_url, "history", ref="conversation:long")
    assert [r["version"] for r in history["items"]] == list(range(22, 9, -1))
    assert history["count"] == 12 and history["checkpoints"] == [10, 15, 20]
    rollback, in_run = history["items"][0], history["items"][1]
    assert rollback["rollback"] and rollback["kind"] == "reset" and rollback["run_id"].startswith("long-run:")
    assert (
        in_run["run_id"] == rollback["run_id"] and not in_run["rollback"] and in_run["changed_keys"] == ["i"]
    )
    pruned = history["items"][-1]  # its commit went with retention; its checkpoint stays
    assert pruned == {
        "version": 10,
        "checkpoint": {"id": "conversation:long@10", "label": None},
        "in_log": False,
    }
    assert [r["version"] for r in history["items"] if r["checkpoint"]] == [20, 15, 10]
    checkpoints = api(store_url, "checkpoints", ref="conversation:long")["items"]
    assert [c["version"] for c in checkpoints] == [20, 15, 10]
    assert all(c["readable"] and ISO.match(c["time"]) and c["size"] > 0 for c in checkpoints)
    assert api(store_url, "state", ref="conversation:long", version=22)["state"] == [
        {"key": "i", "value": 19}
    ]


def test_history_of_one_run_lists_its_writes_and_its_rollback(store_url: str) -> None:
    """``run=`` keeps only that run's commits, newest first, paged like the whole history."""
    run_id = api(store_url, "history", ref="conversation:long")["items"][0]["run_id"]
    only = api(store_url, "history", ref="conversation:long", run=run_id)
    assert only["run"] == run_id and only["count"] == 12 and only["next_before"] is None
    assert [(r["version"], r["rollback"], r["run_id"]) for r in only["items"]] == [
        (22, True, run_id),
        (21, False, run_id),
    ]
    first = api(store_url, "history", ref="conversation:long", run=run_id, limit=1)
    assert [r["version"] for r in first["items"]] == [22] and first["next_before"] == 22
    rest = api(store_url, "history", ref="conversation:long", run=run_id, limit=1, before=22)
    assert [r["version"] for r in rest["items"]] == [21] and rest["next_before"] is None
    assert api(store_url, "history", ref="conversation:long", run="nobody:0")["items"] == []


def test_state_at_a_version_with_a_window_of_messages(store_url: str) -> None:
    now = api(store_url, "state", ref=DEMO)
    assert now["version"] == 4 and now["message_count"] == 4
    assert {row["key"]: row["value"] for row in now["state"]} == {"blob": {"$bytes": "AAH/"}, "draft": "v2"}
    assert now["capabilities"] == {"web_search": True} and now["conversation_stage"] == "drafting"
    v1 = api(store_url, "state", ref=DEMO, version=1)
    assert v1["messages"] == [{"role": "user", "content": "draft the intro"}]
    window = api(store_url, "state", ref=DEMO, messages_from=1, messages_limit=2)
    assert window["messages_from"] == 1 and [m["content"] for m in window["messages"]] == [
        "here is a first draft",
        "shorter, please",
    ]
    newest = api(store_url, "state", ref=DEMO, messages_limit=1)
    assert newest["messages_from"] == 3 and newest["messages"] == [{"role": "assistant", "content": "done"}]


def test_diff_between_two_versions(store_url: str) -> None:
    d = api(store_url, "diff", ref=DEMO, a=1, b=4)
    assert (d["a"], d["b"]) == (1, 4)
    assert d["state"]["rows"] == [
        {"key": "blob", "change": "added", "new": {"$bytes": "AAH/"}},
        {"key": "draft", "change": "changed", "old": "v1", "new": "v2"},
        {"key": "scratch", "change": "removed", "old": "tmp"},
    ]
    assert d["capabilities"]["rows"] == [{"key": "web_search", "change": "added", "new": True}]
    assert d["messages"]["common"] == 1 and d["messages"]["removed"] == 0
    assert [m["content"] for m in d["messages"]["added"]] == [
        "here is a first draft",
        "shorter, please",
        "done",
    ]
    assert d["stage"] == {"old": "initial", "new": "drafting"}
    back = api(store_url, "diff", ref=DEMO, a=4, b=1)  # either way round
    assert back["messages"]["removed"] == 3 and back["state"]["rows"][0]["change"] == "removed"


BAD = [
    ("scopes?limit=abc", 400, "bad_parameter"),
    ("scopes?limit=0", 400, "bad_parameter"),
    ("scopes?limit=501", 400, "bad_parameter"),
    ("scopes?limit=99999999999999999999999", 400, "bad_parameter"),
    ("scopes?after=not-a-ref", 400, "bad_parameter"),
    ("scopes?parent=planet:x", 400, "bad_parameter"),
    ("scopes?level=galaxy", 400, "bad_parameter"),
    ("scopes?prefix=" + "x" * 500, 400, "bad_parameter"),
    ("scopes?limit=1&limit=2", 400, "bad_parameter"),
    ("scopes?sort=id", 400, "unknown_parameter"),
    ("scope", 400, "missing_parameter"),
    ("scope?ref=conversation:nobody", 404, "no_scope"),
    ("history?ref=conversation:nobody", 404, "no_scope"),
    ("history?ref=conversation:demo&before=-1", 400, "bad_parameter"),
    ("state?ref=conversation:demo&version=5", 404, "no_version"),
    ("state?ref=conversation:demo&version=1.5", 400, "bad_parameter"),
    ("state?ref=conversation:demo&messages_limit=0", 400, "bad_parameter"),
    ("state?ref=conversation:long&version=3", 404, "no_version"),  # pruned by retention
    ("diff?ref=conversation:demo&a=1", 400, "missing_parameter"),
    ("diff?ref=conversation:demo&a=1&b=99", 404, "no_version"),
    ("diff?ref=conversation:demo&a=x&b=1", 400, "bad_parameter"),
    ("checkpoints?ref=bad", 400, "bad_parameter"),
    ("live", 404, "not_live"),
    ("live/events", 404, "not_live"),
    ("nothing/here", 404, "not_found"),
]


@pytest.mark.parametrize(("path", "status", "code"), BAD, ids=[b[0][:40] for b in BAD])
def test_bad_requests_get_typed_4xx_errors(store_url: str, path: str, status: int, code: str) -> None:
    got, head, body = fetch(store_url + "api/" + path)
    assert (got, body["error"]["code"]) == (status, code), body
    assert body["error"]["status"] == status and body["error"]["message"]
    assert head["content-type"] == "application/json"


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE", "OPTIONS"])
@pytest.mark.parametrize("path", ["", "api/scopes", "api/scope?ref=conversation:demo", "static/app.js"])
def test_every_method_but_get_is_refused(store_url: str, method: str, path: str) -> None:
    status, head, body = fetch(store_url + path, method=method)
    assert status == 405 and body["error"]["code"] == "method_not_allowed"
    assert head["allow"] == "GET, HEAD"


def test_the_page_and_its_files_are_served_with_a_strict_policy(store_url: str) -> None:
    status, head, page = fetch(store_url)
    assert status == 200 and b'<script src="/static/app.js"' in page
    assert "default-src 'self'" in head["content-security-policy"] and head["x-frame-options"] == "DENY"
    status, head, script = fetch(store_url + "static/app.js")
    assert status == 200 and "javascript" in head["content-type"] and b"EventSource" in script
    assert fetch(store_url + "static/style.css")[0] == 200
    assert fetch(store_url + "static/missing.js")[0] == 404
    assert fetch(store_url + "api/info", method="HEAD")[0] == 200


def test_a_foreign_host_name_is_refused(store_url: str) -> None:
    status, _head, body = fetch(store_url + "api/info", headers={"Host": "attacker.example:80"})
    assert status == 400 and body["error"]["code"] == "bad_host"
    port = store_url.rsplit(":", 1)[1].rstrip("/")
    assert fetch(store_url + "api/info", headers={"Host": f"localhost:{port}"})[0] == 200


def test_it_reads_while_another_process_owns_the_store(store_url: str, sim_store: dict[str, Any]) -> None:
    with GlobalStateManager.open(sim_store["path"]) as owner:  # the server is the other process
        owner.get_conversation_state("demo").set("draft", "v3")
        owner.get_conversation_state("latecomer", team_id="t0").add_message({"role": "user", "content": "hi"})
        assert api(store_url, "scope", ref=DEMO)["version"] == 5
        assert api(store_url, "state", ref=DEMO)["state"][1] == {"key": "draft", "value": "v3"}
        assert [r["ref"] for r in api(store_url, "scopes", prefix="late")["items"]] == [
            "conversation:latecomer"
        ]
        assert api(store_url, "diff", ref=DEMO, a=4, b=5)["state"]["rows"] == [
            {"key": "draft", "change": "changed", "old": "v2", "new": "v3"}
        ]
    sim_store["versions"][DEMO] = 5
    sim_store["versions"]["conversation:latecomer"] = 1


def test_a_damaged_record_is_reported_never_shown_as_another_version(tmp_path: Path) -> None:
    with GlobalStateManager.open(tmp_path) as m:
        c = m.get_conversation_state("c")
        for i in range(4):
            c.set("i", i)
    env = lmdb.open(str(tmp_path / "data"), max_dbs=8)
    with env.begin(write=True, db=env.open_db(b"log")) as txn:  # commit v2 flipped on disk
        key = versioned_key(ScopeRef.parse("conversation:c"), 2)
        raw = bytearray(txn.get(key))
        raw[len(raw) // 2] ^= 0xFF
        txn.put(key, bytes(raw))
    env.close()
    with (
        open_read_only(str(tmp_path)) as manager,
        InspectorServer(manager, host="127.0.0.1", port=0, live=False) as server,
    ):
        rows = api(server.url, "history", ref="conversation:c")["items"]
        assert [r["version"] for r in rows] == [4, 3, 2, 1]
        assert "checksum" in rows[2]["unreadable"] and "unreadable" not in rows[1]
        for path in (
            "state?ref=conversation:c&version=3",
            "state?ref=conversation:c",
            "diff?ref=conversation:c&a=1&b=4",
        ):
            status, _head, body = fetch(server.url + "api/" + path)
            assert (status, body["error"]["code"]) == (422, "unreadable"), path
        assert api(server.url, "state", ref="conversation:c", version=1)["state"] == [
            {"key": "i", "value": 0}
        ]
        assert api(server.url, "scopes", parent="global:global")["items"][0]["version"] == 4


def test_the_routes_on_the_simulated_store_encrypted(
    store_url: str, sim_store: dict[str, Any], tmp_path: Path
) -> None:
    """The same answers from the store encrypted at rest, read with its keyring."""
    keyring = victor_actors.Keyring({"k1": victor_actors.Keyring.generate_key()}, active="k1")
    copy = tmp_path / "encrypted"
    shutil.copytree(sim_store["path"], copy)
    GlobalStateManager.open(copy, encryption=keyring, encryption_migrate=True).close()
    assert b"t0w0a0" not in (copy / "data" / "data.mdb").read_bytes()  # no id left in the clear
    with pytest.raises(victor_actors.VictorActorsError):
        open_read_only(str(copy)).close()  # without its keys it does not open
    with (
        open_read_only(str(copy), encryption=keyring) as manager,
        InspectorServer(manager, host="127.0.0.1", port=0, live=False) as server,
    ):

        def same(path: str, **params: Any) -> Any:
            plain, sealed = api(store_url, path, **params), api(server.url, path, **params)
            for doc in (plain, sealed):
                for row in doc.get("items", []) if isinstance(doc, dict) else []:
                    row.pop("size", None)  # sealed records are larger
                if isinstance(doc, dict):
                    doc.pop("size", None)
                if path == "scopes":  # pages follow key order, a keyed hash of the id when encrypted
                    doc["items"].sort(key=lambda row: row["ref"])
            assert sealed == plain, path
            return sealed

        assert sorted(r["ref"] for r in same("scopes", limit=500)["items"]) == sorted(sim_store["versions"])
        same("scopes", parent="team:t0")
        same("scopes", prefix="t0w1", level="conversation")
        same("scope", ref=DEMO)
        same("history", ref="conversation:long")
        same("history", ref="conversation:t0w0a0", limit=50)
        same("state", ref=DEMO, version=2)
        same("diff", ref=DEMO, a=1, b=4)
        same("checkpoints", ref="conversation:long")


def test_serve_refuses_a_path_without_a_store(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "victor_actors", "serve", str(tmp_path / "none"), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2 and done.stderr.startswith("victor-actors: error: no victor_actors store")


# -- live mode ---------------------------------------------------------------------------------------


def test_live_mode_binds_to_localhost_and_reports_the_owner(live: tuple[GlobalStateManager, Any]) -> None:
    manager, server = live
    assert server.url == f"http://127.0.0.1:{server.port}/" and server.port > 0
    info = api(server.url, "info")
    assert info["mode"] == "live" and info["read_only"] and not info["owner_read_only"]
    data = api(server.url, "live")
    assert data["stats"]["commits"] >= 1 and data["stats"]["live_actors"] >= 1
    assert set(data) >= {"commits_per_second", "supervision", "runs", "uptime_seconds"}
    scope = api(server.url, "scope", ref="conversation:talk")
    assert scope["live"]["version"] == scope["version"] == 1
    with pytest.raises(OSError):
        serve_manager(manager, port=server.port)  # the address is taken: refused, not shared


def test_live_events_stream_the_counters(live: tuple[GlobalStateManager, Any]) -> None:
    manager, server = live
    talk = manager.get_conversation_state("talk")
    with _OPENER.open(server.url + "api/live/events?interval=0.05", timeout=10) as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        first = _next_event(stream)
        talk.set("turn", first["stats"]["commits"])  # one commit after the first event
        for _ in range(200):  # events keep coming; one soon shows the commit
            later = _next_event(stream)
            if later["stats"]["commits"] > first["stats"]["commits"]:
                break
        else:
            pytest.fail("no event showed the commit")


def _next_event(stream: Any) -> dict[str, Any]:
    kind = None
    for raw in stream:
        line = raw.decode("utf-8").rstrip("\n")
        if line.startswith("event: "):
            kind = line[len("event: ") :]
        elif line.startswith("data: ") and kind == "live":
            data: dict[str, Any] = json.loads(line[len("data: ") :])
            return data
    raise AssertionError("the stream ended")


def test_live_shows_runs_in_progress_and_rolled_back(live: tuple[GlobalStateManager, Any]) -> None:
    manager, server = live
    talk = manager.get_conversation_state("talk")
    with pytest.raises(RunFailedError), manager.run("sess-json", timeout=30) as run:
        talk.set("draft", "inside the run")
        active = api(server.url, "live")["runs"]["in_progress"]
        row = next(r for r in active if r["id"] == run.id)
        assert row["session_id"] == "sess-json" and row["scopes"] == ["conversation:talk"]
        raise RuntimeError("the agent gave up")
    runs = api(server.url, "live")["runs"]
    done = next(r for r in runs["finished"] if r["id"] == run.id)
    assert done["status"] == "rolled_back" and "gave up" in done["reason"]
    assert done["rolled_back_scopes"] == ["conversation:talk"] and runs["outcomes"]["rolled_back"] >= 1
    assert run.id not in [r["id"] for r in runs["in_progress"]]


def test_live_shows_supervision_events(live: tuple[GlobalStateManager, Any]) -> None:
    manager, server = live
    talk = manager.get_conversation_state("talk")
    inject_fault(manager, talk.ref, RuntimeError("injected for the inspector"))
    with pytest.raises(ScopeFailedError):
        talk.set("x", 1)
    manager.quiesce()  # the supervision events are delivered
    recent = api(server.url, "live")["supervision"]["recent"]
    kinds = [e["kind"] for e in recent if e["ref"] == "conversation:talk"]
    assert "failed" in kinds and "restarted" in kinds
    assert any("injected for the inspector" in e["reason"] for e in recent)
    assert [e["seq"] for e in recent] == sorted(e["seq"] for e in recent)


def test_live_mode_over_a_manager_in_memory() -> None:
    with GlobalStateManager.open() as manager, serve_manager(manager, port=0) as server:
        manager.get_team_state("ops").set("k", 1)
        rows = api(server.url, "scopes", parent="global:global")["items"]
        assert [(r["ref"], r["version"], r["size"]) for r in rows] == [("team:ops", 1, None)]
        assert api(server.url, "state", ref="team:ops")["state"] == [{"key": "k", "value": 1}]
        for path in ("history?ref=team:ops", "state?ref=team:ops&version=0", "checkpoints?ref=team:ops"):
            status, _head, body = fetch(server.url + "api/" + path)
            assert status == 404 and body["error"]["code"] == "no_store", path
        assert fetch(server.url + "api/info", method="POST")[0] == 405
    with pytest.raises(OSError):
        _OPENER.open(server.url + "api/info", timeout=5)  # closed: nothing listens any more


# -- the page, in a real browser ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.path.exists(p)]
    if missing:
        pytest.fail(
            f"the browser tests need Debian's chromium and chromium-driver ({', '.join(missing)} missing): "
            "bash scripts/install_browser.sh (README's test command runs it first) installs them"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-proxy-server",
        "--window-size=1500,1250",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)  # no Selenium Manager
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    where = tmp_path_factory.mktemp("screenshots")

    def shoot(driver: Any, name: str) -> Path:
        """The whole page (up to 2,400 px tall), saved as ``name``."""
        path = where / name
        size = driver.get_window_size()
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(
            size["width"],
            min(2400, height + size["height"] - driver.execute_script("return window.innerHeight")),
        )
        try:
            assert driver.save_screenshot(str(path)) and path.stat().st_size > 10_000
        finally:
            driver.set_window_size(size["width"], size["height"])
        extra = os.environ.get("VICTOR_ACTORS_SCREENSHOTS")
        if extra and os.path.isdir(extra):
            shutil.copy(path, os.path.join(extra, name))
        return path

    return shoot


def until(driver: Any, condition: Callable[[Any], Any], what: str, timeout: float = 10.0) -> Any:
    """Wait (explicitly, polling the DOM) until ``condition(driver)`` is truthy; return it."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(
        driver, timeout, poll_frequency=0.05, ignored_exceptions=[StaleElementReferenceException]
    )
    return wait.until(condition, message=f"waited {timeout} s for {what}")


def click(driver: Any, selector: str, what: str) -> None:
    """Find and click in one step, again if the element was re-rendered in between (the live
    panel redraws its tables on every event: a clicked row may be stale by the time it is used)."""
    from selenium.webdriver.common.by import By

    until(driver, lambda d: d.find_element(By.CSS_SELECTOR, selector).click() or True, f"to click {what}")


def rows(driver: Any, selector: str, attribute: str) -> list[str]:
    script = (
        "return Array.from(document.querySelectorAll(arguments[0])).map(e => e.getAttribute(arguments[1]))"
    )
    result: list[str] = driver.execute_script(script, selector, attribute)
    return result


def texts(driver: Any, selector: str) -> list[str]:
    script = "return Array.from(document.querySelectorAll(arguments[0])).map(e => e.textContent)"
    result: list[str] = driver.execute_script(script, selector)
    return result


def open_page(driver: Any, url: str) -> None:
    driver.get(url)
    until(driver, lambda d: d.execute_script("return document.body.dataset.ready") == "1", "the page to load")


def test_browser_tree_follow_diff_conversation_search(
    browser: Any, store_url: str, sim_store: dict[str, Any], shots: Callable[..., Path]
) -> None:
    from selenium.webdriver.common.by import By

    d = browser
    open_page(d, store_url)
    # the tree: every scope, with its version
    expected = sim_store["versions"]
    until(d, lambda d: set(rows(d, "#tree .scope-row", "data-ref")) == set(expected), "the whole tree")
    for ref, version in expected.items():
        cell = d.find_element(By.CSS_SELECTOR, f'#tree .scope-row[data-ref="{ref}"] .version')
        assert cell.text == str(version), ref
    depth = {
        r: int(x)
        for r, x in zip(
            rows(d, "#tree .scope-row", "data-ref"), rows(d, "#tree .scope-row", "data-depth"), strict=True
        )
    }
    assert depth["global:global"] == 0 and depth["team:t0"] == 1 and depth[DEMO] == 2
    assert depth["conversation:t0w0a0"] == 3

    # follow a scope: its history, one row per commit, newest first
    d.find_element(By.CSS_SELECTOR, f'#tree .scope-row[data-ref="{DEMO}"] a.scope-link').click()
    versions = [str(v) for v in range(expected[DEMO], 0, -1)]
    until(d, lambda d: rows(d, "#history tr.commit", "data-version") == versions, "the history of the demo")
    assert d.find_element(By.ID, "scope-title").text == DEMO
    v3 = d.find_element(By.CSS_SELECTOR, '#history tr.commit[data-version="3"]')
    assert v3.find_element(By.CSS_SELECTOR, ".keys").text == "blob, draft, scratch"
    assert "update_state x2" in v3.find_element(By.CSS_SELECTOR, ".transitions").text

    # its messages, as a conversation
    until(d, lambda d: len(texts(d, "#conversation .message")) == 4, "the conversation")
    assert texts(d, "#conversation .message.role-user .content") == ["draft the intro", "shorter, please"]
    assert texts(d, "#conversation .message.role-assistant .content") == ["here is a first draft", "done"]

    # two versions compared, side by side
    d.find_element(By.CSS_SELECTOR, '#history tr.commit[data-version="1"] input[name="a"]').click()
    d.find_element(By.CSS_SELECTOR, '#history tr.commit[data-version="4"] input[name="b"]').click()
    d.find_element(By.ID, "compare").click()
    until(d, lambda d: d.find_element(By.ID, "diff-title").text == "Diff v1 -> v4", "the diff")
    changed = until(
        d, lambda d: d.find_element(By.CSS_SELECTOR, '#diff tr.diff-row.changed[data-key="draft"]'), "draft"
    )
    assert [c.text for c in changed.find_elements(By.CSS_SELECTOR, "td.value")] == ['"v1"', '"v2"']
    assert d.find_element(By.CSS_SELECTOR, '#diff tr.diff-row.added[data-key="blob"]').text.endswith(
        '{"$bytes":"AAH/"}'
    )
    assert d.find_element(By.CSS_SELECTOR, '#diff tr.diff-row.removed[data-key="scratch"]')
    assert texts(d, "#diff .added-messages .message .content") == [
        "here is a first draft",
        "shorter, please",
        "done",
    ]
    assert "a=1" in d.current_url and "b=4" in d.current_url
    shots(d, "inspector.png")

    # an older version, by its link
    d.find_element(By.CSS_SELECTOR, '#history tr.commit[data-version="1"] a.version-link').click()
    until(d, lambda d: d.find_element(By.ID, "version-title").text == "State at v1", "the state at v1")
    until(
        d, lambda d: texts(d, "#conversation .message .content") == ["draft the intro"], "v1's conversation"
    )

    # search by id prefix, then by level
    box = d.find_element(By.ID, "search")
    box.send_keys("t0w1")
    wanted = sorted(r for r in expected if r.split(":", 1)[1].startswith("t0w1"))
    until(d, lambda d: sorted(rows(d, "#tree .scope-row", "data-ref")) == wanted, "the search results")
    d.find_element(By.CSS_SELECTOR, '#level option[value="conversation"]').click()
    wanted = [r for r in wanted if r.startswith("conversation:")]
    until(d, lambda d: sorted(rows(d, "#tree .scope-row", "data-ref")) == wanted, "conversations only")
    box.clear()
    box.send_keys("nobody-has-this-id")
    until(d, lambda d: texts(d, "#tree tr.empty") == ["no scope matches"], "no match")


def test_browser_live_counter_moves_while_commits_run(
    browser: Any, live: tuple[GlobalStateManager, Any], shots: Callable[..., Path]
) -> None:
    from selenium.webdriver.common.by import By

    manager, server = live
    d = browser
    open_page(d, server.url)
    assert d.find_element(By.ID, "mode").text == "live"

    def counter(driver: Any) -> int | None:
        text = driver.find_element(By.ID, "live-commits").text
        return int(text) if text.isdigit() else None

    until(d, lambda d: counter(d) is not None, "the first live event")
    before = counter(d)
    assert before is not None

    def version_shown(driver: Any) -> int:
        cell = '#tree .scope-row[data-ref="conversation:talk"] .version'
        return int(driver.find_element(By.CSS_SELECTOR, cell).text)

    shown = until(d, version_shown, "the tree")
    assert shown == manager.scope("conversation:talk").version
    # the scope open in the pane beside the tree
    click(d, '#tree .scope-row[data-ref="conversation:talk"] a.scope-link', "the conversation in the tree")
    until(d, lambda d: pane_version(d) == shown, "the scope pane")
    talk = manager.get_conversation_state("talk")
    stop = threading.Event()

    def work() -> None:
        i = 0
        while not stop.is_set():
            talk.set("tick", i)
            i += 1

    writer = threading.Thread(target=work, daemon=True)
    writer.start()
    try:
        until(d, lambda d: (counter(d) or 0) > before, "the commit counter to move")
        until(d, lambda d: float(d.find_element(By.ID, "live-rate").text or 0) > 0, "a commit rate")
        until(d, lambda d: version_shown(d) > shown, "the tree to follow the commits")
    finally:
        stop.set()
        writer.join(10)

    # Regression (issue 29, item 8): the pane stayed at the version it was opened at while the
    # tree moved on (v47 beside v79). It follows now: its version, its newest history row, its
    # state. This failed before the fix.
    final = talk.version
    until(d, lambda d: version_shown(d) == final, "the tree at the last commit", timeout=15)
    until(d, lambda d: pane_version(d) == final, "the pane to follow the commits", timeout=15)
    until(d, lambda d: rows(d, "#history tr.commit", "data-version")[0] == str(final), "the history")
    history = [int(v) for v in rows(d, "#history tr.commit", "data-version")]
    assert history == sorted(set(history), reverse=True)  # new rows on top, none twice
    until(d, lambda d: d.find_element(By.ID, "version-title").text == f"State at v{final} (current)", "state")

    # a run in progress shows, then its rollback
    with pytest.raises(RunFailedError), manager.run("sess-page", timeout=30) as run:
        talk.set("draft", "inside the run")
        until(d, lambda d: run.id in rows(d, "#runs-active tr.run-row", "data-run"), "the run in progress")
        assert d.find_element(By.ID, "live-runs").text == "1"
        raise RuntimeError("rolled back on purpose")
    until(d, lambda d: run.id in rows(d, "#runs-finished tr.run-row.rolled_back", "data-run"), "the rollback")
    assert run.id not in rows(d, "#runs-active tr.run-row", "data-run")
    shots(d, "inspector-live.png")

    # Regression (issue 29, item 8): a run's row named its scopes as text; each is now a link to
    # the run's commits in that scope (its write and its rollback). This failed before the fix.
    store = manager.store
    assert store is not None
    ours = [v for v in store.log_versions(talk.ref) if store.commit_record(talk.ref, v).run_id == run.id]
    assert len(ours) == 2  # the write, then its rollback
    click(
        d,
        f'#runs-finished tr.run-row[data-run="{run.id}"] a.run-scope[data-ref="conversation:talk"]',
        "the run's scope link",
    )
    wanted = [str(v) for v in reversed(ours)]
    until(d, lambda d: rows(d, "#history tr.commit", "data-version") == wanted, "the run's commits")
    assert texts(d, "#history tr.commit .kind") == ["rollback", "batch"]
    assert texts(d, "#history tr.commit .run") == [run.id, run.id]
    assert run.id in d.find_element(By.ID, "history-count").text
    click(d, "#history-count a.all-commits", "every commit")
    until(d, lambda d: len(rows(d, "#history tr.commit", "data-version")) > 2, "every commit again")


def pane_version(driver: Any) -> int | None:
    """The version in the scope pane's summary (None before a scope is shown)."""
    script = (
        "const dt = Array.from(document.querySelectorAll('#scope-summary dt'))"
        ".find(e => e.textContent === 'version');"
        "return dt ? dt.nextElementSibling.textContent : null;"
    )
    found = driver.execute_script(script)
    return int(found) if found else None


def test_browser_live_panel_keeps_the_tree_in_view_after_many_runs(
    browser: Any, shots: Callable[..., Path]
) -> None:
    """Regression (issue 29, item 8): with 50 finished runs and 50 supervision events the live
    panel grew to about 2,100 px and pushed the scope tree out of the window. Its tables now
    scroll inside it. This failed before the fix."""
    from selenium.webdriver.common.by import By

    d = browser
    with GlobalStateManager.open() as manager, serve_manager(manager, port=0) as server:
        conv = manager.get_conversation_state("busy", team_id="crew")
        conv.set("k", 0)
        open_page(d, server.url)
        top_before = d.execute_script(
            "return document.getElementById('tree-pane').getBoundingClientRect().top"
        )
        for i in range(55):
            with pytest.raises(RunFailedError), manager.run(f"sess-{i}", timeout=30):
                conv.set("k", i + 1)
                api(server.url, "live")  # the live feed sees this run in progress
                raise RuntimeError("rolled back on purpose")
        for _ in range(25):
            inject_fault(manager, conv.ref, RuntimeError("injected"))
            with pytest.raises(ScopeFailedError):
                conv.set("x", 1)
        manager.quiesce()
        until(d, lambda d: len(rows(d, "#runs-finished tr.run-row", "data-run")) == 50, "50 finished runs")
        until(d, lambda d: len(rows(d, "#supervision tr.event", "data-seq")) == 50, "50 supervision events")
        top = d.execute_script("return document.getElementById('tree-pane').getBoundingClientRect().top")
        height = d.find_element(By.ID, "live").size["height"]
        assert top < top_before + 400 and top < 700, (top_before, top)
        assert height < 500, height
        # newest first, in view (the live panel re-renders its tables: read the row afresh each poll)
        until(
            d,
            lambda d: (e := d.find_element(By.CSS_SELECTOR, "#runs-finished tr.run-row")).is_displayed()
            and e.get_attribute("data-run").startswith("sess-54:"),
            "the newest run in view",
        )
        shots(d, "inspector-live-many-runs.png")


def test_browser_live_page_says_when_its_program_is_gone(browser: Any) -> None:
    """Regression (issue 29, item 8): once the program serving the live page exited, the page
    said "reconnecting" and any click showed a raw "Failed to fetch". It now says that the
    program has probably stopped and that the page shows what it last read. This failed before
    the fix."""
    from selenium.webdriver.common.by import By

    d = browser
    manager = GlobalStateManager.open()
    server = serve_manager(manager, port=0)
    try:
        manager.get_conversation_state("bye").set("k", 1)
        open_page(d, server.url)
        until(d, lambda d: d.find_element(By.ID, "live-status").text == "live", "the live stream")
    finally:
        server.close()  # as when the program exits: nothing answers at that address any more
        manager.close()
    until(d, lambda d: "disconnected" in d.find_element(By.ID, "live-status").text, "the disconnection")
    assert "probably stopped" in d.find_element(By.ID, "live-status").text
    d.find_element(By.ID, "refresh").click()  # a request to a server that is gone
    box = until(
        d,
        lambda d: d.find_element(By.ID, "error") if d.find_element(By.ID, "error").is_displayed() else None,
        "the error",
    )
    assert "does not answer" in box.text and "probably stopped" in box.text, box.text
    assert "Failed to fetch" not in box.text


def test_manager_serve_starts_the_live_inspector_over_a_running_manager() -> None:
    with GlobalStateManager.open() as manager:
        manager.get_conversation_state("c").set("k", 1)
        with manager.serve(port=0) as server:
            with urllib.request.urlopen(urllib.parse.urljoin(server.url, "api/info"), timeout=10) as response:
                info = json.loads(response.read())
            assert info["mode"] == "live"
            assert server.url.startswith("http://127.0.0.1:")
        assert manager.get_conversation_state("c").get("k") == 1  # closing the server leaves the manager
