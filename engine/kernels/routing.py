"""Route a model's linears to the CPU kernels: mlx-lm's `QuantizedLinear`, `Linear` with 16-bit
or fp32 weights, `QuantizedEmbedding.as_linear` (a tied head) and the sharded linears that tensor
parallelism uses; a mixture of experts' `QuantizedSwitchLinear` (mlx-lm's `SwitchGLU` and
`SwitchMLP`: `mx.gather_qmm`); its `RMSNorm`s; and its rotary embeddings (`nn.RoPE` and mlx-lm's
`Llama3RoPE` and `YarnRoPE`). Each routed layer gets a subclass of its own class whose
forward pass calls the kernels; its weights and parameters are untouched, so loading, sharding
and the ring see the same module tree. mlx-lm's `swiglu`, which its model modules import by
name, is routed in those modules, and the `mx.logsumexp` that normalises the logits at every
sampling step in mlx-lm's generate module (`logsumexp` here). Greedy sampling takes
`argmax_last` (engine.sampling).
"""
# pyright: reportMissingTypeStubs=false, reportUnknownMemberType=false, reportUnknownVariableType=false
# pyright: reportUnknownArgumentType=false, reportAttributeAccessIssue=false
# (mlx.nn ships no complete type information.)

from __future__ import annotations

import functools
import importlib
import math
import sys
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.nn.layers import distributed
from mlx_lm.models.rope_utils import Llama3RoPE, YarnRoPE
from mlx_lm.models.switch_layers import QuantizedSwitchLinear

from engine import kernels

_ROUTED = "_exo_tui_cpu_kernels"
_ORIGINAL_SWIGLU = "_exo_tui_original_swiglu"


def _quantized_product(layer: Any, x: mx.array) -> mx.array:
    return kernels.quantized_matmul(
        x,
        layer["weight"],
        layer["scales"],
        layer.get("biases"),
        layer.group_size,
        layer.bits,
        getattr(layer, "mode", "affine"),
    )


def _with_bias(layer: Any, y: mx.array) -> mx.array:
    return y + layer["bias"] if "bias" in layer else y


# Forward passes of the routed classes. The sharded ones mirror mlx.nn.layers.distributed's
# (its `sum_gradients` on the input only matters for gradients, and inference takes none).
def _quantized_linear(self: Any, x: mx.array) -> mx.array:
    return _with_bias(self, _quantized_product(self, x))


def _quantized_sharded_to_all(self: Any, x: mx.array) -> mx.array:
    y = mx.distributed.all_sum(_quantized_product(self, x), group=self.group)
    return _with_bias(self, y)


def _dense_linear(self: Any, x: mx.array) -> mx.array:
    return _with_bias(self, kernels.dense_matmul(x, self["weight"]))


def _dense_sharded_to_all(self: Any, x: mx.array) -> mx.array:
    y = mx.distributed.all_sum(kernels.dense_matmul(x, self["weight"]), group=self.group)
    return _with_bias(self, y)


def _quantized_switch_linear(
    self: Any, x: mx.array, indices: mx.array, sorted_indices: bool = False
) -> mx.array:
    # The kernel groups the rows by expert itself, sorted or not.
    y = kernels.gather_quantized_matmul(
        x,
        self["weight"],
        self["scales"],
        self.get("biases"),
        indices,
        self.group_size,
        self.bits,
        self.mode,
    )
    return y + mx.expand_dims(self["bias"][indices], -2) if "bias" in self else y


def _quantized_as_linear(self: Any, x: mx.array) -> mx.array:
    return _quantized_product(self, x)


def _dense_as_linear(self: Any, x: mx.array) -> mx.array:
    return kernels.dense_matmul(x, self["weight"])


def _rms_norm(self: Any, x: mx.array) -> mx.array:
    weight = self["weight"]
    if not kernels.one_float_type(x, weight):
        return mx.fast.rms_norm(x, weight, self.eps)
    return kernels.rms_norm(x, weight, self.eps)


@functools.cache
def _base_inv_freqs(dims: int, base: float) -> mx.array:
    """The inverse frequencies of a base, by the ops mx.fast.rope's CPU fallback takes."""
    half = dims // 2
    step = mx.array(math.log(base) / half, dtype=mx.float32)
    inv = mx.exp(mx.arange(0, -half, -1, dtype=mx.float32) * step)
    mx.eval(inv)
    return inv


# Each Llama3RoPE's frequencies (by id, with the array, so the id stays its own) and their
# reciprocals, computed once rather than at every call.
_INV_OF_FREQS: dict[int, tuple[mx.array, mx.array]] = {}


def _freqs_inv(freqs: mx.array) -> mx.array:
    held = _INV_OF_FREQS.get(id(freqs))
    if held is None or held[0] is not freqs:
        held = (freqs, mx.reciprocal(freqs.astype(mx.float32)))
        mx.eval(held[1])
        _INV_OF_FREQS[id(freqs)] = held
    return held[1]


def _rope_covers(x: mx.array) -> bool:
    return x.ndim >= 3 and x.dtype in kernels.FLOAT_TYPES


def _rope(self: Any, x: mx.array, offset: int | mx.array = 0) -> mx.array:
    if not _rope_covers(x):
        return mx.fast.rope(x, self.dims, traditional=self.traditional, base=self.base,
                            scale=self.scale, offset=offset)  # fmt: skip
    inv = _base_inv_freqs(self.dims, float(self.base))
    return kernels.rope(x, inv, offset, self.dims, self.traditional, self.scale)


def _llama3_rope(self: Any, x: mx.array, offset: int | mx.array = 0) -> mx.array:
    if not _rope_covers(x):
        return mx.fast.rope(x, self.dims, traditional=self.traditional, base=None, scale=1.0,
                            offset=offset, freqs=self._freqs)  # fmt: skip
    return kernels.rope(x, _freqs_inv(self._freqs), offset, self.dims, self.traditional, 1.0)


def _yarn_rope(
    self: Any, x: mx.array, offset: int | mx.array = 0, scale: float = 1.0, inverse: bool = False
) -> mx.array:
    # gpt-oss's: the input scaled by mscale, then rotated by its own frequencies. Rotating only
    # some of the features, or backwards, stays on mlx-lm's way.
    if inverse or scale != 1.0 or not _rope_covers(x) or x.shape[-1] != self.dims:
        original: Any = YarnRoPE.__call__  # (typed for an int offset; it takes an array too)
        return original(self, x, offset, scale, inverse)
    scaled = x * self.mscale if self.mscale != 1.0 else x  # x.at[..., :dims].multiply, all dims
    return kernels.rope(scaled, _freqs_inv(self._freqs), offset, self.dims, self.traditional, 1.0)


_ROPE_FORWARD = {nn.RoPE: _rope, Llama3RoPE: _llama3_rope, YarnRoPE: _yarn_rope}

_QUANTIZED_FORWARD = {
    nn.QuantizedLinear: ("__call__", _quantized_linear),
    distributed.QuantizedAllToShardedLinear: ("__call__", _quantized_linear),
    distributed.QuantizedShardedToAllLinear: ("__call__", _quantized_sharded_to_all),
    nn.QuantizedEmbedding: ("as_linear", _quantized_as_linear),
    QuantizedSwitchLinear: ("__call__", _quantized_switch_linear),
}
_DENSE_FORWARD = {
    nn.Linear: ("__call__", _dense_linear),
    distributed.AllToShardedLinear: ("__call__", _dense_linear),
    distributed.ShardedToAllLinear: ("__call__", _dense_sharded_to_all),
    nn.Embedding: ("as_linear", _dense_as_linear),
}


def _routed_swiglu(original: Any) -> Any:
    @functools.wraps(original)
    def swiglu(gate: mx.array, x: mx.array) -> mx.array:
        if gate.shape != x.shape or not kernels.one_float_type(gate, x):
            return original(gate, x)
        return kernels.silu_mul(gate, x)

    setattr(swiglu, _ORIGINAL_SWIGLU, original)
    return swiglu


def _model_modules() -> list[Any]:
    """mlx-lm's model modules loaded so far (each imports `swiglu` by name)."""
    return [m for name, m in list(sys.modules.items()) if name.startswith("mlx_lm.models.")]


def _route_swiglu() -> None:
    for module in _model_modules():
        current = getattr(module, "swiglu", None)
        if callable(current) and not hasattr(current, _ORIGINAL_SWIGLU):
            module.swiglu = _routed_swiglu(current)


def _restore_swiglu() -> None:
    for module in _model_modules():
        original = getattr(getattr(module, "swiglu", None), _ORIGINAL_SWIGLU, None)
        if original is not None:
            module.swiglu = original


def logsumexp(
    a: mx.array, axis: int | None = None, keepdims: bool = False, **kwargs: Any
) -> mx.array:
    """mx.logsumexp, over the last axis on the kernels where they run (MLX's CPU takes a scalar
    exp over every logit of a sampling step)."""
    last = axis in (-1, a.ndim - 1) or (axis is None and all(d == 1 for d in a.shape[:-1]))
    if kwargs or a.ndim == 0 or not last or a.dtype not in kernels.FLOAT_TYPES or not enabled():
        return mx.logsumexp(a, axis=axis, keepdims=keepdims, **kwargs)
    out = kernels.logsumexp_last(a)
    if keepdims:
        return out
    return out.reshape(()) if axis is None else out.squeeze(-1)  # None: every axis reduced


def argmax_last(a: mx.array) -> mx.array:
    """mx.argmax(a, axis=-1), on the kernels where they run (MLX's CPU takes one scalar loop over
    every logit of every row: a share of each step of several requests decoding together)."""
    if a.ndim == 0 or a.dtype not in kernels.FLOAT_TYPES or not enabled():
        return mx.argmax(a, axis=-1)
    return kernels.argmax_last(a)


class _MlxForGenerate:
    """mlx.core as mlx-lm's generate module sees it, with `logsumexp` above: that module calls
    `mx.logsumexp` by its module's name, so this takes the place of its `mx`."""

    logsumexp = staticmethod(logsumexp)

    def __getattr__(self, name: str) -> Any:
        return getattr(mx, name)


def _route_logsumexp(on: bool) -> None:
    # (`mlx_lm.generate` as an attribute is the package's generate function, not the module.)
    generate = importlib.import_module("mlx_lm.generate")
    current: Any = getattr(generate, "mx")  # noqa: B009 - replaced below
    if on and not isinstance(current, _MlxForGenerate):
        setattr(generate, "mx", _MlxForGenerate())  # noqa: B010 - a module's global
    elif not on and isinstance(current, _MlxForGenerate):
        setattr(generate, "mx", mx)  # noqa: B010


@functools.cache
def _routed_class(cls: type, method: str, forward: Any) -> type:
    return type(f"Cpu{cls.__name__}", (cls,), {method: forward, _ROUTED: True})


def enabled() -> bool:
    """True when MLX computes on the CPU and the extension is there and not turned off."""
    return mx.default_device() == mx.cpu and kernels.available()


def install(model: nn.Module) -> int:
    """Route `model`'s linears to the kernels (when `enabled()`); the number of layers routed.
    Layers the kernels do not cover keep MLX's kernels, and a line says so once."""
    if not enabled():
        if mx.default_device() == mx.cpu:
            kernels.warn_once(f"CPU kernels: {kernels.describe()}")
        return 0
    _route_swiglu()
    _route_logsumexp(True)
    routed = 0
    for _, layer in model.named_modules():
        if getattr(type(layer), _ROUTED, False):
            routed += 1
            continue
        cls = type(layer)
        if cls in _QUANTIZED_FORWARD:
            mode = getattr(layer, "mode", "affine")
            if not kernels.covers_quantized(layer.bits, layer.group_size, mode, "biases" in layer):
                kernels.warn_once(
                    f"CPU kernels: {mode} {layer.bits}-bit weights in groups of "
                    f"{layer.group_size} are not covered; those layers run on MLX's own kernels"
                )
                continue
            method, forward = _QUANTIZED_FORWARD[cls]
            layer.__class__ = _routed_class(cls, method, forward)
            routed += 1
        elif cls is nn.RMSNorm:
            layer.__class__ = _routed_class(cls, "__call__", _rms_norm)
            routed += 1
        elif cls in _ROPE_FORWARD:
            layer.__class__ = _routed_class(cls, "__call__", _ROPE_FORWARD[cls])
            routed += 1
        elif cls in _DENSE_FORWARD and layer["weight"].dtype in kernels.FLOAT_TYPES:
            method, forward = _DENSE_FORWARD[cls]
            layer.__class__ = _routed_class(cls, method, forward)
            routed += 1
    return routed


def uninstall(model: nn.Module) -> int:
    """Put `model`'s routed layers, mlx-lm's swiglu and its logsumexp back on MLX's kernels; the
    number of layers changed."""
    _restore_swiglu()
    _route_logsumexp(False)
    restored = 0
    for _, layer in model.named_modules():
        if getattr(type(layer), _ROUTED, False):
            layer.__class__ = type(layer).__bases__[0]
            restored += 1
    return restored
