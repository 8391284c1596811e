"""Where a batched request's chunks go: its caller's side of the model's thread.

The model's thread hands each chunk to the request's `Replies` as it makes it: a queue read by
`BatchEngine.generate`, or straight into a server's inbox (`BatchEngine.submit`)."""

from __future__ import annotations

import queue
from collections.abc import Callable
from dataclasses import dataclass

from engine.batch_messages import PrefillDone, Refused
from engine.errors import EngineError, ModelFormatError, RequestError
from engine.generate import CancelToken
from engine.types import Chunk, DoneChunk, ReasoningChunk, TextChunk, ToolCallChunk

ANSWER_CHUNKS = (TextChunk, ReasoningChunk, ToolCallChunk)


# What `BatchEngine.submit` hands each chunk to, on the model's thread; an EngineError in place
# of any chunk when the request cannot be served after all (its weights are not numbers).
Deliver = Callable[[Chunk | EngineError], None]


class Replies:
    """A request's chunks, handed to its `deliver` as the model's thread makes them."""

    def __init__(self, deliver: Deliver, cancel: CancelToken) -> None:
        self._deliver = deliver
        self._cancel = cancel

    def put(self, chunk: Chunk | Refused) -> None:
        if isinstance(chunk, Refused):
            error = RequestError if chunk.about == "request" else ModelFormatError
            self._deliver(error(chunk.cause, chunk.fix))
            return
        kept = as_cancelled(chunk, self._cancel)
        if kept is not None:
            self._deliver(kept)


def as_cancelled(chunk: Chunk, cancel: CancelToken) -> Chunk | None:
    """`chunk` as a caller who may have stopped gets it: after its cancel the answer ends where
    it stopped (what was decoded ahead of it is dropped, None) and its end says cancelled.
    Only the answer's chunks are dropped: a prefill's progress is the engine's to report."""
    # The cancel is looked at only for these (a token may count its looks: tests/engine).
    if isinstance(chunk, ANSWER_CHUNKS):
        return None if cancel.is_set() else chunk
    if isinstance(chunk, DoneChunk) and chunk.finish_reason != "cancelled" and cancel.is_set():
        return chunk.model_copy(update={"finish_reason": "cancelled"})
    return chunk


@dataclass
class Caller:
    """Where a request's chunks go, and its cancel (both held outside the messages: a
    callback and an event are not data)."""

    replies: Replies
    cancel: CancelToken


@dataclass
class PrefillCaller:
    replies: queue.Queue[PrefillDone]
    cancel: CancelToken
