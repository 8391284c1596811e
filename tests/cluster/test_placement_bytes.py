"""Placement's byte estimates for mixtures of experts against what a loaded model holds: tiny
qwen3_moe at 4 bits (mlx-lm's convert) and gpt-oss as mlx-community's (MXFP4 experts, the rest
at 8 bits, an untied head), loaded by the engine, their arrays' bytes summed per layer."""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from engine.loading import LoadedModel, load_model_sync, transformer_layers
from engine.models.cards import read_card
from engine.types import ModelCard
from exo_tui.cluster.control.placement import (
    Placement,
    kv_cache_bytes,
    layer_weight_bytes,
    non_layer_bytes,
    place,
)
from exo_tui.hub.catalogue import CatalogueEntry, entry_card

# A layer's estimate is its tensors' bytes in the safetensors headers: what it holds, exactly
# (a hair for rounding when the layers' total is split). The rest of the model's estimate is the
# rest of the files: what it holds and the files' headers, exactly.
LAYER_TOLERANCE = 0.001
# The catalogue's card of a model not downloaded estimates the embeddings from its figures.
CATALOGUE_TOLERANCE = 0.01


def headers(folder: Path) -> int:
    """The bytes of the safetensors files' headers: a length, then that much JSON."""
    total = 0
    for file in folder.glob("*.safetensors"):
        with file.open("rb") as f:
            total += 8 + struct.unpack("<Q", f.read(8))[0]
    return total


def held(parameters: Any) -> int:
    arrays = cast("list[tuple[str, mx.array]]", tree_flatten(parameters))
    return sum(a.nbytes for _, a in arrays)


def held_bytes(loaded: LoadedModel) -> tuple[list[int], int]:
    """The bytes each transformer layer's arrays hold, and those of the rest of the model."""
    layers = [held(layer.parameters()) for layer in transformer_layers(loaded.model)]
    return layers, held(loaded.model.parameters()) - sum(layers)


class Node:
    def __init__(self, node_id: str, available: int) -> None:
        self.node_id = node_id
        self.name = node_id
        self.memory_available_bytes = available


@pytest.fixture(scope="module")
def moe_models(
    tiny_model_factory: Callable[..., Path],
    tiny_gpt_oss: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Path]:
    from mlx_lm import convert

    folder = tmp_path_factory.mktemp("qwen3-moe-q4") / "model"
    source = tiny_model_factory("qwen3_moe", dtype="bfloat16")
    convert(str(source), mlx_path=str(folder), quantize=True, q_bits=4, q_group_size=64)
    return {"qwen3_moe-4bit": folder, "gpt_oss-mxfp4": tiny_gpt_oss}


@pytest.fixture(scope="module")
def loaded_models(moe_models: dict[str, Path]) -> dict[str, tuple[ModelCard, LoadedModel]]:
    return {name: (read_card(path), load_model_sync(path)) for name, path in moe_models.items()}


@pytest.fixture(params=["qwen3_moe-4bit", "gpt_oss-mxfp4"])
def moe(
    request: pytest.FixtureRequest, loaded_models: dict[str, tuple[ModelCard, LoadedModel]]
) -> tuple[ModelCard, LoadedModel]:
    return loaded_models[request.param]


def test_each_layers_estimate_is_what_the_loaded_layer_holds(
    moe: tuple[ModelCard, LoadedModel],
) -> None:
    card, loaded = moe
    layers, rest = held_bytes(loaded)
    assert card.bytes_in_layers == sum(layers)
    for layer in layers:
        assert abs(layer_weight_bytes(card, 1) - layer) <= LAYER_TOLERANCE * layer
    assert non_layer_bytes(card) == rest + headers(Path(card.path))
    if card.model_type == "gpt_oss":  # its 8-bit embeddings and head outweigh its tiny layers
        assert rest > 10 * sum(layers)


def test_each_pipeline_shards_weights_are_what_its_rank_holds(
    moe: tuple[ModelCard, LoadedModel],
) -> None:
    card, loaded = moe
    layers, rest = held_bytes(loaded)
    nodes = [Node("a", 10**9), Node("b", 2 * 10**9)]
    placement = place(nodes, card, "pipeline", context_length=64)
    assert isinstance(placement, Placement), placement
    for shard in placement.shards:
        spec = shard.spec
        weights = shard.bytes_needed - kv_cache_bytes(card, spec.num_layers, 64, card.num_kv_heads)
        holds = rest + sum(layers[spec.start_layer : spec.end_layer])
        assert abs(weights - headers(Path(card.path)) - holds) <= LAYER_TOLERANCE * holds, spec


def test_the_catalogues_card_of_gpt_oss_splits_it_as_the_loaded_model(
    loaded_models: dict[str, tuple[ModelCard, LoadedModel]],
) -> None:
    """The card of a model not on disk, from catalogue figures of the tiny gpt-oss (MXFP4
    experts, 8-bit group-64 rest, untied head), its bytes those of its tensors."""
    card, loaded = loaded_models["gpt_oss-mxfp4"]
    entry = CatalogueEntry(
        repo="test/tiny-gpt-oss",
        family="gpt-oss",
        model_type="gpt_oss",
        parameters=card.num_parameters,
        active_parameters=card.num_parameters,
        layers=card.num_layers,
        hidden_size=card.hidden_size,
        intermediate_size=card.hidden_size,
        experts=8,
        active_experts=2,
        heads=card.num_attention_heads,
        kv_heads=card.num_kv_heads,
        head_dim=card.head_dim,
        vocab_size=card.vocab_size,
        bytes=card.bytes_on_disk - headers(Path(card.path)),
        bits=4,
        group_size=32,
        quantization_mode="mxfp4",
        rest_bits=8,
        rest_group_size=64,
        context_length=131072,
        reasoning=True,
        tool_format="harmony",
        tensor=True,
    )
    layers, rest = held_bytes(loaded)
    estimate = entry_card(entry)
    assert abs(non_layer_bytes(estimate) - rest) <= LAYER_TOLERANCE * rest
    for layer in layers:
        assert abs(layer_weight_bytes(estimate, 1) - layer) <= LAYER_TOLERANCE * layer
