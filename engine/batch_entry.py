"""Requests that have their first tokens join the batch's running rows at their next step.

mlx-lm's `BatchGenerator.insert` would take such a request through a prompt batch of its own:
its cache merged and deep-copied there, then a step of its own (a pass over every weight for
its rows), before its row joins the running ones. Its first token is already known here (from
`engine.generate.first_token` for one request, `first_tokens` for several that came
together), so its row goes straight in: the next step of the batch feeds that token with the
others' and gives its second token with theirs.

Several requests that come together get their first tokens from one pass (`first_tokens`).
mlx-lm's prompt batch takes two passes for them: one for all but the last token of each
prompt, one for the last, and hands the tokens out a step later still.

This builds on mlx-lm's `GenerationBatch` (the rows being decoded) as its own `extend` sees it.
"""
# pyright: reportUnknownMemberType=false, reportUnknownVariableType=false, reportUnknownArgumentType=false
# pyright: reportMissingTypeStubs=false, reportPrivateUsage=false
# (mlx-lm ships no type information.)

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, GenerationBatch
from mlx_lm.models.cache import BatchKVCache, TokenBuffer

from engine.generate import last_position_logits
from engine.kernels import routing
from engine.sampling import Sampler


def first_tokens(
    model: Any,
    rests: Sequence[list[int]],
    caches: Sequence[list[Any]],
    samplers: Sequence[Sampler],
    stream: Any,
) -> tuple[list[Any], list[int], list[bool]]:
    """The token after each of `rests` (each put after its cache), for all of them in one pass
    over the weights, on `stream`. Returns their caches merged into one batch cache (a row each,
    with its rest), the tokens, and whether each row's logits were numbers.

    The rests are padded on the right to the longest, as mlx-lm's prompt batch does; the caches
    are told, so the padding is rolled to the left of each row afterwards."""
    lengths = [len(rest) for rest in rests]
    padding = [max(lengths) - length for length in lengths]
    with mx.stream(stream):
        merged = [layers[0].merge(list(layers)) for layers in zip(*caches, strict=True)]
        for layer in merged:
            make_room(layer, max(lengths))
        if any(padding):
            for layer in merged:
                layer.prepare(lengths=lengths, right_padding=padding)
        tokens = mx.array([rest + [0] * pad for rest, pad in zip(rests, padding, strict=True)])
        logits = last_position_logits(model, tokens, merged, [n - 1 for n in lengths])
        if any(padding):
            for layer in merged:
                layer.finalize()
        logprobs = logits - routing.logsumexp(logits, axis=-1, keepdims=True)
        if all(sampler is samplers[0] for sampler in samplers):
            sampled = samplers[0](logprobs)
        else:
            rows = [sampler(logprobs[i : i + 1]) for i, sampler in enumerate(samplers)]
            sampled = mx.concatenate(rows)
        finite = mx.all(mx.isfinite(logits), axis=-1)
        mx.eval(sampled, finite, [layer.state for layer in merged])
    return merged, cast(list[int], sampled.tolist()), cast(list[bool], finite.tolist())


def enter(
    generator: BatchGenerator,
    token: int,
    prompt: list[int],
    cache: list[Any],
    sampler: Sampler,
    max_tokens: int,
) -> int:
    """Add a request whose `prompt` is in `cache` and whose first token is `token` (see
    `enter_rows`); its uid."""
    with mx.stream(generator.stream):
        merged = [layer.merge([layer]) for layer in cache]
        for layer in merged:
            make_room(layer, 1)  # for the token the batch's next step feeds
    (uid,) = enter_rows(generator, [token], [prompt], merged, [sampler], [max_tokens])
    return uid


def enter_rows(
    generator: BatchGenerator,
    tokens: Sequence[int],
    prompts: Sequence[list[int]],
    merged: list[Any],
    samplers: Sequence[Sampler],
    max_tokens: Sequence[int],
) -> list[int]:
    """Add requests to the running rows (any number of them, none included): each holds its
    prompt in its row of the batch cache `merged` and has its first token. Returns their uids.
    Each one's first response is its first token again (a step answers with the tokens it
    fed), to be skipped, and its length counts that token."""
    running = generator._generation_batch
    count = len(prompts)
    uids = list(range(generator._uid_count, generator._uid_count + count))
    generator._uid_count += count
    rows = GenerationBatch.empty(generator.model, generator.sampler)  # empty: it takes no step
    rows.uids = uids
    rows.tokens = [list(prompt) for prompt in prompts]  # in the cache; each step appends its own
    rows.samplers = list(samplers)
    rows.logits_processors = [[] for _ in prompts]
    rows.stop_sequences = [generator._default_stop_sequences for _ in prompts]
    rows.max_tokens = list(max_tokens)
    rows._token_context = [TokenBuffer(prompt) for prompt in prompts]
    rows._num_tokens = [0] * count
    rows._matchers = [generator._default_stop_sequences.matcher() for _ in prompts]
    with mx.stream(generator.stream):  # the arrays of the model's thread
        if running.prompt_cache:
            join_caches(running.prompt_cache, merged)  # (so `extend` keeps running's, joined)
        else:
            rows.prompt_cache = merged
        rows._next_tokens = mx.array(list(tokens), dtype=mx.uint32)
        # Nothing reads the logprobs of a response that repeats the first token.
        rows._next_logprobs = [mx.zeros((1,)) for _ in prompts]
        running.extend(rows)
    return uids


# A batch cache's keys and values have room past the tokens they hold (mlx-lm grows them 256
# positions at a time). mlx-lm's growth copies the whole cache into a new one, zeros included,
# and its `extend` pads each side to the other's room, then copies both again into one: work on
# the positions nobody has written, on every layer, each time requests join (bench/batch_join.py).
# These two write each cache once: what it holds, then its room as one fill.


def make_room(cache: Any, tokens: int) -> None:
    """Give a batch cache room for `tokens` more as its own growth would, in one pass."""
    if not isinstance(cache, BatchKVCache):
        return
    keys: Any = cache.keys
    values: Any = cache.values
    held = cache._idx
    if keys is None or held + tokens <= keys.shape[2]:
        return  # (an empty one allocates without copying)
    room = (tokens + cache.step - 1) // cache.step * cache.step
    widths = [(0, 0), (0, 0), (0, room), (0, 0)]
    cache.keys = mx.pad(keys[..., :held, :], widths)
    cache.values = mx.pad(values[..., :held, :], widths)


def join_caches(running: list[Any], joining: list[Any]) -> None:
    """Each layer of `joining` (new rows) appended to the same layer of `running`, in place, as
    mlx-lm's `extend` does: the rows right-aligned at the longer one's end, the room the larger
    of the two."""
    for ours, theirs in zip(running, joining, strict=True):
        if not (_plain(ours) and _plain(theirs)):
            ours.extend(theirs)
            continue
        end = max(ours._idx, theirs._idx)
        room = max(ours.keys.shape[2], theirs.keys.shape[2]) - end
        # `_join` copies what the caches hold twice (MLX's pad copies again after the
        # concatenation), so it wins only where most of the joined cache is room: a few hundred
        # positions held, not a long chat's thousand (bench/batch_join.py, and the README).
        if room > end:
            _join(ours, theirs, end, room)
        else:
            ours.extend(theirs)


def _plain(cache: Any) -> bool:
    return type(cache) is BatchKVCache and cache.keys is not None and cache._right_padding is None


def _join(ours: Any, theirs: Any, end: int, room: int) -> None:
    def held(cache: Any, array: mx.array) -> mx.array:
        part = array[..., : cache._idx, :]
        shift = end - cache._idx
        return mx.pad(part, [(0, 0), (0, 0), (shift, 0), (0, 0)]) if shift else part

    widths = [(0, 0), (0, 0), (0, room), (0, 0)]
    for name in ("keys", "values"):
        rows = mx.concatenate(
            [held(ours, getattr(ours, name)), held(theirs, getattr(theirs, name))]
        )
        setattr(ours, name, mx.pad(rows, widths))  # (room > end >= 0 here)
    ours.left_padding = mx.concatenate(
        [ours.left_padding + (end - ours._idx), theirs.left_padding + (end - theirs._idx)]
    )
    ours.offset = mx.concatenate([ours.offset, theirs.offset])
    ours._idx = end
