"""The inspector's web application: JSON routes, server-sent events, and the page that uses them.

Routes (every one answers GET and HEAD only; anything else is 405):

``/``                        the page (``static/index.html``; its script and styles under ``/static/``)
``/api/info``                what is being served: the mode (``store`` or ``live``), the store's path
``/api/scopes``              a page of scopes: ``after`` (a scope ref: the cursor), ``limit`` (1-500),
                             ``level``, ``prefix`` (of the id), ``parent`` (a scope ref, or ``none``)
``/api/scope``               one scope: ``ref``
``/api/history``             its commits, newest first: ``ref``, ``before`` (a version), ``limit``,
                             ``run`` (only that run's commits)
``/api/state``               its state at ``version`` (default current), with a window of messages:
                             ``messages_from``, ``messages_limit``
``/api/diff``                what changed between versions ``a`` and ``b`` of ``ref``
``/api/checkpoints``         its stored checkpoints: ``ref``
``/api/live``                live mode only: counters, runs and supervision events, now
``/api/live/events``         live mode only: the same as server-sent events, every ``interval`` seconds

Errors are JSON, ``{"error": {"status", "code", "message"}}``, with a 4xx
status for anything a request got wrong: an unknown or repeated parameter,
a malformed value, an unknown scope, a version never reached or no longer
stored. When the server is bound to a loopback address, a request whose
``Host`` is not a loopback name is refused (400 ``bad_host``), so a web page
elsewhere cannot read the store through DNS rebinding.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from importlib import resources
from typing import Any

import anyio
import anyio.to_thread
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from victor_actors import ScopeRef, StateScope, VictorActorsError
from victor_actors.web._catalog import ROOTS
from victor_actors.web._errors import InspectorError
from victor_actors.web._live import LiveFeed
from victor_actors.web._views import Inspector, translate

__all__ = ["LOOPBACK_NAMES", "create_app"]

logger = logging.getLogger("victor_actors.web")

LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
_METHODS = ("GET", "HEAD")
_MAX_VERSION = 2**63 - 1
_MAX_ID_BYTES = 400  # as the runtime's own limit on scope ids
_SECURITY_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (
        b"content-security-policy",
        b"default-src 'self'; img-src 'self' data:; object-src 'none'; frame-ancestors 'none'; "
        b"base-uri 'none'",
    ),
]


def _bad(name: str, why: str) -> InspectorError:
    return InspectorError(400, "bad_parameter", f"parameter {name!r}: {why}", parameter=name)


class Query:
    """The query parameters of one request, checked: no unknown name, none given twice."""

    def __init__(self, request: Request, allowed: tuple[str, ...]) -> None:
        params = request.query_params
        for name in params:
            if name not in allowed:
                takes = ", ".join(allowed) or "no parameters"
                raise InspectorError(
                    400,
                    "unknown_parameter",
                    f"unknown parameter {name!r}; {request.url.path} takes {takes}",
                    parameter=name,
                )
            if len(params.getlist(name)) > 1:
                raise _bad(name, "given more than once")
        self._params: Mapping[str, str] = params

    def text(self, name: str, *, required: bool = False) -> str | None:
        value = self._params.get(name)
        if value is None or value == "":
            if required:
                raise InspectorError(
                    400, "missing_parameter", f"parameter {name!r} is required", parameter=name
                )
            return None
        if len(value.encode("utf-8", "surrogatepass")) > _MAX_ID_BYTES + 32:
            raise _bad(name, f"longer than {_MAX_ID_BYTES + 32} bytes")
        return value

    def ref(self, name: str, *, required: bool = False) -> ScopeRef | None:
        text = self.text(name, required=required)
        if text is None:
            return None
        try:
            return ScopeRef.parse(text)
        except (VictorActorsError, ValueError) as exc:
            raise _bad(name, f"not a scope ref like conversation:c1 ({exc})") from None

    def integer(self, name: str, *, default: int | None, low: int, high: int) -> int | None:
        text = self.text(name)
        if text is None:
            return default
        if not (text.isascii() and text.isdigit()) or len(text) > 19:
            raise _bad(name, f"a whole number from {low} to {high}, not {text!r}")
        value = int(text)
        if not low <= value <= high:
            raise _bad(name, f"a whole number from {low} to {high}, not {value}")
        return value

    def version(self, name: str, *, required: bool = False) -> int | None:
        if required and self.text(name) is None:
            raise InspectorError(400, "missing_parameter", f"parameter {name!r} is required", parameter=name)
        return self.integer(name, default=None, low=0, high=_MAX_VERSION)

    def number(self, name: str, *, default: float, low: float, high: float) -> float:
        text = self.text(name)
        if text is None:
            return default
        try:
            value = float(text)
        except ValueError:
            raise _bad(name, f"a number of seconds from {low} to {high}, not {text!r}") from None
        if not low <= value <= high:  # also refuses nan
            raise _bad(name, f"a number of seconds from {low} to {high}, not {text!r}")
        return value

    def level(self, name: str) -> StateScope | None:
        text = self.text(name)
        if text is None:
            return None
        try:
            return StateScope(text)
        except ValueError:
            levels = ", ".join(s.value for s in StateScope)
            raise _bad(name, f"one of {levels}, not {text!r}") from None

    def parent(self, name: str) -> ScopeRef | str | None:
        if self.text(name) == ROOTS:
            return ROOTS
        return self.ref(name)


def _error_response(exc: InspectorError, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse(
        exc.body(), status_code=exc.status, headers={"cache-control": "no-store", **(headers or {})}
    )


class Guard:
    """Refuse every method but GET and HEAD, and foreign ``Host`` names; add security headers."""

    def __init__(self, app: ASGIApp, allowed_hosts: frozenset[str] | None) -> None:
        self.app = app
        self.allowed_hosts = allowed_hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "websocket":  # nothing here speaks websockets
                await send({"type": "websocket.close", "code": 1008})
                return
            await self.app(scope, receive, send)
            return
        refusal: Response | None = None
        if scope["method"] not in _METHODS:
            err = InspectorError(
                405,
                "method_not_allowed",
                f"{scope['method']} is refused: the inspector only reads (GET and HEAD); nothing was changed",
            )
            refusal = _error_response(err, {"allow": ", ".join(_METHODS)})
        elif self.allowed_hosts is not None:
            host = _host_name(dict(scope["headers"]).get(b"host", b"").decode("latin-1"))
            if host not in self.allowed_hosts:
                err = InspectorError(
                    400,
                    "bad_host",
                    f"Host {host!r} is not a loopback name; this inspector answers only on this machine",
                )
                refusal = _error_response(err)

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *_SECURITY_HEADERS]
            await send(message)

        if refusal is not None:
            await refusal(scope, receive, send_secured)
            return
        await self.app(scope, receive, send_secured)


def _host_name(host: str) -> str:
    """``127.0.0.1:8765`` -> ``127.0.0.1``; ``[::1]:8765`` -> ``[::1]``."""
    if host.startswith("["):
        return host[: host.find("]") + 1] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def create_app(
    inspector: Inspector,
    *,
    feed: LiveFeed | None = None,
    allowed_hosts: frozenset[str] | None = LOOPBACK_NAMES,
    stopping: threading.Event | None = None,
) -> ASGIApp:
    """The ASGI application over ``inspector`` (and, in live mode, ``feed``).

    ``allowed_hosts``: the ``Host`` names answered (None: any, for a server
    bound to a non-loopback address on purpose). ``stopping``: once set, the
    event streams end, so the server can shut down without waiting for them.
    """
    stop = stopping or threading.Event()
    page = (resources.files("victor_actors.web") / "static" / "index.html").read_text("utf-8")

    def route(handler: Callable[[Query], Any], *allowed: str) -> Callable[[Request], Response]:
        def endpoint(request: Request) -> Response:
            query = Query(request, allowed)
            with translate():
                data = handler(query)
            return JSONResponse(data, headers={"cache-control": "no-store"})

        return endpoint

    def need_feed() -> LiveFeed:
        if feed is None:
            raise InspectorError(
                404,
                "not_live",
                "live data comes only from the process that owns the store (manager.serve(...)); "
                "this server reads a store",
            )
        return feed

    def index(request: Request) -> Response:
        Query(request, ())
        return HTMLResponse(page, headers={"cache-control": "no-store"})

    def scopes(q: Query) -> Any:
        return inspector.scopes(
            after=q.ref("after"),
            limit=q.integer("limit", default=100, low=1, high=500) or 100,
            level=q.level("level"),
            prefix=q.text("prefix"),
            parent=q.parent("parent"),
        )

    def scope(q: Query) -> Any:
        return inspector.scope(_required_ref(q))

    def history(q: Query) -> Any:
        ref = _required_ref(q)
        before = q.version("before")
        limit = q.integer("limit", default=100, low=1, high=500) or 100
        return inspector.history(ref, before=before, limit=limit, run=q.text("run"))

    def state(q: Query) -> Any:
        ref = _required_ref(q)
        version = q.version("version")
        start = q.integer("messages_from", default=None, low=0, high=_MAX_VERSION)
        limit = q.integer("messages_limit", default=100, low=1, high=500) or 100
        return inspector.state(ref, version=version, messages_from=start, messages_limit=limit)

    def diff(q: Query) -> Any:
        ref = _required_ref(q)
        a, b = q.version("a", required=True), q.version("b", required=True)
        assert a is not None and b is not None
        return inspector.diff(ref, a, b)

    def checkpoints(q: Query) -> Any:
        return inspector.checkpoints(_required_ref(q))

    def live(q: Query) -> Any:
        return need_feed().sample()

    async def live_events(request: Request) -> Response:
        query = Query(request, ("interval",))
        interval = query.number("interval", default=0.5, low=0.05, high=10.0)
        source = need_feed()

        async def stream() -> AsyncIterator[str]:
            yield "retry: 2000\n\n"
            count = 0
            while not stop.is_set():
                try:
                    data = await anyio.to_thread.run_sync(source.sample)
                except VictorActorsError as exc:  # the manager closed under us
                    yield f"event: closed\ndata: {json.dumps({'message': str(exc)})}\n\n"
                    return
                count += 1
                text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
                yield f"id: {count}\nevent: live\ndata: {text}\n\n"
                await anyio.sleep(interval)

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={"cache-control": "no-store", "x-accel-buffering": "no"},
        )

    async def on_inspector_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, InspectorError)
        return _error_response(exc)

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        message = f"no route {request.url.path}" if exc.status_code == 404 else str(exc.detail)
        return _error_response(InspectorError(exc.status_code, code, message), exc.headers)

    async def on_crash(request: Request, exc: Exception) -> Response:
        logger.exception("the inspector failed on %s", request.url.path)
        return _error_response(InspectorError(500, "internal", f"{type(exc).__name__}: {exc}"))

    app = Starlette(
        routes=[
            Route("/", index, methods=["GET"]),
            Route("/api/info", route(lambda q: inspector.info()), methods=["GET"]),
            Route(
                "/api/scopes", route(scopes, "after", "limit", "level", "prefix", "parent"), methods=["GET"]
            ),
            Route("/api/scope", route(scope, "ref"), methods=["GET"]),
            Route("/api/history", route(history, "ref", "before", "limit", "run"), methods=["GET"]),
            Route(
                "/api/state",
                route(state, "ref", "version", "messages_from", "messages_limit"),
                methods=["GET"],
            ),
            Route("/api/diff", route(diff, "ref", "a", "b"), methods=["GET"]),
            Route("/api/checkpoints", route(checkpoints, "ref"), methods=["GET"]),
            Route("/api/live", route(live), methods=["GET"]),
            Route("/api/live/events", live_events, methods=["GET"]),
            Mount("/static", StaticFiles(packages=[("victor_actors.web", "static")]), name="static"),
        ],
        exception_handlers={
            InspectorError: on_inspector_error,
            HTTPException: on_http_error,
            Exception: on_crash,
        },
    )
    return Guard(app, allowed_hosts)


def _required_ref(q: Query) -> ScopeRef:
    ref = q.ref("ref", required=True)
    assert ref is not None
    return ref
