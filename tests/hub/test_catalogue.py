"""The model catalogue: every entry agrees with itself, with mlx-lm and with placement."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from exo_tui.cluster.control.placement import Placement, PlacementError, place
from exo_tui.hub.catalogue import (
    CatalogueEntry,
    CatalogueError,
    entry_card,
    find_entry,
    load_catalogue,
    parse_catalogue,
)

ENTRIES = load_catalogue()

# Parameters counted from the architecture may differ from the entry by the small tensors the
# formula leaves out (biases, q/k norms, attention sinks): at most 1 %.
PARAMETER_TOLERANCE = 0.01
# Bytes against parameters x stored bits per weight: norms kept in 16 bits make it a little
# larger, and mixed quantization (gpt-oss keeps attention and embeddings at 8 bits) up to ~9 %.
BYTES_BELOW = 0.98
BYTES_ABOVE = 1.10


def architecture_parameters(e: CatalogueEntry) -> int:
    """Embeddings (and an untied head), then per layer attention, MLP or experts, two norms."""
    head_dim = e.attention_head_dim
    attention = e.hidden_size * head_dim * (2 * e.heads + 2 * e.kv_heads)
    if e.experts:
        mlp = e.experts * 3 * e.hidden_size * e.intermediate_size + e.hidden_size * e.experts
    else:
        mlp = 3 * e.hidden_size * e.intermediate_size
    embeddings = e.vocab_size * e.hidden_size * (1 if e.tied_embeddings else 2)
    return embeddings + e.layers * (attention + mlp + 2 * e.hidden_size) + e.hidden_size


def test_catalogue_spans_families_and_sizes() -> None:
    families = {e.family for e in ENTRIES}
    assert {"llama", "qwen3", "gemma", "mistral", "deepseek", "gpt-oss"} <= families
    sizes = sorted(e.parameters for e in ENTRIES)
    assert sizes[0] < 1e9 and sizes[-1] > 200e9
    assert 12 <= len(ENTRIES) <= 20
    assert all(e.repo.startswith("mlx-community/") for e in ENTRIES)


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.repo.split("/")[1] for e in ENTRIES])
def test_entry_is_consistent(entry: CatalogueEntry) -> None:
    assert entry.heads % entry.kv_heads == 0
    if entry.head_dim is None:
        assert entry.hidden_size % entry.heads == 0
    counted = architecture_parameters(entry)
    assert abs(counted - entry.parameters) <= PARAMETER_TOLERANCE * entry.parameters, counted
    expected_bytes = entry.parameters * entry.bits_per_weight / 8
    assert BYTES_BELOW * expected_bytes <= entry.bytes <= BYTES_ABOVE * expected_bytes
    assert entry.context_length >= 8192


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.repo.split("/")[1] for e in ENTRIES])
def test_tensor_support_matches_mlx_lm(entry: CatalogueEntry) -> None:
    import mlx_lm.utils as mlx_utils

    remap: dict[str, str] = getattr(mlx_utils, "MODEL_REMAPPING", {})
    module = importlib.import_module(
        f"mlx_lm.models.{remap.get(entry.model_type, entry.model_type)}"
    )
    assert hasattr(module.Model, "shard") == entry.tensor


def test_entry_card_is_placeable() -> None:
    class Node:
        def __init__(self, node_id: str, available: int) -> None:
            self.node_id = node_id
            self.name = node_id
            self.memory_available_bytes = available

    entry = find_entry("MLX-COMMUNITY/Llama-3.3-70B-Instruct-4bit")
    assert entry is not None
    card = entry_card(entry)
    assert card.num_layers == 80 and card.bytes_on_disk == entry.bytes
    assert card.head_dim == 128 and card.quantization is not None
    nodes = [Node("a", 32 * 2**30), Node("b", 32 * 2**30)]
    placement = place(nodes, card, "pipeline")
    assert isinstance(placement, Placement), placement
    assert sum(s.spec.num_layers for s in placement.shards) == 80
    too_small = place([Node("a", 8 * 2**30)], card, "pipeline")
    assert isinstance(too_small, PlacementError) and too_small.kind == "memory"


def test_bad_entries_are_refused_with_the_reason() -> None:
    good = ENTRIES[0].model_dump(exclude_none=True)

    def toml(**changes: object) -> str:
        fields = {**good, **changes}
        lines = [f"{k} = {v!r}".replace("True", "true").replace("False", "false")
                 .replace("'", '"') for k, v in fields.items()]  # fmt: skip
        return "[[model]]\n" + "\n".join(lines) + "\n"

    with pytest.raises(CatalogueError, match="kv_heads"):
        parse_catalogue(toml(kv_heads=7))
    with pytest.raises(CatalogueError, match="tool_format"):
        parse_catalogue(toml(tool_format="xml"))
    with pytest.raises(CatalogueError, match="more than once"):
        parse_catalogue(toml() + toml())


def test_a_user_catalogue_comes_first_and_replaces_entries_of_the_same_repo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.cli.test_chat_downloads_cli import catalogue_toml

    packaged = ENTRIES[0]
    mine = packaged.model_copy(update={"context_length": 4096})
    extra = ENTRIES[1].model_copy(update={"repo": "me/my-own-model"})
    own = tmp_path / "mine.toml"
    own.write_text(catalogue_toml(mine) + catalogue_toml(extra))
    monkeypatch.setenv("EXO_TUI_CATALOGUE", str(own))
    entries = load_catalogue()
    assert [e.repo for e in entries[:2]] == [packaged.repo, "me/my-own-model"]
    assert entries[0].context_length == 4096
    assert len(entries) == len(ENTRIES) + 1
    assert find_entry("ME/my-own-model") == entries[1]
    monkeypatch.setenv("EXO_TUI_CATALOGUE", str(tmp_path / "missing.toml"))
    with pytest.raises(CatalogueError, match="missing.toml, named by EXO_TUI_CATALOGUE"):
        load_catalogue()
