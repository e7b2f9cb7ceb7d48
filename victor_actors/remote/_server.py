"""The owner's listeners: unix and TCP sockets in front of a :class:`Host`.

:func:`serve` starts listening on a thread of its own (an event loop named
``victor-actors-owner``) for a manager that already owns its store; the
returned :class:`OwnerServer` stops listening, drains the requests in
progress and closes its connections on :meth:`OwnerServer.close`. The
manager itself is closed by whoever opened it.

Each connection is one client process (or several: any number may connect).
Its first frame must be the handshake, within a few seconds; a wrong token
is answered with a typed error and the connection closed. After it, every
frame is a request, handled in a task of its own, so a long poll never
delays a write. Garbage (a frame that does not decode, an unknown
operation) gets a typed error for that request and nothing applied; a
frame declaring more than the limit closes that connection. Other clients
never notice.

A unix socket file left by an owner that died is taken over: before
binding, the path is probed; a socket nobody answers on is removed. One
that answers belongs to a live owner and is never touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import stat
import threading
from typing import Any

from victor_actors._errors import ScopeAccessError, StoreLockedError, VictorActorsError
from victor_actors._manager import GlobalStateManager
from victor_actors.remote import _wire as w
from victor_actors.remote._frames import (
    HANDSHAKE_TIMEOUT,
    MAX_FRAME,
    PROTOCOL,
    FrameTooLarge,
    check_token,
    parse_url,
    read_frame,
    write_frame,
)
from victor_actors.remote._host import Host

__all__ = ["OwnerServer", "serve"]

logger = logging.getLogger("victor_actors")


def _take_over(path: str) -> None:
    """Remove a stale socket file at ``path`` (nobody answers on it); refuse one in use."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise ScopeAccessError(f"{path!r} exists and is not a socket; the owner did not start")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    except OSError:
        pass  # a socket that does not answer in time: treat it as in use
    finally:
        probe.close()
    raise StoreLockedError(f"another owner listens on {path!r}; this one did not start")


class OwnerServer:
    """Listening sockets serving one manager's scopes; :meth:`close` stops them."""

    def __init__(
        self,
        manager: GlobalStateManager,
        urls: list[str],
        *,
        token: bytes | None = None,
        max_frame: int = MAX_FRAME,
    ) -> None:
        self.manager = manager
        self.endpoints = [parse_url(u) for u in urls]
        for e in self.endpoints:
            if e.scheme == "tcp" and token is None and not e.loopback:
                raise ScopeAccessError(
                    f"{e.url} listens beyond this machine: give a token (token_file / --token-file); "
                    "the owner did not start"
                )
        self.token = token
        self.max_frame = max_frame
        self.host = Host(manager)
        self.closed = False
        self._servers: list[asyncio.base_events.Server] = []
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self.urls: list[str] = []

    # -- life ------------------------------------------------------------------------

    def start(self) -> OwnerServer:
        started = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            try:
                self._loop.run_until_complete(self._listen())
            except BaseException as exc:
                failure.append(exc)
                started.set()
                return
            started.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="victor-actors-owner", daemon=True)
        self._thread.start()
        started.wait()
        if failure:
            self._thread.join(timeout=5)
            self._loop.close()
            raise failure[0]
        return self

    async def _listen(self) -> None:
        for e in self.endpoints:
            if e.scheme == "unix":
                _take_over(e.path)
                old = os.umask(0o077)  # the socket is the owner's user's alone unless a token says more
                try:
                    server = await asyncio.start_unix_server(self._serve, path=e.path, limit=1 << 20)
                finally:
                    os.umask(old)
                self.urls.append(e.url)
            else:
                server = await asyncio.start_server(self._serve, e.host, e.port, limit=1 << 20)
                port = server.sockets[0].getsockname()[1]
                self.urls.append(f"tcp://{e.host}:{port}")
            self._servers.append(server)

    def close(self, drain: float = 10.0) -> None:
        """Stop accepting, let the requests in progress finish (up to ``drain`` s), close. Idempotent."""
        if self.closed or self._thread is None:
            self.closed = True
            return
        self.closed = True
        future = asyncio.run_coroutine_threadsafe(self._stop(drain), self._loop)
        with contextlib.suppress(Exception):
            future.result(drain + 5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        with contextlib.suppress(Exception):
            self._loop.close()

    async def _stop(self, drain: float) -> None:
        for server in self._servers:
            server.close()
        for e in self.endpoints:
            if e.scheme == "unix":
                with contextlib.suppress(OSError):
                    os.unlink(e.path)
        requests = [t for t in self._tasks if getattr(t, "victor_request", False)]
        if requests:
            await asyncio.wait(requests, timeout=drain)
        for writer in list(self._writers):
            writer.close()
        await self.host.aclose()
        for task in list(self._tasks):
            task.cancel()

    # -- connections ----------------------------------------------------------------------

    def _spawn(self, coro: Any, *, request: bool) -> None:
        task = self._loop.create_task(coro)
        task.victor_request = request  # type: ignore[attr-defined]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.closed:
            writer.close()
            return
        self._writers.add(writer)
        try:
            if not await self._handshake(reader, writer):
                return
            while not self.closed:
                try:
                    rid, payload = await read_frame(reader, self.max_frame)
                except FrameTooLarge as exc:
                    write_frame(writer, exc.rid, w.encode({"r": (), "e": w.error_to(exc)}))
                    await writer.drain()
                    return
                self._spawn(self._request(writer, rid, payload), request=True)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            return  # the client went away (mid-frame or between frames): nothing to answer
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        try:
            rid, payload = await asyncio.wait_for(read_frame(reader, 1 << 16), HANDSHAKE_TIMEOUT)
            hello = w.decode(payload)
        except (TimeoutError, FrameTooLarge, VictorActorsError):
            return False
        if hello.get("hello") != PROTOCOL:
            err: VictorActorsError = ScopeAccessError(
                f"the client speaks protocol {hello.get('hello')!r:.40}, this owner {PROTOCOL}; "
                "upgrade one of them"
            )
        elif not check_token(self.token, hello.get("token")):
            err = ScopeAccessError(
                "the owner refused the connection: wrong or missing token; nothing was applied"
            )
        else:
            info = await self.host.call(w.encode({"ops": ({"k": "info"},)}))
            _ok, value = w.decode(info)["r"][0]
            write_frame(writer, rid, w.encode({"ok": True, **value}))
            await writer.drain()
            return True
        write_frame(writer, rid, w.encode({"e": w.error_to(err)}))
        await writer.drain()
        return False

    async def _request(self, writer: asyncio.StreamWriter, rid: int, payload: bytes) -> None:
        reply = await self.host.call(payload)
        if writer.is_closing():
            return
        try:
            write_frame(writer, rid, reply)
            await writer.drain()
        except (ConnectionError, OSError):
            pass  # the client went away; a write it sent is in the store, and its retry finds it


def serve(
    manager: GlobalStateManager,
    url: str | list[str],
    *,
    token: bytes | None = None,
    max_frame: int = MAX_FRAME,
) -> OwnerServer:
    """Serve ``manager``'s scopes to other processes at ``url`` (or several); return the server.

    The manager must own its store (not read-only) or be in memory.

    Raises:
        StoreLockedError: another owner listens on the socket path.
        ScopeAccessError: a TCP address beyond this machine without a token.
        TransitionValidationError: a URL that is not unix://PATH or tcp://HOST:PORT.
    """
    urls = [url] if isinstance(url, str) else list(url)
    return OwnerServer(manager, urls, token=token, max_frame=max_frame).start()
