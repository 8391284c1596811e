"""The experts' products (mx.gather_qmm) and MXFP4 on the CPU kernels compute what MLX computes.

Tolerance: as tests/engine/test_kernels.py states it for the dense products: an output may differ
from MLX's product computed in fp32 by 1e-5 of the sum of |x_k * w_k| over its dot product, plus
the rounding of the output type, plus, where bf16 x meets 4-bit affine or 8-bit affine weights
with bf16 scales or MXFP4 on AVX512-BF16, half a step of x's integers times |w|. By 4-bit weights
the kernels take an expert's rows of x as 16-bit integers for one row and 8-bit ones (a step a
64 values) for several: the bound here is the coarser of the two wherever an expert could get
several rows. By 8-bit and MXFP4 weights every row takes 8-bit integers, a step a 32 values.
"""
# pyright: reportUnknownMemberType=false, reportUnknownVariableType=false, reportUnknownArgumentType=false

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from engine import kernels
from engine.kernels import routing
from engine.loading import load_model_sync
from tests.engine.kernel_checks import (
    FLOATS,
    PROPERTIES,
    assert_close,
    ext,
    greedy_logits,
    integer_x_rounding,
    promoted,
    quantized_copy,
    weights,
)

pytestmark = pytest.mark.skipif(not kernels.available(), reason=kernels.describe())

# Each example builds experts' weights: fewer examples than the dense products take.
EXPERTS_PROPERTIES = settings(PROPERTIES, max_examples=40)
FORMATS = [("affine", 4, 32), ("affine", 4, 64), ("affine", 4, 128), ("affine", 8, 32),
           ("affine", 8, 64), ("affine", 8, 128), ("mxfp4", 4, 32)]  # fmt: skip


def quantized_experts(
    experts: int,
    n: int,
    k: int,
    mode: str,
    bits: int,
    group_size: int,
    scale_type: mx.Dtype,
    seed: int,
) -> tuple[mx.array, mx.array, mx.array | None, mx.array]:
    """Random experts' weights as MLX quantizes them, and the same weights dequantized (fp32)."""
    dense = mx.random.normal((experts, n, k), key=mx.random.key(seed)) * 0.05
    if mode == "mxfp4":
        w, scales = mx.quantize(dense, group_size=group_size, bits=bits, mode=mode)
        biases = None
        values = mx.dequantize(w, scales, None, group_size, bits, mode=mode).astype(mx.float32)
    else:
        w, scales, biases = mx.quantize(dense, group_size=group_size, bits=bits)
        scales, biases = scales.astype(scale_type), biases.astype(scale_type)
        values = mx.dequantize(
            w, scales.astype(mx.float32), biases.astype(mx.float32), group_size, bits
        )
    return w, scales, biases, values


def x_rounding(isa: str, mode: str, bits: int, x: mx.array, scale_type: mx.Dtype,
               values: mx.array, indices: mx.array) -> mx.array | float:  # fmt: skip
    """The most x's integers move each output (see the module's docstring); 0 where the kernels
    take x as it is."""
    k = x.shape[-1]
    if not isa.startswith("avx512bf16") or x.dtype != mx.bfloat16:
        return 0.0
    if mode == "mxfp4" or bits == 8:
        if k % 64 or (mode == "affine" and scale_type != mx.bfloat16):
            return 0.0
        block, top = 32, 127  # every row as 8-bit integers, 32 values a step
    elif scale_type != mx.bfloat16 or k % 128:
        return 0.0
    else:
        block, top = (64, 127) if k % 256 == 0 else (32, 32767)
    x32 = x.astype(mx.float32)
    halves = mx.max(mx.abs(x32.reshape(*x.shape[:-1], k // block, block)), axis=-1) / top / 2
    steps = mx.repeat(halves, block, axis=-1).reshape(x.shape)
    return reference(steps, mx.abs(values), indices)


def reference(x: mx.array, values: mx.array, indices: mx.array) -> mx.array:
    """x [..., M, K] by the experts `indices` names, in fp32: each expert's rows at once."""
    batch = mx.broadcast_shapes(x.shape[:-2], indices.shape)
    rows, k = x.shape[-2:]
    xs = np.array(mx.broadcast_to(x, (*batch, rows, k)).reshape(-1, rows, k), dtype=np.float32)
    flat = np.array(mx.broadcast_to(indices, batch).reshape(-1))
    w = np.array(values, dtype=np.float32)
    out = np.zeros((flat.size, rows, w.shape[1]), dtype=np.float32)
    for expert in np.unique(flat):
        chosen = flat == expert
        out[chosen] = xs[chosen] @ w[expert].T
    return mx.array(out).reshape(*batch, rows, w.shape[1])


@EXPERTS_PROPERTIES
@given(
    fmt=st.sampled_from(FORMATS),
    groups=st.integers(1, 9),
    n=st.integers(1, 70),
    experts=st.integers(1, 12),
    tokens=st.one_of(st.integers(1, 4), st.integers(5, 150)),
    top_k=st.integers(1, 8),
    rows=st.sampled_from([1, 1, 1, 2]),
    layout=st.sampled_from(["switch", "sorted"]),
    x_type=st.sampled_from(FLOATS),
    scale_type=st.sampled_from(FLOATS),
    seed=st.integers(0, 2**16),
)
@example(fmt=("affine", 4, 64), groups=4, n=64, experts=8, tokens=1, top_k=8, rows=1,
         layout="switch", x_type=mx.bfloat16, scale_type=mx.bfloat16, seed=0)  # fmt: skip
@example(fmt=("mxfp4", 4, 32), groups=9, n=40, experts=4, tokens=64, top_k=4, rows=1,
         layout="sorted", x_type=mx.bfloat16, scale_type=mx.bfloat16, seed=1)  # fmt: skip
def test_gather_quantized_matmul_matches_mlx(
    isa: str,
    fmt: tuple[str, int, int],
    groups: int,
    n: int,
    experts: int,
    tokens: int,
    top_k: int,
    rows: int,
    layout: str,
    x_type: mx.Dtype,
    scale_type: mx.Dtype,
    seed: int,
) -> None:
    """As mlx-lm's SwitchGLU calls it: x [tokens, 1, rows, K] by indices [tokens, top_k]
    (experts repeated within a token and across tokens, any order), or sorted by expert with
    x [tokens * top_k, rows, K] and indices [tokens * top_k]."""
    mode, bits, group_size = fmt
    k = group_size * groups
    w, scales, biases, values = quantized_experts(
        experts, n, k, mode, bits, group_size, scale_type, seed
    )
    key = mx.random.key(seed + 1)
    indices = mx.random.randint(0, experts, (tokens, top_k), key=key).astype(mx.uint32)
    x = mx.random.normal((tokens, 1, rows, k), key=mx.random.key(seed + 2)).astype(x_type)
    if layout == "sorted":
        order = mx.argsort(indices.reshape(-1))
        x = x.reshape(tokens, rows, k)[order // top_k]
        indices = indices.reshape(-1)[order]
    got = kernels.gather_quantized_matmul(x, w, scales, biases, indices, group_size, bits, mode)
    x32 = x.astype(mx.float32)
    expected = reference(x32, values, indices)
    out_type = x_type if mode == "mxfp4" else promoted(x_type, scale_type)
    assert got.dtype == out_type
    bound = reference(mx.abs(x32), mx.abs(values), indices)
    rounding = x_rounding(isa, mode, bits, x, scale_type, values, indices)
    assert_close(got, expected, bound, out_type, rounding)


@PROPERTIES
@given(
    groups=st.integers(1, 100),
    n=st.integers(1, 67),
    rows=st.one_of(st.integers(1, 8), st.integers(9, 300)),
    x_type=st.sampled_from(FLOATS),
    seed=st.integers(0, 2**16),
)
def test_mxfp4_matmul_matches_mlx(
    isa: str, groups: int, n: int, rows: int, x_type: mx.Dtype, seed: int
) -> None:
    """MXFP4 in a plain linear (K any multiple of 32: gpt-oss's 2880 is not one of 128)."""
    k = 32 * groups
    w, scales = mx.quantize(weights(n, k, seed), group_size=32, bits=4, mode="mxfp4")
    x = mx.random.normal((rows, k), key=mx.random.key(seed + 1)).astype(x_type)
    got = kernels.quantized_matmul(x, w, scales, None, 32, 4, "mxfp4")
    values = mx.dequantize(w, scales, None, 32, 4, mode="mxfp4").astype(mx.float32)
    x32 = x.astype(mx.float32)
    assert got.dtype == x_type
    rounding = (
        integer_x_rounding(isa, x32, values, mxfp4=True)
        if x_type == mx.bfloat16 and k % 64 == 0
        else 0.0
    )
    assert_close(got, x32 @ values.T, mx.abs(x32) @ mx.abs(values).T, x_type, rounding)


@pytest.mark.parametrize("fmt", [("affine", 4, 64), ("affine", 8, 32), ("mxfp4", 4, 32)])
@pytest.mark.parametrize("field", ["scales", "biases", "x"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_and_inf_give_what_mlx_gives(
    isa: str, fmt: tuple[str, int, int], field: str, bad: float
) -> None:
    mode, bits, group_size = fmt
    # E8M0 has no infinity (255 is its NaN), and mxfp4 no biases.
    if mode == "mxfp4" and (field == "biases" or (field == "scales" and bad == float("inf"))):
        pytest.skip("mxfp4 has no biases, and its one non-finite scale is NaN")
    w, scales, biases, _ = quantized_experts(6, 33, 256, mode, bits, group_size, mx.bfloat16, 3)
    x = mx.random.normal((4, 1, 1, 256), key=mx.random.key(4)).astype(mx.bfloat16)
    if field == "x":
        x[2, 0, 0, 200] = bad
    elif mode == "mxfp4":
        scales[1, 7, 2] = 255
    else:
        (scales if field == "scales" else biases)[1, 7, 2] = bad  # type: ignore[index]
    indices = mx.array([[0, 1], [1, 2], [3, 1], [5, 5]], dtype=mx.uint32)
    expected = mx.gather_qmm(x, w, scales, biases, rhs_indices=indices, transpose=True,
                             group_size=group_size, bits=bits, mode=mode)  # fmt: skip
    got = kernels.gather_quantized_matmul(x, w, scales, biases, indices, group_size, bits, mode)
    assert mx.array_equal(mx.isnan(got), mx.isnan(expected)), (fmt, field)
    assert mx.array_equal(mx.isinf(got), mx.isinf(expected)), (fmt, field)


def test_an_expert_out_of_range_is_refused_not_read() -> None:
    """A router that names an expert the weights do not hold gets NaN for that product (never a
    read past the weights); the other products are untouched."""
    w, scales, biases, values = quantized_experts(4, 16, 128, "affine", 4, 64, mx.float32, 5)
    x = mx.random.normal((2, 1, 1, 128), key=mx.random.key(6))
    for bad in (4, 1 << 30, -1):
        indices = mx.array([[0, bad], [3, 2]], dtype=mx.int32)
        got = kernels.gather_quantized_matmul(x, w, scales, biases, indices, 64, 4)
        assert bool(mx.all(mx.isnan(got[0, 1])))
        assert not bool(mx.any(mx.isnan(got[0, 0]))) and not bool(mx.any(mx.isnan(got[1])))
        good = mx.array([[0, 0], [3, 2]], dtype=mx.uint32)
        expected = reference(x, values, good)
        assert float(mx.max(mx.abs(got[1] - expected[1]))) < 1e-4


def test_bad_arguments_are_refused_with_the_reason() -> None:
    w, scales, biases, _ = quantized_experts(4, 16, 128, "affine", 4, 64, mx.float32, 5)
    x = mx.zeros((1, 1, 1, 128))
    indices = mx.zeros((1, 2), dtype=mx.uint32)
    with pytest.raises(ValueError, match="features"):
        kernels.gather_quantized_matmul(mx.zeros((1, 1, 1, 64)), w, scales, biases, indices, 64, 4)
    with pytest.raises(ValueError, match="biases"):
        kernels.gather_quantized_matmul(x, w, scales, None, indices, 64, 4)
    with pytest.raises(ValueError, match="mode"):
        kernels.gather_quantized_matmul(x, w, scales, biases, indices, 64, 4, "nvfp4")
    with pytest.raises(ValueError, match="integers"):
        kernels.gather_quantized_matmul(x, w, scales, biases, indices.astype(mx.float32), 64, 4)
    with pytest.raises(ValueError, match="3-D"):
        kernels.gather_quantized_matmul(x, w[0], scales[0], biases[0], indices, 64, 4)


@pytest.fixture(scope="module")
def moe_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny qwen3_moe in bf16 (as mlx-community's), 4-bit in groups of 64 and 8-bit in 32."""
    from mlx_lm import convert

    from tests.tiny_models import build_tiny_model

    root = tmp_path_factory.mktemp("moe-models")
    source = build_tiny_model(
        root / "qwen3-moe", "qwen3_moe", hidden_size=256, intermediate_size=512,
        num_experts=8, num_experts_per_tok=2,
    )  # fmt: skip
    convert(str(source), mlx_path=str(root / "bf16"), dtype="bfloat16")
    return {
        "q4": quantized_copy(root / "bf16", root / "q4", 4, 64),
        "q8": quantized_copy(root / "bf16", root / "q8", 8, 32),
    }


@pytest.mark.parametrize("name", ["q4", "q8"])
def test_a_moe_model_gives_the_same_greedy_tokens_with_and_without_the_kernels(
    moe_models: dict[str, Path], name: str
) -> None:
    """32 greedy tokens, from a prompt long enough that mlx-lm sorts the tokens by expert (64
    pairs or more) and then one token at a time: identical tokens, and logits within 2 % of the
    largest at every step (bf16 activations round at every layer)."""
    loaded = load_model_sync(moe_models[name])
    with_kernels = load_model_sync(moe_models[name])
    kinds = {type(m).__name__ for _, m in with_kernels.model.named_modules()}
    assert "CpuQuantizedSwitchLinear" in kinds
    routed = sum(
        1 for _, m in with_kernels.model.named_modules() if type(m).__name__.startswith("Cpu")
    )
    assert routing.uninstall(loaded.model) == routed
    prompt = loaded.tokenizer.encode("Tell me a story about a dog and a cat. " * 6)
    assert len(prompt) * 2 >= 64
    expected_tokens, expected_logits = greedy_logits(loaded.model, prompt, 32)
    tokens, logits = greedy_logits(with_kernels.model, prompt, 32)
    assert tokens == expected_tokens
    for got, expected in zip(logits, expected_logits, strict=True):
        scale = float(mx.max(mx.abs(expected)))
        assert float(mx.max(mx.abs(got - expected))) <= 2e-2 * scale


def test_switch_layers_without_quantization_stay_on_mlx() -> None:
    """mlx-lm's SwitchLinear with 16-bit weights is not routed (the kernels take quantized
    experts); the model still runs."""
    from mlx_lm.models.switch_layers import SwitchGLU

    glu = SwitchGLU(64, 32, 4)
    holder = nn.Module()
    holder.glu = glu
    routing.install(holder)
    assert type(glu.gate_proj).__name__ == "SwitchLinear"
    ext()  # the extension is there: only the layer's kind kept it on MLX
