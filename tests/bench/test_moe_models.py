"""bench/moe_models.py: the mlx-lm folder and llama.cpp's GGUF it writes hold the same bits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from bench import moe_models
from bench.moe_models import MoeShape

pytest.importorskip("gguf")

TINY = {
    "qwen3_moe": MoeShape("qwen3_moe", hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                          head_dim=32, num_experts=8, experts_per_token=2, expert_size=64,
                          vocab_size=1024),
    "gpt_oss": MoeShape("gpt_oss", hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                        head_dim=32, num_experts=4, experts_per_token=2, expert_size=128,
                        vocab_size=1024),
}  # fmt: skip


@pytest.mark.parametrize("arch", list(TINY))
def test_both_sides_dequantize_alike_and_mlx_lm_loads_it(tmp_path: Path, arch: str) -> None:
    from mlx_lm import load

    shape = TINY[arch]
    result = moe_models.worker_build(shape, tmp_path)
    formats = {"qwen3_moe": {"q4", "q8"}, "gpt_oss": {"q8", "mxfp4"}}[arch]
    assert set(result["values"]) == formats | {"bf16 -> f32"}
    folder = moe_models.mlx_folder(tmp_path)
    index = (folder / "model.safetensors.index.json").read_text()
    assert f'"total_size": {moe_models.model_bytes(shape)}' in index
    model = load(str(folder))[0]
    logits = model(mx.array([[1, 2, 3, 4]]))
    assert logits.shape == (1, 4, shape.vocab_size)
    assert bool(mx.all(mx.isfinite(logits)).item())
    depth = 2 if arch == "gpt_oss" else 1
    view = moe_models.reduced_view(folder, shape, depth)
    assert json.loads((view / "config.json").read_text())["num_hidden_layers"] == depth
    reduced: Any = load(str(view))[0]
    assert len(reduced.layers) == depth


def test_a_wrong_nibble_order_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shape = TINY["qwen3_moe"]
    moe_models.build_mlx(tmp_path / "mlx", shape)

    def high_first(codes: np.ndarray) -> np.ndarray:
        blocks = codes.reshape(*codes.shape[:-1], -1, 2, 16)
        return blocks[..., 1, :] | (blocks[..., 0, :] << 4)

    monkeypatch.setattr(moe_models, "ggml_nibbles", high_first)
    moe_models.build_gguf(tmp_path / "mlx", tmp_path / "model.gguf", shape)
    with pytest.raises(SystemExit, match="differ"):
        moe_models.same_bits(tmp_path / "mlx", tmp_path / "model.gguf", shape)


def test_a_scale_that_fp16_rounds_is_refused() -> None:
    scales = np.array([[1 + 2.0**-12]], dtype=np.float32)  # exact in fp32, not in fp16
    with pytest.raises(ValueError, match="fp16"):
        moe_models.fp16_scales(scales, scales * np.float32(-8), bits=4, repeat=2)
