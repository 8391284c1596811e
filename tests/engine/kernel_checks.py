"""What the kernel tests share: the instruction sets to run, the tolerance of a product against
MLX's in fp32 (see tests/engine/test_kernels.py's docstring), weights, and a model's greedy
tokens and logits."""
# pyright: reportUnknownMemberType=false, reportUnknownVariableType=false, reportUnknownArgumentType=false

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from hypothesis import HealthCheck, settings

from engine import kernels

# Each instruction set; "+amx" also runs bf16 x by 4-bit weights (a few rows of x: on the 8-bit
# tiles where the CPU has AMX-INT8, else on the bf16 ones) and bf16 by bf16 (from 16 rows) on AMX
# tiles; "+amx-bf16" runs every few rows of 4-bit products (from 3) on the bf16 tiles; "+int8" and
# "+int16" take one row of bf16 x by 4-bit weights as 8-bit or as 16-bit integers (no tiles).
ISAS = [
    name
    for name in (
        "avx512bf16+amx",
        "avx512bf16+amx-bf16",
        "avx512bf16+int8",
        "avx512bf16+int16",
        "avx512",
        "avx2",
        "portable",
    )
    if kernels.available()
]
ROUNDING = {mx.float32: 0.0, mx.bfloat16: 2.0**-8, mx.float16: 2.0**-11}
# The spacing of the type's smallest (subnormal) values: below it rounding is absolute.
SMALLEST = {mx.float32: 0.0, mx.bfloat16: 0.0, mx.float16: 2.0**-24}
FLOATS = [mx.float32, mx.bfloat16, mx.float16]
PROPERTIES = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def ext() -> Any:
    module = kernels.extension()
    assert module is not None
    return module


def assert_close(
    got: mx.array, expected: mx.array, bound: mx.array, dtype: mx.Dtype, x_rounding: Any = 0.0
) -> None:
    """`got` within accumulation-order differences (`bound` = sum |x w|), dtype rounding and,
    where the kernel rounds x to integers, `x_rounding` (see `integer_x_rounding`)."""
    assert got.shape == expected.shape
    difference = mx.abs(got.astype(mx.float32) - expected)
    allowed = (
        1e-5 * bound + x_rounding + ROUNDING[dtype] * mx.abs(expected) + SMALLEST[dtype] + 1e-30
    )
    worst = float(mx.max(difference / allowed))
    assert worst <= 1.0, f"off by {worst:.2f}x the tolerance"


def integer_x_rounding(
    isa: str, x32: mx.array, dense: mx.array, bits: int = 4, mxfp4: bool = False
) -> mx.array | float:
    """The most that x's integers (bf16 x by 4-bit, 8-bit or MXFP4 weights with bf16 scales on
    AVX512-BF16) move each output: the sum over k of |w_k| times half of x_k's step. By 4-bit
    weights one row of x (or k not a multiple of 256) takes 16-bit integers, a step the largest
    magnitude of its 32 values / 32767, and several rows 8-bit ones, a step the largest of its 64
    values / 127; by 8-bit and MXFP4 weights every row takes 8-bit ones, a step the largest of
    its 32 values / 127. 0 on the other instruction sets, which take x as it is."""
    if not isa.startswith("avx512bf16"):
        return 0.0
    k = x32.shape[-1]
    rows = x32.size // k
    if bits == 8 or mxfp4:
        block, top = 32, 127
    elif rows >= ext().int8_min_rows() and k % 256 == 0:
        block, top = 64, 127
    else:
        block, top = 32, 32767
    groups = mx.max(mx.abs(x32.reshape(-1, k // block, block)), axis=-1) / top / 2
    half_steps = mx.repeat(groups, block, axis=-1).reshape(x32.shape)
    return half_steps @ mx.abs(dense).T


def promoted(a: mx.Dtype, b: mx.Dtype) -> mx.Dtype:
    return (mx.zeros(1, dtype=a) + mx.zeros(1, dtype=b)).dtype


def weights(rows: int, k: int, seed: int) -> mx.array:
    return mx.random.normal((rows, k), key=mx.random.key(seed)) * 0.05


def quantized_copy(
    source: Path, folder: Path, bits: int, group_size: int, mode: str = "affine"
) -> Path:
    from mlx_lm import convert

    convert(
        str(source),
        mlx_path=str(folder),
        quantize=True,
        q_bits=bits,
        q_group_size=group_size,
        q_mode=mode,
    )
    return folder


def greedy_logits(
    model: nn.Module, prompt: list[int], steps: int
) -> tuple[list[int], list[mx.array]]:
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    tokens: list[int] = []
    logits: list[mx.array] = []
    step = mx.array(prompt)[None]
    for _ in range(steps):
        out = model(step, cache=cache)[0, -1].astype(mx.float32)
        mx.eval(out)
        logits.append(out)
        tokens.append(int(mx.argmax(out)))
        step = mx.array([[tokens[-1]]])
    return tokens, logits
