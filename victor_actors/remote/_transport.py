"""How a client reaches an owner: the transport seam, and the socket transport (unix and TCP).

A transport has one job: carry a request's bytes to the owner and bring its
reply back (``await transport.call(payload)``), raising :class:`Unreachable`
when the owner cannot be reached or the connection dropped before the reply
came, so the client can tell "not answered" from "refused". Everything else
(coalescing, retries, deadlines, runs, events) is the client's, the same for
every transport; the Ray shards are reached through the same seam.

:class:`SocketTransport` keeps one connection per client process and
multiplexes requests over it by request id. A dropped connection fails the
requests in flight with :class:`Unreachable` and is opened again on the next
call; a new owner instance (a restart) is noted in ``instance`` so the
client can register its tools again.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from typing import Any, Protocol

from victor_actors._errors import VictorActorsError
from victor_actors.remote import _wire as w
from victor_actors.remote._frames import (
    HANDSHAKE_TIMEOUT,
    MAX_FRAME,
    PROTOCOL,
    FrameTooLarge,
    parse_url,
    read_frame,
    write_frame,
)

__all__ = ["SocketTransport", "Transport", "Unreachable"]


class Unreachable(Exception):
    """The owner could not be reached, or the connection dropped before the reply.

    ``sent``: whether the request's bytes may have reached the owner (False:
    it certainly was not applied).
    """

    def __init__(self, message: str, *, sent: bool = True) -> None:
        super().__init__(message)
        self.sent = sent


class Transport(Protocol):
    """What the client needs of a way to reach one owner."""

    where: str  # names the owner in errors: a URL, "shard 1"
    unreachable: tuple[type[BaseException], ...]  # what ``call`` raises when nobody answered

    async def call(self, payload: bytes) -> bytes: ...

    async def aclose(self) -> None: ...


class _Connection:
    __slots__ = ("pending", "reader", "task", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.pending: dict[int, asyncio.Future[bytes]] = {}
        self.task: asyncio.Task[None] | None = None


class SocketTransport:
    """One owner over a unix or TCP socket (see the module's documentation)."""

    unreachable: tuple[type[BaseException], ...] = (Unreachable,)

    def __init__(
        self, url: str, *, token: bytes | None, client_id: str, connect_timeout: float = 5.0
    ) -> None:
        self.endpoint = parse_url(url)
        self.where = url
        self.token = token
        self.client_id = client_id
        self.connect_timeout = connect_timeout
        self.instance: str | None = None  # the owner instance of the current connection
        self.owner_pid: int | None = None
        self.info: dict[str, Any] = {}
        self.connects = 0
        self._conn: _Connection | None = None
        self._lock: asyncio.Lock | None = None
        self._ids = itertools.count(1)
        self._closed = False

    async def _connection(self) -> _Connection:
        conn = self._conn
        if conn is not None:
            return conn
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._conn is not None:
                return self._conn
            if self._closed:
                raise Unreachable("the client was closed", sent=False)
            self._conn = await self._open()
            return self._conn

    async def _open(self) -> _Connection:
        e = self.endpoint
        try:
            if e.scheme == "unix":
                opening = asyncio.open_unix_connection(e.path, limit=1 << 20)
            else:
                opening = asyncio.open_connection(e.host, e.port, limit=1 << 20)
            reader, writer = await asyncio.wait_for(opening, self.connect_timeout)
        except (OSError, TimeoutError) as exc:
            raise Unreachable(
                f"no owner answers at {self.where} ({type(exc).__name__}: {exc})", sent=False
            ) from None
        try:
            hello = {"hello": PROTOCOL, "token": self.token, "pid": os.getpid(), "client": self.client_id}
            write_frame(writer, 0, w.encode(hello))
            await writer.drain()
            _rid, raw = await asyncio.wait_for(read_frame(reader, 1 << 20), HANDSHAKE_TIMEOUT)
            reply = w.decode(raw)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, FrameTooLarge, VictorActorsError) as exc:
            writer.close()
            raise Unreachable(
                f"the owner at {self.where} did not complete the handshake ({exc!r})", sent=False
            ) from None
        if "e" in reply:
            writer.close()
            raise w.error_from(reply["e"], self.where)  # a typed refusal (a wrong token): not retried
        self.info = dict(reply)
        self.instance = str(reply.get("instance"))
        pid = reply.get("pid")
        self.owner_pid = pid if isinstance(pid, int) else None
        self.connects += 1
        conn = _Connection(reader, writer)
        conn.task = asyncio.get_running_loop().create_task(self._read(conn))
        return conn

    async def _read(self, conn: _Connection) -> None:
        why = "the owner closed the connection"
        try:
            while True:
                rid, payload = await read_frame(conn.reader, MAX_FRAME)
                future = conn.pending.pop(rid, None)
                if future is not None and not future.done():
                    future.set_result(payload)
        except FrameTooLarge as exc:
            why = str(exc)
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as exc:
            why = f"the connection to the owner dropped ({type(exc).__name__})"
        finally:
            self._drop(conn, why)

    def _drop(self, conn: _Connection, why: str) -> None:
        if self._conn is conn:
            self._conn = None
        conn.writer.close()
        pending, conn.pending = conn.pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(Unreachable(f"{why} at {self.where}"))

    async def call(self, payload: bytes) -> bytes:
        conn = await self._connection()
        rid = next(self._ids)
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        conn.pending[rid] = future
        try:
            write_frame(conn.writer, rid, payload)
            await conn.writer.drain()
        except (ConnectionError, OSError) as exc:
            self._drop(conn, f"writing to the owner failed ({type(exc).__name__})")
            raise Unreachable(f"the connection to {self.where} dropped") from None
        try:
            return await future
        finally:
            conn.pending.pop(rid, None)

    async def aclose(self) -> None:
        self._closed = True
        conn = self._conn
        if conn is not None:
            self._drop(conn, "the client was closed")
            if conn.task is not None:
                conn.task.cancel()
