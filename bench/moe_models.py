"""The models of bench/moe.py: random mixtures of experts of Qwen3-30B-A3B's and gpt-oss-20b's
shapes, written a layer at a time as an mlx-lm folder, then as llama.cpp's GGUF from the very same
bits, and the check that both sides dequantize every value alike.

The quantized codes are written directly (random packed codes, random scales): no full-precision
copy is ever held, so a build needs about one layer's memory. Each format is one that both sides
read as stored:

- MLX affine 4-bit, groups of 64, every bias -8 x scale: value = scale x (code - 8), which is two
  ggml Q4_0 blocks (d = scale). Likewise 8-bit with bias -128 x scale is two Q8_0 blocks.
- MLX mxfp4 (groups of 32, a uint8 E8M0 scale, no bias) is ggml's MXFP4 block bit for bit (MLX
  e2m1 x 2^(e-127) = ggml's doubled e2m1 x 2^(e-128)).

The nibbles are ordered differently: MLX packs element i of a row at bits 4(i % 8) of uint32
i // 8 (so byte j holds elements 2j, 2j+1, low nibble first); a ggml block of 32 holds element j
in the low nibble of byte j and element j + 16 in its high nibble. Q8_0 and MLX's 8-bit keep
element order (MLX's code is ggml's int8 + 128).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import SEED, add_stand_in_vocab, engine_first

# Bump when what is built changes, so the cache builds again.
BUILD_VERSION = 1


@dataclass(frozen=True)
class MoeShape:
    """What decides a model's size and speed; `arch` is mlx-lm's model_type."""

    arch: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_experts: int
    experts_per_token: int
    expert_size: int
    vocab_size: int


QWEN3_30B_A3B = MoeShape(
    arch="qwen3_moe", hidden_size=2048, num_layers=48, num_heads=32, num_kv_heads=4,
    head_dim=128, num_experts=128, experts_per_token=8, expert_size=768, vocab_size=151936,
)  # fmt: skip
GPT_OSS_20B = MoeShape(
    arch="gpt_oss", hidden_size=2880, num_layers=24, num_heads=64, num_kv_heads=8,
    head_dim=64, num_experts=32, experts_per_token=4, expert_size=2880, vocab_size=201088,
)  # fmt: skip
TITLES = {
    "qwen3_moe": "Qwen3-30B-A3B shape: MLX affine 4-bit g64 = Q4_0 (router 8-bit g64 = Q8_0)",
    "gpt_oss": "gpt-oss-20b shape: experts MXFP4 (both sides), the rest MLX 8-bit g64 = Q8_0",
}


@dataclass(frozen=True)
class Format:
    bits: int
    group_size: int
    mode: str
    ggml: str  # the GGMLQuantizationType's name
    block_bytes: int  # a ggml block of 32 values


FORMATS = {
    "q4": Format(4, 64, "affine", "Q4_0", 18),
    "q8": Format(8, 64, "affine", "Q8_0", 34),
    "mxfp4": Format(4, 32, "mxfp4", "MXFP4", 17),
}
# The scales' spread: a weight's standard deviation comes out near 0.02 in every format (random
# codes: 4-bit affine codes - 8 have an RMS of 4.6, 8-bit ones 74, e2m1 values 2.9).
AFFINE_SCALES = {"q4": (0.003, 0.005), "q8": (0.0002, 0.0003)}
MXFP4_EXPONENTS = (119, 122)  # 2^-8 .. 2^-6


@dataclass(frozen=True)
class Tensor:
    """One tensor of the model: `fmt` a key of FORMATS (then `mlx` names its .weight, .scales
    and, for affine, .biases; `shape` is (..., out, in)), or "ones" / "small" (a bf16 array).
    `gguf` is the name that gguf's tensor map turns into llama.cpp's."""

    mlx: str
    fmt: str
    shape: tuple[int, ...]
    gguf: str

    @property
    def expert(self) -> bool:
        return ".mlp.switch_mlp." in self.mlx or ".mlp.experts." in self.mlx

    def mlx_bytes(self) -> int:
        count = int(np.prod(self.shape))
        if self.fmt not in FORMATS:
            return 2 * count
        f = FORMATS[self.fmt]
        groups = count // f.group_size
        return count * f.bits // 8 + groups * (1 if f.mode == "mxfp4" else 4)


def quantized(name: str, fmt: str, *shape: int) -> Tensor:
    # mlx-lm's switch_mlp is the converter's (and gguf's tensor map's) experts.
    return Tensor(name, fmt, shape, f"{name.replace('.switch_mlp.', '.experts.')}.weight")


def dense(name: str, fmt: str, *shape: int, gguf: str | None = None) -> Tensor:
    return Tensor(name, fmt, shape, gguf or name)


def layer_tensors(shape: MoeShape, i: int) -> list[Tensor]:
    h, hd, e, f = shape.hidden_size, shape.head_dim, shape.num_experts, shape.expert_size
    q, kv = shape.num_heads * hd, shape.num_kv_heads * hd
    p = f"model.layers.{i}"
    norms = [dense(f"{p}.input_layernorm.weight", "ones", h),
             dense(f"{p}.post_attention_layernorm.weight", "ones", h)]  # fmt: skip
    if shape.arch == "qwen3_moe":
        return [
            *norms,
            dense(f"{p}.self_attn.q_norm.weight", "ones", hd),
            dense(f"{p}.self_attn.k_norm.weight", "ones", hd),
            quantized(f"{p}.self_attn.q_proj", "q4", q, h),
            quantized(f"{p}.self_attn.k_proj", "q4", kv, h),
            quantized(f"{p}.self_attn.v_proj", "q4", kv, h),
            quantized(f"{p}.self_attn.o_proj", "q4", h, q),
            # The router at 8 bits, as mlx-lm's qwen3_moe quant_predicate (and mlx-community's
            # Qwen3-30B-A3B-4bit) has it.
            quantized(f"{p}.mlp.gate", "q8", e, h),
            quantized(f"{p}.mlp.switch_mlp.gate_proj", "q4", e, f, h),
            quantized(f"{p}.mlp.switch_mlp.up_proj", "q4", e, f, h),
            quantized(f"{p}.mlp.switch_mlp.down_proj", "q4", e, h, f),
        ]
    out = norms
    for n, rows, cols in (("q", q, h), ("k", kv, h), ("v", kv, h), ("o", h, q)):
        name = f"{p}.self_attn.{n}_proj"
        out += [quantized(name, "q8", rows, cols), dense(f"{name}.bias", "small", rows)]
    out += [
        dense(f"{p}.self_attn.sinks", "small", shape.num_heads, gguf=f"{p}.self_attn.sinks.weight"),
        quantized(f"{p}.mlp.router", "q8", e, h),
        dense(f"{p}.mlp.router.bias", "small", e),
    ]
    for n, rows, cols in (("gate", f, h), ("up", f, h), ("down", h, f)):
        name = f"{p}.mlp.experts.{n}_proj"
        out += [quantized(name, "mxfp4", e, rows, cols), dense(f"{name}.bias", "small", e, rows)]
    return out


def top_tensors(shape: MoeShape) -> list[Tensor]:
    """The embedding, final norm and (untied) head."""
    fmt = "q4" if shape.arch == "qwen3_moe" else "q8"
    return [
        quantized("model.embed_tokens", fmt, shape.vocab_size, shape.hidden_size),
        dense("model.norm.weight", "ones", shape.hidden_size),
        quantized("lm_head", fmt, shape.vocab_size, shape.hidden_size),
    ]


def expert_bytes_per_token(shape: MoeShape, layers: int | None = None) -> int:
    """The expert weights (codes, scales, biases) one decoding step reads: k experts a layer."""
    per_layer = sum(t.mlx_bytes() for t in layer_tensors(shape, 0) if t.expert)
    count = shape.num_layers if layers is None else layers
    return per_layer * shape.experts_per_token // shape.num_experts * count


def bytes_per_token(shape: MoeShape, layers: int | None = None) -> int:
    """All the weights one decoding step reads: each layer's attention, norms, router and k
    experts, and the head (an embedding row is next to nothing)."""
    experts = expert_bytes_per_token(shape, 1)
    per_layer = sum(t.mlx_bytes() for t in layer_tensors(shape, 0) if not t.expert)
    head = sum(t.mlx_bytes() for t in top_tensors(shape) if t.mlx == "lm_head")
    return (shape.num_layers if layers is None else layers) * (per_layer + experts) + head


def model_bytes(shape: MoeShape) -> int:
    per_layer = sum(t.mlx_bytes() for t in layer_tensors(shape, 0))
    return shape.num_layers * per_layer + sum(t.mlx_bytes() for t in top_tensors(shape))


# --------------------------------------------------------------------------- where


def cache_folder(shape: MoeShape) -> Path:
    import platformdirs

    s = shape
    key = (f"{s.arch}-{s.num_layers}l-h{s.hidden_size}-a{s.num_heads}x{s.num_kv_heads}x{s.head_dim}"
           f"-e{s.num_experts}x{s.experts_per_token}x{s.expert_size}-v{s.vocab_size}")  # fmt: skip
    return platformdirs.user_cache_path("exo-tui") / "bench" / f"moe-v{BUILD_VERSION}-{key}"


def mlx_folder(folder: Path) -> Path:
    return folder / "mlx"


def gguf_file(folder: Path) -> Path:
    return folder / "model.gguf"


def shard_name(index: int, shape: MoeShape) -> str:
    """Shard `index` (layer `index`; num_layers: the embedding, norm and head) of the folder."""
    total = shape.num_layers + 1
    return f"model-{index + 1:05d}-of-{total:05d}.safetensors"


def shards(shape: MoeShape) -> Iterator[tuple[int, str, list[Tensor]]]:
    """(index, file name, tensors) of each shard, in GGUF order: the embedding and head first
    (index num_layers), then each layer (its own index)."""
    yield shape.num_layers, shard_name(shape.num_layers, shape), top_tensors(shape)
    for i in range(shape.num_layers):
        yield i, shard_name(i, shape), layer_tensors(shape, i)


# --------------------------------------------------------------------------- mlx-lm folder


def mlx_config(shape: MoeShape) -> dict[str, Any]:
    from tests.tiny_models import BOS_TOKEN, EOS_TOKEN_IDS, PAD_TOKEN, SPECIAL_TOKEN_IDS

    common: dict[str, Any] = {
        "model_type": shape.arch,
        "hidden_size": shape.hidden_size,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_kv_heads,
        "head_dim": shape.head_dim,
        "num_experts_per_tok": shape.experts_per_token,
        "vocab_size": shape.vocab_size,
        "tie_word_embeddings": False,
        "bos_token_id": SPECIAL_TOKEN_IDS[BOS_TOKEN],
        "eos_token_id": list(EOS_TOKEN_IDS),
        "pad_token_id": SPECIAL_TOKEN_IDS[PAD_TOKEN],
        "torch_dtype": "bfloat16",
    }
    overrides: dict[str, Any] = {}
    if shape.arch == "qwen3_moe":
        common.update(
            architectures=["Qwen3MoeForCausalLM"], intermediate_size=6144,
            num_experts=shape.num_experts, moe_intermediate_size=shape.expert_size,
            decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True, rms_norm_eps=1e-6,
            rope_theta=1000000.0, max_position_embeddings=40960, hidden_act="silu",
        )  # fmt: skip
        top = FORMATS["q4"]
        for i in range(shape.num_layers):
            overrides[f"model.layers.{i}.mlp.gate"] = {"group_size": 64, "bits": 8}
    else:
        common.update(
            architectures=["GptOssForCausalLM"], intermediate_size=shape.expert_size,
            num_local_experts=shape.num_experts, experts_per_token=shape.experts_per_token,
            rms_norm_eps=1e-5, rope_theta=150000, sliding_window=128, swiglu_limit=7.0,
            attention_bias=True, max_position_embeddings=131072, initial_context_length=4096,
            rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                          "beta_slow": 1.0, "original_max_position_embeddings": 4096,
                          "truncate": False},
            layer_types=layer_types(shape.num_layers),
        )  # fmt: skip
        top = FORMATS["q8"]
        mx4 = FORMATS["mxfp4"]
        for i in range(shape.num_layers):
            for n in ("gate", "up", "down"):
                overrides[f"model.layers.{i}.mlp.experts.{n}_proj"] = {
                    "group_size": mx4.group_size, "bits": mx4.bits, "mode": mx4.mode}  # fmt: skip
    quantization = {"group_size": top.group_size, "bits": top.bits, "mode": top.mode, **overrides}
    return {**common, "quantization": quantization, "quantization_config": quantization}


def layer_types(num_layers: int) -> list[str]:
    """gpt-oss alternates, sliding window first (llama.cpp's swa pattern 2 says the same)."""
    return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)]


def random_tensor(t: Tensor, rng: np.random.Generator) -> dict[str, Any]:
    """`t`'s MLX arrays, drawn from `rng`."""
    import mlx.core as mx

    if t.fmt == "ones":
        return {t.mlx: mx.ones(t.shape, dtype=mx.bfloat16)}
    if t.fmt == "small":
        values = rng.standard_normal(t.shape, dtype=np.float32) * np.float32(0.02)
        return {t.mlx: mx.array(values).astype(mx.bfloat16)}
    f = FORMATS[t.fmt]
    *rows, cols = t.shape
    codes = rng.integers(0, 1 << 32, size=(*rows, cols * f.bits // 32), dtype=np.uint32)
    groups = (*rows, cols // f.group_size)
    out = {f"{t.mlx}.weight": mx.array(codes)}
    if f.mode == "mxfp4":
        low, high = MXFP4_EXPONENTS
        out[f"{t.mlx}.scales"] = mx.array(rng.integers(low, high, size=groups, dtype=np.uint8))
        return out
    # bf16 scales, as mlx-lm writes them (its default dtype, what mlx-community ships and the
    # engine's kernels are tuned for), drawn where bf16 values are also exact in fp16: Q4_0's
    # and Q8_0's d is fp16, so both sides hold the same scale. The bias, a power of two times it,
    # is exact too.
    low, high = AFFINE_SCALES[t.fmt]
    scales = mx.array(rng.uniform(low, high, size=groups).astype(np.float32)).astype(mx.bfloat16)
    out[f"{t.mlx}.scales"] = scales
    out[f"{t.mlx}.biases"] = scales * mx.array(-(1 << (f.bits - 1)), dtype=mx.bfloat16)
    return out


def build_mlx(folder: Path, shape: MoeShape, log: Any = None) -> None:
    """The mlx-lm folder, one shard a layer (and one for the embedding and head), each written
    as soon as it is drawn; its index; config; the tests' tiny tokenizer (the bench feeds ids)."""
    import mlx.core as mx

    from tests.tiny_models import build_tokenizer

    folder.mkdir(parents=True)
    weight_map: dict[str, str] = {}
    total = 0
    for count, (index, name, tensors) in enumerate(shards(shape), start=1):
        rng = np.random.default_rng([SEED, index])
        weights: dict[str, Any] = {}
        for t in tensors:
            weights.update(random_tensor(t, rng))
        mx.eval(weights)
        mx.save_safetensors(str(folder / name), weights, metadata={"format": "mlx"})
        weight_map.update(dict.fromkeys(weights, name))
        total += sum(w.nbytes for w in weights.values())
        if log:
            log(f"mlx-lm folder: shard {count} of {shape.num_layers + 1}")
    index_json = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index_json, indent=1) + "\n")
    (folder / "config.json").write_text(json.dumps(mlx_config(shape), indent=2) + "\n")
    build_tokenizer(folder, 768, seed=SEED)


def reduced_view(folder: Path, shape: MoeShape, layers: int) -> Path:
    """A folder of the first `layers` layers of the mlx-lm folder (links to its shards, no
    index: mlx-lm loads every model*.safetensors), for plain mlx-lm, which is slow at depth."""
    view = folder.parent / f"mlx-first-{layers}-layers"
    if view.exists():
        return view
    partial = view.with_name(view.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    names = ["tokenizer.json", "tokenizer_config.json"]
    names += [shard_name(index, shape) for index in [*range(layers), shape.num_layers]]
    for name in names:
        os.symlink(Path("..") / folder.name / name, partial / name)  # relative: the cache may move
    config = mlx_config(dataclasses.replace(shape, num_layers=layers))
    (partial / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    partial.rename(view)
    return view


# --------------------------------------------------------------------------- GGUF


def unpack_nibbles(words: Any) -> Any:
    """MLX's packed 4-bit codes (uint32, 8 a word, low bits first) as one uint8 a value."""
    assert sys.byteorder == "little"
    packed = words.view(np.uint8)
    codes = np.empty((*packed.shape[:-1], 2 * packed.shape[-1]), dtype=np.uint8)
    codes[..., 0::2] = packed & 0x0F
    codes[..., 1::2] = packed >> 4
    return codes


def ggml_nibbles(codes: Any) -> Any:
    """4-bit codes (..., n) as ggml's blocks of 32: (..., n / 32, 16) bytes, byte j holding
    value j low and value j + 16 high."""
    blocks = codes.reshape(*codes.shape[:-1], -1, 2, 16)
    return blocks[..., 0, :] | (blocks[..., 1, :] << 4)


def fp16_scales(scales: Any, biases: Any, bits: int, repeat: int) -> Any:
    """MLX's affine scales (float32 here) as ggml's fp16 d, one a block of 32, checking that the
    group is a ggml block: bias = -2^(bits-1) x scale, and the scale exact in fp16."""
    if not np.array_equal(biases, scales * np.float32(-(1 << (bits - 1)))):
        raise ValueError("a bias is not -2^(bits-1) x its scale: not a ggml block")
    d = scales.astype(np.float16)
    if not np.array_equal(d.astype(np.float32), scales):
        raise ValueError("a scale is not exact in fp16")
    return np.repeat(d, repeat, axis=-1).view(np.uint8).reshape(*d.shape[:-1], -1, 2)


def ggml_tensor(t: Tensor, weights: dict[str, Any]) -> tuple[Any, str | None]:
    """`t` as GGUF stores it: uint8 blocks (..., out, bytes a row) and the GGML type's name, or
    float32 values (1-D norms, biases, sinks) and None."""
    import mlx.core as mx

    if t.fmt not in FORMATS:
        return np.array(weights[t.mlx].astype(mx.float32)), None
    f = FORMATS[t.fmt]
    words = np.array(weights[f"{t.mlx}.weight"])
    if f.mode == "mxfp4":
        e = np.array(weights[f"{t.mlx}.scales"])[..., None]
        blocks = np.concatenate([e, ggml_nibbles(unpack_nibbles(words))], axis=-1)
    else:
        scales = np.array(weights[f"{t.mlx}.scales"].astype(mx.float32))
        biases = np.array(weights[f"{t.mlx}.biases"].astype(mx.float32))
        d = fp16_scales(scales, biases, f.bits, f.group_size // 32)
        if f.bits == 4:
            qs = ggml_nibbles(unpack_nibbles(words))
        else:  # MLX's 8-bit code is ggml's int8 + 128, in element order
            qs = (words.view(np.uint8) ^ 0x80).reshape(*d.shape[:-1], 32)
        blocks = np.concatenate([d, qs], axis=-1)
    return blocks.reshape(*blocks.shape[:-2], -1), f.ggml


def ggml_byte_shape(t: Tensor) -> tuple[int, ...]:
    *rows, cols = t.shape
    return (*rows, cols // 32 * FORMATS[t.fmt].block_bytes)


def add_metadata(writer: Any, shape: MoeShape) -> None:
    """What convert_hf_to_gguf writes for Qwen3MoeForCausalLM and GptOssForCausalLM."""
    import gguf

    config = mlx_config(shape)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(shape.hidden_size)
    writer.add_block_count(shape.num_layers)
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(shape.num_heads)
    writer.add_head_count_kv(shape.num_kv_heads)
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_expert_count(shape.num_experts)
    writer.add_expert_used_count(shape.experts_per_token)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_expert_feed_forward_length(shape.expert_size)
    writer.add_vocab_size(shape.vocab_size)
    if shape.arch == "qwen3_moe":
        writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    else:
        rope = config["rope_scaling"]
        writer.add_sliding_window(config["sliding_window"])
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(rope["factor"])
        writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        writer.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
        writer.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
        writer.add_file_type(gguf.LlamaFileType.MOSTLY_MXFP4_MOE)
    add_stand_in_vocab(writer, shape.vocab_size)


def gguf_names(shape: MoeShape) -> Any:
    import gguf

    arch = gguf.MODEL_ARCH.QWEN3MOE if shape.arch == "qwen3_moe" else gguf.MODEL_ARCH.GPT_OSS
    return arch, gguf.get_tensor_name_map(arch, shape.num_layers)


def gguf_name(names: Any, t: Tensor) -> str:
    name = names.get_name(t.gguf, try_suffixes=(".weight", ".bias"))
    if name is None:
        raise ValueError(f"no GGUF name for {t.gguf}")
    return name


def build_gguf(source: Path, target: Path, shape: MoeShape, log: Any = None) -> None:
    """llama.cpp's GGUF of the mlx-lm folder, streamed: every tensor's info first, then each
    shard's tensors converted and written in turn."""
    import gguf
    import mlx.core as mx

    arch, names = gguf_names(shape)
    writer = gguf.GGUFWriter(target, gguf.MODEL_ARCH_NAMES[arch])
    add_metadata(writer, shape)
    for _, _, tensors in shards(shape):
        for t in tensors:
            if t.fmt in FORMATS:
                byte_shape = ggml_byte_shape(t)
                raw = gguf.GGMLQuantizationType[FORMATS[t.fmt].ggml]
                nbytes = int(np.prod(byte_shape))
                writer.add_tensor_info(gguf_name(names, t), byte_shape, np.dtype(np.uint8), nbytes,
                                       raw_dtype=raw)  # fmt: skip
            else:
                nbytes = 4 * int(np.prod(t.shape))
                writer.add_tensor_info(gguf_name(names, t), t.shape, np.dtype(np.float32), nbytes)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for count, (_, name, tensors) in enumerate(shards(shape), start=1):
        weights = mx.load(str(source / name))
        assert isinstance(weights, dict)
        for t in tensors:
            writer.write_tensor_data(ggml_tensor(t, weights)[0])
        del weights
        if log:
            log(f"GGUF: shard {count} of {shape.num_layers + 1}")
    writer.close()


# --------------------------------------------------------------------------- the same bits


def same_bits(source: Path, target: Path, shape: MoeShape, rows: int = 4) -> dict[str, Any]:
    """Dequantize the first and last `rows` rows (of the first and last expert) of every tensor
    of the embedding, the head and the first and last layers, with gguf's numpy dequantizer from
    the GGUF and with mx.dequantize (scales and biases in fp32, so nothing is rounded) from the
    mlx-lm folder: the values must be equal bit for bit."""
    import gguf
    import mlx.core as mx

    _, names = gguf_names(shape)
    stored = {t.name: t for t in gguf.GGUFReader(target).tensors}
    checked: dict[str, int] = {}
    picked = {shape.num_layers, 0, shape.num_layers - 1}
    for index, name, tensors in shards(shape):
        if index not in picked:
            continue
        weights = mx.load(str(source / name))
        assert isinstance(weights, dict)
        for t in tensors:
            g = stored[gguf_name(names, t)]
            if t.fmt not in FORMATS:
                ours = np.array(weights[t.mlx].astype(mx.float32)).reshape(-1)
                theirs = np.asarray(g.data, dtype=np.float32).reshape(-1)
            else:
                ours, theirs = _dequantized_rows(t, weights, g, rows)
            if ours.shape != theirs.shape or not np.array_equal(ours, theirs):
                raise SystemExit(f"{t.mlx} and {g.name} differ")
            kind = t.fmt if t.fmt in FORMATS else "bf16 -> f32"
            checked[kind] = checked.get(kind, 0) + ours.size
    return {"values": checked}


def _dequantized_rows(t: Tensor, weights: dict[str, Any], g: Any, rows: int) -> tuple[Any, Any]:
    import mlx.core as mx
    from gguf import quants

    f = FORMATS[t.fmt]
    out_dims = t.shape[-2]
    experts = [0, t.shape[0] - 1] if len(t.shape) == 3 else [None]
    pick = [*range(rows), *range(out_dims - rows, out_dims)]
    data = np.asarray(g.data).reshape(-1, out_dims, ggml_byte_shape(t)[-1])
    ours: list[Any] = []
    theirs: list[Any] = []
    for e in experts:
        part = {
            key: (array if e is None else array[e])[mx.array(pick)]
            for key in ("weight", "scales", "biases")
            if (array := weights.get(f"{t.mlx}.{key}")) is not None
        }
        if f.mode == "mxfp4":
            values = mx.dequantize(part["weight"], part["scales"], group_size=f.group_size,
                                   bits=f.bits, mode=f.mode, dtype=mx.float32)  # fmt: skip
        else:
            values = mx.dequantize(part["weight"], part["scales"].astype(mx.float32),
                                   part["biases"].astype(mx.float32), group_size=f.group_size,
                                   bits=f.bits)  # fmt: skip
        ours.append(np.array(values))
        theirs.append(quants.dequantize(data[0 if e is None else e][pick], g.tensor_type))
    return np.concatenate(ours), np.concatenate(theirs)


# --------------------------------------------------------------------------- the worker


def worker_build(shape: MoeShape, folder: Path) -> dict[str, Any]:
    """Build whatever of the cache folder is missing (each piece renamed into place whole), then
    check that both hold the same bits."""
    engine_first()

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    built: list[str] = []
    folder.mkdir(parents=True, exist_ok=True)
    source, target = mlx_folder(folder), gguf_file(folder)
    if not source.exists():
        partial = source.with_name(source.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        build_mlx(partial, shape, log)
        partial.rename(source)
        built.append("mlx")
        target.unlink(missing_ok=True)  # written from an older folder
    if not target.exists():
        partial = target.with_name(target.name + ".partial")
        partial.unlink(missing_ok=True)
        build_gguf(source, partial, shape, log)
        partial.rename(target)
        built.append("gguf")
    return {"built": built, **same_bits(source, target, shape)}


def shape_from_json(payload: dict[str, Any]) -> MoeShape:
    return MoeShape(**payload)
