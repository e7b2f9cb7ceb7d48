"""Running the inspector: a socket bound here, uvicorn serving the application on it.

The socket is bound and listening before uvicorn starts, so the server's
address (and an ephemeral ``port=0``) is known at once and a client that
connects early waits in the backlog instead of being refused. Starlette and
uvicorn are imported only when a server starts: the rest of the package
(and the command line) works without the ``web`` extra.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from typing import TYPE_CHECKING, Any

from victor_actors import GlobalStateManager, VictorActorsError

if TYPE_CHECKING:
    from victor_actors.web._live import LiveFeed

__all__ = ["InspectorServer", "bind", "is_loopback", "serve_manager"]

EXTRA = "the web inspector needs the web extra: pip install 'victor-actors[web]'"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (``port=0``: an ephemeral port).

    Raises:
        OSError: the address is in use, or ``host`` is not an address of this machine.
    """
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"a port is a whole number from 0 to 65535, not {port!r}")
    family, kind, proto, _name, address = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)[
        0
    ]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


def _uvicorn_server(app: Any) -> Any:
    """A uvicorn server for ``app`` whose ``ready`` event is set once it accepts (or has failed)."""
    try:
        import uvicorn
    except ImportError as exc:
        raise ImportError(EXTRA) from exc

    class Server(uvicorn.Server):
        def __init__(self, config: uvicorn.Config) -> None:
            super().__init__(config)
            self.ready = threading.Event()

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            try:
                await super().startup(sockets)
            finally:
                self.ready.set()

    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="off",
        http="h11",
        ws="none",
        timeout_graceful_shutdown=1,
    )
    return Server(config)


def build_app(
    manager: GlobalStateManager, *, live: bool, host: str, stopping: threading.Event
) -> tuple[Any, LiveFeed | None]:
    """The application over ``manager`` (and its live feed in live mode)."""
    try:
        from victor_actors.web._app import LOOPBACK_NAMES, create_app
    except ImportError as exc:
        raise ImportError(EXTRA) from exc
    from victor_actors.web._live import LiveFeed
    from victor_actors.web._views import Inspector

    feed = LiveFeed(manager) if live else None
    hosts = LOOPBACK_NAMES | {host} if is_loopback(host) else None
    return create_app(Inspector(manager, live=live), feed=feed, allowed_hosts=hosts, stopping=stopping), feed


class InspectorServer:
    """An inspector serving on a daemon thread: ``url``, ``port``, ``close()``; a context manager.

    It never closes the manager it shows; closing the manager first makes
    the live routes answer 410 ``closed``.
    """

    def __init__(self, manager: GlobalStateManager, *, host: str, port: int, live: bool) -> None:
        self._stopping = threading.Event()
        self._sock = bind(host, port)
        self.host = host
        self.port: int = self._sock.getsockname()[1]
        try:
            app, self._feed = build_app(manager, live=live, host=host, stopping=self._stopping)
            self._server = _uvicorn_server(app)
        except BaseException:
            self._sock.close()
            raise
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"victor-actors-web-{self.port}", daemon=True)
        self._thread.start()
        self._server.ready.wait(10.0)
        if self._failure is not None or not self._server.started:
            self.close()
            raise VictorActorsError(f"the inspector could not start on {self.url}: {self._failure!r}")

    def _run(self) -> None:
        try:
            self._server.run(sockets=[self._sock])
        except BaseException as exc:  # reported by the constructor if it happens at start-up
            self._failure = exc
        finally:
            self._server.ready.set()

    @property
    def url(self) -> str:
        host = f"[{self.host.strip('[]')}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def __repr__(self) -> str:
        return f"<InspectorServer {self.url}{' closed' if self._stopping.is_set() else ''}>"

    def close(self, timeout: float = 5.0) -> None:
        """Stop serving (open event streams end within a second); idempotent."""
        self._stopping.set()
        self._server.should_exit = True
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)
        if self._feed is not None:
            self._feed.close()
        self._sock.close()

    def __enter__(self) -> InspectorServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve_manager(
    manager: GlobalStateManager, *, host: str = "127.0.0.1", port: int = 8765
) -> InspectorServer:
    """Serve the live inspector over a running ``manager`` until ``close()``; return at once.

    Everything the store-only inspector shows, plus what only the owner
    knows: commits per second, live actors, mailbox depth, supervision
    events, runs in progress and rolled back, updated through server-sent
    events. Binds to ``127.0.0.1`` by default; ``port=0`` picks a free port
    (see ``.port`` and ``.url``). The routes only read.

    Raises:
        OSError: the address is in use or not this machine's.
        ImportError: the ``web`` extra (starlette, uvicorn) is not installed.
    """
    return InspectorServer(manager, host=host, port=port, live=True)


def serve_forever(manager: GlobalStateManager, *, host: str, port: int, ready: Any = None) -> None:
    """Serve the store inspector over a read-only ``manager`` on this thread until Ctrl-C (SIGINT, SIGTERM).

    ``ready(url)`` is called once the socket listens.
    """
    stopping = threading.Event()
    sock = bind(host, port)
    try:
        app, _feed = build_app(manager, live=False, host=host, stopping=stopping)
        server = _uvicorn_server(app)
        bound = sock.getsockname()[1]
        if ready is not None:
            shown = f"[{host.strip('[]')}]" if ":" in host else host
            ready(f"http://{shown}:{bound}/")
        server.run(sockets=[sock])
    finally:
        stopping.set()
        sock.close()
