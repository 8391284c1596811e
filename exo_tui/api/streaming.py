"""A streamed response body, sent as it is made: the SSE and NDJSON answers."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping

from starlette.responses import Response
from starlette.types import Receive, Scope, Send


class Streamed(Response):
    """Each item of `body` sent as it comes. Nothing here listens for the client leaving: the
    request's own watcher does (`context.watch_disconnect`), which cancels the answer and so
    ends `body`. Starlette's StreamingResponse and sse-starlette's EventSourceResponse each
    run tasks of their own beside the body for that (sse-starlette four, and a cancel scope
    for every send), work on the event loop for every request and chunk that bench/api.py
    measures on the cores the model decodes on."""

    def __init__(
        self,
        body: AsyncGenerator[bytes],
        media_type: str,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.body_iterator = body
        self.status_code = 200
        self.media_type = media_type
        self.background = None
        self.init_headers(headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async for chunk in self.body_iterator:
                last = isinstance(chunk, Last)
                await send({"type": "http.response.body", "body": chunk, "more_body": not last})
                if last:
                    return
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await self.body_iterator.aclose()


class Last(bytes):
    """A body's last piece: it goes out with the response's end in one write, so the client
    wakes once for both."""
