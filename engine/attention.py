"""Attention for MLX's CPU backend, computed in numpy.

MLX's CPU `exp` and row reductions are scalar and many times slower than numpy's vectorised
ones, so once a chat has a history, softmax is most of a prefill in
`mx.fast.scaled_dot_product_attention`. This computes the same attention in numpy over MLX's own
buffers (the queries and the KV cache are read in place, not copied): matmuls in numpy's BLAS,
the softmax (masked, max, exp and sum) in place over each block of scores, at the same
precision.

`install(model)` routes the model's mlx-lm attention here when MLX runs on the CPU, and one
query (a decoding step) to the kernel extension's decode attention where it is built (gpt-oss's
attention sinks too, here and there); quantized KV caches and the GPU keep mlx-lm's own path.
`EXO_TUI_ATTENTION=mlx` turns it off.
"""
# pyright: reportMissingTypeStubs=false, reportUnknownMemberType=false, reportUnknownVariableType=false
# (mlx-lm and threadpoolctl ship no type information.)

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from threadpoolctl import ThreadpoolController

from engine import kernels
from engine.blas import machine_cores

# Scores held at once (4 bytes each: 8 MiB); longer prompts are processed in blocks of queries.
MAX_SCORES = 1 << 21
# Small blocks keep MLX's kernel (fewer scores per head than this): their softmax is cheap, and
# this path syncs at every layer, which stops mlx-lm from building the next step while this one
# computes.
MIN_SCORES_PER_HEAD = 1024
# Without the kernel extension, one query (a decoding step, a turn whose message was prefilled
# while it was typed) keeps MLX's kernel over fewer keys than this: it needs no sync, and over
# short histories that wins; past this many keys the numpy path wins.
ONE_QUERY_MLX_KEYS = 2048
# From this many scores in a call, the query rows are shared among the cores.
PARALLEL_SCORES = 1 << 17
_ORIGINAL = "_exo_tui_original_sdpa"

Mask = mx.array | str | None
Floats = np.ndarray[Any, np.dtype[np.float32]]
ScoresMask = np.ndarray[Any, np.dtype[Any]] | str | None


def _mask_block(scores: Floats, mask: ScoresMask, rows: slice, length: int) -> None:
    """Apply `mask` to a block of `scores` ([B, KV heads, repeat, rows, keys]) in place."""
    if isinstance(mask, str):  # "causal": query i sees keys up to i + (keys - length)
        first = rows.start + scores.shape[-1] - length  # keys before this are seen by every row
        tail = scores[..., first:]
        tail += _causal_bias(*tail.shape[-2:])
    elif mask is not None:
        block = mask[..., rows, :]
        if block.dtype == np.bool_:
            scores[np.broadcast_to(~block, scores.shape)] = -np.inf
        else:
            scores += block


@functools.lru_cache(maxsize=32)
def _causal_bias(rows: int, keys: int) -> Floats:
    """-inf above the diagonal: row i sees keys 0..i (an add costs a tenth of a masked store)."""
    return np.triu(np.full((rows, keys), -np.inf, dtype=np.float32), k=1)


def attention(
    queries: mx.array,
    keys: mx.array,
    values: mx.array,
    *,
    scale: float,
    mask: Mask,
    sinks: mx.array | None = None,
) -> mx.array:
    """softmax(q kᵀ · scale + mask) v, like `mx.fast.scaled_dot_product_attention` (GQA too).

    `mask` is None, "causal", a boolean array (True: attend) or an additive float array;
    `sinks` (gpt-oss's), one logit a head [H] that joins each softmax with no value.
    """
    batch, heads, length, dim = queries.shape
    kv_heads, key_count = keys.shape[1], keys.shape[2]
    repeat = heads // kv_heads
    if isinstance(mask, mx.array):
        mask = _group_heads(mask, kv_heads, repeat)
        if mask.dtype not in (mx.bool_, mx.float32):
            mask = mask.astype(mx.float32)
    # In numpy before the shares start: MLX's streams belong to the thread that made them.
    scores_mask: ScoresMask = np.asarray(mask) if isinstance(mask, mx.array) else mask
    _numpy_blas_on_one_thread()
    # numpy reads MLX's buffers in place (evaluating them first): the KV cache is not copied.
    q_all: Floats = np.asarray(queries.astype(mx.float32))
    keys_t: Floats = np.asarray(keys.astype(mx.float32)).swapaxes(-1, -2)
    v_all: Floats = np.asarray(values.astype(mx.float32))
    sink_all: Floats | None = (
        None
        if sinks is None
        else np.asarray(sinks.astype(mx.float32)).reshape(1, kv_heads, repeat, 1, 1)
    )
    block = max(1, MAX_SCORES // max(1, batch * heads * key_count))
    out = np.empty((batch, kv_heads, repeat, length, dim), dtype=np.float32)

    def attend(rows: slice) -> None:
        for start in range(rows.start, rows.stop, block):
            part = slice(start, min(rows.stop, start + block))
            count = part.stop - part.start
            q = q_all[:, :, part].reshape(batch, kv_heads, repeat * count, dim) * np.float32(scale)
            scores = np.matmul(q, keys_t).reshape(batch, kv_heads, repeat, count, key_count)
            _mask_block(scores, scores_mask, part, length)
            top = scores.max(axis=-1, keepdims=True)
            if sink_all is not None:
                top = np.maximum(top, sink_all)
            scores -= top
            np.exp(scores, out=scores)
            totals = scores.sum(axis=-1, keepdims=True)
            if sink_all is not None:
                totals += np.exp(sink_all - top)
            weighted = np.matmul(scores.reshape(batch, kv_heads, repeat * count, key_count), v_all)
            np.divide(
                weighted.reshape(batch, kv_heads, repeat, count, dim), totals, out=out[..., part, :]
            )

    shares = _shares(length, batch * heads * length * key_count)
    # numpy lets go of the GIL in its matmuls and loops: the shares run at once, one a core.
    others = [_pool().submit(attend, rows) for rows in shares[1:]]
    attend(shares[0])
    for other in others:
        other.result()
    return mx.array(out.reshape(batch, heads, length, dim)).astype(queries.dtype)


def _shares(length: int, scores: int) -> list[slice]:
    """The query rows each core takes: one share for a small block (a thread's hand-off costs
    more than it saves), else one per core, as even as rows allow."""
    count = min(length, _cores()) if scores >= PARALLEL_SCORES else 1
    bounds = [length * i // count for i in range(count + 1)]
    return [slice(a, b) for a, b in zip(bounds, bounds[1:], strict=False)]


@functools.cache
def _cores() -> int:
    """The cores this process may use: its share when several ranks run on one machine (they
    set OPENBLAS_NUM_THREADS), else every core it can run on."""
    share = os.environ.get("OPENBLAS_NUM_THREADS", "")
    return int(share) if share.isdigit() and int(share) > 0 else machine_cores()


@functools.cache
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=max(1, _cores() - 1), thread_name_prefix="attention")


@functools.cache
def _numpy_blas_on_one_thread() -> None:
    """numpy's wheels bring their own OpenBLAS; its threads, waiting for work after each of these
    small matmuls, took the cores from MLX's BLAS and made a step several times slower. One
    thread runs these matmuls on the calling thread."""
    ThreadpoolController().select(prefix="libscipy_openblas").limit(limits=1)


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


def _mlx_is_faster(query_count: int, key_count: int) -> bool:
    if query_count == 1:
        return key_count < ONE_QUERY_MLX_KEYS
    return query_count * key_count < MIN_SCORES_PER_HEAD


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
        if hasattr(cache, "bits") or not enabled():
            return original(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)
        if (
            queries.shape[2] == 1
            and kernels.available()
            and kernels.one_float_type(queries, keys, values)
        ):
            # One query sees every key: "causal" asks nothing more of it.
            array_mask = mask if isinstance(mask, mx.array) else None
            return kernels.decode_attention(queries, keys, values, scale, array_mask, sinks)
        if _mlx_is_faster(queries.shape[2], keys.shape[2]):
            return original(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)
        return attention(queries, keys, values, scale=scale, mask=mask, sinks=sinks)

    setattr(scaled_dot_product_attention, _ORIGINAL, original)
    return scaled_dot_product_attention
