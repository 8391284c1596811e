"""Continuous batching: concurrent requests to one loaded model decode together, each with its
own prompt cache, sampler and chunks.

One thread owns the model and runs mlx-lm's `BatchGenerator`; any number of threads call
`BatchEngine.generate` and get the chunks `engine.generate` would give them. A request joins
the batch at the next step (`engine.batch_joins`) and leaves it at the step it ends (its end,
its length, a stop string, a cancel, or its caller closing the stream), and its cache goes back
to the model's prompt cache, so a chat's next turn prefills only what is new. The next-turn
prefill runs on the same thread while no request is active, and a request that arrives stops
it.
"""
# pyright: reportUnknownMemberType=false, reportUnknownVariableType=false, reportUnknownArgumentType=false
# pyright: reportMissingTypeStubs=false
# (mlx-lm ships no type information.)

from __future__ import annotations

import atexit
import itertools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Sequence
from typing import Any

import mlx.core as mx
from mlx_lm.generate import BatchGenerator
from mlx_lm.models.cache import make_prompt_cache

from engine import mlx_threads
from engine.answer import failure_chunks, is_harmony
from engine.batch_callers import (
    Caller,
    Deliver,
    PrefillCaller,
    Replies,
    as_cancelled,
)
from engine.batch_joins import Joins, Live, unstarted
from engine.batch_messages import (
    Admission,
    Closing,
    Message,
    PrefillAsked,
    PrefillDone,
    Refused,
    Withdrawal,
)
from engine.errors import EngineError, RequestError
from engine.generate import (
    PREFILL_STEP,
    CancelToken,
    NeverCancelled,
    not_numbers,
    prefill_next_turn,
    prepared,
)
from engine.kv_memory import CacheRoom, format_bytes, free_memory_bytes, kv_bytes_per_position
from engine.loading import LoadedModel
from engine.types import (
    ChatRequest,
    Chunk,
    DoneChunk,
    ErrorChunk,
    PrefillProgress,
)

log = logging.getLogger(__name__)


DEFAULT_BATCH = 16  # requests decoded together; more wait for a slot (serve --max-batch)
# Long prompts the batch prefills together, at most (mlx_lm.server's --prompt-concurrency): a
# step's activations grow with each.
PREFILL_BATCH = 8
# Steps between two looks at the memory free (psutil reads /proc): the caches grow every 256.
MEMORY_CHECK_STEPS = 32


# Engines not closed yet. An interpreter that exits while a model's thread decodes aborts, so
# at exit each is closed first (which waits for the step under way).
_open: set[BatchEngine] = set()


@atexit.register
def _close_open_engines() -> None:
    for batch in list(_open):
        batch.close()


def batchable(loaded: LoadedModel) -> bool:
    """Whether this model's requests can decode together: every layer's cache must merge into
    a batch (mlx-lm's caches that do have `merge`).

    gpt-oss (harmony) stays one request at a time. Batched (mlx-lm's BatchRotatingKVCache for
    its sliding-window layers) its answers are the same tokens, but the batch keeps only each
    answer's cache, and one past its window cannot be cut back to serve the next turn, which
    rarely continues the answer as written (harmony drops the reasoning; API clients send none
    back). Alone, the engine keeps the prompt's cache too (engine.generate)."""
    if is_harmony(loaded):
        return False
    return all(hasattr(cache, "merge") for cache in make_prompt_cache(loaded.model))


class _PrefillStop:
    """A next-turn prefill stops at its cancel, or when anything else reaches the thread."""

    def __init__(self, cancel: CancelToken, inbox: queue.Queue[Message]) -> None:
        self._cancel = cancel
        self._inbox = inbox

    def is_set(self) -> bool:
        return self._cancel.is_set() or not self._inbox.empty()


class BatchEngine:
    """A loaded model that answers up to `max_batch` requests at once, decoded together."""

    def __init__(
        self,
        loaded: LoadedModel,
        max_batch: int = DEFAULT_BATCH,
        free_memory: Callable[[], int] = free_memory_bytes,
    ) -> None:
        """`free_memory`: the bytes this machine has free (the system's own reading)."""
        if max_batch < 1:
            raise ValueError(f"max_batch is {max_batch}; it must be 1 or more")
        self.loaded = loaded
        self.max_batch = max_batch
        card = loaded.card
        self._room = CacheRoom(
            kv_bytes_per_position(card, card.num_layers, card.num_kv_heads), free_memory
        )
        self._steps_to_look = 0  # steps until the next look at the memory free
        self._inbox: queue.Queue[Message] = queue.Queue()
        self._ids = itertools.count()
        self._lock = threading.Lock()  # over the two tables of callers
        self._callers: dict[int, Caller] = {}
        self._prefill_callers: dict[int, PrefillCaller] = {}
        # The model's thread's own state.
        self._waiting: deque[Admission] = deque()
        self._live: dict[int, Live] = {}  # by the batch's uid
        self._prefills: deque[PrefillAsked] = deque()
        self._stream: Any = None  # the model's thread's own, made there
        self._batch: Any = None  # BatchGenerator, made when a request first needs it
        self.most_at_once = 0  # the most requests one step has decoded
        self._joins = Joins(loaded, self._generator, self._live, self._reply)
        self._closed = threading.Event()  # set under the lock: nothing is sent after it
        _open.add(self)
        mlx_threads.start(self._run)

    # The callers' side.

    def submit(self, request: ChatRequest, cancel: CancelToken | None, deliver: Deliver) -> int:
        """Start the answer to `request`, decoded with the other requests: `deliver` gets each
        chunk from the model's thread as it is made (no thread of the caller's wakes for it),
        the last a DoneChunk, or an EngineError in its place. Cancel it with `cancel`. Raises
        RequestError at once when the request cannot be served. Returns the request's id."""
        started = time.perf_counter()
        prompt, max_tokens = prepared(self.loaded, request)
        need = self._room.batch(1, len(prompt))
        if need > self._room.spare() + self.loaded.prompt_cache.nbytes:
            raise self._no_memory(len(prompt), need)  # (the model's thread looks again)
        ident = next(self._ids)
        token = cancel or NeverCancelled()
        caller = Caller(Replies(deliver, token), token)
        with self._lock:
            self._callers[ident] = caller
        admission = Admission(
            id=ident, request=request, prompt=tuple(prompt), max_tokens=max_tokens, started=started
        )
        if not self._send(admission):
            for chunk in failure_chunks(
                f"{self.loaded.card.name} was unloaded", prompt_tokens=len(prompt)
            ):
                deliver(chunk)
        return ident

    def generate(self, request: ChatRequest, cancel: CancelToken | None = None) -> Generator[Chunk]:
        """Stream the answer to `request` (see `submit`) on the caller's thread; the last chunk
        is a DoneChunk. Raises RequestError before any chunk when the request cannot be
        served. Closing the stream early frees its slot."""
        replies: queue.Queue[Chunk | EngineError] = queue.Queue()
        token = cancel or NeverCancelled()
        ident = self.submit(request, token, replies.put)
        ended = False
        try:
            while True:
                item = replies.get()
                if isinstance(item, EngineError):
                    ended = True
                    raise item
                ended = isinstance(item, DoneChunk)
                # Asked again as it is read: a caller who stopped while chunks waited here.
                chunk = as_cancelled(item, token)
                if chunk is not None:
                    yield chunk
                if ended:
                    return
        finally:
            if not ended:  # the caller closed the stream: free its slot
                self._send(Withdrawal(id=ident))

    def prefill_next(
        self, request: ChatRequest, cancel: CancelToken | None = None, draft: str = ""
    ) -> int:
        """`prefill_next_turn` on the model's thread once no request is active; blocks until it
        is done. A request that arrives, or `cancel`, stops it between steps."""
        ident = next(self._ids)
        caller = PrefillCaller(queue.Queue(), cancel or NeverCancelled())
        with self._lock:
            self._prefill_callers[ident] = caller
        if not self._send(PrefillAsked(id=ident, request=request, draft=draft)):
            return 0
        done = caller.replies.get()
        if done.cause is not None:
            raise RequestError(done.cause, done.fix)
        return done.tokens

    def close(self) -> None:
        """End every request (cancelled) and let go of the model's thread (which waits for
        other work: see engine.mlx_threads); requests after it get an error."""
        if self._send(Closing()):
            self._closed.wait()
        _open.discard(self)

    def _send(self, message: Message) -> bool:
        """Hand `message` to the model's thread; False once it has let go of the model."""
        with self._lock:
            if self._closed.is_set():
                return False
            self._inbox.put(message)
            return True

    # The model's thread.

    def _run(self) -> None:
        # MLX's streams belong to the thread that made them: this thread decodes on its own.
        self._stream = mx.new_stream(mx.default_device())
        self._joins.stream = self._stream
        try:
            while self._serving():
                pass
        finally:
            mx.synchronize(self._stream)
            mx.synchronize()
            with self._lock:
                self._closed.set()
            self._refuse_the_rest()

    def _serving(self) -> bool:
        """`_serve`, and a fault in it (a bug, MLX failing) ends the requests it touched with
        an error instead of the thread: the requests after them are answered."""
        try:
            return self._serve()
        except Exception as error:
            log.exception("The model's thread failed")
            self._fail_all(f"Decoding failed: {type(error).__name__}: {error}")
            return True

    def _refuse_the_rest(self) -> None:
        """Answer what was sent before the thread let go: nothing is sent after."""
        for message in self._messages(block=False):
            if isinstance(message, Admission):
                with self._lock:
                    caller = self._callers.pop(message.id, None)
                if caller is not None:
                    for chunk in failure_chunks(
                        f"{self.loaded.card.name} was unloaded", prompt_tokens=len(message.prompt)
                    ):
                        caller.replies.put(chunk)
            elif isinstance(message, PrefillAsked):
                with self._lock:
                    prefill = self._prefill_callers.pop(message.id, None)
                if prefill is not None:
                    prefill.replies.put(PrefillDone())

    def _serve(self) -> bool:
        """One round: read what came, start and end requests, one step. False: closing."""
        idle = not (self._live or self._waiting or self._prefills)
        if self._read(self._messages(block=idle)):
            self._close()
            return False
        self._end_cancelled()
        if self._admit():
            # Requests that came while those took their first pass join before the step, so
            # the batch starts them all with one pass. A step later, the batch would take a
            # pass for them apart from its own step, then copy every running request's cache
            # to make room for theirs (mlx-lm's `extend`). Once a round: requests that each
            # end with their first token, sent without pause, would otherwise hold the step
            # back from the ones decoding.
            late = self._messages(block=False)
            if self._read(late):
                self._close()
                return False
            if late:
                self._end_cancelled()
                self._admit()
        if self._live:
            self._keep_room()
        if self._live:
            self._step()
        elif self._prefills and not self._waiting:
            self._prefill(self._prefills.popleft())
        return True

    def _read(self, messages: list[Message]) -> bool:
        """Take in what came; True: the engine is closing."""
        closing = False
        for message in messages:
            match message:
                case Admission():
                    self._waiting.append(message)
                case Withdrawal():
                    self._withdraw(message.id)
                case PrefillAsked():
                    self._prefills.append(message)
                case Closing():
                    closing = True
        return closing

    def _messages(self, block: bool) -> list[Message]:
        messages: list[Message] = [self._inbox.get()] if block else []
        while True:
            try:
                messages.append(self._inbox.get_nowait())
            except queue.Empty:
                return messages

    def _generator(self) -> Any:
        if self._batch is None:
            tokenizer: Any = self.loaded.tokenizer
            self._batch = BatchGenerator(
                self.loaded.model,
                stop_tokens=[[token] for token in tokenizer.eos_token_ids],
                completion_batch_size=self.max_batch,
                prefill_batch_size=min(self.max_batch, PREFILL_BATCH),
                prefill_step_size=PREFILL_STEP,
                stream=self._stream,
            )
        return self._batch

    def _admit(self) -> int:
        """Start the waiting requests there is room for, in slots and in memory; how many
        started. One the memory free could not hold even alone is refused."""
        admitted: list[tuple[Admission, Caller]] = []
        while self._waiting and len(self._live) + len(admitted) < self.max_batch:
            admission = self._waiting[0]
            with self._lock:
                caller = self._callers.get(admission.id)
            if caller is not None:  # (its cancel was looked at this round)
                rows = len(self._live) + len(admitted)
                live = max((_length(each) for each in self._live.values()), default=0)
                longest = max([live, len(admission.prompt)] + [len(a.prompt) for a, _ in admitted])
                # What the batch would take with it, less what its caches hold already.
                need = self._room.batch(rows + 1, longest) - self._room.held(len(self._live), live)
                if need > self._room.spare():
                    if rows:
                        break  # it waits for answers to end
                    if not self._freed(need):
                        self._waiting.popleft()
                        self._refuse_for_memory(admission, caller, need)
                        continue
                admitted.append((admission, caller))
            self._waiting.popleft()
        self._joins.start(admitted)
        return len(admitted)

    def _freed(self, need: int) -> bool:
        """Let go of what is only kept for later (the prompt cache, MLX's spare buffers);
        whether `need` bytes then fit."""
        self.loaded.prompt_cache.clear()
        mx.clear_cache()
        return need <= self._room.spare()

    def _refuse_for_memory(self, admission: Admission, caller: Caller, need: int) -> None:
        error = self._no_memory(len(admission.prompt), need)
        refused = Refused(cause=error.cause, fix=error.fix, about="request")
        self._reply(admission.id, caller, [refused])

    def _no_memory(self, prompt_tokens: int, need: int) -> RequestError:
        return RequestError(
            f"The prompt's cache would take {format_bytes(need)} ({prompt_tokens} tokens and "
            f"room to answer), more than the {format_bytes(max(0, self._room.spare()))} this "
            "machine has free for it",
            "Shorten the conversation, or free memory on this machine",
        )

    def _keep_room(self) -> None:
        """Every MEMORY_CHECK_STEPS steps: where the batch's caches could not grow once more
        in the memory free, the longest answer ends there (its length), and so on until they
        could: the machine never runs out of memory under them."""
        self._steps_to_look -= 1
        if self._steps_to_look > 0:
            return
        self._steps_to_look = MEMORY_CHECK_STEPS
        growth = self._room.growing(len(self._live))
        if growth <= self._room.spare() or self._freed(growth):
            return
        while self._live and self._room.growing(len(self._live)) > self._room.spare():
            uid, live = max(self._live.items(), key=lambda item: _length(item[1]))
            log.warning(
                "Memory is short: an answer ends at %d tokens, its cache's growth would not fit",
                len(live.answer.token_ids),
            )
            live.answer.finish = "length"
            self._remove(uid)
            self.loaded.prompt_cache.clear()  # (what `_remove` kept of it)
        self._steps_to_look = 1  # looked at again before the next step

    def _step(self) -> None:
        batch = self._generator()
        prefilling = [live for live in self._live.values() if live.prefilling]
        if not prefilling:
            _, responses = batch.next()
        else:
            pace = self.loaded.prefill_pace
            longest = max(live.prefill_total - live.prefill_done for live in prefilling)
            # A step's share of the prompts in the batch; 0: the rest goes in one (capped).
            batch.prefill_step_size = pace.step(longest, len(prefilling)) or PREFILL_STEP
            with batch.stats() as stats:
                prompted, responses = batch.next()
            pace.record(stats.prompt_tokens, stats.prompt_time)
            self._report_prefill(prompted)
        self.most_at_once = max(self.most_at_once, len(responses))
        ended: list[Any] = []  # the caches of the requests that ended, computed after the loop
        for response in responses:
            live = self._live.get(response.uid)
            if live is None:
                continue
            answer = live.answer
            if live.repeats_first:
                live.repeats_first = False
                continue
            if not answer.token_ids and not self._finite(response):
                continue
            for chunk in answer.token(int(response.token)):
                live.caller.replies.put(chunk)
            if response.finish_reason is not None:  # the generator ended it (its end, its length)
                if answer.finish is None:
                    answer.finish = "length" if response.finish_reason == "length" else "stop"
                self._end(response.uid, response.prompt_cache, response.all_tokens, ended)
            elif answer.finish is not None:  # a stop string
                self._remove(response.uid, ended)
        # Every request's chunks went out before any cache is computed, which waits for the
        # step the batch has already begun (mlx-lm dispatches the next before it reads this
        # one's tokens).
        if ended:
            mx.eval(ended)

    def _report_prefill(self, prompted: list[Any]) -> None:
        """Tell each request whose prompt went a step further how far it has gone."""
        for response in prompted:
            live = self._live.get(response.uid)
            if live is None or not live.prefill_total:
                continue
            done = min(live.prefill_offset + int(response.progress[0]), live.prefill_total)
            if done > live.prefill_done:
                live.prefill_done = done
                live.caller.replies.put(PrefillProgress(done=done, total=live.prefill_total))

    def _finite(self, response: Any) -> bool:
        """Whether a request's first logits (of a prompt the batch prefilled) are numbers; if
        not, its caller is told why, as `first_token` does, and its cache is dropped."""
        if bool(mx.all(mx.isfinite(response.logprobs)).item()):
            return True
        live = self._live.pop(response.uid)
        if response.finish_reason is None:
            self._generator().remove([response.uid])
        error = not_numbers(self.loaded.card.name)
        self._reply(live.id, live.caller, [Refused(cause=error.cause, fix=error.fix)])
        return False

    def _remove(self, uid: int, ended: list[Any] | None = None) -> None:
        """Take `uid` out of the batch; its cache goes back to the prompt cache (see `_end`)."""
        caches = self._generator().remove([uid], return_prompt_caches=True)
        cache, tokens = caches[uid]
        self._end(uid, cache, tokens, ended)

    def _end(
        self, uid: int, cache: list[Any], tokens: list[int], ended: list[Any] | None = None
    ) -> None:
        """End the request: its cache is kept for a next turn, its end sent, then its cache
        computed, or added to `ended` for its caller to compute. Computed on this thread: a
        lazy array built on this thread's stream cannot be computed on another (the next
        engine's, or the one-at-a-time path's)."""
        live = self._live.pop(uid)
        if tokens:  # (none: it left before any of its prompt went through the model)
            self.loaded.prompt_cache.keep(list(tokens), cache)
        self._reply(live.id, live.caller, live.answer.done())
        if tokens:
            state = [layer.state for layer in cache]
            if ended is None:
                mx.eval(state)
            else:
                ended.append(state)

    def _reply(self, ident: int, caller: Caller, chunks: Sequence[Chunk | Refused]) -> None:
        for chunk in chunks:
            caller.replies.put(chunk)
        with self._lock:
            self._callers.pop(ident, None)

    def _end_cancelled(self) -> None:
        for uid, live in list(self._live.items()):
            if live.caller.cancel.is_set():
                live.answer.cancel()
                self._remove(uid)
        for admission in list(self._waiting):
            with self._lock:
                caller = self._callers.get(admission.id)
            if caller is not None and caller.cancel.is_set():
                self._waiting.remove(admission)
                self._cancel_waiting(admission, caller)

    def _cancel_waiting(self, admission: Admission, caller: Caller) -> None:
        """End a request that never joined the batch: nothing was computed for it."""
        answer = unstarted(self.loaded, admission)
        answer.cancel()
        self._reply(admission.id, caller, answer.done())

    def _withdraw(self, ident: int) -> None:
        with self._lock:
            self._callers.pop(ident, None)
        self._waiting = deque(a for a in self._waiting if a.id != ident)
        for uid, live in list(self._live.items()):
            if live.id == ident:
                live.answer.cancel()
                self._remove(uid)

    def _fail_all(self, message: str) -> None:
        """End every live request with `message`; the next request gets a fresh generator
        (its caches may be half-updated, and are not kept)."""
        self._batch = None
        for live in self._live.values():
            live.answer.finish = "error"
            self._reply(live.id, live.caller, [ErrorChunk(message=message), *live.answer.done()])
        self._live.clear()

    def _prefill(self, asked: PrefillAsked) -> None:
        with self._lock:
            caller = self._prefill_callers.pop(asked.id, None)
        if caller is None:
            return
        stop = _PrefillStop(caller.cancel, self._inbox)
        try:
            tokens = prefill_next_turn(self.loaded, asked.request, stop, asked.draft)
        except EngineError as error:
            caller.replies.put(PrefillDone(cause=error.cause, fix=error.fix))
        except Exception as error:  # a bug: said to the caller, and the thread goes on
            log.exception("A next-turn prefill failed")
            caller.replies.put(
                PrefillDone(cause=f"The prefill failed: {type(error).__name__}: {error}")
            )
        else:
            caller.replies.put(PrefillDone(tokens=tokens))

    def _close(self) -> None:
        for uid, live in list(self._live.items()):
            live.answer.cancel()
            self._remove(uid)
        while self._waiting:
            admission = self._waiting.popleft()
            with self._lock:
                caller = self._callers.get(admission.id)
            if caller is not None:
                self._cancel_waiting(admission, caller)
        with self._lock:
            prefills = list(self._prefill_callers.values())
            self._prefill_callers.clear()
        for prefill in prefills:
            prefill.replies.put(PrefillDone())
        if self._batch is not None:
            self._batch.close()
            self._batch = None


def _length(live: Live) -> int:
    """The positions a request's cache holds: its prompt and its answer so far."""
    return len(live.answer.prompt) + len(live.answer.token_ids)
