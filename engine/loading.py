"""Loading generators: a model comes into memory one transformer layer at a time, with progress."""
# pyright: reportMissingTypeStubs=false, reportUnknownMemberType=false
# (mlx.nn and mlx-lm ship no complete type information.)

from __future__ import annotations

import json
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten  # pyright: ignore[reportUnknownVariableType]
from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.utils import load_model as mlx_lm_load_model  # pyright: ignore[reportUnknownVariableType]
from mlx_lm.utils import load_tokenizer  # pyright: ignore[reportUnknownVariableType]

from engine import attention, blas, kernels
from engine.errors import ModelFormatError
from engine.harmony import stop_token_ids
from engine.kernels import routing
from engine.models.cards import read_card
from engine.models.weights import require_weight_files
from engine.prefill import PrefillPace
from engine.prompt_cache import ConversationCache
from engine.types import LoadProgress, ModelCard

Loading = Generator[LoadProgress, None, "LoadedModel"]
Loaded = TypeVar("Loaded")
Progress = TypeVar("Progress")
# The lazily built model and its config in, the layers this process must materialise out.
PrepareLayers = Callable[[nn.Module, dict[str, Any]], Sequence[nn.Module]]


@dataclass
class LoadedModel:
    """A model in memory, ready to generate: weights, tokenizer, card and its prompt caches."""

    model: nn.Module
    tokenizer: TokenizerWrapper
    card: ModelCard
    config: dict[str, Any]
    blas: str
    kernels: str = field(default_factory=kernels.describe)
    prompt_cache: ConversationCache = field(default_factory=ConversationCache)
    prefill_pace: PrefillPace = field(default_factory=PrefillPace)  # its measured speed
    ranks: int = 1  # the ranks of a ring that run it together (engine.parallel), 1: alone

    @property
    def context_length(self) -> int | None:
        return self.card.context_length

    def unload(self) -> None:
        """Drop the prompt caches and MLX's buffer cache; the weights go with the last reference."""
        self.prompt_cache.clear()
        mx.clear_cache()


def transformer_layers(model: nn.Module) -> Sequence[nn.Module]:
    """The model's list of transformer blocks (mlx-lm models expose it as `.layers`)."""
    layers: Any = getattr(model, "layers", None)
    if layers is None:
        inner: Any = getattr(model, "model", None)
        layers = getattr(inner, "layers", None)
    if not isinstance(layers, list | tuple):
        raise ModelFormatError(
            f"mlx-lm's {type(model).__module__} model exposes no list of transformer layers",
            "Pick a model with a standard decoder architecture",
        )
    return list(layers)  # pyright: ignore[reportUnknownArgumentType]


def materialise_layers(layers: Sequence[nn.Module], rank: int = 0) -> Generator[LoadProgress]:
    """Evaluate each layer's weights in turn, reporting after each one; the last report is n/n."""
    total = len(layers)
    for index, layer in enumerate(layers):
        # Start reading the next layer before waiting on this one: each eval is a sync point,
        # and overlapping them keeps per-layer progress nearly as fast as one eval of all.
        if index + 1 < total:
            mx.async_eval(layers[index + 1].parameters())
        weights = [array for _, array in _leaves(layer)]
        mx.eval(weights)
        kernels.back_with_huge_pages(weights)
        yield LoadProgress(layers_loaded=index + 1, total=total, rank=rank)


def open_lazy(
    path: Path, layers: tuple[int, int] | None = None
) -> tuple[nn.Module, dict[str, Any], TokenizerWrapper, ModelCard]:
    """Build the model with lazily loaded weights and its tokenizer; nothing big is read yet.

    `layers` are the only layers this process will run (a pipeline rank): the folder may then
    hold only the weight files those need, and the other layers are left unloaded."""
    card = read_card(path)
    require_weight_files(path, layers, name=card.name)
    try:
        built = cast(
            tuple[nn.Module, dict[str, Any]],
            mlx_lm_load_model(path, lazy=True, strict=card.layers_on_disk is None),
        )
        model, config = built
    except ValueError as error:
        raise ModelFormatError(
            f"mlx-lm cannot build the model in {path}: {error}",
            "Check that the weights match config.json, or re-download the model",
        ) from error
    attention.install(model)
    try:
        tokenizer: TokenizerWrapper = load_tokenizer(path, eos_token_ids=config.get("eos_token_id"))
    except (OSError, ValueError, json.JSONDecodeError) as error:
        raise ModelFormatError(
            f"Could not load the tokenizer in {path}: {error}",
            "The folder needs tokenizer.json (or tokenizer.model) and tokenizer_config.json; "
            "re-download the model",
        ) from error
    if card.model_type == "gpt_oss":
        # Harmony ends a turn with <|return|> or <|call|>; fail here if its vocabulary is missing.
        eos = cast(set[int], tokenizer.eos_token_ids)
        tokenizer.eos_token_ids = eos | set(stop_token_ids())
    return model, config, tokenizer, card


def load_model(
    path: Path | str,
    *,
    prepare: PrepareLayers | None = None,
    rank: int = 0,
    layer_range: tuple[int, int] | None = None,
) -> Loading:
    """Load a model: `loaded = yield from load_model(path)`, one LoadProgress per layer.

    `prepare` turns the lazily built model into this process's part (engine.parallel cuts or
    shards it) and returns the layers to materialise; by default the whole model is loaded.
    `layer_range` says which layers `prepare` keeps: only their weight files need be on disk.
    """
    path = Path(path)
    blas_in_use = blas.describe()
    model, config, tokenizer, card = open_lazy(path, layer_range)
    layers = prepare(model, config) if prepare is not None else transformer_layers(model)
    # After `prepare`: tensor parallelism swaps in sharded linears, which are routed too.
    routing.install(model)
    # Embeddings, final norm and head first, so the last report (n/n) means ready.
    layer_ids = {id(array) for layer in layers for _, array in _leaves(layer)}
    rest = [array for _, array in _leaves(model) if id(array) not in layer_ids]
    mx.eval(rest)
    kernels.back_with_huge_pages(rest)
    # What modules keep beside their parameters (a scaled rope's frequencies) is a lazy graph on
    # this thread's stream, which no other thread can run: computed now, any thread may answer.
    mx.eval(_beside_parameters(model))
    yield from materialise_layers(layers, rank)
    return LoadedModel(model=model, tokenizer=tokenizer, card=card, config=config, blas=blas_in_use)


def run_loading(
    loading: Generator[Progress, None, Loaded],
    on_progress: Callable[[Progress], None] | None = None,
) -> Loaded:
    """Run a generator that reports progress (a model's load, a shard's, a ring's, a download, a
    chat turn) to the end, handing each report to `on_progress`; its result."""
    while True:
        try:
            progress = next(loading)
        except StopIteration as done:
            loaded: Loaded = done.value
            return loaded
        if on_progress is not None:
            on_progress(progress)


def load_model_sync(path: Path | str) -> LoadedModel:
    """Load a model, for callers that need no progress."""
    return run_loading(load_model(path))


def _leaves(module: nn.Module) -> list[tuple[str, mx.array]]:
    return tree_flatten(module.parameters())  # pyright: ignore[reportReturnType]


def _beside_parameters(module: nn.Module) -> list[mx.array]:
    """The arrays a module holds that are not parameters: those named with a leading `_` (a
    module is a dict of its arrays and children)."""
    leaves = cast(list[tuple[str, object]], tree_flatten(cast(Any, module)))
    return [
        value
        for name, value in leaves
        if isinstance(value, mx.array) and any(part.startswith("_") for part in name.split("."))
    ]
