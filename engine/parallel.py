"""Pipeline and tensor sharding over an mx.distributed.Group, as loading generators.

Pipeline: rank r keeps the contiguous layers [start, end) of its ShardSpec (rank 0 the first
ones) and nothing else is ever materialised. Its first layer receives the hidden state from rank
r-1, its last layer sends to rank r+1, and every rank then takes the last rank's output from an
all_gather, so all ranks compute the same logits and sample the same token. This works for any
mlx-lm model whose forward pass loops over a list of layers with a cache per layer, not only the
few that ship mlx-lm's PipelineMixin.

Tensor: mlx-lm's own `shard()` splits every layer's weights lazily, then the layers are
materialised one at a time, so progress and peak memory are per layer.
"""
# pyright: reportMissingTypeStubs=false, reportUnknownMemberType=false
# (mlx.nn and mlx-lm ship no complete type information.)

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_map  # pyright: ignore[reportUnknownVariableType]
from mlx_lm.models.cache import _BaseCache  # pyright: ignore[reportPrivateUsage]

from engine.errors import EngineError, ModelFormatError
from engine.loading import Loading, load_model, transformer_layers
from engine.models.cards import read_card
from engine.types import ModelCard, ShardSpec


class ShardError(EngineError):
    """A shard spec that cannot work for this model or this ring, found before anything loads."""


def pipeline_specs(layer_counts: Sequence[int]) -> list[ShardSpec]:
    """One pipeline spec per rank, rank 0 first, from how many layers each rank holds."""
    specs: list[ShardSpec] = []
    start = 0
    for rank, count in enumerate(layer_counts):
        specs.append(
            ShardSpec(
                strategy="pipeline",
                start_layer=start,
                end_layer=start + count,
                rank=rank,
                world_size=len(layer_counts),
            )
        )
        start += count
    return specs


def even_layer_counts(num_layers: int, world_size: int) -> list[int]:
    """Layers per rank for an even split; the first ranks take the remainder."""
    base, extra = divmod(num_layers, world_size)
    return [base + (rank < extra) for rank in range(world_size)]


def tensor_specs(num_layers: int, world_size: int) -> list[ShardSpec]:
    """One tensor spec per rank: every rank holds a slice of every layer."""
    return [
        ShardSpec(
            strategy="tensor", start_layer=0, end_layer=num_layers, rank=rank, world_size=world_size
        )
        for rank in range(world_size)
    ]


def check_shard_spec(card: ModelCard, spec: ShardSpec, world_size: int) -> None:
    """Raise ShardError when `spec` cannot run `card` in a ring of `world_size` ranks."""
    n = card.num_layers
    span = f"[{spec.start_layer}, {spec.end_layer})"
    layers = f"{card.name} has {n} layers, numbered 0 to {n - 1}"
    if world_size < 1 or spec.world_size != world_size:
        raise ShardError(
            f"The shard spec is for a ring of {spec.world_size} ranks but this ring has "
            f"{world_size}",
            "Make the specs for the ring that runs them",
        )
    if not 0 <= spec.rank < world_size:
        raise ShardError(
            f"The shard spec is for rank {spec.rank}, outside a ring of {world_size} ranks",
            f"Use ranks 0 to {world_size - 1}",
        )
    if not 0 <= spec.start_layer < n or not 0 < spec.end_layer <= n:
        raise ShardError(
            f"The layer range {span} of rank {spec.rank} is out of bounds: {layers}",
            f"Give each rank a range within [0, {n})",
        )
    if spec.end_layer <= spec.start_layer:
        raise ShardError(
            f"The shard spec for rank {spec.rank} has an empty layer range {span}",
            "Give every rank at least one layer (start_layer < end_layer)",
        )
    if spec.strategy == "pipeline":
        if spec.rank == 0 and spec.start_layer != 0:
            raise ShardError(
                f"Rank 0 must hold the first layer, but its range is {span}",
                "Start rank 0's range at layer 0",
            )
        if spec.rank == world_size - 1 and spec.end_layer != n:
            raise ShardError(
                f"The last rank ({spec.rank}) must hold the last layer, but its range is {span} "
                f"and {layers}",
                f"End the last rank's range at layer {n}",
            )
        return
    if (spec.start_layer, spec.end_layer) != (0, n):
        raise ShardError(
            f"A tensor shard holds a slice of every layer, but rank {spec.rank} was given {span}",
            f"Use the full range [0, {n})",
        )
    if world_size == 1:
        return
    if not card.supports_tensor:
        raise ShardError(
            f"Tensor sharding needs mlx-lm's shard(), which the {card.model_type} architecture "
            "does not have",
            "Use pipeline sharding for this model",
        )
    uneven = [
        f"{count} {what}"
        for count, what in (
            (card.num_attention_heads, "attention heads"),
            (card.num_kv_heads, "key/value heads"),
        )
        if count % world_size
    ]
    if uneven:
        raise ShardError(
            f"{card.name} has {' and '.join(uneven)}, which {world_size} ranks cannot split evenly",
            "Pick a number of ranks that divides the head counts, or use pipeline sharding",
        )


def check_shard_specs(card: ModelCard, specs: Sequence[ShardSpec]) -> None:
    """Check a whole ring's specs: each one, and that together they cover every layer once."""
    for rank, spec in enumerate(specs):
        if spec.rank != rank or spec.strategy != specs[0].strategy:
            raise ShardError(
                f"Spec {rank} of the ring is for rank {spec.rank} with {spec.strategy} sharding",
                "List one spec per rank, in rank order, all with the same strategy",
            )
        check_shard_spec(card, spec, len(specs))
    if specs and specs[0].strategy == "pipeline":
        for before, after in zip(specs, specs[1:], strict=False):
            if before.end_layer != after.start_layer:
                raise ShardError(
                    f"Rank {before.rank} ends at layer {before.end_layer} but rank {after.rank} "
                    f"starts at layer {after.start_layer}",
                    "Give the ranks contiguous ranges that cover every layer once",
                )


def load_shard(path: Path | str, spec: ShardSpec, group: mx.distributed.Group | None) -> Loading:
    """Load this rank's part: `loaded = yield from load_shard(path, spec, group)`.

    Yields one LoadProgress per layer this rank holds; the spec is checked before anything is
    read, and the returned model generates in lockstep with the other ranks. A pipeline rank
    may load before its ring exists (`group=None`: its weights need nothing from the others),
    then `join_pipeline(model, group)` once the ring has formed; a tensor rank needs the ring
    to split its weights.
    """
    path = Path(path)
    card = read_card(path)
    if group is None:
        if spec.strategy != "pipeline":
            raise ShardError(
                "A tensor shard splits its weights over the ring: it cannot load before joining",
                "Join the ring first (load_shard with its group)",
            )
        check_shard_spec(card, spec, spec.world_size)
    else:
        check_shard_spec(card, spec, group.size())
        _check_rank(spec, group)

    def prepare(model: nn.Module, config: dict[str, Any]) -> Sequence[nn.Module]:
        if spec.strategy == "pipeline":
            return _cut_pipeline(model, card, spec, group)
        assert group is not None
        return _shard_tensor(model, card, group)

    # A pipeline rank needs only its layers' weight files on disk (a per-shard download).
    own = (spec.start_layer, spec.end_layer) if spec.strategy == "pipeline" else None
    loaded = yield from load_model(path, prepare=prepare, rank=spec.rank, layer_range=own)
    loaded.ranks = spec.world_size
    return loaded


def join_pipeline(model: nn.Module, group: mx.distributed.Group, spec: ShardSpec) -> None:
    """Give a pipeline rank loaded without its ring (load_shard with group=None) the ring."""
    if group.size() != spec.world_size:
        raise ShardError(
            f"The shard spec is for a ring of {spec.world_size} ranks but this ring has "
            f"{group.size()}",
            "Make the specs for the ring that runs them",
        )
    _check_rank(spec, group)
    for layer in cast(list[nn.Module], _layer_holder(model)["layers"]):
        hop: _Hop | None = getattr(layer, "_pipeline_hop", None)
        if hop is not None:
            hop.group = group


def _check_rank(spec: ShardSpec, group: mx.distributed.Group) -> None:
    if spec.rank != group.rank():
        raise ShardError(
            f"The shard spec is for rank {spec.rank} but this process is rank {group.rank()}",
            "Give each process the spec of its own rank (MLX_RANK)",
        )


# ------------------------------------------------------------------------------------ pipeline


@dataclass
class _Hop:
    """What a rank's first or last layer does around its own computation; `group` is set
    when the rank joins its ring (it may load before)."""

    group: mx.distributed.Group | None
    receive_from: int | None
    send_to: int | None
    gather: bool


class _PipelineStage:
    """Mixed into the class of a rank's first and last layers (see _hook)."""

    _pipeline_hop: _Hop

    def __call__(self, x: mx.array, *args: Any, **kwargs: Any) -> Any:
        hop = self._pipeline_hop
        if hop.group is None:
            raise ShardError(
                "This pipeline rank has not joined its ring", "Call join_pipeline after joining"
            )
        if hop.receive_from is not None:
            # Only the shape and dtype of this rank's own embedding are used.
            x = mx.distributed.recv_like(x, hop.receive_from, group=hop.group)
        h = cast(Any, super()).__call__(x, *args, **kwargs)
        if not hop.gather:
            return h
        if not isinstance(h, mx.array):
            raise ShardError(
                f"A transformer layer returned {type(h).__name__}, not the hidden state",
                "Pipeline sharding needs layers that return one array; use tensor sharding",
            )
        if hop.send_to is not None:
            h = mx.distributed.send(h, hop.send_to, group=hop.group)
            _keep_send_in_graph(h, [*args, *kwargs.values()])
        # Every rank leaves the step with the last rank's hidden state, so the logits agree.
        return mx.distributed.all_gather(h, group=hop.group)[-h.shape[0] :]


def _keep_send_in_graph(sent: mx.array, arguments: Sequence[object]) -> None:
    """Make this layer's KV cache depend on the send.

    A chunked prefill evaluates only the caches (`mx.eval([c.state for c in cache])`), never the
    logits; without this, the send would not run and the next rank would wait for it forever.
    """
    for argument in arguments:
        if not isinstance(argument, _BaseCache):
            continue
        cache: Any = argument
        keys: object = getattr(cache, "keys", None)
        if isinstance(keys, mx.array):
            cache.keys = mx.depends(keys, sent)
        elif isinstance(keys, tuple) and keys:  # a quantized cache: (data, scales, biases)
            parts = list(cast(tuple[mx.array, ...], keys))
            cache.keys = tuple(cast(list[mx.array], mx.depends(parts, sent)))
        return


def _hook(layer: nn.Module, hop: _Hop) -> None:
    """Give one layer instance the pipeline hop; its parameters and attributes stay as they are
    (a wrapper module would rename every weight and hide the layer's attributes)."""
    base = type(layer)
    stage = type(f"{base.__name__}PipelineStage", (_PipelineStage, base), {})
    layer.__class__ = stage
    cast(Any, layer)._pipeline_hop = hop


def _layer_holder(model: nn.Module) -> nn.Module:
    """The module whose `layers` list the forward pass iterates (model.model for most)."""
    queue: list[tuple[nn.Module, int]] = [(model, 0)]
    while queue:
        module, depth = queue.pop(0)
        layers = cast(dict[str, object], module).get("layers")
        if isinstance(layers, list) and cast(list[object], layers):
            return module
        if depth < 3:
            queue.extend(
                (child, depth + 1)
                for child in cast(dict[str, Any], module).values()
                if isinstance(child, nn.Module)
            )
    raise ModelFormatError(
        f"mlx-lm's {type(model).__module__} model exposes no list of transformer layers",
        "Pipeline sharding needs a standard decoder architecture",
    )


# PipelineMixin's own bounds: they slice the list we replace and stay at 0 and None.
_MIXIN_INDICES = frozenset({"start_idx", "end_idx"})


def _reindex(holder: nn.Module, card: ModelCard, start: int, end: int, total: int) -> None:
    """Some models pick masks from the cache of the first layer of each type (llama's fa_idx
    and swa_idx over its layer_types, gpt-oss's ga_idx and swa_idx). Point them at the first
    owned layer of that type, or at the rank's first layer when it owns none (the mask made
    there is then used by no layer: mlx-lm's gpt_oss indexes the caches with both unchecked);
    refuse, before anything loads, indices that mean anything else."""
    indices = {
        name: value
        for name, value in vars(holder).items()
        if name.endswith("_idx") and name not in _MIXIN_INDICES and isinstance(value, int)
    }
    if not indices:
        return
    found = cast(dict[str, object], holder).get("layer_types")
    types = cast(list[object], found) if isinstance(found, list) else []
    firsts = {types.index(kind) for kind in types}
    unknown = sorted(name for name, value in indices.items() if value not in firsts)
    if len(types) != total or unknown:
        raise ShardError(
            f"mlx-lm's {card.model_type} model uses layer indices "
            f"({', '.join(unknown or sorted(indices))}) that a pipeline cut would break",
            "Use tensor sharding or run the model on one node",
        )
    owned_types = types[start:end]
    for name, value in indices.items():
        kind = types[value]
        setattr(holder, name, owned_types.index(kind) if kind in owned_types else 0)
    holder.layer_types = owned_types


def _cut_pipeline(
    model: nn.Module, card: ModelCard, spec: ShardSpec, group: mx.distributed.Group | None
) -> Sequence[nn.Module]:
    holder = _layer_holder(model)
    layers = cast(list[nn.Module], holder["layers"])
    if spec.end_layer > len(layers):
        raise ShardError(
            f"mlx-lm built {len(layers)} layers for {card.name} but the spec ends at "
            f"layer {spec.end_layer}",
            f"End the last range at layer {len(layers)}",
        )
    _reindex(holder, card, spec.start_layer, spec.end_layer, len(layers))
    owned = layers[spec.start_layer : spec.end_layer]
    # The other layers' lazy weights lose their last reference here and are never read.
    holder.layers = owned
    rank, size = spec.rank, spec.world_size
    if size > 1:
        first = _Hop(group, rank - 1 if rank > 0 else None, None, gather=False)
        last = _Hop(group, None, rank + 1 if rank < size - 1 else None, gather=True)
        if len(owned) == 1:
            _hook(owned[0], _Hop(group, first.receive_from, last.send_to, gather=True))
        else:
            _hook(owned[0], first)
            _hook(owned[-1], last)
    return owned


# -------------------------------------------------------------------------------------- tensor


def _shard_tensor(
    model: nn.Module, card: ModelCard, group: mx.distributed.Group
) -> Sequence[nn.Module]:
    if group.size() == 1:
        return transformer_layers(model)
    try:
        # Lazy: each layer's slices are cut when load_model materialises that layer.
        cast(Any, model).shard(group)
    except ValueError as error:
        raise ShardError(
            f"mlx-lm could not split {card.name} over {group.size()} ranks: {error}",
            "Pick a number of ranks that divides the model's sizes, or use pipeline sharding",
        ) from error
    layers = transformer_layers(model)
    for layer in layers:
        layer.update(tree_map(_own_buffer, layer.parameters()))
    return layers


def _own_buffer(weight: mx.array) -> mx.array:
    """A copy in a buffer of its own size.

    shard() cuts "all-to-sharded" weights (q, k, v, gate, up) as row slices, which MLX keeps as
    views of the whole loaded matrix: without a copy a rank would hold every full matrix.
    Concatenating never reuses its input's buffer, where a unary copy could.
    """
    if weight.ndim == 0:
        return weight
    return mx.concatenate([weight, weight[:0]])
