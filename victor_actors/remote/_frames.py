"""Frames on a socket, addresses and tokens: what the unix and TCP transports share.

A connection carries frames: a 12-byte header (payload length, request id,
both big-endian) and a payload of framed msgpack (:mod:`._wire`). Request
ids let one connection carry many requests at once (a long poll beside a
write); a reply carries its request's id. The first frame each way is the
handshake: the client sends ``{"hello": PROTOCOL, "token": ..., "pid":
..., "client": ...}`` and the owner answers ``{"ok": True, "instance":
..., "pid": ...}`` or a typed error, then closes.

A frame declaring more than ``max_frame`` bytes is refused before a byte of
it is read: the peer gets a typed error for that request id and the
connection is closed (nothing else can be trusted on it after that).
"""

from __future__ import annotations

import asyncio
import hmac
import os
import struct
import urllib.parse

from victor_actors._errors import ScopeAccessError, TransitionValidationError, VictorActorsError

__all__ = [
    "HEADER",
    "MAX_FRAME",
    "PROTOCOL",
    "Endpoint",
    "FrameTooLarge",
    "check_token",
    "parse_url",
    "read_frame",
    "read_token",
    "write_frame",
]

PROTOCOL = 1
HEADER = struct.Struct(">IQ")  # payload length, request id
MAX_FRAME = 128 * 1024 * 1024  # the largest payload either side accepts (a record is at most 64 MiB)
HANDSHAKE_TIMEOUT = 10.0


class FrameTooLarge(VictorActorsError):
    """A frame declared more bytes than the receiver accepts; the connection is closed."""

    def __init__(self, rid: int, size: int, limit: int) -> None:
        super().__init__(
            f"a frame of {size} bytes exceeds the limit of {limit} bytes; nothing of it was read or "
            "applied, and the connection was closed"
        )
        self.rid = rid


class Endpoint:
    """Where an owner listens: ``unix:///path/to/socket`` or ``tcp://host:port``."""

    __slots__ = ("host", "path", "port", "scheme", "url")

    def __init__(self, scheme: str, url: str, *, path: str = "", host: str = "", port: int = 0) -> None:
        self.scheme = scheme
        self.url = url
        self.path = path
        self.host = host
        self.port = port

    def __repr__(self) -> str:
        return f"<Endpoint {self.url}>"

    @property
    def loopback(self) -> bool:
        return self.scheme == "unix" or self.host in ("127.0.0.1", "::1", "localhost")


def parse_url(url: str) -> Endpoint:
    """Parse an owner's URL.

    Raises:
        TransitionValidationError: not ``unix://PATH`` or ``tcp://HOST:PORT``.
    """
    if not isinstance(url, str) or not url:
        raise TransitionValidationError(
            f"an owner's URL is a str such as unix:///tmp/owner.sock, not {url!r}"
        )
    if url.startswith("unix://"):
        path = url[len("unix://") :]
        if not path:
            raise TransitionValidationError(f"{url!r} names no socket path (unix:///path/to/socket)")
        if len(os.fsencode(path)) > 107:
            raise TransitionValidationError(
                f"the socket path of {url!r} is longer than the 107 bytes a unix socket may have"
            )
        return Endpoint("unix", url, path=path)
    if url.startswith("tcp://"):
        parsed = urllib.parse.urlsplit(url)
        try:
            port = parsed.port
        except ValueError:
            port = None
        if not parsed.hostname or port is None or parsed.path not in ("", "/"):
            raise TransitionValidationError(f"{url!r} is not tcp://HOST:PORT")
        return Endpoint("tcp", url, host=parsed.hostname, port=port)
    raise TransitionValidationError(
        f"{url!r:.200} is not an owner's URL: use unix:///path/to/socket or tcp://host:port"
    )


def read_token(path: str | os.PathLike[str] | None) -> bytes | None:
    """The shared token in a token file (its bytes, surrounding whitespace removed), or None.

    Raises:
        ScopeAccessError: the file cannot be read, or holds no token.
    """
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            raw = f.read(4097)
    except OSError as exc:
        raise ScopeAccessError(
            f"cannot read the token file {os.fspath(path)!r}: {exc.strerror or exc}"
        ) from None
    token = raw.strip()
    if not token or len(raw) > 4096:
        raise ScopeAccessError(f"the token file {os.fspath(path)!r} must hold a token of 1 to 4096 bytes")
    return token


def check_token(expected: bytes | None, given: object) -> bool:
    """Whether ``given`` (from a handshake) matches ``expected`` (None: no token is asked for)."""
    if expected is None:
        return True
    if isinstance(given, str):
        given = given.encode("utf-8", "surrogatepass")
    if not isinstance(given, bytes):
        return False
    return hmac.compare_digest(expected, given)


async def read_frame(reader: asyncio.StreamReader, max_frame: int = MAX_FRAME) -> tuple[int, bytes]:
    """The next frame's request id and payload.

    Raises:
        asyncio.IncompleteReadError: the peer closed the connection (mid-frame or between frames).
        FrameTooLarge: the header declared more than ``max_frame`` bytes (nothing more was read).
    """
    header = await reader.readexactly(HEADER.size)
    size, rid = HEADER.unpack(header)
    if size > max_frame:
        raise FrameTooLarge(rid, size, max_frame)
    return rid, await reader.readexactly(size)


def write_frame(writer: asyncio.StreamWriter, rid: int, payload: bytes) -> None:
    """Queue one frame (one ``write``, so frames from concurrent tasks never interleave)."""
    writer.write(HEADER.pack(len(payload), rid) + payload)
