"""What every route reads: the backend getter, the scheduler, and helpers on the request."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from engine.errors import EngineError
from engine.generate import validate
from engine.types import ChatRequest, ErrorChunk, TextChunk
from exo_tui.api.errors import from_engine
from exo_tui.api.loaded import BackendGetter
from exo_tui.api.scheduler import CancelFlag, Scheduler, StreamEvent


@dataclass(frozen=True)
class ApiContext:
    get_backend: BackendGetter
    scheduler: Scheduler
    api_key: str | None = None
    started: float = field(default_factory=time.time)


def context_of(request: Request) -> ApiContext:
    context: ApiContext = request.app.state.api
    return context


def client_of(request: Request) -> str:
    """The peer's address and, when it sent one, its User-Agent (the board's client column)."""
    peer = f"{request.client.host}:{request.client.port}" if request.client else "unknown"
    agent = request.headers.get("user-agent", "")
    return f"{peer} {agent[:60]}".strip()


def checked(chat: ChatRequest) -> ChatRequest:
    """The engine's own checks, before the request queues (400 now, not after the wait)."""
    try:
        validate(chat)
    except EngineError as error:
        raise from_engine(error) from None
    return chat


def json_response(body: BaseModel, status: int = 200) -> Response:
    return Response(body.model_dump_json(exclude_none=True), status, media_type="application/json")


def watch_disconnect(request: Request, cancel: CancelFlag) -> asyncio.Task[None]:
    """Cancel the request when its client goes (the body has been read: the next message the
    server receives for it is the disconnect). Cancel the task once the answer is sent."""

    async def wait() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                cancel.set()
                return

    return asyncio.create_task(wait())


async def first_of(events: AsyncGenerator[StreamEvent], watcher: asyncio.Task[None]) -> StreamEvent:
    """A stream's first event, taken before the response starts: a refusal before it is still
    an error response (a 400). Failing, the watcher and the stream are closed."""
    try:
        return await anext(events)
    except BaseException:
        watcher.cancel()
        await events.aclose()
        raise


def as_read(event: StreamEvent) -> StreamEvent:
    """An error about the model's own text (a tool call cut off by `max_tokens`, or one its
    parser cannot read) as that text: the client gets what the model wrote and the answer's
    own finish reason, as from other servers, not an error that loses the answer."""
    if isinstance(event, ErrorChunk) and event.output:
        return TextChunk(text=event.output)
    return event


async def then(
    first: StreamEvent, rest: AsyncGenerator[StreamEvent]
) -> AsyncGenerator[StreamEvent]:
    """`first` (already taken, to answer a refusal with a 400), then the rest."""
    try:
        yield first
        async for event in rest:
            yield event
    finally:
        await rest.aclose()
