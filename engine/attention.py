"""Attention for MLX's CPU backend, with its softmax in numpy.

MLX's CPU `exp` costs ~15 ns per element here and its row reductions ~1 ns (numpy: ~1.5 and
~0.1, vectorised), so once a chat has a history, softmax is most of a prefill: 10 heads x 96 new
tokens x 1,362 keys took 24 ms per layer in `mx.fast.scaled_dot_product_attention`. This computes
the same attention with MLX's matmuls (fast BLAS) around a numpy softmax over each block of
scores (masked, max, exp and sum in place): ~2x faster than doing those passes in MLX, at the
same precision.

`install(model)` routes the model's mlx-lm attention here when MLX runs on the CPU; attention
sinks, quantized KV caches and the GPU keep mlx-lm's own path. `EXO_TUI_ATTENTION=mlx` turns
it off.
"""
# pyright: reportMissingTypeStubs=false, reportUnknownMemberType=false, reportUnknownVariableType=false
# (mlx-lm ships no type information.)

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

# Scores held at once (4 bytes each: 8 MiB); longer prompts are processed in blocks of queries.
# Each block costs a sync and smaller matmuls: 96 new tokens x 10 heads x 1,362 keys took 14.6 ms
# a layer in three blocks, 9.0 in one.
MAX_SCORES = 1 << 21
# MLX's kernel keeps decoding (one query): this path syncs at every layer, which would stop
# mlx-lm from building the next step while this one computes. It keeps small blocks too (fewer
# scores per head than MIN_SCORES_PER_HEAD): their softmax is cheap and the copies to and from
# numpy cost more than they save. Measured here (10 heads): 4 queries over 1,372 keys 1.1 ms a
# layer against MLX's 3.6; 16 over 64 the same; 2 over 64 twice as slow.
MIN_QUERIES = 2
MIN_SCORES_PER_HEAD = 1024
_ORIGINAL = "_exo_tui_original_sdpa"

Mask = mx.array | str | None


def _softmax_weights(
    scores: mx.array, mask: Mask, rows: slice, length: int
) -> tuple[np.ndarray, np.ndarray]:
    """exp(scores - row max), masked positions 0, and the row sums: in numpy, in place.

    `scores` is [B, KV heads, repeat, rows, keys] float32."""
    weights = np.array(scores)
    keys = weights.shape[-1]
    if isinstance(mask, str):  # "causal": query i sees keys up to i + (keys - length)
        first = rows.start + keys - length  # keys before this are seen by every row
        tail = weights[..., first:]
        hidden = np.triu(np.ones(tail.shape[-2:], dtype=np.bool_), k=1)
        tail[..., hidden] = -np.inf
    elif isinstance(mask, mx.array):
        block: np.ndarray[Any, np.dtype[Any]] = np.array(mask[..., rows, :])
        if block.dtype == np.bool_:
            weights[np.broadcast_to(~block, weights.shape)] = -np.inf
        else:
            weights += block
    weights -= weights.max(axis=-1, keepdims=True)
    np.exp(weights, out=weights)
    return weights, weights.sum(axis=-1, keepdims=True)


def attention(
    queries: mx.array, keys: mx.array, values: mx.array, *, scale: float, mask: Mask
) -> mx.array:
    """softmax(q kᵀ · scale + mask) v, like `mx.fast.scaled_dot_product_attention` (GQA too).

    `mask` is None, "causal", a boolean array (True: attend) or an additive float array.
    """
    batch, heads, length, dim = queries.shape
    kv_heads, key_count = keys.shape[1], keys.shape[2]
    repeat = heads // kv_heads
    if isinstance(mask, mx.array):
        mask = _group_heads(mask, kv_heads, repeat)
        if mask.dtype not in (mx.bool_, mx.float32):
            mask = mask.astype(mx.float32)
    block = max(1, MAX_SCORES // max(1, batch * heads * key_count))
    keys_t = keys.swapaxes(-1, -2)
    outputs: list[mx.array] = []
    for start in range(0, length, block):
        rows = slice(start, min(length, start + block))
        count = rows.stop - rows.start
        q = (queries[:, :, rows] * scale).reshape(batch, kv_heads, -1, dim)
        scores = (q @ keys_t).reshape(batch, kv_heads, repeat, count, key_count)
        weights, totals = _softmax_weights(scores.astype(mx.float32), mask, rows, length)
        weighted = mx.array(weights).astype(values.dtype).reshape(batch, kv_heads, -1, key_count)
        out = (weighted @ values).reshape(batch, kv_heads, repeat, count, dim) / mx.array(totals)
        outputs.append(out.astype(queries.dtype).reshape(batch, heads, count, dim))
    return outputs[0] if len(outputs) == 1 else mx.concatenate(outputs, axis=2)


def _group_heads(mask: mx.array, kv_heads: int, repeat: int) -> mx.array:
    """A [B, H, L, S] mask reshaped to the scores' [B, KV heads, repeat, L, S]."""
    if mask.ndim < 4:
        return mask
    if mask.shape[1] == 1:
        return mx.expand_dims(mask, 2)
    return mask.reshape(mask.shape[0], kv_heads, repeat, mask.shape[2], mask.shape[3])


def enabled() -> bool:
    """True when MLX computes on the CPU and `EXO_TUI_ATTENTION` does not ask for MLX's own."""
    setting = os.environ.get("EXO_TUI_ATTENTION", "auto").strip().lower()
    return setting not in ("mlx", "off", "0", "no") and mx.default_device() == mx.cpu


def install(model: nn.Module) -> bool:
    """Route `model`'s mlx-lm attention through `attention` (when `enabled()` at each call)."""
    module: Any = sys.modules.get(type(model).__module__)
    original: Callable[..., mx.array] | None = getattr(module, "scaled_dot_product_attention", None)
    if module is None or original is None:
        return False
    if hasattr(original, _ORIGINAL):
        return True
    module.scaled_dot_product_attention = _routed(original)
    return True


def _routed(original: Callable[..., mx.array]) -> Callable[..., mx.array]:
    @functools.wraps(original)
    def scaled_dot_product_attention(
        queries: mx.array,
        keys: mx.array,
        values: mx.array,
        cache: Any,
        scale: float,
        mask: Mask,
        sinks: mx.array | None = None,
    ) -> mx.array:
        if (
            queries.shape[2] < MIN_QUERIES
            or queries.shape[2] * keys.shape[2] < MIN_SCORES_PER_HEAD
            or sinks is not None
            or hasattr(cache, "bits")
            or not enabled()
        ):
            return original(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)
        return attention(queries, keys, values, scale=scale, mask=mask)

    setattr(scaled_dot_product_attention, _ORIGINAL, original)
    return scaled_dot_product_attention
