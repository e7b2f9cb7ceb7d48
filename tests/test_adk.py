"""victor_actors.adk: VictorActorsSessionService, Google ADK's ``BaseSessionService`` on scopes.

ADK keeps its shared session-service contract in its repository only (google/adk-python,
tests/unittests/sessions/_conformance.py: "every test that takes the ``session_service`` fixture
states a behavior all ``BaseSessionService`` implementations owe"; the tests are in
test_session_service.py), not in its published distributions, so it cannot be run from the
installed release. Part 1 restates each of those contract tests in our own words, one test here per
upstream test (its name in the docstring), with no divergence: each runs on a local manager and through
a client of an owner (another process's view) whose store is encrypted at rest. Part 2 is the issue's own
concurrency and rollback cases; part 3 drives ADK's own Runner against a scripted model. One owner
process for the module (tests/owner_process.py, an encrypted store) serves the worker processes
of part 2, a rollback and a Runner through its clients.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncGenerator, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.adk")  # the adk extra is in the test extra: CI always runs these

from google.adk.errors.already_exists_error import AlreadyExistsError  # noqa: E402
from google.adk.errors.session_not_found_error import SessionNotFoundError  # noqa: E402
from google.adk.events import Event, EventActions  # noqa: E402
from google.adk.sessions.base_session_service import GetSessionConfig  # noqa: E402
from google.adk.tools.tool_confirmation import ToolConfirmation  # noqa: E402
from google.genai import types  # noqa: E402
from owner_process import fork_clients, owner_process  # noqa: E402  (tests/owner_process.py)

import victor_actors  # noqa: E402
from victor_actors import GlobalStateManager, Keyring, RunFailedError, TransitionValidationError  # noqa: E402
from victor_actors.adk import VictorActorsSessionService  # noqa: E402

KEYS = Keyring({"k1": bytes(range(32))}, active="k1")


@pytest.fixture(scope="module")
def owner_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One owner process for the module, on an encrypted store (tests/owner_process.py)."""
    with owner_process(tmp_path_factory.mktemp("adk-owner")) as url:
        yield url


@pytest.fixture(params=["local", "remote"])
def manager(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A local manager, or a client of an owner whose store is encrypted at rest."""
    if request.param == "local":
        with GlobalStateManager.open(tmp_path / "store") as local:
            yield local
        return
    url = f"unix://{tmp_path}/owner.sock"
    with GlobalStateManager.open(tmp_path / "store", listen=url, encryption=KEYS), victor_actors.connect(url) as client:
        yield client


@pytest.fixture
def service(manager: Any) -> VictorActorsSessionService:
    return VictorActorsSessionService(manager)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def _delta(**state: Any) -> EventActions:
    return EventActions(state_delta=state)


def _ev(**kw: Any) -> Event:
    return Event(invocation_id=kw.pop("invocation_id", "inv"), author=kw.pop("author", "user"), **kw)


# -- 1. ADK's shared contract, in our words ------------------------------------------------------


def test_an_unknown_session_reads_as_none(service: VictorActorsSessionService) -> None:
    """test_get_empty_session"""
    assert run(service.get_session(app_name="app", user_id="u", session_id="123")) is None


def test_create_then_get_then_delete(service: VictorActorsSessionService) -> None:
    """test_create_get_session"""

    async def go() -> None:
        made = await service.create_session(app_name="app", user_id="u", state={"key": "value"})
        assert (made.app_name, made.user_id, made.state) == ("app", "u", {"key": "value"}) and made.id
        assert made.last_update_time <= time.time()
        got = await service.get_session(app_name="app", user_id="u", session_id=made.id)
        assert got == made and got.last_update_time <= time.time()
        await service.delete_session(app_name="app", user_id="u", session_id=made.id)
        assert await service.get_session(app_name="app", user_id="u", session_id=made.id) is None

    run(go())


def test_created_sessions_are_listed_with_their_state(service: VictorActorsSessionService) -> None:
    """test_create_and_list_sessions"""

    async def go() -> None:
        ids = [f"session{i}" for i in range(5)]
        for sid in ids:
            await service.create_session(app_name="app", user_id="u", session_id=sid, state={"key": "v" + sid})
        listed = (await service.list_sessions(app_name="app", user_id="u")).sessions
        assert {s.id for s in listed} == set(ids)
        assert all(s.state == {"key": "v" + s.id} and s.events == [] for s in listed)

    run(go())


def test_sessions_are_listed_least_recently_updated_first(service: VictorActorsSessionService) -> None:
    """test_list_sessions_ordered_by_last_update_time"""

    async def go() -> None:
        for sid in ("a", "b", "c"):
            await service.create_session(app_name="app", user_id="u", session_id=sid)
        a = await service.get_session(app_name="app", user_id="u", session_id="a")
        await service.append_event(a, _ev(timestamp=time.time() + 1))
        listed = (await service.list_sessions(app_name="app", user_id="u")).sessions
        assert [s.id for s in listed] == ["b", "c", "a"]

    run(go())


def test_listing_without_a_user_lists_every_users_sessions(service: VictorActorsSessionService) -> None:
    """test_list_sessions_all_users"""

    async def go() -> None:
        for user, sid in (("u1", "s1a"), ("u1", "s1b"), ("u2", "s2a")):
            await service.create_session(app_name="app", user_id=user, session_id=sid, state={"key": sid})
        one = (await service.list_sessions(app_name="app", user_id="u1")).sessions
        assert {s.id: s.state for s in one} == {"s1a": {"key": "s1a"}, "s1b": {"key": "s1b"}}
        two = (await service.list_sessions(app_name="app", user_id="u2")).sessions
        assert [(s.id, s.state) for s in two] == [("s2a", {"key": "s2a"})]
        every = (await service.list_sessions(app_name="app")).sessions
        assert {s.id: s.user_id for s in every} == {"s1a": "u1", "s1b": "u1", "s2a": "u2"}

    run(go())


def test_app_state_is_seen_by_every_user_of_the_app(service: VictorActorsSessionService) -> None:
    """test_app_state_is_shared_by_all_users_of_app"""

    async def go() -> None:
        s1 = await service.create_session(app_name="app", user_id="u1", session_id="s1", state={"app:k1": "v1"})
        await service.append_event(s1, _ev(actions=_delta(**{"app:k2": "v2"})))
        s2 = await service.create_session(app_name="app", user_id="u2", session_id="s2")
        assert s2.state == {"app:k1": "v1", "app:k2": "v2"}
        again = await service.get_session(app_name="app", user_id="u1", session_id="s1")
        assert again.state["app:k1"] == "v1" and again.state["app:k2"] == "v2"

    run(go())


def test_user_state_is_seen_by_that_users_sessions_only(service: VictorActorsSessionService) -> None:
    """test_user_state_is_shared_only_by_user_sessions"""

    async def go() -> None:
        s1 = await service.create_session(app_name="app", user_id="u1", session_id="s1", state={"user:k1": "v1"})
        await service.append_event(s1, _ev(actions=_delta(**{"user:k2": "v2"})))
        s1b = await service.create_session(app_name="app", user_id="u1", session_id="s1b")
        assert s1b.state == {"user:k1": "v1", "user:k2": "v2"}
        assert (await service.create_session(app_name="app", user_id="u2", session_id="s2")).state == {}

    run(go())


def test_session_state_stays_in_its_session(service: VictorActorsSessionService) -> None:
    """test_session_state_is_not_shared"""

    async def go() -> None:
        s1 = await service.create_session(app_name="app", user_id="u1", session_id="s1", state={"sk1": "v1"})
        await service.append_event(s1, _ev(actions=_delta(sk2="v2")))
        got = await service.get_session(app_name="app", user_id="u1", session_id="s1")
        assert got.state["sk1"] == "v1" and got.state["sk2"] == "v2"
        assert (await service.create_session(app_name="app", user_id="u1", session_id="s1b")).state == {}

    run(go())


@pytest.mark.parametrize(
    ("initial", "delta", "key", "expected"),
    [
        ({"profile": {"name": "ada", "role": "admin"}}, {"profile": {"name": "bob"}}, "profile", {"name": "bob"}),
        ({"flag": True}, {"flag": None}, "flag", None),
        ({"app:cfg": {"name": "ada", "role": "x"}}, {"app:cfg": {"name": "bob"}}, "app:cfg", {"name": "bob"}),
        ({"user:pref": "dark"}, {"user:pref": None}, "user:pref", None),
    ],
)
def test_a_delta_value_replaces_the_stored_one_and_none_is_stored(
    service: VictorActorsSessionService, initial: dict[str, Any], delta: dict[str, Any], key: str, expected: Any
) -> None:
    """test_dict_valued_state_delta_replaces_stored_value, test_none_valued_state_delta_is_stored_not_dropped,
    test_app_state_dict_valued_delta_replaces_stored_value, test_user_state_none_valued_delta_is_stored_not_dropped"""

    async def go() -> None:
        s = await service.create_session(app_name="app", user_id="u1", session_id="s1", state=initial)
        await service.append_event(s, _ev(actions=EventActions(state_delta=dict(delta))))
        assert key in s.state and s.state[key] == expected
        # read back: by the same session, and (for app and user state) by another one
        got = await service.get_session(app_name="app", user_id="u1", session_id="s1")
        assert key in got.state and got.state[key] == expected
        if ":" in key:
            other = await service.create_session(app_name="app", user_id="u1", session_id="s1b")
            assert key in other.state and other.state[key] == expected

    run(go())


def test_a_stored_boolean_survives_an_unrelated_delta(service: VictorActorsSessionService) -> None:
    """test_boolean_state_survives_unrelated_state_delta"""

    async def go() -> None:
        s = await service.create_session(app_name="app", user_id="u1", session_id="s1", state={"flag": False})
        await service.append_event(s, _ev(actions=_delta(new_flag=True)))
        got = await service.get_session(app_name="app", user_id="u1", session_id="s1")
        for state in (s.state, got.state):
            assert state["flag"] is False and state["new_flag"] is True

    run(go())


def test_temp_state_is_visible_in_the_invocation_and_never_stored(service: VictorActorsSessionService) -> None:
    """test_temp_state_is_not_persisted_in_state_or_events, test_temp_state_visible_across_sequential_events"""

    async def go() -> None:
        s = await service.create_session(app_name="app", user_id="u1", session_id="s1")
        first = _ev(author="agent1", actions=_delta(**{"temp:out": "from a1", "sk": "v2"}))
        await service.append_event(s, first)
        assert s.state["temp:out"] == "from a1" and s.state["sk"] == "v2"  # the next agent reads it
        assert "temp:out" not in first.actions.state_delta and first.actions.state_delta["sk"] == "v2"
        got = await service.get_session(app_name="app", user_id="u1", session_id="s1")
        assert "temp:out" not in got.state
        assert "temp:out" not in got.events[0].actions.state_delta

    run(go())


def test_a_session_is_found_under_its_own_user_only(service: VictorActorsSessionService) -> None:
    """test_get_session_respects_user_id"""

    async def go() -> None:
        s1 = await service.create_session(app_name="app", user_id="u1", session_id="s1")
        await service.append_event(s1, _ev())
        await service.create_session(app_name="app", user_id="u2", session_id="s1")
        got = await service.get_session(app_name="app", user_id="u2", session_id="s1")
        assert got.user_id == "u2" and got.events == []

    run(go())


def test_creating_an_existing_id_raises(service: VictorActorsSessionService) -> None:
    """test_create_session_with_existing_id_raises_error"""

    async def go() -> None:
        await service.create_session(app_name="app", user_id="u", session_id="existing", state={"keep": 1})
        for same in ("existing", "  existing  "):
            with pytest.raises(AlreadyExistsError):
                await service.create_session(app_name="app", user_id="u", session_id=same, state={"keep": 2})
        got = await service.get_session(app_name="app", user_id="u", session_id="existing")
        assert got.state == {"keep": 1}

    run(go())


def test_a_padded_id_reaches_the_session_it_created(service: VictorActorsSessionService) -> None:
    """test_padded_session_id_reads_and_deletes"""

    async def go() -> None:
        made = await service.create_session(app_name="app", user_id="u", session_id="order-42\n", state={"cart": "book"})
        assert made.id == "order-42"
        got = await service.get_session(app_name="app", user_id="u", session_id="order-42\n")
        assert got.id == "order-42" and got.state["cart"] == "book"
        await service.delete_session(app_name="app", user_id="u", session_id="order-42\n")
        assert await service.get_session(app_name="app", user_id="u", session_id="order-42") is None
        blank = await service.create_session(app_name="app", user_id="u", session_id="   ")
        assert blank.id.strip() == blank.id and blank.id  # a blank id is no id: one is made

    run(go())


def test_events_round_trip_whole(service: VictorActorsSessionService) -> None:
    """test_append_event_bytes, test_append_event_complete, test_append_event_with_requested_tool_confirmations"""

    async def go() -> None:
        s = await service.create_session(app_name="app", user_id="u")
        image = types.Content(role="user", parts=[types.Part.from_bytes(data=b"png-bytes", mime_type="image/png")])
        grounding = types.GroundingMetadata(search_entry_point=types.SearchEntryPoint(sdk_blob=b"blob"))
        await service.append_event(s, _ev(content=image, grounding_metadata=grounding))
        full = _ev(
            content=types.Content(role="user", parts=[types.Part(text="text")]),
            turn_complete=True,
            partial=False,
            actions=EventActions(artifact_delta={"file": 0}, transfer_to_agent="agent", escalate=True),
            long_running_tool_ids={"tool1"},
            error_code="code",
            error_message="message",
            interrupted=True,
            usage_metadata=types.GenerateContentResponseUsageMetadata(
                prompt_token_count=1, candidates_token_count=1, total_token_count=2
            ),
            custom_metadata={"custom_key": "custom_value"},
            timestamp=1700000000.123,
            input_transcription=types.Transcription(text="in", finished=True),
        )
        await service.append_event(s, full)
        confirm = EventActions(
            requested_tool_confirmations={
                "call_1": ToolConfirmation(hint="hint", confirmed=False, payload={"resource_id": "album_1"})
            }
        )
        await service.append_event(s, _ev(actions=confirm))
        got = await service.get_session(app_name="app", user_id="u", session_id=s.id)
        assert got == s
        assert got.events[0].content == image and got.events[0].grounding_metadata == grounding
        tc = got.events[2].actions.requested_tool_confirmations["call_1"]
        assert (tc.hint, tc.confirmed, tc.payload) == ("hint", False, {"resource_id": "album_1"})

    run(go())


def test_last_update_time_is_the_appended_events_timestamp(service: VictorActorsSessionService) -> None:
    """test_session_last_update_time_updates_on_event"""

    async def go() -> None:
        s = await service.create_session(app_name="app", user_id="u")
        before = s.last_update_time
        await service.append_event(s, _ev(timestamp=before + 10))
        got = await service.get_session(app_name="app", user_id="u", session_id=s.id)
        assert s.last_update_time == pytest.approx(before + 10) == got.last_update_time > before

    run(go())


def test_get_session_filters_events_by_its_config(service: VictorActorsSessionService) -> None:
    """test_get_session_with_config"""

    async def go() -> None:
        base = float(int(time.time()))
        s = await service.create_session(app_name="app", user_id="u")
        for i in range(1, 6):
            await service.append_event(s, _ev(timestamp=base + i))

        async def times(config: GetSessionConfig | None) -> list[float]:
            got = await service.get_session(app_name="app", user_id="u", session_id=s.id, config=config)
            return [e.timestamp - base for e in got.events]

        assert await times(None) == [1, 2, 3, 4, 5]
        assert await times(GetSessionConfig(num_recent_events=0)) == []
        assert await times(GetSessionConfig(num_recent_events=3)) == [3, 4, 5]
        assert await times(GetSessionConfig(after_timestamp=base + 4)) == [4, 5]
        assert await times(GetSessionConfig(after_timestamp=base + 50)) == []
        assert await times(GetSessionConfig(after_timestamp=base + 4, num_recent_events=3)) == [4, 5]

    run(go())


def test_partial_events_are_not_stored(service: VictorActorsSessionService) -> None:
    """test_partial_events_are_not_persisted"""

    async def go() -> None:
        s = await service.create_session(app_name="app", user_id="u")
        await service.append_event(s, _ev(partial=True))
        got = await service.get_session(app_name="app", user_id="u", session_id=s.id)
        assert s.events == [] and got.events == []

    run(go())


def test_user_state_reads_without_a_session(service: VictorActorsSessionService) -> None:
    """test_get_user_state_returns_empty_dict_when_no_state_exists, ..._returns_state_written_via_append_event,
    ..._is_not_visible_across_users, ..._is_not_visible_across_apps, ..._available_before_session_is_created,
    ..._reflects_latest_write"""

    async def go() -> None:
        assert await service.get_user_state(app_name="app", user_id="u1") == {}
        s = await service.create_session(app_name="app", user_id="u1")
        await service.append_event(s, _ev(actions=_delta(**{"user:profile": {"name": "Alice"}, "session_key": 1})))
        await service.append_event(s, _ev(actions=_delta(**{"user:counter": 1})))
        await service.append_event(s, _ev(actions=_delta(**{"user:counter": 2})))
        assert await service.get_user_state(app_name="app", user_id="u1") == {"profile": {"name": "Alice"}, "counter": 2}
        assert await service.get_user_state(app_name="app", user_id="u2") == {}
        assert await service.get_user_state(app_name="other_app", user_id="u1") == {}

    run(go())


def test_event_timestamps_come_back_exactly(service: VictorActorsSessionService) -> None:
    """test_get_session_keeps_exact_epoch_across_a_repeated_local_hour (stored as the float itself)"""

    async def go() -> None:
        s = await service.create_session(app_name="app", user_id="u")
        for epoch in (1730613600.0, 1730615400.0):
            await service.append_event(s, _ev(timestamp=epoch))
        got = await service.get_session(app_name="app", user_id="u", session_id=s.id)
        assert [e.timestamp for e in got.events] == [1730613600.0, 1730615400.0]

    run(go())


# -- beyond the shared contract: what ADK's own backends also do, and our edges ---------------------------


def test_appending_to_a_missing_or_deleted_session_raises_and_writes_nothing(service: VictorActorsSessionService) -> None:
    """As ADK's in-memory, database and sqlite services do (SessionNotFoundError)."""

    async def go() -> None:
        s = await service.create_session(app_name="app", user_id="u", session_id="gone")
        await service.delete_session(app_name="app", user_id="u", session_id="gone")
        with pytest.raises(SessionNotFoundError):
            await service.append_event(s, _ev(actions=_delta(**{"app:leak": 1})))
        ghost = s.model_copy(update={"id": "never"})
        with pytest.raises(SessionNotFoundError):
            await service.append_event(ghost, _ev())
        fresh = await service.create_session(app_name="app", user_id="u", session_id="gone")
        assert fresh.state == {} and fresh.events == [] and "app:leak" not in fresh.state

    run(go())


def test_a_state_value_without_a_json_form_is_refused_and_nothing_is_written(
    service: VictorActorsSessionService,
) -> None:
    async def go() -> None:
        s = await service.create_session(app_name="app", user_id="u")
        with pytest.raises(TransitionValidationError):
            await service.append_event(s, _ev(actions=_delta(ok=1, callback=lambda: 1)))
        got = await service.get_session(app_name="app", user_id="u", session_id=s.id)
        assert got.events == [] and "ok" not in got.state and s.events == []

    run(go())


def test_several_apps_share_one_store(service: VictorActorsSessionService) -> None:
    async def go() -> None:
        for app in ("support", "sales"):
            await service.create_session(app_name=app, user_id="u", session_id="s", state={"app:name": app})
        for app in ("support", "sales"):
            got = await service.get_session(app_name=app, user_id="u", session_id="s")
            assert got.state == {"app:name": app}
        assert (await service.list_sessions(app_name="billing")).sessions == []

    run(go())


# -- 2. the concurrency and rollback cases ----------------------------------------------------


def _check_all_there(service: VictorActorsSessionService, sid: str, writers: int, per: int) -> None:
    async def check() -> None:
        got = await service.get_session(app_name="app", user_id="u", session_id=sid)
        assert len(got.events) == writers * per  # no lost event
        for w in range(writers):
            for i in range(per):
                tag = f"{w}-{i}"
                assert got.state[f"s{tag}"] == tag  # no lost session key
                assert got.state[f"user:u{tag}"] == tag and got.state[f"app:a{tag}"] == tag  # user and app keys
        newest = max(e.timestamp for e in got.events)
        assert got.last_update_time == newest

    run(check())


def test_fifty_threads_appending_to_one_session_and_its_user_and_app_state(tmp_path: Path) -> None:
    """50 threads, each appending events whose deltas write the session, the user and the app at once:
    no event or key is lost, and last_update_time, read all along by another thread, never goes back."""
    with GlobalStateManager.open(tmp_path) as m:
        service = VictorActorsSessionService(m)
        made = run(service.create_session(app_name="app", user_id="u", session_id="hot"))
        barrier = threading.Barrier(51)
        done = threading.Event()
        seen: list[float] = []

        def writer(w: int) -> None:
            async def go() -> None:
                session = made.model_copy(deep=True)  # each writer holds its own (soon stale) copy
                barrier.wait()
                for i in range(3):
                    tag = f"{w}-{i}"
                    delta = {f"s{tag}": tag, f"user:u{tag}": tag, f"app:a{tag}": tag}
                    await service.append_event(session, _ev(actions=EventActions(state_delta=delta)))

            run(go())

        def reader() -> None:
            async def go() -> None:
                barrier.wait()
                while not done.is_set():
                    got = await service.get_session(
                        app_name="app", user_id="u", session_id="hot", config=GetSessionConfig(num_recent_events=0)
                    )
                    seen.append(got.last_update_time)
                    time.sleep(0.002)  # pacing only: leave the writers the interpreter

            run(go())

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(50)]
        watcher = threading.Thread(target=reader)
        for t in [*threads, watcher]:
            t.start()
        for t in threads:
            t.join()
        done.set()
        watcher.join()
        assert seen and seen == sorted(seen)  # monotonic, as every reader saw it
        _check_all_there(service, "hot", 50, 3)


def _append_in_a_process(start: Any, url: str, w: int) -> None:
    async def go() -> None:
        with victor_actors.connect(url) as client:
            service = VictorActorsSessionService(client)
            session = await service.get_session(app_name="app", user_id="u", session_id="hot")
            start.wait()
            for i in range(3):
                tag = f"{w}-{i}"
                delta = {f"s{tag}": tag, f"user:u{tag}": tag, f"app:a{tag}": tag}
                await service.append_event(session, _ev(actions=EventActions(state_delta=delta)))

    run(go())


def test_processes_appending_to_one_session_and_its_user_and_app_state(owner_url: str) -> None:
    """Worker processes (each a client of the owner process, as ``uvicorn --workers`` would be) and
    this one append at once to one session, its user's and its app's state: nothing is lost.

    Four processes besides threads' fifty above: the issue's "20 processes or 50 threads"."""
    with victor_actors.connect(owner_url) as client:
        service = VictorActorsSessionService(client)
        run(service.create_session(app_name="app", user_id="u", session_id="hot"))
        fork_clients(_append_in_a_process, [(owner_url, w) for w in range(4)])
        _check_all_there(service, "hot", 4, 3)


def test_concurrent_first_creations_of_one_id_let_exactly_one_win(manager: Any) -> None:
    """ADK users report a race on first session creation: here one creator wins, every other one is told."""
    service = VictorActorsSessionService(manager)

    async def go() -> None:
        got = await asyncio.gather(
            *(
                service.create_session(app_name="app", user_id="new-user", session_id="first", state={"by": i})
                for i in range(20)
            ),
            return_exceptions=True,
        )
        made = [g for g in got if not isinstance(g, BaseException)]
        assert len(made) == 1 and all(isinstance(g, AlreadyExistsError) for g in got if g not in made)
        (listed,) = (await service.list_sessions(app_name="app")).sessions
        assert listed.state == made[0].state

    run(go())


@pytest.mark.parametrize("where", ["local", "owner process"])
def test_a_run_rolled_back_across_an_append_event(where: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """A run that appended an event writing session, user and app state, then failed: the rollback
    removes the event and restores every key in the three scopes."""
    opened = (
        GlobalStateManager.open(tmp_path)
        if where == "local"
        else victor_actors.connect(request.getfixturevalue("owner_url"))
    )
    with opened as m:
        service = VictorActorsSessionService(m)

        async def go() -> None:
            s = await service.create_session(app_name="rb", user_id="u", session_id="s", state={"k": "before"})
            await service.append_event(s, _ev(actions=_delta(**{"user:tier": "free", "app:flag": "off"})))
            before = await service.get_session(app_name="rb", user_id="u", session_id="s")
            with pytest.raises(RunFailedError) as info:
                async with m.arun("s", timeout=30):
                    delta = {"k": "during", "user:tier": "pro", "app:flag": "on", "new": 1}
                    await service.append_event(s, _ev(actions=EventActions(state_delta=delta)))
                    raise RuntimeError("the model call failed")
            assert len(info.value.rollback_report.scopes) == 3  # session, user and app scopes
            after = await service.get_session(app_name="rb", user_id="u", session_id="s")
            assert after.state == before.state and len(after.events) == 1
            assert after.last_update_time == before.last_update_time

        run(go())


# -- 3. ADK's own Runner --------------------------------------------------------------------------------


def test_adks_runner_on_our_service(service: VictorActorsSessionService) -> None:
    _drive_adks_runner(service)


def test_adks_runner_through_a_client_of_an_owner_process(owner_url: str) -> None:
    """The same, with the store encrypted and owned by another process."""
    with victor_actors.connect(owner_url) as client:
        _drive_adks_runner(VictorActorsSessionService(client))


def _drive_adks_runner(service: VictorActorsSessionService) -> None:
    from google.adk.agents import LlmAgent
    from google.adk.models.base_llm import BaseLlm
    from google.adk.models.llm_response import LlmResponse
    from google.adk.runners import Runner

    class Scripted(BaseLlm):
        """A model that answers each call with the next canned reply (no network)."""

        replies: list[str]

        async def generate_content_async(self, llm_request: Any, stream: bool = False) -> AsyncGenerator[LlmResponse, None]:
            text = self.replies.pop(0)
            yield LlmResponse(content=types.Content(role="model", parts=[types.Part(text=text)]))

    async def go() -> None:
        agent = LlmAgent(name="guide", model=Scripted(model="scripted", replies=["Paris.", "Lyon."]), output_key="last")
        runner = Runner(app_name="travel", agent=agent, session_service=service)
        s = await service.create_session(app_name="travel", user_id="u")
        for question in ("Capital of France?", "Second city?"):
            message = types.Content(role="user", parts=[types.Part(text=question)])
            async for _event in runner.run_async(user_id="u", session_id=s.id, new_message=message):
                pass
        got = await service.get_session(app_name="travel", user_id="u", session_id=s.id)
        texts = [e.content.parts[0].text for e in got.events if e.content]
        assert texts == ["Capital of France?", "Paris.", "Second city?", "Lyon."]
        assert got.state["last"] == "Lyon."

    run(go())
