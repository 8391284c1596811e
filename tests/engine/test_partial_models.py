"""A folder holding only some of a model's weight files: a pipeline node's share of a download."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten

from engine.errors import ModelFormatError
from engine.loading import load_model, load_model_sync, run_loading, transformer_layers
from engine.models.cards import read_card
from engine.models.finding import find_models
from engine.models.weights import missing_weight_files

# tiny_model_factory("llama", shards=4): one layer per file; the embeddings sit in the first
# file, the final norm and head in the last.
SHARDS = [f"model-{i:05d}-of-00004.safetensors" for i in range(1, 5)]


@pytest.fixture(scope="module")
def whole(tiny_model_factory: Callable[..., Path]) -> Path:
    return tiny_model_factory("llama", shards=4)


@pytest.fixture
def without_layer_2(whole: Path, tmp_path: Path) -> Path:
    """The model without the file that holds only layer 2."""
    folder = shutil.copytree(whole, tmp_path / "tiny-llama")
    (folder / SHARDS[2]).unlink()
    return folder


def keep(start: int, end: int) -> Callable[[nn.Module, dict[str, Any]], Sequence[nn.Module]]:
    """A prepare step that keeps layers [start, end) (what a pipeline rank materialises)."""

    def prepare(model: nn.Module, config: dict[str, Any]) -> Sequence[nn.Module]:
        return transformer_layers(model)[start:end]

    return prepare


def weights(layers: Sequence[nn.Module]) -> list[tuple[str, mx.array]]:
    return [
        item
        for layer in layers
        for item in cast("list[tuple[str, mx.array]]", tree_flatten(layer.parameters()))
    ]


def test_the_card_of_a_partial_folder_names_the_layers_on_disk(
    whole: Path, without_layer_2: Path
) -> None:
    full, part = read_card(whole), read_card(without_layer_2)
    assert full.layers_on_disk is None and full.holds_layers(0, 4)
    assert part.layers_on_disk == (0, 1, 3)
    assert part.holds_layers(0, 2) and part.holds_layers(3, 4) and not part.holds_layers(1, 3)
    # The card still describes the whole model (what placement needs), from the index's total
    # (tensor bytes, without the files' headers).
    assert part.bytes_on_disk == pytest.approx(full.bytes_on_disk, rel=0.01)
    assert part.num_parameters == pytest.approx(full.num_parameters, rel=0.01)
    assert part.num_layers == full.num_layers == 4
    assert missing_weight_files(without_layer_2, (0, 2)) == []
    assert missing_weight_files(without_layer_2, (1, 3)) == [SHARDS[2]]
    found = find_models([without_layer_2.parent], include_bundled=False)
    assert [card.layers_on_disk for card in found] == [(0, 1, 3)]


def test_a_rank_loads_its_layers_from_a_partial_folder(whole: Path, without_layer_2: Path) -> None:
    reference = load_model_sync(whole)
    loaded = run_loading(load_model(without_layer_2, prepare=keep(0, 2), layer_range=(0, 2)))
    got = weights(transformer_layers(loaded.model)[0:2])
    want = weights(transformer_layers(reference.model)[0:2])
    assert [name for name, _ in got] == [name for name, _ in want]
    for (name, a), (_, b) in zip(got, want, strict=True):
        assert mx.array_equal(a, b).item(), name
    head, reference_head = loaded.model.lm_head, reference.model.lm_head
    assert head is not None and reference_head is not None
    assert mx.array_equal(head.weight, reference_head.weight).item()


def test_layers_whose_file_is_missing_are_refused_by_name(without_layer_2: Path) -> None:
    """A folder of the user's is no hub repo: the fix is to copy the file in, not download."""
    with pytest.raises(ModelFormatError) as error:
        run_loading(load_model(without_layer_2, prepare=keep(1, 3), layer_range=(1, 3)))
    assert SHARDS[2] in error.value.cause and "layers 1-2" in error.value.cause
    assert f"Copy {SHARDS[2]} into {without_layer_2}" in error.value.fix
    assert "download" not in error.value.fix
    with pytest.raises(ModelFormatError, match=SHARDS[2]):
        load_model_sync(without_layer_2)  # the whole model


def test_a_partial_hub_snapshot_says_to_download_the_rest_of_its_repo(
    whole: Path, tmp_path: Path
) -> None:
    snapshot = tmp_path / "hub" / "models--mlx-community--tiny" / "snapshots" / ("a" * 40)
    shutil.copytree(whole, snapshot)
    (snapshot / SHARDS[2]).unlink()
    with pytest.raises(ModelFormatError) as error:
        run_loading(load_model(snapshot, prepare=keep(1, 3), layer_range=(1, 3)))
    assert SHARDS[2] in error.value.cause
    fix = "Download them: exo-tui models download mlx-community/tiny --layers 1:3"
    assert error.value.fix == fix
