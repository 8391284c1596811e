"""A model card for tests that need one without a model folder: a tiny llama's, by default."""

from __future__ import annotations

from typing import Any

from engine.types import ModelCard


def tiny_card(**overrides: Any) -> ModelCard:
    fields: dict[str, Any] = {
        "name": "tiny",
        "path": "/m",
        "source": "models_dir",
        "model_type": "llama",
        "num_layers": 4,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_kv_heads": 2,
        "head_dim": 16,
        "vocab_size": 768,
        "context_length": 2048,
        "quantization": None,
        "dtype": "float32",
        "bytes_on_disk": 1_000_000,
        "num_parameters": 250_000,
        "supports_tensor": True,
    }
    fields.update(overrides)
    return ModelCard(**fields)
