"""The API server: the Starlette app (routes, the key, errors in each API's shape) and the
uvicorn that serves it on a thread of its own, with a clean stop."""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import logging
import socket
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from uvicorn.config import LOGGING_CONFIG

from engine.errors import EngineError
from exo_tui.api import ollama_routes, openai_routes
from exo_tui.api.board import RequestBoard
from exo_tui.api.context import ApiContext, json_response
from exo_tui.api.errors import ApiError
from exo_tui.api.loaded import BackendGetter
from exo_tui.api.ollama_types import ErrorOut
from exo_tui.api.openai_types import ErrorBody, ErrorResponse
from exo_tui.api.scheduler import MAX_WAITING, Scheduler

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080  # mlx_lm.server's and llama-server's
KEEP_ALIVE_S = 75  # seconds an idle connection stays open (nginx's and gunicorn's common setting)
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def build_app(
    get_backend: BackendGetter,
    board: RequestBoard,
    *,
    api_key: str | None = None,
    max_waiting: int = MAX_WAITING,
) -> Starlette:
    """The ASGI app: OpenAI under /v1, Ollama under /api, answering with `get_backend()`."""
    app = Starlette(
        routes=[*openai_routes.ROUTES, *ollama_routes.ROUTES],
        exception_handlers={
            ApiError: _api_error,
            Exception: _fault,
            404: _no_route,
            405: _bad_method,
        },
    )
    app.state.api = ApiContext(get_backend, Scheduler(board, max_waiting), api_key)
    if api_key:
        app.add_middleware(_KeyRequired, api_key=api_key)  # pyright: ignore[reportArgumentType]
    return app


def scheduler_of(app: Starlette) -> Scheduler:
    context: ApiContext = app.state.api
    return context.scheduler


def error_response(path: str, error: ApiError) -> Response:
    """`error` in the shape of the API that `path` belongs to."""
    if path.startswith("/api/"):
        body: ErrorOut | ErrorResponse = ErrorOut(error=error.message)
    else:
        body = ErrorResponse(
            error=ErrorBody(
                message=error.message, type=error.kind, param=error.param, code=str(error.status)
            )
        )
    response = json_response(body, error.status)
    response.headers.update(error.headers)
    return response


async def _api_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, ApiError)
    return error_response(request.url.path, error)


async def _fault(request: Request, error: Exception) -> Response:
    log.exception("the API failed on %s", request.url.path)
    return error_response(
        request.url.path,
        ApiError(500, f"The server failed: {type(error).__name__}: {error}", "server_error"),
    )


async def _no_route(request: Request, error: Exception) -> Response:
    return error_response(
        request.url.path,
        ApiError(
            404,
            f"There is no endpoint {request.url.path}. The OpenAI API is under /v1 "
            "(/v1/chat/completions, /v1/models), Ollama's under /api (/api/chat, /api/tags)",
            "not_found_error",
        ),
    )


async def _bad_method(request: Request, error: Exception) -> Response:
    return error_response(
        request.url.path,
        ApiError(
            405, f"{request.method} is not allowed on {request.url.path}", "invalid_request_error"
        ),
    )


class _KeyRequired:
    """Every request but Ollama's "is it running" probe carries the key as a Bearer token."""

    def __init__(
        self, app: Callable[[Scope, Receive, Send], Awaitable[None]], api_key: str
    ) -> None:
        self._app = app
        self._expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] == "/":
            await self._app(scope, receive, send)
            return
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        given = next((v for k, v in headers if k == b"authorization"), b"")
        if hmac.compare_digest(given, self._expected):
            await self._app(scope, receive, send)
            return
        why = "has no API key" if not given else "has the wrong API key"
        error = ApiError(
            401,
            f"The request {why}. Send the server's key as `Authorization: Bearer KEY` "
            "(the openai client's api_key; for Ollama clients, that header)",
            "authentication_error",
        )
        await error_response(scope["path"], error)(scope, receive, send)


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def require_key_off_loopback(host: str, api_key: str | None) -> None:
    if not is_loopback(host) and not api_key:
        raise EngineError(
            f"--host {host} is not a loopback address: anyone who can reach it could use the "
            "model, and nothing would stop them",
            "Pass --api-key KEY (clients send it as `Authorization: Bearer KEY`), or serve on "
            "127.0.0.1",
        )


class ApiServer:
    """uvicorn serving `app` on a thread of its own; `start` returns once it listens."""

    def __init__(
        self,
        app: Starlette,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        log_to_stderr: bool = True,
    ) -> None:
        """`log_to_stderr=False` under the TUI, whose screen a log line would tear."""
        self.app = app
        self.host = host
        self._socket = _bound(host, port)  # a port in use fails here, in the caller's thread
        self.port: int = self._socket.getsockname()[1]
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=3,
            # An idle connection is kept longer than clients keep theirs in their pools (httpx
            # 5 s, aiohttp 15 s): with uvicorn's 5 s, a client reusing one as the server closes
            # it gets a connection error instead of its answer.
            timeout_keep_alive=KEEP_ALIVE_S,
            log_config=LOGGING_CONFIG if log_to_stderr else None,
        )
        if not log_to_stderr:
            for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
                logging.getLogger(name).addHandler(logging.NullHandler())
                logging.getLogger(name).propagate = False
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name="api-server", daemon=True)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> None:
        self._thread.start()
        while not self._server.started and self._thread.is_alive():
            self._thread.join(0.02)
        if not self._server.started:
            raise OSError(f"the API server on {self.url} did not start")

    def cancel_all(self) -> None:
        """Cancel every request, queued or answering (from any thread: a model unloads)."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(scheduler_of(self.app).cancel_all)

    def stop(self) -> None:
        """Cancel what is queued or answering, close the connections and wait for the thread."""
        self.cancel_all()
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join()
        self._socket.close()

    _loop: Any = None

    def _run(self) -> None:
        import asyncio

        async def serve() -> None:
            self._loop = asyncio.get_running_loop()
            await self._server.serve(sockets=[self._socket])

        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(serve())


def _loop_factory() -> Any:
    """uvloop's event loop where it is installed (not on Windows): it takes less of the cores
    the model decodes on per chunk than asyncio's own (bench/api.py)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def start_api(
    get_backend: BackendGetter,
    board: RequestBoard,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    api_key: str | None = None,
    max_waiting: int = MAX_WAITING,
) -> ApiServer:
    """The API on `host:port`, serving `get_backend()`, listening when this returns (OSError
    if the port cannot be had); `.stop()` ends it. Off loopback it needs a key."""
    if not is_loopback(host) and not api_key:
        raise ValueError(f"serving on {host}, off loopback, needs an API key")
    app = build_app(get_backend, board, api_key=api_key, max_waiting=max_waiting)
    server = ApiServer(app, host, port)
    server.start()
    return server


def _bound(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio turns Nagle off only on sockets that say they are TCP, and a
    # reply's head and body written apart then wait for a delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {error.strerror}") from None
    sock.listen(128)
    return sock
