"""The OpenAI endpoints: GET /v1/models and POST /v1/chat/completions (SSE or one JSON)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator

from sse_starlette import ServerSentEvent
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from engine.types import DoneChunk, ErrorChunk
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
from exo_tui.api.errors import ApiError
from exo_tui.api.loaded import backend_for
from exo_tui.api.openai_convert import chat_request, completion_id, delta, finish, merged, usage
from exo_tui.api.openai_types import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Choice,
    ChunkChoice,
    Delta,
    ErrorBody,
    ErrorResponse,
    ModelList,
    ModelObject,
)
from exo_tui.api.scheduler import KeepAlive, Queued, Started, StreamEvent, Unsaid
from exo_tui.api.streaming import Last, Streamed


async def list_models(request: Request) -> Response:
    context = context_of(request)
    backend = context.get_backend()
    data = (
        [] if backend is None else [ModelObject(id=backend.card.name, created=int(context.started))]
    )
    return json_response(ModelList(data=data))


async def chat_completions(request: Request) -> Response:
    context = context_of(request)
    body = await read_model(request, ChatCompletionRequest, "chat completion request")
    backend = backend_for(context.get_backend, body.model)
    chat = checked(chat_request(body, backend.card))
    job = context.scheduler.admit(backend, chat, "openai", client_of(request))
    watcher = watch_disconnect(request, job.cancel)
    events = context.scheduler.stream(job)
    if not body.stream:
        try:
            return json_response(await _whole(events, backend.card.name))
        finally:
            watcher.cancel()
            await events.aclose()
    first = await first_of(events, watcher)
    include_usage = body.stream_options is not None and body.stream_options.include_usage
    return Streamed(
        _sse(first, events, watcher, backend.card.name, include_usage),
        "text/event-stream",
        {"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


async def _whole(events: AsyncIterator[StreamEvent], model: str) -> ChatCompletion:
    """The whole answer, once its thread has ended (the events run out)."""
    deltas: list[Delta] = []
    done: DoneChunk | None = None
    async for event in events:
        event = as_read(event)
        if isinstance(event, ErrorChunk):
            raise ApiError(500, event.message, "server_error")
        if isinstance(event, DoneChunk):
            done = done or event
        elif not isinstance(event, Unsaid):
            deltas.append(delta(event, sum(len(d.tool_calls or ()) for d in deltas)))
    assert done is not None  # the scheduler always ends with one
    return ChatCompletion(
        id=completion_id(),
        created=int(time.time()),
        model=model,
        choices=[Choice(message=merged(deltas), finish_reason=finish(done.finish_reason))],
        usage=usage(done.usage),
    )


async def _sse(
    first: StreamEvent,
    events: AsyncGenerator[StreamEvent],
    watcher: asyncio.Task[None],
    model: str,
    include_usage: bool,
) -> AsyncGenerator[bytes]:
    cid, created = completion_id(), int(time.time())

    def chunk(choices: list[ChunkChoice], **extra: object) -> bytes:
        wire = ChatCompletionChunk.model_validate(
            {"id": cid, "created": created, "model": model, "choices": choices, **extra}
        )
        return sse(wire.model_dump_json(exclude_none=True))

    position = first.position if isinstance(first, Queued) else None
    calls = 0
    try:
        yield chunk(
            [ChunkChoice(delta=Delta(role="assistant", content=""))], queue_position=position
        )
        if not isinstance(first, Queued | Started):
            events = then(first, events)
        async for event in events:
            event = as_read(event)
            if isinstance(event, KeepAlive):
                yield b": keep-alive\n\n"  # an SSE comment: clients read past it
            elif isinstance(event, Unsaid):
                continue
            elif isinstance(event, ErrorChunk):
                error = ErrorResponse(error=ErrorBody(message=event.message, type="server_error"))
                yield sse(error.model_dump_json(exclude_none=True))
            elif isinstance(event, DoneChunk):
                # The end in one write: the client wakes for it once, not three times.
                end = chunk([ChunkChoice(delta=Delta(), finish_reason=finish(event.finish_reason))])
                if include_usage:
                    end += chunk([], usage=usage(event.usage))
                yield Last(end + sse("[DONE]"))  # (the scheduler ends every stream with one)
                return
            else:
                yield chunk([ChunkChoice(delta=delta(event, calls))])
                calls += event.type == "tool_call"
    finally:
        watcher.cancel()
        await events.aclose()


def sse(data: str) -> bytes:
    """One server-sent event, as EventSourceResponse writes a `{"data": ...}` (lines end in
    "\n")."""
    return ServerSentEvent(data=data, sep="\n").encode()


ROUTES = [
    Route("/v1/models", list_models, methods=["GET"]),
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
]
