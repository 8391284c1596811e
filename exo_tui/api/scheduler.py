"""The queue in front of the model: at most `backend.concurrency` answers at once, the rest FIFO.

Each answer starts with `Backend.answer`, on a worker thread (rendering and tokenizing the
prompt stays off the loop); its chunks reach the event loop through the job's inbox, put there
from the backend's own thread. Everything else here runs on the loop's thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable
from typing import Literal

from engine.errors import EngineError
from engine.types import ChatRequest, Chunk, DoneChunk, ErrorChunk, Frozen, PrefillProgress
from exo_tui.api.board import RequestBoard, RequestState
from exo_tui.api.errors import ApiError
from exo_tui.api.inbox import Inbox
from exo_tui.chat.backend import Backend, cancelled_done
from exo_tui.chat.turn import joined

log = logging.getLogger(__name__)

MAX_WAITING = 16
RETRY_AFTER_S = 5  # a 429's Retry-After: a few short answers' time
BOARD_INTERVAL_S = 0.1  # a running answer's tokens reach the board at most this often
# A stream's chunks go out at most this often (50 a second, smoother than a screen needs):
# each one costs the server and the client the same work however many tokens it holds, work
# that the model's threads would otherwise do on the same cores. bench/api.py measures it.
STREAM_EVERY_S = 0.02
# A stream with nothing to send for this long says it is alive: clients and proxies give up on
# a connection silent for longer (a long wait in the queue, a long prompt's prefill).
KEEPALIVE_S = 15.0


class Queued(Frozen):
    """The request waits for a slot; position 1 runs next."""

    type: Literal["queued"] = "queued"
    position: int


class Started(Frozen):
    """The backend took the request (no refusal came at once): its chunks follow. A stream's
    response starts on it, while the model works on the first token."""

    type: Literal["started"] = "started"


class KeepAlive(Frozen):
    """Nothing came for KEEPALIVE_S."""

    type: Literal["keepalive"] = "keepalive"


StreamEvent = Queued | Started | KeepAlive | Chunk
# The events with no word on either API's wire (a prefill's progress among them: a client
# waits for its first token, as from any server). An SSE stream says a KeepAlive as a comment.
Unsaid = Queued | Started | KeepAlive | PrefillProgress


class Failed(Frozen):
    """`generate` raised: refused (an EngineError, the client's to fix) or a fault here."""

    type: Literal["failed"] = "failed"
    message: str
    refused: bool


Event = Chunk | Started | Failed | None  # None: the answer's thread has ended


class CancelFlag(threading.Event):
    """The request's cancel (the board's Esc, a client gone): setting it also tells the loop,
    so a queued request leaves the queue at once."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_set: Callable[[], None]) -> None:
        super().__init__()
        self._loop = loop
        self._on_set = on_set

    def set(self) -> None:
        super().set()
        with contextlib.suppress(RuntimeError):  # a closed loop: nothing waits any more
            self._loop.call_soon_threadsafe(self._on_set)


class Job:
    """One admitted request, from the queue to its last chunk."""

    def __init__(
        self,
        backend: Backend,
        request: ChatRequest,
        cancel: CancelFlag,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.backend = backend
        self.request = request
        self.cancel = cancel
        self.id = ""
        self.events: Inbox[Event] = Inbox(loop)
        self.state: Literal["waiting", "running", "finished"] = "waiting"
        self.position: int | None = None
        self.outcome: RequestState = "done"
        self.detail = ""

    def is_set(self) -> bool:
        """The cancel token `generate` sees (the engine ends an answer at a stop string)."""
        return self.cancel.is_set()


class Scheduler:
    """Admits requests, runs them in order, and keeps the board up to date."""

    def __init__(self, board: RequestBoard, max_waiting: int = MAX_WAITING) -> None:
        self.board = board
        self.max_waiting = max_waiting
        self._waiting: deque[Job] = deque()
        self._running: set[Job] = set()
        self._starting: set[asyncio.Task[None]] = set()  # held: the loop keeps weak references

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def admit(
        self, backend: Backend, request: ChatRequest, api: Literal["openai", "ollama"], client: str
    ) -> Job:
        """Queue `request` (on the loop's thread); 429 when the queue is full."""
        if len(self._waiting) >= self.max_waiting:
            raise ApiError(
                429,
                f"The server is busy: {len(self._running)} answering and {len(self._waiting)} "
                f"waiting, the most it queues. Retry in {RETRY_AFTER_S} seconds",
                "rate_limit_error",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        loop = asyncio.get_running_loop()
        job: Job | None = None

        def cancelled() -> None:
            if job is not None:
                self._cancelled(job)

        job = Job(backend, request, CancelFlag(loop, cancelled), loop)
        job.id = self.board.open(api, backend.card.name, client, job.cancel).id
        self._waiting.append(job)
        self._grant()
        return job

    async def stream(self, job: Job) -> AsyncGenerator[StreamEvent]:
        """The job's chunks, after a `Queued` first if it waits and a `Started` once the
        backend took it (unless a chunk came first), and always a DoneChunk last; a
        `KeepAlive` whenever nothing came for KEEPALIVE_S.
        Raises ApiError when it fails before its first chunk; a later failure is an
        ErrorChunk. Leaving early cancels it. The board shows what was handed over here: an
        answer whose client left before its end is cancelled, however far the model got."""
        meter = _Meter(self.board, job.id)
        sent = done = False
        try:
            if job.state == "waiting" and job.position is not None:
                yield Queued(position=job.position)
                sent = True
            ended = False
            loop = asyncio.get_running_loop()
            last_sent = 0.0
            while not ended:
                taken = await job.events.take(KEEPALIVE_S)
                if not taken:
                    yield KeepAlive()
                    continue
                # The first chunk at once; later ones at most every STREAM_EVERY_S, what came
                # meanwhile in one. (A model slower than that is not held at all: the loop
                # then wakes once a token, not also for a timer.)
                wait = last_sent + STREAM_EVERY_S - loop.time()
                if sent and wait > 0:
                    await job.events.hold(wait)
                    taken += job.events.take_ready()
                meter.saw(taken, job)
                batch = joined(taken)
                if any(not isinstance(event, Started) for event in batch):
                    last_sent = loop.time()  # (a response's start holds no chunk back)
                for event in batch:
                    if event is None:
                        ended = True
                        break
                    if isinstance(event, Failed):
                        if not sent:
                            raise ApiError(
                                400 if event.refused else 500,
                                event.message,
                                "invalid_request_error" if event.refused else "server_error",
                            )
                        yield ErrorChunk(message=event.message)
                        continue
                    sent = True
                    done = isinstance(event, DoneChunk)  # (set first: the reader may close
                    yield event  # the stream at this yield, once it has what it needs)
                    if done:  # the last: the stream ends with it, not once the answer's
                        ended = True  # thread has ended too
                        break
            if not done:  # cancelled (the thread stops at once) or failed: still an ending
                yield cancelled_done()
        finally:
            if not done and job.outcome == "done":  # the client left before the end
                job.outcome, job.detail = "cancelled", job.detail or "cancelled"
            if job.state == "finished":  # (its own board update may have come first)
                self.board.update(job.id, state=job.outcome, detail=job.detail)
            elif not done:
                job.cancel.set()

    def cancel_all(self) -> None:
        """Cancel every request, queued or running (the server is stopping)."""
        for job in [*self._waiting, *self._running]:
            job.cancel.set()

    def _grant(self) -> None:
        while self._waiting and len(self._running) < max(1, self._waiting[0].backend.concurrency):
            job = self._waiting.popleft()
            job.state = "running"
            job.position = None
            self._running.add(job)
            self.board.update(job.id, state="prefilling", queue_position=None)
            task = asyncio.get_running_loop().create_task(self._start(job))
            self._starting.add(task)
            task.add_done_callback(self._starting.discard)
        for position, job in enumerate(self._waiting, 1):
            if job.position != position:
                job.position = position
                self.board.update(job.id, queue_position=position)

    def _cancelled(self, job: Job) -> None:
        if job.state != "waiting":
            return  # a running answer sees its cancel before its next token
        self._waiting.remove(job)
        job.state = "finished"
        self.board.update(job.id, state="cancelled", queue_position=None, detail="while queued")
        job.events.put(None, last=True)
        self._grant()

    def _finished(self, job: Job) -> None:
        self._running.discard(job)
        job.state = "finished"
        self.board.update(job.id, state=job.outcome, detail=job.detail)
        job.events.put(None, last=True)
        self._grant()

    async def _start(self, job: Job) -> None:
        """Start the job's answer; its chunks go to its inbox from the backend's thread."""
        loop = asyncio.get_running_loop()
        ended = threading.Lock()  # taken by the one call that ends the answer
        putting = threading.Lock()  # the first item, and `Started` only before any
        began = False

        def put(event: Event) -> None:
            nonlocal began
            with putting:
                began = True
                # False: the loop has closed, nobody reads this answer.
                if not job.events.put(event, last=isinstance(event, DoneChunk)):
                    job.cancel.set()

        def end() -> None:
            if ended.acquire(blocking=False):
                with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits
                    loop.call_soon_threadsafe(self._finished, job)

        def deliver(item: Chunk | Exception) -> None:
            if isinstance(item, EngineError):
                job.outcome, job.detail = "error", str(item)
                put(Failed(message=str(item), refused=True))
                end()
            elif isinstance(item, Exception):  # a bug or a lost node: said to this client
                log.error("answering %s failed", job.id, exc_info=item)
                job.outcome, job.detail = "error", f"{type(item).__name__}: {item}"
                put(Failed(message=job.detail, refused=False))
                end()
            elif not isinstance(item, PrefillProgress):
                # Neither API has a word for a prefill's progress: a client waits for its
                # first token, as from any server.
                put(item)
                if isinstance(item, DoneChunk):
                    end()

        try:
            taken = await asyncio.to_thread(job.backend.answer, job.request, job, deliver)
        except Exception as error:  # refused before it started (an EngineError), or a fault
            deliver(error)
            return
        with putting:
            if taken and not began:
                began = True
                job.events.put(Started())


class _Meter:
    """A running answer's state, tokens and rate on the board (not on every token)."""

    def __init__(self, board: RequestBoard, request_id: str) -> None:
        self._board = board
        self._id = request_id
        self._first = 0.0
        self._last = 0.0
        self._count = 0
        self._first_count = 0  # the tokens of the first batch, before the rate's clock started

    def saw(self, batch: list[Event], job: Job) -> None:
        """A batch as the stream took it (the tokens counted once a batch, not one by one)."""
        count = 0
        done: DoneChunk | None = None
        for event in batch:
            if isinstance(event, DoneChunk):
                done = event
            elif isinstance(event, ErrorChunk):
                job.outcome, job.detail = "error", event.message
                count += 1
            elif event is not None and not isinstance(event, Failed | Started):
                count += 1
        if count:
            self._counted(count)
        if done is not None:
            if done.finish_reason == "cancelled":
                job.outcome = "cancelled"
            elif done.finish_reason == "error":
                job.outcome = "error"
            job.detail = job.detail or done.finish_reason
            self._board.update(
                self._id,
                prompt_tokens=done.usage.prompt_tokens,
                completion_tokens=done.usage.completion_tokens,
                tokens_per_second=done.stats.decode_tps,
            )

    def _counted(self, count: int) -> None:
        now = time.perf_counter()
        self._count += count
        if not self._first:
            self._first = self._last = now
            self._first_count = self._count
            self._board.update(self._id, state="answering", completion_tokens=self._count)
        elif now - self._last >= BOARD_INTERVAL_S:
            self._last = now
            rate = (self._count - self._first_count) / max(now - self._first, 1e-9)
            self._board.update(self._id, completion_tokens=self._count, tokens_per_second=rate)
