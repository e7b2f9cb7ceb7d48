"""victor_actors.claude_agent: VictorActorsSessionStore, the Claude Agent SDK's ``SessionStore`` on scopes.

1. The SDK's own conformance suite (``claude_agent_sdk.testing.run_session_store_conformance``, from the
   installed package) with nothing skipped, on a local manager and through a client of an owner
   (another process's view) whose store is encrypted at rest.
2. The SDK's own ``query()`` loop, with a scripted stand-in for the Claude Code CLI as its transport,
   mirrors a conversation into the store; the SDK's store-backed readers read it back.
3. What the protocol's documentation asks beyond the suite: entries deduplicated by uuid, subagent
   transcripts as child scopes, delete and append again, concurrent appends (threads, and worker
   processes that are clients of one owner process for the module, tests/owner_process.py) losing
   nothing and folding the summary over every batch.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("claude_agent_sdk")  # the claude-agent extra is in the test extra: CI always runs these

from claude_agent_sdk import (  # noqa: E402
    ClaudeAgentOptions,
    ResultMessage,
    SessionStore,
    Transport,
    get_session_messages_from_store,
    list_sessions_from_store,
    project_key_for_directory,
    query,
)
from claude_agent_sdk.testing import run_session_store_conformance  # noqa: E402
from owner_process import fork_clients, owner_process  # noqa: E402  (tests/owner_process.py)

import victor_actors  # noqa: E402
from victor_actors import GlobalStateManager, Keyring, ScopeRef, TransitionValidationError  # noqa: E402
from victor_actors.claude_agent import VictorActorsSessionStore  # noqa: E402

KEYS = Keyring({"k1": bytes(range(32))}, active="k1")
OPTIONAL = ("list_sessions", "list_session_summaries", "delete", "list_subkeys")


class Managers:
    """Fresh managers on fresh stores, of one variant, all closed at the end."""

    def __init__(self, variant: str, root: Path) -> None:
        self.variant, self.root, self.opened = variant, root, []
        self.count = 0

    def new(self) -> Any:
        self.count += 1
        path = self.root / f"store-{self.count}"
        if self.variant == "remote":  # a client of an owner whose store is encrypted at rest
            url = f"unix://{self.root}/owner-{self.count}.sock"
            owner = GlobalStateManager.open(path, listen=url, encryption=KEYS)
            client = victor_actors.connect(url)
            self.opened += [client, owner]
            return client
        manager = GlobalStateManager.open(path)
        self.opened.append(manager)
        return manager

    def close(self) -> None:
        for m in self.opened:
            m.close()


@pytest.fixture(scope="module")
def owner_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One owner process for the module, on an encrypted store (tests/owner_process.py)."""
    with owner_process(tmp_path_factory.mktemp("claude-owner")) as url:
        yield url


@pytest.fixture(params=["local", "remote"])
def managers(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Managers]:
    made = Managers(request.param, tmp_path)
    try:
        yield made
    finally:
        made.close()


# -- 1. the SDK's conformance suite ----------------------------------------------------------------


def test_the_sdks_conformance_suite_passes_with_nothing_skipped(managers: Managers) -> None:
    store = VictorActorsSessionStore(managers.new())
    # the suite skips an optional method the store does not override: every one is overridden here
    for method in OPTIONAL:
        assert getattr(type(store), method) is not getattr(SessionStore, method), method
    asyncio.run(run_session_store_conformance(lambda: VictorActorsSessionStore(managers.new())))
    assert managers.count >= 15  # one fresh store per contract: the suite ran all 14


# -- 2. the SDK's own query loop --------------------------------------------------------------------


class ScriptedClaude(Transport):
    """A stand-in for the Claude Code CLI on the SDK's transport seam (no process, no network).

    It answers the SDK's control requests and replies to each prompt with a canned answer, after
    mirroring the two transcript lines (the prompt and the answer, chained by parentUuid) the way the
    CLI mirrors its JSONL transcript to a session store.
    """

    def __init__(self, config_dir: str, project: str, session_id: str, answers: list[str]) -> None:
        self.transcript = f"{config_dir}/projects/{project}/{session_id}.jsonl"
        self.session_id, self.answers = session_id, list(answers)
        self.last: str | None = None
        self.out: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()

    async def connect(self) -> None:
        return None

    def is_ready(self) -> bool:
        return True

    async def write(self, data: str) -> None:
        msg = json.loads(data)
        if msg["type"] == "control_request":
            reply = {"subtype": "success", "request_id": msg["request_id"], "response": {}}
            await self.out.put({"type": "control_response", "response": reply})
        elif msg["type"] == "user":
            answer = self.answers.pop(0)
            asked = {"type": "user", "uuid": str(uuid.uuid4()), "parentUuid": self.last,
                     "sessionId": self.session_id, "timestamp": "2026-01-01T00:00:00.000Z",
                     "message": {"role": "user", "content": msg["message"]["content"]}}  # fmt: skip
            said = {"type": "assistant", "uuid": str(uuid.uuid4()), "parentUuid": asked["uuid"],
                    "sessionId": self.session_id, "timestamp": "2026-01-01T00:00:01.000Z",
                    "message": {"role": "assistant", "content": [{"type": "text", "text": answer}]}}  # fmt: skip
            self.last = said["uuid"]
            await self.out.put({"type": "transcript_mirror", "filePath": self.transcript, "entries": [asked, said]})
            await self.out.put({"type": "assistant", "message": said["message"] | {"model": "scripted"}})
            await self.out.put({"type": "result", "subtype": "success", "duration_ms": 1, "duration_api_ms": 1,
                                "is_error": False, "num_turns": 1, "session_id": self.session_id})  # fmt: skip

    async def read_messages(self) -> AsyncIterator[dict[str, Any]]:
        while (msg := await self.out.get()) is not None:
            yield msg

    async def end_input(self) -> None:
        await self.out.put(None)

    async def close(self) -> None:
        await self.out.put(None)


def test_the_sdks_query_loop_mirrors_into_the_store_and_its_readers_read_it_back(managers: Managers) -> None:
    _drive_the_query_loop(VictorActorsSessionStore(managers.new()))


def test_the_sdks_query_loop_through_a_client_of_an_owner_process(owner_url: str) -> None:
    """The same, with the store encrypted and owned by another process."""
    with victor_actors.connect(owner_url) as client:
        _drive_the_query_loop(VictorActorsSessionStore(client))


def _drive_the_query_loop(store: VictorActorsSessionStore) -> None:
    workdir, config_dir = tempfile.mkdtemp(), tempfile.mkdtemp()
    sid = str(uuid.uuid4())

    async def go() -> None:
        options = ClaudeAgentOptions(session_store=store, cwd=workdir, env={"CLAUDE_CONFIG_DIR": config_dir})
        cli = ScriptedClaude(config_dir, project_key_for_directory(workdir), sid, ["Four."])
        results = [m async for m in query(prompt="What is 2 + 2?", options=options, transport=cli)]
        assert isinstance(results[-1], ResultMessage)
        (info,) = await list_sessions_from_store(store, directory=workdir)
        assert info.session_id == sid and info.first_prompt == "What is 2 + 2?"
        said = await get_session_messages_from_store(store, sid, directory=workdir)
        assert [m.type for m in said] == ["user", "assistant"]
        assert said[1].message["content"][0]["text"] == "Four."

    asyncio.run(go())


# -- 3. beyond the suite ---------------------------------------------------------------------------------


def _e(n: int, **more: Any) -> dict[str, Any]:
    return {"type": "x", "n": n, **more}


MAIN = {"project_key": "proj", "session_id": "sess"}
SUB = {**MAIN, "subpath": "subagents/agent-1"}


def test_a_batch_sent_again_is_not_stored_twice(tmp_path: Path) -> None:
    """The SDK retries a batch it is not sure landed: entries with a uuid already stored are skipped."""
    with GlobalStateManager.open(tmp_path) as m:
        store = VictorActorsSessionStore(m)

        async def go() -> None:
            batch = [_e(1, uuid="a"), _e(2), _e(3, uuid="b"), _e(4, uuid="a")]
            await store.append(MAIN, batch)  # type: ignore[arg-type]
            await store.append(MAIN, batch)  # type: ignore[arg-type]
            assert await store.load(MAIN) == [_e(1, uuid="a"), _e(2), _e(3, uuid="b"), _e(2)]  # type: ignore[arg-type]

        asyncio.run(go())


def test_subagent_transcripts_are_child_scopes_of_the_main_one(tmp_path: Path) -> None:
    with GlobalStateManager.open(tmp_path) as m:
        store = VictorActorsSessionStore(m)
        asyncio.run(store.append(SUB, [_e(1)]))  # type: ignore[arg-type]
        main = m.get_conversation_state("claude/proj/sess", create=False)
        assert main.parent == ScopeRef("team", "claude/proj")
        child = m.get_conversation_state("claude/proj/sess/subagents%2Fagent-1", create=False)
        assert child.parent == main.ref and "claude/proj/sess/subagents%2Fagent-1" in main.snapshot().sessions
        assert list(child.snapshot().messages) == [_e(1)]
        assert asyncio.run(store.load(MAIN)) is None  # type: ignore[arg-type]  # the main one was never written


def test_deleted_transcripts_start_afresh_and_their_scopes_are_emptied(tmp_path: Path) -> None:
    with GlobalStateManager.open(tmp_path) as m:
        store = VictorActorsSessionStore(m)

        async def go() -> None:
            await store.append(MAIN, [_e(1, uuid="a")])  # type: ignore[arg-type]
            await store.append(SUB, [_e(2, uuid="s")])  # type: ignore[arg-type]
            await store.delete(MAIN)  # type: ignore[arg-type]
            assert await store.load(SUB) is None  # type: ignore[arg-type]
            await store.append(MAIN, [_e(3, uuid="a")])  # the same uuid: a new history, so stored
            await store.append(SUB, [_e(4)])  # type: ignore[arg-type]
            assert await store.load(MAIN) == [_e(3, uuid="a")]  # type: ignore[arg-type]
            assert await store.load(SUB) == [_e(4)]  # type: ignore[arg-type]
            assert [s["session_id"] for s in await store.list_sessions("proj")] == ["sess"]
            (summary,) = await store.list_session_summaries("proj")
            assert summary["session_id"] == "sess"

        asyncio.run(go())


@pytest.mark.parametrize(
    ("key", "entries"),
    [
        ({"project_key": "", "session_id": "s"}, [_e(1)]),
        ({"project_key": "p", "session_id": "s", "subpath": ""}, [_e(1)]),
        ({"project_key": "p"}, [_e(1)]),
        (MAIN, [{"type": "x", "bad": object()}]),
        (MAIN, "not a list"),
    ],
)
def test_a_malformed_key_or_entry_is_refused_and_nothing_is_stored(
    tmp_path: Path, key: Any, entries: Any
) -> None:
    with GlobalStateManager.open(tmp_path) as m:
        store = VictorActorsSessionStore(m)
        with pytest.raises(TransitionValidationError):
            asyncio.run(store.append(key, entries))
        assert not any(ref.id.startswith("claude/") for ref in m.scopes())


def _check_concurrent(store: VictorActorsSessionStore, writers: int, batches: int) -> None:
    """Every writer's every batch is there once, whole, in the writer's order; then the closing batch
    (appended last, alone) set the title the summary holds, folded over everything before it."""

    async def check() -> None:
        await store.append(MAIN, _batch(writers, 0, True))  # type: ignore[arg-type]
        got = await store.load(MAIN)  # type: ignore[arg-type]
        assert got is not None
        seen = [(e["w"], e["b"], e["i"]) for e in got]
        assert len(seen) == (writers * batches + 1) * 2 and len(set(seen)) == len(seen)
        for i in range(0, len(seen), 2):  # each batch whole: its two entries next to each other
            assert seen[i][:2] == seen[i + 1][:2] and (seen[i][2], seen[i + 1][2]) == (0, 1)
        for w in range(writers):  # each writer's batches in its call order
            mine = [b for (ww, b, i) in seen if ww == w and i == 0]
            assert mine == sorted(mine)
        (summary,) = await store.list_session_summaries("proj")
        (listed,) = await store.list_sessions("proj")
        assert summary["mtime"] == listed["mtime"] and summary["data"]["custom_title"] == "last"

    asyncio.run(check())


def _batch(w: int, b: int, last: bool) -> list[dict[str, Any]]:
    title = "last" if last else f"w{w}b{b}"
    return [
        {"type": "x", "w": w, "b": b, "i": 0, "uuid": f"{w}-{b}-0"},
        {"type": "x", "w": w, "b": b, "i": 1, "customTitle": title},
    ]


def test_fifty_threads_appending_to_one_session_lose_nothing(tmp_path: Path) -> None:
    with GlobalStateManager.open(tmp_path) as m:
        store = VictorActorsSessionStore(m)
        barrier = threading.Barrier(50)

        def writer(w: int) -> None:
            async def run() -> None:
                barrier.wait()
                for b in range(3):
                    await store.append(MAIN, _batch(w, b, False))  # type: ignore[arg-type]

            asyncio.run(run())

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(50)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        _check_concurrent(store, 50, 3)


def _append_in_a_process(start: Any, url: str, w: int) -> None:
    async def run() -> None:
        with victor_actors.connect(url) as client:
            store = VictorActorsSessionStore(client)
            start.wait()
            for b in range(5):
                await store.append(MAIN, _batch(w, b, False))  # type: ignore[arg-type]

    asyncio.run(run())


def test_processes_appending_to_one_session_lose_nothing(owner_url: str) -> None:
    """Four worker processes, each a client of the owner process, append to one transcript at once."""
    fork_clients(_append_in_a_process, [(owner_url, w) for w in range(4)])
    with victor_actors.connect(owner_url) as client:
        _check_concurrent(VictorActorsSessionStore(client), 4, 5)
