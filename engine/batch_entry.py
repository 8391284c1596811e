"""A request that has its first token joins the batch's running rows at their next step.

mlx-lm's `BatchGenerator.insert` would take it through a prompt batch of its own: its cache
merged and deep-copied there, then a step of its own (a pass over every weight for one row),
before its row joins the running ones. Its first token is already known here (the pass that
gave it is `engine.generate.first_token`), so its row goes straight in: the next step of the
batch feeds that token with the others' and gives its second token with theirs.

This builds on mlx-lm's `GenerationBatch` (the rows being decoded) as its own `extend` sees it;
`enter` falls back to `insert` for any other state of the generator.
"""
# pyright: reportUnknownMemberType=false, reportUnknownVariableType=false, reportUnknownArgumentType=false
# pyright: reportMissingTypeStubs=false, reportPrivateUsage=false
# (mlx-lm ships no type information.)

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, GenerationBatch
from mlx_lm.models.cache import TokenBuffer

from engine.sampling import Sampler


def enter(
    generator: BatchGenerator,
    token: int,
    prompt: list[int],
    cache: list[Any],
    sampler: Sampler,
    max_tokens: int,
) -> tuple[int, bool]:
    """Add a request whose `prompt` is in `cache` and whose first token is `token`.

    Returns its uid and whether it went into the running rows, in which case its first
    response is `token` again (to be skipped) and its length counts that token
    (`max_tokens` includes it). Otherwise it was inserted, and its responses start at its
    second token."""
    running = generator._generation_batch
    next_tokens = running._next_tokens  # what the rows feed at their next step
    if (
        not len(running)
        or next_tokens is None
        or len(generator._prompt_batch)
        or generator._unprocessed_sequences
    ):
        (uid,) = generator.insert(
            [[token]],
            max_tokens=[max_tokens - 1],
            caches=[cache],
            all_tokens=[list(prompt)],  # the batch appends to it
            samplers=[sampler],
        )
        return uid, False
    uid = generator._uid_count
    generator._uid_count += 1
    row = GenerationBatch.empty(generator.model, generator.sampler)  # empty: it takes no step
    row.uids = [uid]
    row.tokens = [list(prompt)]  # the tokens in its cache; the step appends what it feeds
    row.samplers = [sampler]
    row.logits_processors = [[]]
    row.stop_sequences = [generator._default_stop_sequences]
    row.max_tokens = [max_tokens]
    row._token_context = [TokenBuffer(prompt)]
    row._num_tokens = [0]
    row._matchers = [generator._default_stop_sequences.matcher()]
    with mx.stream(generator.stream):  # the arrays of the model's thread
        row.prompt_cache = [layer.merge([layer]) for layer in cache]
        row._next_tokens = mx.array([token], dtype=next_tokens.dtype)
        # Its first response is the first token again (a step answers with the tokens it
        # fed), already had by the caller: nothing reads these logprobs.
        row._next_logprobs = [mx.zeros((1,))]
        running.extend(row)
    return uid, True
