"""Model folders written for the model store's tests: a tiny llama config, its tensors and the
files of a folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

LLAMA_CONFIG: dict[str, Any] = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 100,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "bfloat16",
}


def llama_tensors(dtype: type[np.generic] = np.float16) -> dict[str, np.ndarray]:
    t: dict[str, np.ndarray] = {"model.embed_tokens.weight": np.zeros((100, 32), dtype)}
    for i in range(2):
        p = f"model.layers.{i}"
        t[f"{p}.self_attn.q_proj.weight"] = np.zeros((32, 32), dtype)
        t[f"{p}.self_attn.k_proj.weight"] = np.zeros((16, 32), dtype)
        t[f"{p}.self_attn.v_proj.weight"] = np.zeros((16, 32), dtype)
        t[f"{p}.self_attn.o_proj.weight"] = np.zeros((32, 32), dtype)
        t[f"{p}.input_layernorm.weight"] = np.ones((32,), dtype)
    t["model.norm.weight"] = np.ones((32,), dtype)
    return t


def numel(tensors: dict[str, np.ndarray]) -> int:
    return sum(int(a.size) for a in tensors.values())


def write_model(
    folder: Path,
    config: dict[str, Any] | None = None,
    files: dict[str, dict[str, np.ndarray]] | None = None,
    *,
    tokenizer: bool = True,
) -> Path:
    """A model folder: config.json, the given safetensors files, a tokenizer.json stub."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(LLAMA_CONFIG if config is None else config))
    if files is None:
        files = {"model.safetensors": llama_tensors()}
    for name, tensors in files.items():
        save_file(tensors, str(folder / name), metadata={"format": "mlx"})
    if tokenizer:
        (folder / "tokenizer.json").write_text("{}")
    return folder
