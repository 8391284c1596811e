"""The Ollama endpoints: tags, version, show, chat and generate (NDJSON streams by default)."""

from __future__ import annotations

import asyncio
import datetime
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from engine.types import ChatRequest, DoneChunk, ErrorChunk
from exo_tui.api.bodies import read_model
from exo_tui.api.context import (
    as_read,
    checked,
    client_of,
    context_of,
    first_of,
    json_response,
    then,
    watch_disconnect,
)
from exo_tui.api.errors import ApiError, bad_request
from exo_tui.api.loaded import backend_for
from exo_tui.api.ollama_convert import (
    chat_request,
    details,
    digest,
    done_reason,
    generate_request,
    merged,
    message_part,
    now,
    timings,
)
from exo_tui.api.ollama_types import (
    ChatIn,
    ChatLine,
    ErrorOut,
    GenerateIn,
    GenerateLine,
    MessageOut,
    Running,
    RunningModel,
    Show,
    ShowIn,
    TagModel,
    Tags,
    Version,
)
from exo_tui.api.scheduler import Queued, Started, StreamEvent, Unsaid
from exo_tui.api.streaming import Last, Streamed
from exo_tui.chat.backend import Backend

OLLAMA_VERSION = "0.12.0"  # the Ollama API this one follows, for clients that check

# One line of the answer: its message part, the last chunk on the last line, the queue position.
Shape = Callable[[MessageOut, DoneChunk | None, float, int | None], BaseModel]


async def root(request: Request) -> Response:
    return PlainTextResponse("Ollama is running")


async def version(request: Request) -> Response:
    return json_response(Version(version=OLLAMA_VERSION))


async def tags(request: Request) -> Response:
    context = context_of(request)
    backend = context.get_backend()
    models: list[TagModel] = []
    if backend is not None:
        card = backend.card
        models.append(
            TagModel(
                name=card.name,
                model=card.name,
                modified_at=_started(context.started),
                size=card.bytes_on_disk,
                digest=digest(card),
                details=details(card),
            )
        )
    return json_response(Tags(models=models))


async def running(request: Request) -> Response:
    """/api/ps: the loaded model, kept until it is unloaded (expires_at far ahead)."""
    backend = context_of(request).get_backend()
    models: list[RunningModel] = []
    if backend is not None:
        card = backend.card
        models.append(
            RunningModel(
                name=card.name,
                model=card.name,
                size=card.bytes_on_disk,
                digest=digest(card),
                details=details(card),
                expires_at="9999-12-31T23:59:59Z",
                context_length=card.context_length,
            )
        )
    return json_response(Running(models=models))


async def show(request: Request) -> Response:
    context = context_of(request)
    body = await read_model(request, ShowIn, "show request")
    wanted = body.model or body.name
    if not wanted:
        raise bad_request('The show request names no model. Send {"model": NAME}', "model")
    card = backend_for(context.get_backend, wanted).card
    info = {
        "general.architecture": card.model_type,
        "general.parameter_count": card.num_parameters,
        f"{card.model_type}.context_length": card.context_length,
        f"{card.model_type}.block_count": card.num_layers,
        f"{card.model_type}.embedding_length": card.hidden_size,
    }
    return json_response(
        Show(
            modelfile=f"FROM {card.path}",
            parameters="",
            template="",
            details=details(card),
            model_info=info,
            capabilities=["completion", "tools"],
            modified_at=_started(context.started),
        )
    )


async def chat(request: Request) -> Response:
    body = await read_model(request, ChatIn, "chat request")
    backend = backend_for(context_of(request).get_backend, body.model)
    name = backend.card.name
    if not body.messages:  # Ollama's way to load a model: it is loaded
        return json_response(
            ChatLine(
                model=name, created_at=now(), message=MessageOut(), done=True, done_reason="load"
            )
        )

    def shape(
        part: MessageOut, done: DoneChunk | None, elapsed: float, queued: int | None
    ) -> BaseModel:
        ending = (
            {}
            if done is None
            else {"done_reason": done_reason(done), **timings(done, elapsed).model_dump()}
        )
        return ChatLine.model_validate(
            {"model": name, "created_at": now(), "message": part, "done": done is not None,
             "queue_position": queued, **ending}
        )  # fmt: skip

    return await _answer(
        request, backend, checked(chat_request(body, backend.card)), body.stream, shape
    )


async def generate(request: Request) -> Response:
    body = await read_model(request, GenerateIn, "generate request")
    backend = backend_for(context_of(request).get_backend, body.model)
    name = backend.card.name
    if not body.prompt:  # Ollama's way to load a model: it is loaded
        return json_response(
            GenerateLine(model=name, created_at=now(), response="", done=True, done_reason="load")
        )

    def shape(
        part: MessageOut, done: DoneChunk | None, elapsed: float, queued: int | None
    ) -> BaseModel:
        ending = (
            {}
            if done is None
            else {"done_reason": done_reason(done), **timings(done, elapsed).model_dump()}
        )
        return GenerateLine.model_validate(
            {"model": name, "created_at": now(), "response": part.content,
             "thinking": part.thinking, "done": done is not None, "queue_position": queued,
             **ending}
        )  # fmt: skip

    chat_body = checked(generate_request(body, backend.card))
    return await _answer(request, backend, chat_body, body.stream, shape)


async def _answer(
    request: Request, backend: Backend, chat: ChatRequest, stream: bool, shape: Shape
) -> Response:
    scheduler = context_of(request).scheduler
    started = time.perf_counter()
    job = scheduler.admit(backend, chat, "ollama", client_of(request))
    watcher = watch_disconnect(request, job.cancel)
    events = scheduler.stream(job)
    if not stream:
        try:
            return json_response(await _whole(events, shape, started))
        finally:
            watcher.cancel()
            await events.aclose()
    first = await first_of(events, watcher)
    return Streamed(_lines(first, events, watcher, shape, started), "application/x-ndjson")


async def _whole(events: AsyncIterator[StreamEvent], shape: Shape, started: float) -> BaseModel:
    """The whole answer, once its thread has ended (the events run out)."""
    parts: list[MessageOut] = []
    done: DoneChunk | None = None
    async for event in events:
        event = as_read(event)
        if isinstance(event, ErrorChunk):
            raise ApiError(500, event.message, "server_error")
        if isinstance(event, DoneChunk):
            done = done or event
        elif not isinstance(event, Unsaid):
            parts.append(message_part(event))
    assert done is not None  # the scheduler always ends with one
    return shape(merged(parts), done, time.perf_counter() - started, None)


async def _lines(
    first: StreamEvent,
    events: AsyncGenerator[StreamEvent],
    watcher: asyncio.Task[None],
    shape: Shape,
    started: float,
) -> AsyncGenerator[bytes]:
    try:
        if isinstance(first, Queued):
            yield _line(shape(MessageOut(), None, 0.0, first.position))
        elif not isinstance(first, Started):
            events = then(first, events)
        async for event in events:
            event = as_read(event)
            if isinstance(event, Unsaid):
                continue
            if isinstance(event, ErrorChunk):
                yield _line(ErrorOut(error=event.message))
            elif isinstance(event, DoneChunk):
                yield Last(_line(shape(MessageOut(), event, time.perf_counter() - started, None)))
                return
            else:
                yield _line(shape(message_part(event), None, 0.0, None))
    finally:
        watcher.cancel()
        await events.aclose()


def _line(body: BaseModel) -> bytes:
    return body.model_dump_json(exclude_none=True).encode() + b"\n"


def _started(at: float) -> str:
    return datetime.datetime.fromtimestamp(at, datetime.UTC).isoformat().replace("+00:00", "Z")


ROUTES = [
    Route("/", root, methods=["GET", "HEAD"]),
    Route("/api/version", version, methods=["GET"]),
    Route("/api/tags", tags, methods=["GET"]),
    Route("/api/show", show, methods=["POST"]),
    Route("/api/ps", running, methods=["GET"]),
    Route("/api/chat", chat, methods=["POST"]),
    Route("/api/generate", generate, methods=["POST"]),
]
