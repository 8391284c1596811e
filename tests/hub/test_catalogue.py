"""The model catalogue: every entry agrees with itself, with mlx-lm and with placement."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import mlx_lm
import pytest

from exo_tui.cluster.control.placement import (
    Placement,
    PlacementError,
    layer_weight_bytes,
    non_layer_bytes,
    place,
)
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


class MoeFigures(NamedTuple):
    parameters: int
    active_parameters: int
    bytes: float
    bytes_in_layers: float


def qwen3_moe_figures(e: CatalogueEntry) -> MoeFigures:
    """Every tensor of mlx-lm's qwen3_moe: q/k norms, no biases; all but norms at `bits`."""
    h, d = e.hidden_size, e.attention_head_dim
    attention = h * d * (2 * e.heads + 2 * e.kv_heads)
    expert = 3 * h * e.intermediate_size
    router = h * e.experts
    norms = 2 * h + 2 * d
    embeddings = e.vocab_size * h * (1 if e.tied_embeddings else 2)
    total = e.layers * (attention + e.experts * expert + router + norms) + embeddings + h
    unread = e.layers * (e.experts - e.active_experts) * expert + e.vocab_size * h
    per_weight = e.bits_per_weight / 8
    layers = e.layers * ((attention + e.experts * expert + router) * per_weight + 2 * norms)
    return MoeFigures(total, total - unread, layers + embeddings * per_weight + 2 * h, layers)


def gpt_oss_figures(e: CatalogueEntry) -> MoeFigures:
    """Every tensor of mlx-lm's gpt_oss: biases on attention, router and experts, a sink per
    head; experts at `bits` (MXFP4), the other linears, embeddings and head at `rest_bits`,
    the rest in bf16."""
    h, d, experts = e.hidden_size, e.attention_head_dim, e.experts
    linears = h * d * (2 * e.heads + 2 * e.kv_heads) + h * experts  # attention and router
    small = d * e.heads + 2 * d * e.kv_heads + h + e.heads + experts + 2 * h  # biases, sinks, norms
    expert_weights = 3 * h * e.intermediate_size
    expert_biases = 2 * e.intermediate_size + h
    embeddings = 2 * e.vocab_size * h
    per_layer = linears + small + experts * (expert_weights + expert_biases)
    total = e.layers * per_layer + embeddings + h
    unread = e.layers * (experts - e.active_experts) * (expert_weights + expert_biases)
    rest, packed = e.rest_bits_per_weight / 8, e.bits_per_weight / 8
    layer_bytes = linears * rest + experts * (expert_weights * packed + 2 * expert_biases)
    layers = e.layers * (layer_bytes + 2 * small)
    return MoeFigures(total, total - unread - e.vocab_size * h, layers + embeddings * rest + 2 * h,
                      layers)  # fmt: skip


MOE_FIGURES: dict[str, Callable[[CatalogueEntry], MoeFigures]] = {
    "qwen3_moe": qwen3_moe_figures,
    "gpt_oss": gpt_oss_figures,
}
MOE = [e for e in ENTRIES if e.experts]


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


def test_every_model_type_is_one_mlx_lm_has() -> None:
    import mlx_lm.utils as mlx_utils

    assert tuple(int(n) for n in mlx_lm.__version__.split(".")[:2]) >= (0, 32)
    remap: dict[str, str] = getattr(mlx_utils, "MODEL_REMAPPING", {})
    models = Path(mlx_lm.__file__).parent / "models"
    for entry in ENTRIES:
        name = remap.get(entry.model_type, entry.model_type)
        assert (models / f"{name}.py").is_file(), f"{entry.repo}: mlx-lm has no {name}"
        module = importlib.import_module(f"mlx_lm.models.{name}")
        assert hasattr(module, "Model") and hasattr(module, "ModelArgs"), entry.repo


def test_the_moe_models_people_run_are_listed() -> None:
    repos = {e.repo for e in MOE}
    assert {
        "mlx-community/Qwen3-30B-A3B-4bit",
        "mlx-community/Qwen3-Coder-30B-A3B-Instruct-4bit",
        "mlx-community/Qwen3-235B-A22B-4bit",
        "mlx-community/gpt-oss-20b-MXFP4-Q8",
        "mlx-community/gpt-oss-120b-MXFP4-Q8",
    } <= repos


@pytest.mark.parametrize("entry", MOE, ids=[e.repo.split("/")[1] for e in MOE])
def test_a_mixture_of_experts_figures_are_its_config_counted(entry: CatalogueEntry) -> None:
    """Parameters and active parameters exactly as the config's shapes give them; bytes within
    the catalogue's rounding; and the card's split between layers and the rest as counted."""
    assert entry.model_type in MOE_FIGURES, "count this architecture's tensors here"
    figures = MOE_FIGURES[entry.model_type](entry)
    assert entry.parameters == figures.parameters
    assert entry.active_parameters == figures.active_parameters
    assert abs(entry.bytes - figures.bytes) <= 5_000_000 + 1e-4 * figures.bytes
    card = entry_card(entry)
    assert card.quantization is not None and card.quantization.mode == entry.quantization_mode
    assert card.bytes_in_layers is not None
    assert abs(card.bytes_in_layers - figures.bytes_in_layers) <= 0.002 * figures.bytes_in_layers
    per_layer = layer_weight_bytes(card, 1)
    assert abs(per_layer - figures.bytes_in_layers / entry.layers) <= 0.002 * per_layer
    assert non_layer_bytes(card) == entry.bytes - card.bytes_in_layers
