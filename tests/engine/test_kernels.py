"""The CPU kernels compute what MLX's own ops compute, on every instruction set this CPU runs.

Tolerance: the kernels accumulate in fp32 in another order than MLX, so an output may differ from
MLX's product computed in fp32 by 1e-5 of the sum of |x_k * w_k| over its dot product, plus the
rounding of the output type (2^-8 of the value for bfloat16, 2^-11 for float16, and float16's
subnormal spacing, 2^-24). Where bf16 x meets 4-bit weights on AVX512-BF16, the GEMV takes x as
integers, each block scaled by its largest magnitude: for one row 16-bit ones, blocks of 32 (half
a step is a 65534th of that magnitude, 128 times less than bf16's own rounding of a value at the
top of its block); for several rows 8-bit ones, blocks of 64 (a 254th, as llama.cpp rounds x).
Each value may move by half a step, so the tolerance adds the sum of |w_k| times each half step.
"""
# pyright: reportUnknownMemberType=false, reportUnknownVariableType=false, reportUnknownArgumentType=false

from __future__ import annotations

import gc
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from engine import kernels
from engine.kernels import routing
from engine.loading import load_model_sync
from engine.models.locations import bundled_demo_dir
from tests.engine.kernel_checks import (
    FLOATS,
    PROPERTIES,
    ROUNDING,
    SMALLEST,
    assert_close,
    ext,
    greedy_logits,
    integer_x_rounding,
    promoted,
    quantized_copy,
    weights,
)

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not kernels.available(), reason=kernels.describe())


def maybe_strided(x: mx.array, strided: bool) -> mx.array:
    """`x` itself, or the same values in a non-contiguous view (a transpose of a copy)."""
    if not strided:
        return x
    flipped = mx.array(mx.swapaxes(x, -1, -2))
    mx.eval(flipped)
    view = mx.swapaxes(flipped, -1, -2)
    assert mx.array_equal(view, x)
    return view


@PROPERTIES
@given(
    bits=st.sampled_from([4, 8]),
    group_size=st.sampled_from([32, 64, 128]),
    groups=st.integers(1, 12),
    n=st.integers(1, 67),
    rows=st.one_of(st.integers(1, 8), st.integers(9, 300)),
    batch=st.sampled_from([(), (2,), (1, 3)]),
    x_type=st.sampled_from(FLOATS),
    scale_type=st.sampled_from(FLOATS),
    strided=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_quantized_matmul_matches_mlx(
    isa: str,
    bits: int,
    group_size: int,
    groups: int,
    n: int,
    rows: int,
    batch: tuple[int, ...],
    x_type: mx.Dtype,
    scale_type: mx.Dtype,
    strided: bool,
    seed: int,
) -> None:
    k = group_size * groups  # any multiple of the group: 32 * 7 = 224 is not one of 256
    w, scales, biases = mx.quantize(weights(n, k, seed), group_size=group_size, bits=bits)
    scales, biases = scales.astype(scale_type), biases.astype(scale_type)
    x = mx.random.normal((*batch, rows, k), key=mx.random.key(seed + 1)).astype(x_type)
    got = kernels.quantized_matmul(maybe_strided(x, strided), w, scales, biases, group_size, bits)
    dense = mx.dequantize(w, scales.astype(mx.float32), biases.astype(mx.float32), group_size, bits)
    x32 = x.astype(mx.float32)
    out_type = promoted(x_type, scale_type)
    assert got.dtype == out_type
    # bf16 x by bf16 scales: integer dot products, for 4 bits (k a multiple of 128) and 8 (of 64).
    integers = x_type == scale_type == mx.bfloat16 and k % (128 if bits == 4 else 64) == 0
    rounding = integer_x_rounding(isa, x32, dense, bits) if integers else 0.0
    assert_close(got, x32 @ dense.T, mx.abs(x32) @ mx.abs(dense).T, out_type, rounding)


@PROPERTIES
@given(
    group_size=st.sampled_from([32, 64, 128]),
    blocks=st.integers(1, 12),
    n=st.integers(1, 67),
    rows=st.one_of(st.integers(1, 8), st.integers(9, 120)),
    strided=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_bf16_x_by_4_bits_matches_mlx(
    isa: str, group_size: int, blocks: int, n: int, rows: int, strided: bool, seed: int
) -> None:
    """What mlx-community's 4-bit models run (bf16 x and scales, k a multiple of 128): on
    AVX512-BF16, integer dot products of x, as 16-bit integers, with the nibbles."""
    k = 128 * blocks
    w, scales, biases = mx.quantize(weights(n, k, seed), group_size=group_size, bits=4)
    scales, biases = scales.astype(mx.bfloat16), biases.astype(mx.bfloat16)
    x = mx.random.normal((rows, k), key=mx.random.key(seed + 1)).astype(mx.bfloat16)
    got = kernels.quantized_matmul(maybe_strided(x, strided), w, scales, biases, group_size, 4)
    dense = mx.dequantize(w, scales.astype(mx.float32), biases.astype(mx.float32), group_size, 4)
    x32 = x.astype(mx.float32)
    assert got.dtype == mx.bfloat16
    rounding = integer_x_rounding(isa, x32, dense)
    assert_close(got, x32 @ dense.T, mx.abs(x32) @ mx.abs(dense).T, mx.bfloat16, rounding)


@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize(("rows", "k"), [(2, 2304), (8, 8192), (9, 4352), (16, 2560)])
def test_several_rows_by_4_bits_across_passes_of_x(
    isa: str, group_size: int, rows: int, k: int
) -> None:
    """Several rows of bf16 x by 4-bit weights with k past one pass of the 8-bit GEMV's x (2048
    values), a last pass shorter than the others, and 8 rows at once (their sums reduced
    together) or not."""
    w, scales, biases = mx.quantize(weights(37, k, k), group_size=group_size, bits=4)
    scales, biases = scales.astype(mx.bfloat16), biases.astype(mx.bfloat16)
    x = mx.random.normal((rows, k), key=mx.random.key(rows)).astype(mx.bfloat16)
    got = kernels.quantized_matmul(x, w, scales, biases, group_size, 4)
    dense = mx.dequantize(w, scales.astype(mx.float32), biases.astype(mx.float32), group_size, 4)
    x32 = x.astype(mx.float32)
    rounding = integer_x_rounding(isa, x32, dense)
    assert_close(got, x32 @ dense.T, mx.abs(x32) @ mx.abs(dense).T, mx.bfloat16, rounding)


@PROPERTIES
@given(
    k=st.integers(1, 700),
    n=st.integers(1, 67),
    rows=st.one_of(st.integers(1, 8), st.integers(9, 300)),
    batch=st.sampled_from([(), (3,)]),
    w_type=st.sampled_from([mx.bfloat16, mx.float16, mx.float32]),
    x_type=st.sampled_from(FLOATS),
    strided=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_dense_matmul_matches_mlx(
    isa: str,
    k: int,
    n: int,
    rows: int,
    batch: tuple[int, ...],
    w_type: mx.Dtype,
    x_type: mx.Dtype,
    strided: bool,
    seed: int,
) -> None:
    w = weights(n, k, seed).astype(w_type)
    x = mx.random.normal((*batch, rows, k), key=mx.random.key(seed + 1)).astype(x_type)
    got = kernels.dense_matmul(maybe_strided(x, strided), w)
    x32, w32 = x.astype(mx.float32), w.astype(mx.float32)
    out_type = promoted(x_type, w_type)
    assert got.dtype == out_type
    assert_close(got, x32 @ w32.T, mx.abs(x32) @ mx.abs(w32).T, out_type)


@PROPERTIES
@given(
    dtype=st.sampled_from(FLOATS),
    shape=st.sampled_from([(1, 1, 2048), (3, 64), (2, 5, 7, 128), (1, 1000), (4, 1)]),
    eps=st.sampled_from([1e-5, 1e-6, 0.1]),
    seed=st.integers(0, 2**16),
)
def test_rms_norm_matches_mlx(
    dtype: mx.Dtype, shape: tuple[int, ...], eps: float, seed: int
) -> None:
    """The same two roundings as MLX's rms_norm; only the order of the sum of squares may
    differ, which moves a rounding by at most one step of the type (twice: normalised, then
    weighted)."""
    x = (mx.random.normal(shape, key=mx.random.key(seed)) * 3).astype(dtype)
    w = mx.random.normal(shape[-1:], key=mx.random.key(seed + 1)).astype(dtype)
    got, expected = kernels.rms_norm(x, w, eps), mx.fast.rms_norm(x, w, eps)
    assert got.dtype == dtype and got.shape == x.shape
    step = {mx.float32: 2.0**-22, mx.bfloat16: 2.0**-7, mx.float16: 2.0**-10}[dtype]
    difference = mx.abs(got.astype(mx.float32) - expected.astype(mx.float32))
    assert bool(mx.all(difference <= 2 * step * mx.abs(expected.astype(mx.float32)) + 1e-30))


def test_a_models_norms_run_on_the_kernels(kernel_models: dict[str, Path]) -> None:
    loaded = load_model_sync(kernel_models["qwen3-q4-g32"])  # its q and k norms too
    norms = [m for _, m in loaded.model.named_modules() if isinstance(m, nn.RMSNorm)]
    assert norms and all(type(m).__name__ == "CpuRMSNorm" for m in norms)


@pytest.mark.parametrize("rows", [1, 40])
def test_the_head_of_a_tied_embedding_and_a_lazy_graph(isa: str, rows: int) -> None:
    """A product is a graph node like any other: it composes with other ops before an eval."""
    w, scales, biases = mx.quantize(weights(1000, 256, 1), group_size=64, bits=4)
    x = mx.random.normal((rows, 256), key=mx.random.key(2))
    y = mx.softmax(kernels.quantized_matmul(x * 2.0, w, scales, biases, 64, 4), axis=-1)
    expected = mx.softmax((x * 2.0) @ mx.dequantize(w, scales, biases, 64, 4).T, axis=-1)
    assert float(mx.max(mx.abs(y - expected))) < 1e-5


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_nan_and_inf_weights_give_what_mlx_gives(isa: str, bad: float) -> None:
    dense = weights(33, 128, 3).astype(mx.bfloat16)
    dense[5, 17] = bad
    x = mx.random.normal((3, 128), key=mx.random.key(4))
    expected = x @ dense.astype(mx.float32).T
    got = kernels.dense_matmul(x, dense)
    assert mx.array_equal(mx.isnan(got), mx.isnan(expected))
    assert mx.array_equal(mx.isinf(got), mx.isinf(expected))
    finite = mx.isfinite(expected)
    assert float(mx.max(mx.abs(mx.where(finite, got - expected, 0.0)))) < 1e-4
    # k = 256: one row of bf16 x takes 16-bit integers, several 8-bit ones (8 rows: on AMX's
    # 8-bit tiles where the CPU has them).
    for bits, dtype, rows in [(8, mx.float32, 3), (4, mx.bfloat16, 1), (4, mx.bfloat16, 5),
                              (4, mx.bfloat16, 8), (4, mx.bfloat16, 40)]:  # fmt: skip
        for field in ("scales", "biases", "x"):
            w, scales, biases = mx.quantize(weights(33, 256, 3), group_size=64, bits=bits)
            scales, biases = scales.astype(dtype), biases.astype(dtype)
            x = mx.random.normal((rows, 256), key=mx.random.key(4)).astype(dtype)
            if field == "x":
                x[rows - 1, 200] = bad
            else:
                (scales if field == "scales" else biases)[7, 1] = bad
            # MLX's own product: it dequantizes in x's type, where a weight may round to 0.
            expected = mx.quantized_matmul(x, w, scales, biases, True, 64, bits)
            got = kernels.quantized_matmul(x, w, scales, biases, 64, bits)
            assert mx.array_equal(mx.isnan(got), mx.isnan(expected)), (bits, field, rows)
            assert mx.array_equal(mx.isinf(got), mx.isinf(expected)), (bits, field, rows)


@PROPERTIES
@given(
    batch=st.integers(1, 3),
    kv_heads=st.integers(1, 3),
    repeat=st.sampled_from([1, 2, 4]),
    queries=st.integers(1, 3),
    keys=st.integers(1, 300),
    dim=st.sampled_from([16, 32, 64, 80, 128]),
    dtype=st.sampled_from(FLOATS),
    mask=st.sampled_from(["none", "bool", "additive"]),
    layout=st.sampled_from(["cache", "contiguous", "transposed"]),
    mask_layout=st.sampled_from(["packed", "sliced", "transposed"]),
    with_sinks=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_decode_attention_matches_mlx(
    isa: str, batch: int, kv_heads: int, repeat: int, queries: int, keys: int, dim: int,
    dtype: mx.Dtype, mask: str, layout: str, mask_layout: str, with_sinks: bool, seed: int,
) -> None:  # fmt: skip
    """Against MLX's fused attention in fp32: the softmax's weights sum in another order and
    its exp is a polynomial within two ulps of expf, so an output may differ by 1e-5 of the
    largest |v|, plus the rounding of the output type. k and v come as the KV cache leaves them
    (the first keys of a larger buffer), packed, or with their rows not contiguous; the mask
    broadcasts over heads or the batch, packed, as the first keys of a wider one, or with its
    keys not contiguous; with gpt-oss's sinks (a logit a head) or without."""
    key = mx.random.key(seed)
    q = mx.random.normal((batch, kv_heads * repeat, queries, dim), key=key).astype(dtype)
    capacity = keys + (7 if layout == "cache" else 0)
    if layout == "transposed":
        k = mx.swapaxes(mx.random.normal((batch, kv_heads, dim, keys), key=key + 1), 2, 3)
        v = mx.swapaxes(mx.random.normal((batch, kv_heads, dim, keys), key=key + 2), 2, 3)
    else:
        k = mx.random.normal((batch, kv_heads, capacity, dim), key=key + 1)[:, :, :keys]
        v = mx.random.normal((batch, kv_heads, capacity, dim), key=key + 2)[:, :, :keys]
    k, v = k.astype(dtype), v.astype(dtype)
    chosen: mx.array | None = None
    if mask == "bool":
        chosen = mx.random.uniform(shape=(batch, 1, queries, keys), key=key + 3) > 0.4
        chosen[..., -1] = True  # every row sees a key
    elif mask == "additive":
        chosen = (
            -4 * mx.random.uniform(shape=(1, kv_heads * repeat, 1, keys), key=key + 3)
        ).astype(dtype)
    if chosen is not None and mask_layout == "sliced":
        chosen = mx.concatenate([chosen, mx.zeros_like(chosen)], axis=-1)[..., :keys]
    elif chosen is not None and mask_layout == "transposed":
        chosen = mx.swapaxes(mx.contiguous(mx.swapaxes(chosen, -1, -2)), -1, -2)
    scale = dim**-0.5
    f32 = [a.astype(mx.float32) for a in (q, k, v)]
    reference_mask = (
        chosen if chosen is None or chosen.dtype == mx.bool_ else chosen.astype(mx.float32)
    )
    sinks = (
        (2 * mx.random.normal((kv_heads * repeat,), key=key + 4)).astype(dtype)
        if with_sinks
        else None
    )
    expected = mx.fast.scaled_dot_product_attention(
        *f32,
        scale=scale,
        mask=reference_mask,
        sinks=None if sinks is None else sinks.astype(mx.float32),
    )
    got = kernels.decode_attention(q, k, v, scale, chosen, sinks)
    assert got.dtype == dtype and got.shape == q.shape
    difference = mx.abs(got.astype(mx.float32) - expected)
    allowed = (
        1e-5 * mx.max(mx.abs(f32[2])) + ROUNDING[dtype] * mx.abs(expected) + SMALLEST[dtype] + 1e-30
    )
    assert float(mx.max(difference / allowed)) <= 1.0


@PROPERTIES
@given(
    shape=st.lists(st.integers(1, 40), min_size=1, max_size=3),
    spread=st.floats(0.1, 30.0),
    dtype=st.sampled_from(FLOATS),
    seed=st.integers(0, 2**16),
)
@example(shape=[2, 2], spread=30.0, dtype=mx.float32, seed=0)  # MLX's exp off by 1e-6 there
def test_silu_mul_matches_mlx_swiglu(
    isa: str, shape: list[int], spread: float, dtype: mx.Dtype, seed: int
) -> None:
    """Against mlx-lm's swiglu in the same type: the kernel rounds where MLX's ops round, but its
    exp is a polynomial, so a result may differ from MLX's by two steps of the type (1e-6 of the
    value in fp32), plus float16's subnormal spacing, or by as much as MLX's own result differs
    from the exact one (float64): MLX's fp32 exp is off by about 1e-6 far below zero, where the
    kernel's was exact (seed 0, spread 30)."""
    from mlx_lm.models.activations import swiglu

    key = mx.random.key(seed)
    gate = (spread * mx.random.normal(shape, key=key)).astype(dtype)
    x = mx.random.normal(shape, key=key + 1).astype(dtype)
    gate[..., 0] = float("nan") if shape[-1] > 3 else gate[..., 0]
    expected = swiglu(gate, x).astype(mx.float32)
    got = kernels.silu_mul(gate, x)
    assert got.dtype == dtype
    got32 = got.astype(mx.float32)
    assert mx.array_equal(mx.isnan(got32), mx.isnan(expected))
    steps = {mx.float32: 1e-6, mx.bfloat16: 2.0**-7, mx.float16: 2.0**-10}[dtype]
    g64, x64 = (np.array(a.astype(mx.float32)).astype(np.float64) for a in (gate, x))
    with np.errstate(over="ignore", invalid="ignore"):
        exact = mx.array((g64 / (1 + np.exp(-g64)) * x64).astype(np.float32))
    mlx_error = mx.where(mx.isnan(exact), 0.0, mx.abs(expected - exact))
    allowed = steps * mx.abs(expected) + mlx_error + 2 * SMALLEST[dtype] + 1e-30
    ratio = mx.where(mx.isnan(expected), 0.0, mx.abs(got32 - expected) / allowed)
    assert float(mx.max(ratio)) <= 1.0


def test_a_models_swiglu_runs_on_the_kernel_and_gives_the_same_tokens(
    kernel_models: dict[str, Path],
) -> None:
    """mlx-lm's model modules call `swiglu` by name: loading routes it to the kernel, and the
    greedy tokens and logits are MLX's own within the tolerance of the test above."""
    loaded = load_model_sync(kernel_models["llama-bf16"])
    module = sys.modules[type(loaded.model).__module__]
    assert hasattr(module.swiglu, "_exo_tui_original_swiglu")
    prompt = loaded.tokenizer.encode("Tell me a story about a dog and a cat.")
    tokens, logits = greedy_logits(loaded.model, prompt, 32)
    original = module.swiglu._exo_tui_original_swiglu
    setattr(module, "swiglu", original)  # noqa: B010  (a module typed as ModuleType)
    try:
        expected_tokens, expected_logits = greedy_logits(loaded.model, prompt, 32)
    finally:
        routing.install(loaded.model)
    assert tokens == expected_tokens
    for got, expected in zip(logits, expected_logits, strict=True):
        assert float(mx.max(mx.abs(got - expected))) <= 5e-2 * float(mx.max(mx.abs(expected)))


@PROPERTIES
@given(
    rows=st.integers(1, 9),
    n=st.integers(1, 3000),
    spread=st.floats(0.1, 40.0),
    dtype=st.sampled_from(FLOATS),
    seed=st.integers(0, 2**16),
)
def test_logsumexp_matches_the_exact_value(
    isa: str, rows: int, n: int, spread: float, dtype: mx.Dtype, seed: int
) -> None:
    """Against the sum in float64: within 1e-5 of max(1, |value|) (the exp's two ulps and the
    sum's rounding), plus the rounding of the output type. MLX's own fp32 logsumexp is off by
    more over a vocabulary's worth of logits; this checks the kernel's own error."""
    import numpy as np

    x = (spread * mx.random.normal((rows, n), key=mx.random.key(seed))).astype(dtype)
    values = np.array(x.astype(mx.float32), dtype=np.float64)
    top = values.max(axis=-1, keepdims=True)
    exact = top + np.log(np.exp(values - top).sum(axis=-1, keepdims=True))
    got = np.array(
        routing.logsumexp(x, axis=-1, keepdims=True).astype(mx.float32), dtype=np.float64
    )
    assert got.shape == (rows, 1)
    allowed = 1e-5 * np.maximum(1.0, np.abs(exact)) + ROUNDING[dtype] * np.abs(exact)
    assert float(np.max(np.abs(got - exact) / allowed)) <= 1.0


@PROPERTIES
@given(
    rows=st.integers(1, 9),
    n=st.integers(1, 3000),
    dtype=st.sampled_from(FLOATS),
    ties=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_argmax_gives_mlxs_index(
    isa: str, rows: int, n: int, dtype: mx.Dtype, ties: bool, seed: int
) -> None:
    """The greedy sampler's argmax on the kernel gives MLX's index, the first of equal largest
    values among them (few distinct values make many ties)."""
    x = mx.random.normal((rows, n), key=mx.random.key(seed))
    if ties:
        x = mx.round(x)
    x = x.astype(dtype)
    got = routing.argmax_last(x)
    assert got.dtype == mx.uint32 and got.shape == (rows,)
    assert mx.array_equal(got, mx.argmax(x, axis=-1))


def test_argmax_passes_over_nans_and_infinities_as_mlx_does(isa: str) -> None:
    """A NaN counts as the largest (the first NaN's index), as MLX's argmax has it; -inf and
    +inf compare as values; a row of -inf gives 0."""
    nan, inf = float("nan"), float("inf")
    rows = [
        [nan, 1.0, 5.0, 2.0],
        [1.0, nan, 5.0, nan],
        [-inf, -inf, -inf, -inf],
        [-inf, nan, -inf, -3.0],
        [2.0, inf, 7.0, inf],
        [-0.0, 0.0, -1.0, 0.0],
    ]
    for dtype in FLOATS:
        x = mx.array(rows * 5, dtype=dtype).reshape(-1, 20)[:, :20]  # 20 wide: a vector and a tail
        wide = mx.concatenate([mx.full((6, 40), -inf, dtype=dtype), mx.array(rows, dtype=dtype)], 1)
        for case in (mx.array(rows, dtype=dtype), x, wide):
            assert mx.array_equal(kernels.argmax_last(case), mx.argmax(case, axis=-1))


def test_argmax_keeps_the_leading_axes_and_refuses_an_empty_row() -> None:
    x = mx.random.normal((2, 3, 50), key=mx.random.key(3)).astype(mx.bfloat16)
    assert mx.array_equal(kernels.argmax_last(x), mx.argmax(x, axis=-1))
    with pytest.raises(ValueError, match="last axis"):
        kernels.argmax_last(mx.zeros((2, 0)))


def test_mlx_lms_sampling_normaliser_runs_on_the_kernel(kernel_models: dict[str, Path]) -> None:
    """mlx-lm's generate module normalises the logits with its `mx.logsumexp` at every step:
    loading a model routes that name to the kernel, and going back to MLX's kernels restores
    it; other reductions keep MLX's."""
    generate: Any = sys.modules["mlx_lm.generate"]
    loaded = load_model_sync(kernel_models["llama-q4-g64"])
    logits = mx.random.normal((2, 300), key=mx.random.key(1))
    assert generate.mx.logsumexp is routing.logsumexp
    assert mx.allclose(generate.mx.logsumexp(logits, axis=-1), mx.logsumexp(logits, axis=-1))
    assert mx.allclose(routing.logsumexp(logits, axis=0), mx.logsumexp(logits, axis=0))
    row = logits[:1]
    for keepdims in (False, True):  # no axis: every axis, as MLX's; its shape too
        ours, theirs = (
            routing.logsumexp(row, keepdims=keepdims),
            mx.logsumexp(row, keepdims=keepdims),
        )
        assert ours.shape == theirs.shape and mx.allclose(ours, theirs)
    routing.uninstall(loaded.model)
    try:
        assert generate.mx is mx
    finally:
        routing.install(loaded.model)


@PROPERTIES
@given(
    dtype=st.sampled_from(FLOATS),
    shape=st.sampled_from(
        [(1, 32, 1, 64), (2, 8, 7, 128), (3, 5, 64), (2, 3, 4, 6, 32), (1, 4, 300, 64)]
    ),
    rotated=st.sampled_from([1.0, 0.5, 0.75]),
    traditional=st.booleans(),
    offset=st.integers(0, 5000),
    scale=st.sampled_from([1.0, 0.5, 0.25]),
    base=st.sampled_from([10000.0, 500000.0, 1e6]),
    strided=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_rope_matches_mlx(
    dtype: mx.Dtype,
    shape: tuple[int, ...],
    rotated: float,
    traditional: bool,
    offset: int,
    scale: float,
    base: float,
    strided: bool,
    seed: int,
) -> None:
    """Against mx.fast.rope (MLX's CPU fallback), on a contiguous input or a transposed view (as
    mlx-lm passes its queries and keys). The kernel rounds where the fallback rounds (cos and sin
    to the type, then each product and each sum), but MLX's fp32 cos and sin are not glibc's, so
    a value may differ by one step of the type times the largest input (fp32: two steps)."""
    features = shape[-1]
    dims = max(2, int(features * rotated) // 2 * 2)
    x = (mx.random.normal(shape, key=mx.random.key(seed)) * 2).astype(dtype)
    if strided and x.ndim == 4:
        x = mx.array(mx.swapaxes(x, 1, 2))
        mx.eval(x)
        x = mx.swapaxes(x, 1, 2)  # a [B, H, T, D] view of [B, T, H, D], as mlx-lm's heads are
    inv = routing._base_inv_freqs(dims, base)  # pyright: ignore[reportPrivateUsage]
    got = kernels.rope(x, inv, offset, dims, traditional, scale)
    expected = mx.fast.rope(
        x, dims, traditional=traditional, base=base, scale=scale, offset=offset
    ).astype(mx.float32)
    assert got.dtype == dtype and got.shape == x.shape
    step = {mx.float32: 2.0**-22, mx.bfloat16: 2.0**-8, mx.float16: 2.0**-11}[dtype]
    allowed = step * float(mx.max(mx.abs(x.astype(mx.float32)))) + 2 * SMALLEST[dtype]
    assert float(mx.max(mx.abs(got.astype(mx.float32) - expected))) <= allowed
    # The features past `dims` pass through unchanged.
    assert mx.array_equal(got[..., dims:], x[..., dims:])


def test_rope_takes_an_offset_for_each_batch_entry() -> None:
    """Batched decoding's caches hold one offset per request."""
    x = mx.random.normal((3, 4, 2, 64), key=mx.random.key(3)).astype(mx.bfloat16)
    offsets = mx.array([0, 5, 900])
    inv = routing._base_inv_freqs(64, 10000.0)  # pyright: ignore[reportPrivateUsage]
    got = kernels.rope(x, inv, offsets, 64, False, 1.0)
    expected = mx.fast.rope(x, 64, traditional=False, base=10000.0, scale=1.0, offset=offsets)
    assert mx.array_equal(got, expected)
    with pytest.raises(ValueError, match="one per batch entry"):
        kernels.rope(x, inv, mx.array([1, 2]), 64, False, 1.0)
    with pytest.raises(ValueError, match="dims must be even"):
        kernels.rope(x, inv, 0, 63, False, 1.0)


def test_llama3_rope_runs_on_the_kernel_with_its_own_frequencies() -> None:
    from mlx_lm.models.rope_utils import Llama3RoPE

    config = {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 8192}  # fmt: skip
    layer = Llama3RoPE(64, traditional=False, base=500000.0, scaling_config=config)
    x = mx.random.normal((1, 8, 5, 64), key=mx.random.key(4)).astype(mx.bfloat16)
    expected = layer(x, offset=3000)
    model = nn.Sequential(layer)
    assert routing.install(model) == 1 and type(layer).__name__ == "CpuLlama3RoPE"
    try:
        assert mx.array_equal(layer(x, offset=3000), expected)
    finally:
        routing.uninstall(model)


def test_yarn_rope_runs_on_the_kernel_with_its_scale_and_frequencies() -> None:
    """gpt-oss's rope (yarn: the input scaled by mscale, its own frequencies): the same values."""
    from mlx_lm.models.rope_utils import YarnRoPE

    yarn = {"scaling_factor": 32.0, "original_max_position_embeddings": 4096,
            "beta_fast": 32.0, "beta_slow": 1.0}  # fmt: skip
    layer = YarnRoPE(64, traditional=False, base=150000.0, **yarn)
    assert layer.mscale != 1.0
    x = mx.random.normal((1, 8, 5, 64), key=mx.random.key(5)).astype(mx.bfloat16)
    expected = [layer(x, offset=3000), layer(x, offset=7, inverse=True)]
    model = nn.Sequential(layer)
    assert routing.install(model) == 1 and type(layer).__name__ == "CpuYarnRoPE"
    try:
        assert mx.array_equal(layer(x, offset=3000), expected[0])
        assert mx.array_equal(layer(x, offset=7, inverse=True), expected[1])
    finally:
        routing.uninstall(model)


def test_a_models_rotary_embeddings_run_on_the_kernel(kernel_models: dict[str, Path]) -> None:
    loaded = load_model_sync(kernel_models["qwen3-q4-g32"])
    ropes = [m for _, m in loaded.model.named_modules() if isinstance(m, nn.RoPE)]
    assert ropes and all(type(m).__name__ == "CpuRoPE" for m in ropes)


def test_decode_attention_refuses_mismatched_arguments() -> None:
    q = mx.zeros((1, 4, 1, 8))
    with pytest.raises(ValueError, match="multiple of k's"):
        kernels.decode_attention(q, mx.zeros((1, 3, 5, 8)), mx.zeros((1, 3, 5, 8)), 1.0, None)
    with pytest.raises(ValueError, match="head dim"):
        kernels.decode_attention(q, mx.zeros((1, 2, 5, 4)), mx.zeros((1, 2, 5, 4)), 1.0, None)
    with pytest.raises(ValueError, match="share a dtype"):
        kernels.decode_attention(
            q, mx.zeros((1, 2, 5, 8), mx.bfloat16), mx.zeros((1, 2, 5, 8)), 1.0, None
        )


def test_bad_arguments_are_refused_with_the_reason() -> None:
    w, scales, biases = mx.quantize(weights(8, 128, 5), group_size=64, bits=4)
    x = mx.ones((1, 128))
    with pytest.raises(ValueError, match="bits must be 4 or 8"):
        kernels.quantized_matmul(x, w, scales, biases, 64, 3)
    with pytest.raises(ValueError, match="features"):
        kernels.quantized_matmul(mx.ones((1, 100)), w, scales, biases, 64, 4)
    with pytest.raises(ValueError, match="bfloat16, float16 or float32"):
        kernels.dense_matmul(x, mx.ones((8, 128), dtype=mx.int32))


def test_an_instruction_set_the_cpu_lacks_is_never_chosen() -> None:
    assert ext().isa_supported("portable")
    assert not ext().use_isa("no-such-isa")
    # The kernels in use are always ones this CPU reported.
    assert ext().isa_supported(ext().isa())


# ------------------------------------------------------------------------------ whole models


@pytest.fixture(scope="module")
def kernel_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A llama 256 wide (so groups of 128 fit) and a qwen3, quantized and in bf16."""
    from mlx_lm import convert

    from tests.tiny_models import build_tiny_model

    root = tmp_path_factory.mktemp("kernel-models")
    llama = build_tiny_model(root / "llama", "llama", hidden_size=256, intermediate_size=512)
    qwen3 = build_tiny_model(root / "qwen3", "qwen3", hidden_size=128, intermediate_size=384)
    convert(str(llama), mlx_path=str(root / "llama-bf16"), dtype="bfloat16")
    return {
        "llama-q4-g64": quantized_copy(llama, root / "llama-q4", 4, 64),
        "llama-q8-g128": quantized_copy(llama, root / "llama-q8", 8, 128),
        "qwen3-q4-g32": quantized_copy(qwen3, root / "qwen3-q4", 4, 32),
        "llama-bf16": root / "llama-bf16",
    }


# How far the logits may move, as a share of the largest: bf16's activations round at every
# layer, so that another order of accumulation moves them by a few bf16 steps (1/128 of the value
# each); the fp32 demo's only by fp32 rounding.
LOGITS_TOLERANCE = {"llama-bf16": 5e-2, "demo": 1e-4}


@pytest.mark.parametrize(
    "name", ["llama-q4-g64", "llama-q8-g128", "qwen3-q4-g32", "llama-bf16", "demo"]
)
def test_a_model_gives_the_same_greedy_tokens_with_and_without_the_kernels(
    kernel_models: dict[str, Path], name: str
) -> None:
    """The first 48 greedy tokens are identical, and the logits at every step agree within 2 % of
    the largest logit (LOGITS_TOLERANCE where it says otherwise)."""
    path = bundled_demo_dir() if name == "demo" else kernel_models[name]
    loaded = load_model_sync(path)
    with_kernels = load_model_sync(path)
    routed = sum(
        1 for _, m in with_kernels.model.named_modules() if type(m).__name__.startswith("Cpu")
    )
    assert routed > 0
    assert routing.uninstall(loaded.model) == routed  # `loaded` now runs on MLX's kernels
    prompt = loaded.tokenizer.encode("Tell me a story about a dog and a cat.")
    expected_tokens, expected_logits = greedy_logits(loaded.model, prompt, 48)
    tokens, logits = greedy_logits(with_kernels.model, prompt, 48)
    assert tokens == expected_tokens
    for got, expected in zip(logits, expected_logits, strict=True):
        scale = float(mx.max(mx.abs(expected)))
        assert float(mx.max(mx.abs(got - expected))) <= LOGITS_TOLERANCE.get(name, 2e-2) * scale


def test_the_fp32_demos_linears_and_head_run_on_the_kernels() -> None:
    """fp32 weights (the bundled demo's) take the dense GEMV: its linears and tied head are
    routed (its tokens: the test below)."""
    loaded = load_model_sync(bundled_demo_dir())
    kinds = {type(m).__name__ for _, m in loaded.model.named_modules()}
    assert {"CpuLinear", "CpuEmbedding"} <= kinds


def test_an_uncovered_quantization_runs_on_mlx_and_says_so_once(
    kernel_models: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.tiny_models import build_tiny_model

    source = build_tiny_model(tmp_path / "src", "llama", hidden_size=128, intermediate_size=256)
    kernels.warn_once.cache_clear()
    for bits in (2, 5):
        folder = quantized_copy(source, tmp_path / f"q{bits}", bits, 64)
        with caplog.at_level(logging.WARNING, logger="engine.kernels"):
            loaded = load_model_sync(folder)
        linears = [
            m for _, m in loaded.model.named_modules() if not isinstance(m, (nn.RMSNorm, nn.RoPE))
        ]
        assert not any(type(m).__name__.startswith("Cpu") for m in linears)
        prompt = loaded.tokenizer.encode("Hello there")
        tokens, _ = greedy_logits(loaded.model, prompt, 4)
        assert len(tokens) == 4
        notes = [r.message for r in caplog.records if f"{bits}-bit" in r.message]
        assert len(notes) == 1, notes  # once, though every layer of the model is uncovered
        assert "MLX's own kernels" in notes[0]


def test_an_extension_built_for_another_mlx_is_refused(tmp_path: Path) -> None:
    """MLX's C++ ABI changes between releases: the engine names both and runs on MLX's kernels."""
    code = (
        "import engine, mlx.core as mx\n"
        "mx.__version__ = '0.0.1'\n"
        "from engine import kernels\n"
        "print(kernels.available())\n"
        "print(kernels.describe())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert result.returncode == 0, result.stderr
    available, line = result.stdout.strip().splitlines()
    assert available == "False"
    assert "0.0.1" in line and ext().built_for_mlx in line and "pip install -e ." in line


def test_the_kernels_can_be_turned_off() -> None:
    code = "import engine\nfrom engine import kernels\nprint(kernels.describe())\n"
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={**os.environ, "EXO_TUI_KERNELS": "mlx"},
    )
    assert result.stdout.strip() == "mlx (EXO_TUI_KERNELS=mlx)"


def test_a_quantized_model_holds_what_placement_counts(kernel_models: dict[str, Path]) -> None:
    """Placement counts a model's weights as its bytes on disk: with the kernels the weights stay
    4-bit in memory (no fp32 copy), before and after a forward pass."""
    gc.collect()
    mx.clear_cache()
    before = mx.get_active_memory()
    loaded = load_model_sync(kernel_models["llama-q4-g64"])
    assert any(type(m).__name__.startswith("Cpu") for _, m in loaded.model.named_modules())
    greedy_logits(loaded.model, loaded.tokenizer.encode("Once upon a time"), 8)
    gc.collect()
    mx.clear_cache()
    held = mx.get_active_memory() - before
    assert held == pytest.approx(loaded.card.bytes_on_disk, rel=0.03)


@pytest.mark.parametrize("setting", ["off", "auto"])
def test_many_rows_skip_a_scalar_blas(setting: str) -> None:
    """Netlib's BLAS (what MLX bundles) multiplies at a few GFLOP/s: with it, every row count
    runs on the kernels' own GEMV; with OpenBLAS, many rows may go to its GEMM."""
    code = (
        "from engine import blas, kernels\n"
        "assert kernels.available()\n"
        "print(blas.describe().split()[0], kernels.extension().gemv_max_rows())"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        env={**os.environ, "EXO_TUI_BLAS": setting},
    )  # fmt: skip
    which, rows = done.stdout.split()
    assert (int(rows) >= 1 << 30) == (which == "reference"), done.stdout
    if setting == "off":
        assert which == "reference"


def test_no_kernel_puts_a_copy_node_in_front_of_its_inputs(tmp_path: Path) -> None:
    """The kernels look at their inputs' layout when they run: what is row-major already
    (loaded weights, the kernels' own outputs) goes in as it is, and a view that is not (a
    transpose, a broadcast mask) is copied then. Neither puts a Contiguous node in the graph (a
    node MLX dispatches every step even where it copies nothing), and both give the values of
    the row-major input."""
    w, scales, biases = mx.quantize(weights(64, 256, 0), 64, 4)
    norm = mx.ones((256,))
    x = mx.random.normal((1, 256), key=mx.random.key(1))
    mx.eval(w, scales, biases, norm, x)

    product = kernels.quantized_matmul(kernels.rms_norm(x, norm, 1e-5), w, scales, biases, 64, 4)
    out = kernels.silu_mul(product, product)
    graph = tmp_path / "graph.dot"
    mx.export_to_dot(str(graph), out)
    assert "Contiguous" not in graph.read_text()

    lazy_view = mx.swapaxes(x.reshape(256, 1) * 1.0, 0, 1)  # unevaluated, strided
    viewed = kernels.quantized_matmul(lazy_view, w, scales, biases, 64, 4)
    normed = kernels.rms_norm(mx.swapaxes(x.reshape(8, 32) * 1.0, 0, 1), mx.ones((8,)), 1e-5)
    mx.export_to_dot(str(graph), [viewed, normed])
    assert "Contiguous" not in graph.read_text()
    assert mx.array_equal(viewed, kernels.quantized_matmul(x, w, scales, biases, 64, 4))
    packed = mx.contiguous(mx.swapaxes(x.reshape(8, 32), 0, 1))
    assert mx.array_equal(normed, kernels.rms_norm(packed, mx.ones((8,)), 1e-5))
