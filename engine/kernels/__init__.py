"""Fast CPU matmul kernels for MLX: quantized (MLX's affine 4- and 8-bit format, and MXFP4), the
experts' products of a mixture of experts, and 16-bit.

MLX's x86 CPU kernels for these products are scalar loops, so every mlx-community model (4-bit,
8-bit, bf16) ran at a fraction of the memory speed here. `_kernels` is a C++ extension built at
install with MLX's own extension support (csrc/, CMakeLists.txt): MLX primitives with
`eval_cpu`, vectorised for AVX-512 (with AVX512-BF16 and AMX where the CPU has them) and AVX2,
chosen from what the CPU reports at run time, with a portable build for every other CPU,
multithreaded over output rows, and the RMS norms, rotary embeddings and decoding's attention
(MLX's CPU runs them as chains of generic ops). One row of x (decoding) runs as a GEMV on the
packed weights; a few rows (several requests decoding at once) and many (prefill) on AMX tiles
where the CPU has them, or else as GEMVs and a dequantized tile at a time through BLAS. Weights
stay in their stored format.

`engine.kernels.routing.install(model)` routes a loaded model's linears here when MLX computes on
the CPU. `EXO_TUI_KERNELS=mlx` keeps MLX's own kernels. Where the extension is absent (no
compiler at install) or was built for another MLX release, the engine runs on MLX's kernels and
says so once.
"""
# pyright: reportMissingTypeStubs=false, reportUnknownMemberType=false, reportUnknownVariableType=false
# (the extension module ships no type information.)

from __future__ import annotations

import functools
import importlib
import logging
import os
from types import ModuleType
from typing import Any, cast

import mlx.core as mx

from engine import blas

log = logging.getLogger(__name__)

QUANTIZED_BITS = (4, 8)
GROUP_SIZES = (32, 64, 128)
FLOAT_TYPES = (mx.float32, mx.bfloat16, mx.float16)
SLOW_NOTE = (
    "MLX's own CPU kernels for quantized and 16-bit weights are scalar: 4-bit and bf16 models run "
    "many times slower"
)


@functools.cache
def _load() -> tuple[ModuleType | None, str]:
    """The extension and a line on it, or None and why it is not used."""
    setting = os.environ.get("EXO_TUI_KERNELS", "auto").strip().lower()
    if setting in ("mlx", "off", "0", "no"):
        return None, "mlx (EXO_TUI_KERNELS=mlx)"
    try:
        module = importlib.import_module("engine.kernels._kernels")
    except ImportError as error:
        return None, (
            f"mlx (the kernel extension is not built: {error}). {SLOW_NOTE}; to build it, install "
            "a C++ compiler and cmake (Debian: apt install g++ cmake), then pip install -e ."
        )
    built_for = cast(str, module.built_for_mlx)
    running = cast(str, mx.__version__).split(".dev")[0]  # pyright: ignore[reportAttributeAccessIssue]
    if built_for != running:
        return None, (
            f"mlx (the kernel extension was built for MLX {built_for}, this is MLX {running}, and "
            f"MLX's C++ ABI differs between releases). {SLOW_NOTE}; rebuild it: pip install -e ."
        )
    if blas.describe().startswith("reference"):
        # Netlib's BLAS is scalar: many rows run on the kernels' own GEMV instead of its GEMM.
        module.set_gemv_max_rows(1 << 30)
    if not module.amx():
        # Without AMX (AMD's Zen 4), one row of bf16 x by 4-bit weights reads faster as 8-bit
        # integers than as 16-bit ones, as llama.cpp rounds x (bench/moe.md).
        module.set_int8_min_rows(1)
    tiles = "+amx" if module.amx() else ""  # many rows of bf16 products run on AMX tiles
    return module, f"{module.isa()}{tiles} ({module.threads()} threads)"


def extension() -> Any | None:
    """The loaded extension module, or None where the kernels are off or unavailable."""
    return _load()[0]


def available() -> bool:
    return extension() is not None


def describe() -> str:
    """Which CPU kernels run: `avx512bf16+amx (2 threads)`, or `mlx (...why...)`."""
    return _load()[1]


def short() -> str:
    """`cpu kernels: avx512`, for a node's card and `exo-tui models`."""
    return f"cpu kernels: {describe().split(' ', 1)[0]}"


@functools.cache
def warn_once(message: str) -> None:
    log.warning(message)


def one_float_type(*arrays: mx.array) -> bool:
    """Whether the arrays share one float type the elementwise kernels take."""
    return arrays[0].dtype in FLOAT_TYPES and all(a.dtype == arrays[0].dtype for a in arrays)


def covers_quantized(bits: int, group_size: int, mode: str, has_biases: bool) -> bool:
    if mode == "mxfp4":  # MLX's MXFP4: E8M0 scales, no biases (gpt-oss's experts)
        return bits == 4 and group_size == 32 and not has_biases
    return mode == "affine" and has_biases and bits in QUANTIZED_BITS and group_size in GROUP_SIZES


def quantized_matmul(
    x: mx.array,
    w: mx.array,
    scales: mx.array,
    biases: mx.array | None,
    group_size: int,
    bits: int,
    mode: str = "affine",
) -> mx.array:
    """x @ dequantize(w, scales, biases).T through the extension (which must be available)."""
    module = extension()
    assert module is not None
    return cast(mx.array, module.quantized_matmul(x, w, scales, biases, group_size, bits, mode))


def gather_quantized_matmul(
    x: mx.array,
    w: mx.array,
    scales: mx.array,
    biases: mx.array | None,
    indices: mx.array,
    group_size: int,
    bits: int,
    mode: str = "affine",
) -> mx.array:
    """mx.gather_qmm(x, w, scales, biases, rhs_indices=indices, transpose=True, ...): each row of
    x [..., M, K] by the experts `indices` names (broadcast against x's batch axes), through the
    extension (which must be available). An index out of range gives NaN, never a read."""
    module = extension()
    assert module is not None
    return cast(
        mx.array,
        module.gather_quantized_matmul(x, w, scales, biases, indices, group_size, bits, mode),
    )


def rms_norm(x: mx.array, w: mx.array, eps: float) -> mx.array:
    """mx.fast.rms_norm(x, w, eps), the same values, for x and w of one float type."""
    module = extension()
    assert module is not None
    return cast(mx.array, module.rms_norm(x, w, eps))


def dense_matmul(x: mx.array, w: mx.array) -> mx.array:
    """x @ w.T for a bfloat16, float16 or float32 `w` through the extension (which must be
    available)."""
    module = extension()
    assert module is not None
    return cast(mx.array, module.dense_matmul(x, w))


def decode_attention(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    scale: float,
    mask: mx.array | None,
    sinks: mx.array | None = None,
) -> mx.array:
    """softmax(scale · q kᵀ + mask) v for few query rows a head (decoding), through the
    extension (which must be available). q is [B, H, Lq, D]; k and v [B, KV heads, L, D], read in
    place; the mask None, boolean (True attends) or additive, broadcastable to [B, H, Lq, L];
    `sinks` (gpt-oss's), one logit a head [H] that joins each softmax with no value."""
    module = extension()
    assert module is not None
    return cast(mx.array, module.decode_attention(q, k, v, scale, mask, sinks))


def silu_mul(gate: mx.array, x: mx.array) -> mx.array:
    """silu(gate) * x (mlx-lm's swiglu) through the extension (which must be available)."""
    module = extension()
    assert module is not None
    return cast(mx.array, module.silu_mul(gate, x))


def rope(
    x: mx.array,
    inv_freqs: mx.array,
    offset: int | mx.array,
    dims: int,
    traditional: bool,
    scale: float,
) -> mx.array:
    """mx.fast.rope with its inverse frequencies given (dims / 2 float32 values), rounded where
    MLX's CPU fallback rounds, through the extension (which must be available)."""
    module = extension()
    assert module is not None
    at = offset if isinstance(offset, mx.array) else mx.array(offset, dtype=mx.int32)
    return cast(mx.array, module.rope(x, inv_freqs, at, dims, traditional, scale))


def argmax_last(x: mx.array) -> mx.array:
    """mx.argmax(x, axis=-1) through the extension (which must be available)."""
    module = extension()
    assert module is not None
    return cast(mx.array, module.argmax_last(x))


def logsumexp_last(x: mx.array) -> mx.array:
    """mx.logsumexp(x, axis=-1, keepdims=True) through the extension (which must be available)."""
    module = extension()
    assert module is not None
    return cast(mx.array, module.logsumexp_last(x))


def back_with_huge_pages(arrays: list[mx.array]) -> int:
    """Move the evaluated arrays' memory onto transparent huge pages where the system has them
    (Linux 6.1 and later); their values stay as they are. Decoding reads every weight once a
    token, and on 4 KiB pages that is a TLB miss every 4 KiB. The bytes moved; 0 where the
    kernels are off or unavailable, or MLX computes on a GPU. `EXO_TUI_HUGE_PAGES=off` leaves
    the pages as they are (to measure the difference)."""
    module = extension()
    if module is None or mx.default_device() != mx.cpu:
        return 0
    if os.environ.get("EXO_TUI_HUGE_PAGES", "on").strip().lower() in ("off", "0", "no"):
        return 0
    return cast(int, module.back_with_huge_pages(arrays))
