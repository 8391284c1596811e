"""The sampler of one request: greedy, seeded with a random key of its own, or unseeded."""
# pyright: reportMissingTypeStubs=false, reportUnknownVariableType=false
# (mlx-lm ships no type information.)

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
from mlx_lm.sample_utils import apply_top_p, make_sampler

from engine.kernels.routing import argmax_last
from engine.types import ChatRequest

Sampler = Callable[[mx.array], mx.array]

# One object for every greedy request: a batch whose rows share a sampler samples in one call.
# mlx-lm's greedy sampler, mx.argmax over the last axis, on the CPU kernels where they run.
GREEDY: Sampler = argmax_last


def request_sampler(request: ChatRequest) -> Sampler:
    """The sampler for `request`. A seeded one draws from its own key (split at every token),
    not from MLX's global state, so its tokens are the same alone, in a batch beside other
    requests, or on every rank of a ring."""
    if request.temperature == 0:
        return GREEDY
    top_p = request.top_p if request.top_p < 1 else 0.0
    if request.seed is None:
        return make_sampler(temp=request.temperature, top_p=top_p)
    return _KeyedSampler(request.temperature, top_p, request.seed)


class _KeyedSampler:
    """Temperature and top-p sampling, as mlx-lm's, from a key of its own."""

    def __init__(self, temperature: float, top_p: float, seed: int) -> None:
        self._scale = 1.0 / temperature
        self._top_p = top_p
        self._key = mx.random.key(seed)

    def __call__(self, logprobs: mx.array) -> mx.array:
        pair = mx.random.split(self._key)
        self._key, now = pair[0], pair[1]
        if 0 < self._top_p < 1:
            logprobs = apply_top_p(logprobs, self._top_p)
        return mx.random.categorical(logprobs * self._scale, key=now)
