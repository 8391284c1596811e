"""A chat request in, a stream of typed chunks out: text, reasoning, tool calls, errors, done."""
# pyright: reportUnknownVariableType=false, reportUnknownMemberType=false, reportMissingTypeStubs=false
# (mlx-lm and mlx.nn ship no complete type information.)

from __future__ import annotations

import math
import time
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any, Protocol, cast

import jinja2
import mlx.core as mx
import mlx.nn as nn
from mlx_lm.generate import generate_step, generation_stream, wired_limit

from engine.answer import Answer, is_harmony
from engine.errors import ModelFormatError, RequestError
from engine.harmony import render_gpt_oss_prompt
from engine.kernels import routing
from engine.loading import LoadedModel
from engine.parsers import tool_schema
from engine.prefill import MAX_STEP, Agree, PrefillPace, feed, prefill_steps, timed_feed
from engine.prompt_cache import trims_at_any_length
from engine.sampling import Sampler, request_sampler
from engine.types import ChatRequest, Chunk, Message, PrefillProgress


class CancelToken(Protocol):
    """Anything with `is_set()`, e.g. `threading.Event`; checked before every token."""

    def is_set(self) -> bool: ...


class NeverCancelled:
    def is_set(self) -> bool:
        return False


def message_dict(message: Message) -> dict[str, Any]:
    """A message as Hugging Face chat templates expect it."""
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.reasoning:
        out["reasoning_content"] = message.reasoning
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in message.tool_calls
        ]
    if message.tool_call_id:
        out["tool_call_id"] = message.tool_call_id
    if message.name:
        out["name"] = message.name
    return out


SEED_LIMIT = 2**64  # MLX's random seed is an unsigned 64-bit integer


def validate(request: ChatRequest) -> None:
    """Raise RequestError, naming the field, its value and the valid range, for a request no
    model can serve. Every entry point calls it (the CLI before loading, generate() on every
    rank), so a request from a peer is checked like one typed here.

    Not constraints on the pydantic model: a peer's out-of-range request would then be a
    malformed frame, which closes its session, where it should get the error back."""
    if not request.messages:
        raise RequestError("The chat request has no messages", "Send at least one user message")
    last = request.messages[-1]
    if last.role == "user" and not last.content.strip():
        raise RequestError("The prompt is empty", "Type a message, or pass --prompt TEXT")
    if request.max_tokens < 1:
        raise RequestError(
            f"max_tokens is {request.max_tokens}, but it must be 1 or more",
            "Ask for at least one token (--max-tokens N)",
        )
    if not math.isfinite(request.temperature) or request.temperature < 0:
        raise RequestError(
            f"temperature is {request.temperature}, but it must be a finite number of at least 0",
            "Use 0 for greedy or a positive value (--temperature T)",
        )
    if not math.isfinite(request.top_p) or not 0 < request.top_p <= 1:
        raise RequestError(
            f"top_p is {request.top_p}, but it must be above 0 and at most 1",
            "Use 1 to sample from every token, or a share such as 0.9 (--top-p P)",
        )
    if request.seed is not None and not 0 <= request.seed < SEED_LIMIT:
        raise RequestError(
            f"seed is {request.seed}, outside 0 to 2^64 - 1",
            "Use a whole number from 0 to 18446744073709551615 (--seed S)",
        )


def render_prompt(loaded: LoadedModel, request: ChatRequest) -> list[int]:
    """The prompt token ids: the model's own chat template with the tools, ending in its turn
    (a raw request's text as it stands)."""
    tokenizer: Any = loaded.tokenizer
    if request.raw:
        return list(tokenizer.encode("".join(m.content for m in request.messages)))
    if is_harmony(loaded):
        return render_gpt_oss_prompt(request.messages, request.tools)
    messages = [message_dict(m) for m in request.messages]
    if getattr(tokenizer, "chat_template", None) is None:
        text = "\n".join(m.content for m in request.messages)
        return list(tokenizer.encode(text))
    kwargs: dict[str, Any] = {"add_generation_prompt": True}
    if request.tools:
        kwargs["tools"] = [tool_schema(t) for t in request.tools]
    if request.enable_thinking is not None:
        kwargs["enable_thinking"] = request.enable_thinking
    try:
        rendered: Any = tokenizer.apply_chat_template(messages, **kwargs)
    except jinja2.TemplateError as error:
        # A RequestError, not a model error: a sound template may refuse some conversations
        # (roles out of order) with raise_exception, and a rank keeps serving the next one.
        raise RequestError(
            f"The chat template of {loaded.card.name} cannot render this conversation: "
            f"{type(error).__name__}: {error}",
            f"Fix the chat_template in {Path(loaded.card.path) / 'tokenizer_config.json'} "
            "(or its chat_template.jinja)",
        ) from None
    # Newer transformers may return a BatchEncoding instead of the ids.
    ids = cast(list[int], rendered["input_ids"] if isinstance(rendered, dict) else rendered)
    return [int(t) for t in ids]


# The rest of the prompt goes through the model in one pass that also gives the first token, up
# to this many tokens per layer of the model. mlx-lm prefills all but the last token, then steps
# that one: a second pass over every weight, and it builds the second token's step before it
# hands out the first, so one pass gives the first token sooner. Past it, one pass costs more
# than it saves: a prefill skips the last layer's attention output and MLP (the cache needs
# neither), which one pass computes for every token; the fewer the layers, the sooner that
# extra work outweighs the saved pass.
ONE_PASS_TOKENS_PER_LAYER = 32
PREFILL_STEP = MAX_STEP  # tokens a step when a prefill is longer (mlx-lm's prefill step)


def last_position_logits(
    model: Any, tokens: mx.array, cache: list[Any], positions: list[int] | None = None
) -> mx.array:
    """The logits of the last of `tokens` only ([batch, vocabulary]), or of each row's own
    position in `positions` (rows of different lengths, padded on the right).

    mlx-lm's models apply their head to what their body (`model.model`) returns; for this call
    the body's output is cut to its last position, so the head, as wide as the vocabulary,
    runs once instead of once per token (150k entries in a real model's vocabulary)."""
    body = model.get("model") if isinstance(model, nn.Module) else None
    if not isinstance(body, nn.Module):
        logits = cast(mx.array, model(tokens, cache=cache))
        return logits[:, -1, :] if positions is None else _at(logits, positions)[:, -1, :]
    # An attribute of the instance shadows the child module (which stays among the parameters).
    vars(model)["model"] = _LastPosition(body, positions)
    try:
        logits = model(tokens, cache=cache)
    finally:
        del vars(model)["model"]
    return logits[:, -1, :]


class _LastPosition:
    """A model's body whose output is cut to its last position; the rest of it as it is (a head
    tied to the embeddings reads `model.embed_tokens`)."""

    def __init__(self, body: nn.Module, positions: list[int] | None = None) -> None:
        self._body = body
        self._positions = positions

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        hidden = self._body(*args, **kwargs)
        if not isinstance(hidden, mx.array) or hidden.ndim != 3:
            return hidden
        return hidden[:, -1:, :] if self._positions is None else _at(hidden, self._positions)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._body, name)


def _at(hidden: mx.array, positions: list[int]) -> mx.array:
    """Each row's vector at its own position ([batch, 1, width])."""
    return hidden[mx.arange(len(positions)), mx.array(positions)][:, None, :]


def first_token(
    model: Any,
    rest: list[int],
    cache: list[Any],
    sampler: Sampler,
    one_pass_tokens: int,
    name: str = "The model",
    stream: Any = None,
    pace: PrefillPace | None = None,
) -> mx.array:
    """The token after `rest` (computed), with `rest` put into `cache`: the rest in one pass
    that gives the token (a rest longer than `one_pass_tokens`: all but its last token into the
    cache first). On `stream`, mlx-lm's generation stream unless given; the speed goes into
    `pace`.

    Raises ModelFormatError when the logits are not numbers."""
    last_pass = min(len(rest), PREFILL_STEP) if len(rest) <= one_pass_tokens else 1
    head, tail = rest[: len(rest) - last_pass], rest[len(rest) - last_pass :]
    started = time.perf_counter()
    with mx.stream(stream or generation_stream):
        for start in range(0, len(head), PREFILL_STEP):
            feed(model, head[start : start + PREFILL_STEP], cache)
        logits = last_position_logits(model, mx.array(tail)[None], cache)
        first = sampler(logits - routing.logsumexp(logits, keepdims=True))
        finite = mx.all(mx.isfinite(logits))
        mx.eval(first, finite)
    if pace is not None:
        pace.record(len(rest), time.perf_counter() - started)
    if not finite.item():
        raise not_numbers(name)
    return first


def not_numbers(name: str) -> ModelFormatError:
    """What logits that are not numbers say: weights that are not numbers give NaN logits,
    which sample as token 0 forever."""
    return ModelFormatError(
        f"{name} computes NaN or infinite logits for this prompt: its weights hold values "
        "that are not numbers (corrupt or garbage bytes in its safetensors files)",
        "Download or convert the model again",
    )


def sampled_tokens(
    model: Any,
    rest: list[int],
    cache: list[Any],
    sampler: Sampler,
    max_tokens: int,
    one_pass_tokens: int,
    name: str = "The model",
    pace: PrefillPace | None = None,
) -> Iterator[int]:
    """The tokens that continue `rest` after `cache`: the first from `first_token`, then
    mlx-lm's `generate_step` (which overlaps building each step with computing the one before).

    Each token is fed to the model (into `cache`) before it comes out, except the first: it is
    fed with the step that computes the second."""
    first = first_token(model, rest, cache, sampler, one_pass_tokens, name, pace=pace)
    yield cast(int, first.item())
    if max_tokens == 1:
        return
    for token, _ in generate_step(
        first, model, max_tokens=max_tokens - 1, sampler=sampler, prompt_cache=cache
    ):
        yield int(token)


def prepared(loaded: LoadedModel, request: ChatRequest) -> tuple[list[int], int]:
    """The prompt's token ids and the most tokens the answer may take.

    Raises RequestError when the request cannot be served (see `validate`, and a prompt the
    model's context cannot hold)."""
    validate(request)
    prompt = render_prompt(loaded, request)
    context = loaded.context_length
    if context is not None and len(prompt) >= context:
        raise RequestError(
            f"The prompt is {len(prompt)} tokens but {loaded.card.name} holds at most {context}",
            "Shorten the message or start a new chat",
        )
    max_tokens = (
        request.max_tokens if context is None else min(request.max_tokens, context - len(prompt))
    )
    return prompt, max_tokens


def generate(
    loaded: LoadedModel,
    request: ChatRequest,
    cancel: CancelToken | None = None,
    agree: Agree | None = None,
) -> Generator[Chunk]:
    """Stream the answer to `request`; the last chunk is always a DoneChunk. A prompt that
    takes more than a step to prefill reports its progress first (PrefillProgress), and a
    cancel between its steps ends the answer there. `agree`: on a ring's ranks, rank 0's size
    of each step (see engine.prefill).

    Raises RequestError before anything is generated when the request cannot be served.
    """
    started = time.perf_counter()
    cancel = cancel or NeverCancelled()
    if agree is None and loaded.ranks > 1:
        agree = _no_steps  # the ranks must take the same steps: with no say, none
    prompt, max_tokens = prepared(loaded, request)
    cache, rest = loaded.prompt_cache.take(loaded.model, prompt)
    answer = Answer(loaded, request, prompt, len(prompt) - len(rest), max_tokens, started)
    sampler = request_sampler(request)
    mx.reset_peak_memory()

    prefilled = 0  # of `rest`, before the first token's pass
    # A cache that cannot be cut back (a sliding window's, rotated) serves a later prompt only
    # if it holds a prefix of it, and the next one rarely continues the answer as written
    # (harmony drops an earlier turn's reasoning; an API client sends none back): the cache is
    # kept as it stands after the prompt, too, before the answer goes in.
    trims = trims_at_any_length(loaded.model)

    def kept() -> None:
        # The cache holds the prompt and every token generated (each was fed before it came
        # out), unless generation stopped at the first token; or, stopped in the prefill, the
        # prompt as far as it went.
        if not answer.token_ids:
            loaded.prompt_cache.keep(prompt[: len(prompt) - len(rest) + prefilled], cache)
            return
        token_ids = answer.token_ids
        fed = token_ids[:-1] if len(token_ids) == 1 else token_ids
        loaded.prompt_cache.keep(prompt + fed, cache)

    try:
        with wired_limit(loaded.model, cast(Any, [generation_stream])):
            answer.prefilling()
            model, pace = loaded.model, loaded.prefill_pace
            steps = prefill_steps(model, rest, cache, pace, cancel, agree, generation_stream)
            for progress in steps:
                prefilled = progress.done  # before the yield: a caller may stop listening there
                yield progress
            if prefilled and cancel.is_set():
                answer.cancel()
                kept()
                yield from answer.done()
                return
            one_pass_tokens = ONE_PASS_TOKENS_PER_LAYER * loaded.card.num_layers
            tokens = sampled_tokens(
                model,
                rest[prefilled:],
                cache,
                sampler,
                max_tokens,
                one_pass_tokens,
                loaded.card.name,
                pace,
            )
            for index, token in enumerate(tokens):
                if index == 0 and prefilled:  # the steps said how far they went: now all
                    prefilled = len(rest)  # (the first token's pass fed the rest)
                    yield PrefillProgress(done=len(rest), total=len(rest))
                if index == 0 and not trims:
                    loaded.prompt_cache.keep_copy(prompt, cache)
                yield from answer.token(token)
                if answer.finish is not None:
                    break
                if cancel.is_set():
                    answer.cancel()
                    break
    except GeneratorExit:  # the caller stopped listening: the cache was taken out, put it back
        kept()
        raise
    kept()
    yield from answer.done()


def _no_steps(size: int) -> int:
    return 0


# Two different endings of the next message: what their renderings share is what the next turn
# starts with, whatever the user goes on to type.
_PROBES = ("a", "z")
# What the user may type after a draft: what the renderings of the draft with each share is the
# part of it that the message sent will start with.
_DRAFT_PROBES = ("a", " z", ".", "\n")
PREFILL_CHUNK = 64  # tokens per step of the next-turn prefill at most; a cancel waits one step


def next_turn_prefix(loaded: LoadedModel, request: ChatRequest, draft: str = "") -> list[int]:
    """The prompt tokens the next turn of this conversation is expected to start with.

    Without a `draft`: the history as the chat template will render it then (which can differ
    from what was generated: templates drop reasoning from earlier answers, and text does not
    always re-tokenize to the same ids), up to where the next message begins. With one (what
    the user has typed so far): the whole turn as it would be sent now. When the user types on,
    the next take trims what no longer matches, in place, so guessing costs nothing. A model
    whose caches cannot be cut back (a sliding window's, once rotated) gets only the part of
    the draft that the message will start with whatever comes next, so the turn sent continues
    the cache.
    """

    def sent_with(text: str) -> list[int]:
        message = Message(role="user", content=text)
        return render_prompt(
            loaded, request.model_copy(update={"messages": (*request.messages, message)})
        )

    if draft.strip() and trims_at_any_length(loaded.model):
        return sent_with(draft)
    probes = [draft + probe for probe in _DRAFT_PROBES] if draft.strip() else _PROBES
    renders = [sent_with(probe) for probe in probes]
    shared = 0
    for tokens in zip(*renders, strict=False):
        if any(token != tokens[0] for token in tokens):
            break
        shared += 1
    return renders[0][:shared]


def prefill_next_turn(
    loaded: LoadedModel, request: ChatRequest, cancel: CancelToken | None = None, draft: str = ""
) -> int:
    """Prefill the conversation as the next turn will see it (with the next message `draft`
    as far as it is typed), so that turn's TTFT covers only what is not typed yet; meant for
    the time the user spends reading and typing. Returns the tokens prefilled (0 when the
    prompt cache already held them); `cancel` stops it between steps, and what it prefilled
    is kept."""
    cancel = cancel or NeverCancelled()
    prefix = next_turn_prefix(loaded, request, draft)
    if len(prefix) < 2:
        return 0
    if loaded.prompt_cache.reusable(prefix) >= len(prefix) - 1:
        return 0  # all cached already (a take would give one token back to feed)
    cache, rest = loaded.prompt_cache.take(loaded.model, prefix)
    held = len(prefix) - len(rest)
    model: Any = loaded.model
    pace = loaded.prefill_pace
    start = 0
    while start < len(rest) and not cancel.is_set():
        # A slow model's steps are smaller: a request that arrives waits at most about one.
        chunk = rest[start : start + pace.at_most(PREFILL_CHUNK)]
        timed_feed(model, chunk, cache, pace)
        start += len(chunk)
        held += len(chunk)
    if held:  # what the cache holds goes back (take took it out), a cancelled prefill's too
        loaded.prompt_cache.keep(prefix[:held], cache)
    return held - (len(prefix) - len(rest))


def wait_for_streams() -> None:
    """Block until everything queued on MLX's streams has run: call before the interpreter ends.

    Decoding queues the next token before the last is read (``async_eval``), so an answer or a
    load stopped midway leaves work on a stream's thread; an interpreter that exits under it
    aborts ("terminate called without an active exception").
    """
    mx.synchronize(generation_stream)
    mx.synchronize()
