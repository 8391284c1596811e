"""How requests get into the batch, on the model's thread: each one's cache taken from the
prompt cache, and its prompt's rest either through one pass that also gives its first token (a
short rest), or prefilled by the batch a step's share at a time (a long one). Requests that come
together and whose rests are short get their first tokens from one pass for all of them."""
# pyright: reportUnknownMemberType=false, reportUnknownVariableType=false, reportUnknownArgumentType=false
# pyright: reportMissingTypeStubs=false
# (mlx-lm ships no type information.)

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from engine.answer import Answer
from engine.batch_callers import Caller
from engine.batch_entry import enter, enter_rows, first_tokens
from engine.batch_messages import Admission, Refused
from engine.errors import ModelFormatError
from engine.generate import ONE_PASS_TOKENS_PER_LAYER, first_token, not_numbers
from engine.loading import LoadedModel
from engine.prefill import timed_feed
from engine.sampling import Sampler, request_sampler
from engine.types import Chunk, ErrorChunk, PrefillProgress

log = logging.getLogger(__name__)

Reply = Callable[[int, Caller, Sequence[Chunk | Refused]], None]


def unstarted(loaded: LoadedModel, admission: Admission) -> Answer:
    """The answer of a request that ends before anything was computed for it."""
    request, prompt = admission.request, list(admission.prompt)
    return Answer(loaded, request, prompt, 0, admission.max_tokens, admission.started)


@dataclass
class Live:
    """A request in the batch: its id, its answer so far and where its chunks go; and, while
    the batch prefills its prompt, how far that has gone of how many tokens."""

    id: int
    answer: Answer
    caller: Caller
    prefill_total: int = 0
    prefill_done: int = 0
    prefill_offset: int = 0  # fed before it joined the batch (whose progress starts after it)
    repeats_first: bool = False  # its first response is its first token again (batch_entry)

    @property
    def prefilling(self) -> bool:
        return self.prefill_done < self.prefill_total


@dataclass
class Joining:
    """A request on its way into the batch: its cache taken, and what of its prompt that cache
    does not hold yet (`rest`)."""

    admission: Admission
    caller: Caller
    prompt: list[int]
    cache: list[Any]
    rest: list[int]
    answer: Answer
    sampler: Sampler

    @property
    def id(self) -> int:
        return self.admission.id


class Joins:
    """Puts admitted requests into the batch's rows (`live`, by the batch's uid). `reply` sends a
    request its last chunks and forgets its caller."""

    def __init__(
        self,
        loaded: LoadedModel,
        generator: Callable[[], Any],
        live: dict[int, Live],
        reply: Reply,
    ) -> None:
        self.loaded = loaded
        self.one_pass_tokens = ONE_PASS_TOKENS_PER_LAYER * loaded.card.num_layers
        self.stream: Any = None  # the model's thread's stream, set there
        self._generator = generator
        self._live = live
        self._reply = reply

    def start(self, admitted: list[tuple[Admission, Caller]]) -> None:
        """Put these requests into the batch."""
        if len(admitted) == 1:
            self._start_alone(*admitted[0])
        elif admitted:
            self._start_together(admitted)

    def _start_alone(self, admission: Admission, caller: Caller) -> None:
        try:
            self._join(self._taken(admission, caller))
        except Exception as error:  # a fault of this request's first pass: it alone ends
            self._failed_start([(admission, caller)], error)

    def _failed_start(self, admitted: list[tuple[Admission, Caller]], error: Exception) -> None:
        log.exception("A request could not start")
        message = f"Decoding failed: {type(error).__name__}: {error}"
        for admission, caller in admitted:
            answer = unstarted(self.loaded, admission)
            answer.finish = "error"
            self._reply(admission.id, caller, [ErrorChunk(message=message), *answer.done()])

    def _taken(self, admission: Admission, caller: Caller) -> Joining:
        """The request with its cache taken from the prompt cache."""
        prompt = list(admission.prompt)
        cache, rest = self.loaded.prompt_cache.take(self.loaded.model, prompt)
        cached = len(prompt) - len(rest)
        request = admission.request
        answer = Answer(
            self.loaded, request, prompt, cached, admission.max_tokens, admission.started
        )
        answer.prefilling()
        return Joining(admission, caller, prompt, cache, rest, answer, request_sampler(request))

    def _join(self, joining: Joining, together: bool = False) -> None:
        """Put the request into the batch.

        A short rest of the prompt goes through the model here, in the one pass that also gives
        the first token, as `engine.generate` does: the batch would prefill it, then step its
        last token, a second pass over every weight before the first token. A longer rest, one
        that would take more than a step (engine.prefill), or one joining `together` with
        others is prefilled by the batch, a step's share at a time: the others go on decoding,
        its progress is reported after each step, and a cancel lands between them."""
        rest = joining.rest
        pace = self.loaded.prefill_pace
        caller = joining.caller
        probed = self._probe(rest, joining.cache, caller) if pace.tokens_per_s is None else 0
        if together or len(rest) - probed > self.one_pass_tokens or pace.step(len(rest) - probed):
            (uid,) = self._generator().insert(
                [rest[probed:]],
                max_tokens=[joining.admission.max_tokens],
                caches=[joining.cache],
                all_tokens=[joining.prompt[: len(joining.prompt) - len(rest) + probed]],
                samplers=[joining.sampler],
            )
            total = len(rest)
            self._live[uid] = Live(joining.id, joining.answer, caller, total, probed, probed)
            return
        name = self.loaded.card.name
        try:
            first = first_token(
                self.loaded.model,
                rest[probed:],
                joining.cache,
                joining.sampler,
                self.one_pass_tokens,
                name,
                self.stream,
                pace,
            )
        except ModelFormatError as error:  # the weights are not numbers: raised in its caller
            self._reply(joining.id, caller, [Refused(cause=error.cause, fix=error.fix)])
            return
        if probed:
            caller.replies.put(PrefillProgress(done=len(rest), total=len(rest)))
        token = cast(int, first.item())
        if not self._first(joining, token):
            self._ended(joining, joining.cache)
        else:
            uid = enter(
                self._generator(),
                token,
                joining.prompt,
                joining.cache,
                joining.sampler,
                joining.admission.max_tokens,
            )
            self._live[uid] = Live(joining.id, joining.answer, caller, repeats_first=True)

    def _first(self, joining: Joining, token: int) -> bool:
        """Send the request its first token; False when that ended it (its end, a length of one
        or a stop string)."""
        for chunk in joining.answer.token(token):
            joining.caller.replies.put(chunk)
        return joining.answer.finish is None

    def _ended(self, joining: Joining, cache: list[Any]) -> None:
        """A request that ended with its first token: its prompt's cache is kept (the first
        token was never fed), and its answer ends."""
        self.loaded.prompt_cache.keep(joining.prompt, cache)
        self._reply(joining.id, joining.caller, joining.answer.done())

    def _start_together(self, admitted: list[tuple[Admission, Caller]]) -> None:
        """Requests that came together. Those whose rests fit one pass between two steps get
        their first tokens from one pass for all (`batch_entry.first_tokens`); where each one
        would take a pass of its own, or the batch two (all but the last token, then the
        last). The batch prefills the others together, a step's share at a time."""
        joining: list[Joining] = []
        try:
            for admission, caller in admitted:
                joining.append(self._taken(admission, caller))
        except Exception as error:
            self._failed_start(admitted, error)
            return
        pace = self.loaded.prefill_pace
        joining.sort(key=lambda j: len(j.rest))
        one_pass = [j for j in joining if len(j.rest) <= self.one_pass_tokens]
        while len(one_pass) > 1 and pace.step(len(one_pass[-1].rest), len(one_pass)):
            one_pass.pop()
        if len(one_pass) < 2:
            one_pass = []
        for each in joining[len(one_pass) :]:
            try:
                self._join(each, together=True)
            except Exception as error:
                self._failed_start([(each.admission, each.caller)], error)
        if one_pass:
            self._join_in_one_pass(one_pass)

    def _join_in_one_pass(self, joining: list[Joining]) -> None:
        started = time.perf_counter()
        try:
            merged, tokens, finite = first_tokens(
                self.loaded.model,
                [j.rest for j in joining],
                [j.cache for j in joining],
                [j.sampler for j in joining],
                self.stream,
            )
        except Exception as error:  # a fault of their pass: they alone end
            self._failed_start([(j.admission, j.caller) for j in joining], error)
            return
        self.loaded.prefill_pace.record(
            sum(len(j.rest) for j in joining), time.perf_counter() - started
        )
        keep: list[int] = []
        for row, each in enumerate(joining):
            if not finite[row]:
                error = not_numbers(self.loaded.card.name)
                self._reply(each.id, each.caller, [Refused(cause=error.cause, fix=error.fix)])
            elif not self._first(each, tokens[row]):
                self._ended(each, [layer.extract(row) for layer in merged])
            else:
                keep.append(row)
        if not keep:
            return
        if len(keep) < len(joining):
            for layer in merged:
                layer.filter(keep)
        uids = enter_rows(
            self._generator(),
            [tokens[row] for row in keep],
            [joining[row].prompt for row in keep],
            merged,
            [joining[row].sampler for row in keep],
            [joining[row].admission.max_tokens for row in keep],
        )
        for uid, row in zip(uids, keep, strict=True):
            each = joining[row]
            self._live[uid] = Live(each.id, each.answer, each.caller, repeats_first=True)

    def _probe(self, rest: list[int], cache: list[Any], caller: Caller) -> int:
        """The model's first prompt: a small first step measures its speed, which sizes the
        rest (engine.prefill); the tokens it fed."""
        size = self.loaded.prefill_pace.step(len(rest))
        if not size or size >= len(rest):
            return 0
        timed_feed(self.loaded.model, rest[:size], cache, self.loaded.prefill_pace, self.stream)
        caller.replies.put(PrefillProgress(done=size, total=len(rest)))
        return size
