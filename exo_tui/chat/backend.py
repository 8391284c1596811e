"""What answers a chat: one interface in front of a model in this process, a cluster or a ring.

A chat turn, the app and the CLI hold a `Backend` and never ask which kind it is. The local one
decodes concurrent requests together (continuous batching) and runs the next-turn prefill while
the model is idle; the cluster one is the one bridge from the coordinator's event loop to the
caller's thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from typing import Protocol

from engine.answer import failure_chunks
from engine.batching import DEFAULT_BATCH, BatchEngine, batchable
from engine.errors import EngineError
from engine.generate import CancelToken, generate, prefill_next_turn
from engine.kv_memory import free_memory_bytes
from engine.loading import LoadedModel
from engine.types import ChatRequest, Chunk, DoneChunk, ErrorChunk, ModelCard, Stats, Usage

# A generation of engine chunks: engine.generate over a loaded model, or a ring's chat.
GenerateFn = Callable[[ChatRequest, CancelToken | None], Iterator[Chunk]]
# What `Backend.answer` hands an answer's chunks to, from a thread of the backend's: the chunks,
# the last a DoneChunk, or an exception in place of any (an EngineError: the request is refused).
Deliver = Callable[[Chunk | Exception], None]


# How long a caller that stops reading a cluster's answer waits for its ranks to finish it.
LEAVE_WAIT_S = 30.0


class RanksRefused(EngineError):
    """A request the ranks refused: their EngineError, which came back as chunks."""

    def __init__(self, message: str) -> None:
        Exception.__init__(self, message)
        self.cause, self.fix = message, ""


class Either:
    """Set when either token is."""

    def __init__(self, first: CancelToken | None, second: CancelToken) -> None:
        self._tokens = (first, second) if first is not None else (second,)

    def is_set(self) -> bool:
        return any(token.is_set() for token in self._tokens)


class Backend(Protocol):
    """A model ready to answer."""

    @property
    def card(self) -> ModelCard: ...

    @property
    def concurrency(self) -> int:
        """How many `generate` calls it answers at once (the rest wait for a turn)."""
        ...

    def generate(self, request: ChatRequest, cancel: CancelToken | None) -> Iterator[Chunk]:
        """Stream the answer to `request`; the last chunk is a DoneChunk."""
        ...

    def answer(self, request: ChatRequest, cancel: CancelToken, deliver: Deliver) -> bool:
        """Start the answer to `request` and return: `deliver` gets its chunks as `generate`
        would give them, from a thread of the backend's (see Deliver). What a server answers
        many requests with: a model in this process hands each chunk over from its own thread,
        with no thread a request woken for every token. May raise EngineError at once. True:
        the request is taken (its own refusal, such as a prompt past the context, would have
        been raised here; a fault of the model's, such as weights that are not numbers, can
        still come); False: its refusal may still come, as its first item."""
        ...

    def prefill_next(self, request: ChatRequest, draft: str = "") -> None:
        """Prefill `request` (and the typed `draft`) as the next turn will see it, until
        `stop_prefill`; a backend with nothing to prefill does nothing."""
        ...

    def stop_prefill(self) -> None:
        """Stop the prefill running or queued: a turn (or an unload) is here."""
        ...

    def forget_history(self) -> None:
        """A new chat: what was cached for the last one is of no use."""
        ...

    def unload(self) -> None:
        """Let go of the model."""
        ...


def answer_on_a_thread(
    generate: GenerateFn, request: ChatRequest, cancel: CancelToken, deliver: Deliver
) -> bool:
    """`Backend.answer` for a backend that streams on its caller's thread: `generate` runs on a
    thread of its own, which stops reading at a cancel (the answer then ends cancelled). False:
    `generate` refuses as it starts, on that thread."""

    def run() -> None:
        ended = False
        try:
            chunks = generate(request, cancel)
            try:
                for chunk in chunks:
                    ended = isinstance(chunk, DoneChunk)
                    deliver(chunk)
                    if ended:
                        return
                    if cancel.is_set():
                        break
            finally:
                if isinstance(chunks, Generator):
                    chunks.close()  # a local model puts back the prompt cache it took
            if not ended:
                ended = True
                deliver(cancelled_done())
        except Exception as error:  # refused (an EngineError), a bug or a lost node: said
            if not ended:
                deliver(error)

    threading.Thread(target=run, name="answer", daemon=True).start()
    return False


def cancelled_done() -> DoneChunk:
    """The last chunk of an answer cancelled before its backend said how it ended."""
    return DoneChunk(
        finish_reason="cancelled",
        usage=Usage(prompt_tokens=0, completion_tokens=0),
        stats=Stats(ttft_s=0, prefill_tps=0, decode_tps=0, peak_memory_bytes=0),
        token_ids=(),
    )


class Coordinating(Protocol):
    """What the cluster backend needs of the coordinator."""

    def chat(self, request: ChatRequest, cancel: CancelToken | None = None) -> AsyncIterator[Chunk]:
        """Rank 0's chunks."""
        ...

    async def stop(self) -> None:
        """Stop the instance on every node."""
        ...


class LocalBackend:
    """A model loaded in this process. Up to `max_batch` requests decode together on the
    model's own thread (`engine.batching`); a model whose caches cannot join a batch, or a
    `max_batch` of 1, answers one request at a time on the caller's thread."""

    def __init__(
        self,
        loaded: LoadedModel,
        max_batch: int = DEFAULT_BATCH,
        free_memory: Callable[[], int] = free_memory_bytes,
    ) -> None:
        """`free_memory`: the bytes this machine has free (the system's reading; see
        `engine.kv_memory`), which the batch's caches never outgrow."""
        self.loaded = loaded
        # One generation or next-turn prefill at a time on the model, without the batch.
        self._lock = threading.Lock()
        self._prefill_cancel = threading.Event()
        self._batch = (
            BatchEngine(loaded, max_batch, free_memory)
            if max_batch > 1 and batchable(loaded)
            else None
        )

    @property
    def card(self) -> ModelCard:
        return self.loaded.card

    @property
    def concurrency(self) -> int:
        return 1 if self._batch is None else self._batch.max_batch

    def generate(self, request: ChatRequest, cancel: CancelToken | None) -> Iterator[Chunk]:
        self._a_turn_starts()
        if self._batch is not None:
            yield from self._batch.generate(request, cancel)
            return
        with self._lock:  # after any next-turn prefill has stopped
            yield from generate(self.loaded, request, cancel)

    def answer(self, request: ChatRequest, cancel: CancelToken, deliver: Deliver) -> bool:
        if self._batch is None:
            return answer_on_a_thread(self.generate, request, cancel, deliver)
        self._a_turn_starts()
        self._batch.submit(request, cancel, deliver)  # raises a refusal here
        return True

    def _a_turn_starts(self) -> None:
        # Prefills asked for from here on are for the turn after this one; those asked for
        # before it stop, even the ones still waiting for the model.
        self._prefill_cancel.set()
        self._prefill_cancel = threading.Event()

    def prefill_next(self, request: ChatRequest, draft: str = "") -> None:
        cancel = self._prefill_cancel
        if self._batch is not None:
            self._batch.prefill_next(request, cancel, draft)
            return
        with self._lock:  # after the answer (and its own prefill) let go of the model
            if not cancel.is_set():
                prefill_next_turn(self.loaded, request, cancel, draft)

    def stop_prefill(self) -> None:
        self._prefill_cancel.set()

    def forget_history(self) -> None:
        self.loaded.prompt_cache.clear()

    def unload(self) -> None:
        self._prefill_cancel.set()
        if self._batch is not None:
            self._batch.close()
        self.loaded.unload()


class ClusterBackend:
    """The instance the coordinator runs across nodes. The coordinator lives on `loop`; the
    chunks come to the caller's thread through a queue, and a coordinator that fails ends the
    answer with an error chunk, not with silence."""

    def __init__(
        self, coordinator: Coordinating, card: ModelCard, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.coordinator = coordinator
        self._card = card
        self._loop = loop

    @property
    def card(self) -> ModelCard:
        return self._card

    @property
    def concurrency(self) -> int:
        return 1

    def generate(self, request: ChatRequest, cancel: CancelToken | None) -> Iterator[Chunk]:
        """From any thread but the loop's. The ranks' refusal (their EngineError, which comes
        as chunks) is raised here, as a refusal in this process is."""
        chunks: queue.Queue[Chunk | None] = queue.Queue()
        left = threading.Event()  # the caller stopped reading: the ranks stop too

        async def pump() -> None:
            try:
                async for chunk in self.coordinator.chat(request, Either(cancel, left)):
                    chunks.put(chunk)
            finally:
                chunks.put(None)

        pumping = asyncio.run_coroutine_threadsafe(pump(), self._loop)
        try:
            first = True
            while (chunk := chunks.get()) is not None:
                if first and isinstance(chunk, ErrorChunk) and chunk.refused:
                    raise RanksRefused(chunk.message)
                first = False
                yield chunk
        finally:
            # A caller that leaves early waits for the ranks to finish this request: the
            # next one must not start while this one's frames still come.
            left.set()
            concurrent.futures.wait([pumping], timeout=LEAVE_WAIT_S)
        error = None if pumping.cancelled() else pumping.exception()
        if isinstance(error, EngineError):
            yield from failure_chunks(str(error), refused=True)
        elif error is not None:  # a bug or a lost connection: still said, not an empty answer
            yield from failure_chunks(f"{type(error).__name__}: {error}")

    def answer(self, request: ChatRequest, cancel: CancelToken, deliver: Deliver) -> bool:
        return answer_on_a_thread(self.generate, request, cancel, deliver)

    def prefill_next(self, request: ChatRequest, draft: str = "") -> None:
        """Nothing: the ranks keep their own caches."""

    def stop_prefill(self) -> None:
        """Nothing is prefilled."""

    def forget_history(self) -> None:
        """Nothing is cached here."""

    def unload(self) -> None:
        """Stop the instance on every node (from any thread; it is not waited for)."""
        asyncio.run_coroutine_threadsafe(self.coordinator.stop(), self._loop)


class RingBackend:
    """A ring of local runner processes (`exo-tui chat --ranks N`): its rank 0 answers."""

    def __init__(self, card: ModelCard, chat: GenerateFn, close: Callable[[], None]) -> None:
        self._card = card
        self._chat = chat
        self._close = close

    @property
    def card(self) -> ModelCard:
        return self._card

    @property
    def concurrency(self) -> int:
        return 1

    def generate(self, request: ChatRequest, cancel: CancelToken | None) -> Iterator[Chunk]:
        return self._chat(request, cancel)

    def answer(self, request: ChatRequest, cancel: CancelToken, deliver: Deliver) -> bool:
        return answer_on_a_thread(self.generate, request, cancel, deliver)

    def prefill_next(self, request: ChatRequest, draft: str = "") -> None:
        """Nothing: the ranks keep their own caches."""

    def stop_prefill(self) -> None:
        """Nothing is prefilled."""

    def forget_history(self) -> None:
        """Nothing is cached here."""

    def unload(self) -> None:
        self._close()
