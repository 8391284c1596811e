"""Placement: which node runs which layers of a model, and whether each node has the memory.

`place(nodes, card, strategy)` is pure; the TUI's preview and the coordinator both call it.

How the bytes a node needs are estimated (from the card alone, nothing is loaded):

- *Weights outside the layers* (embeddings, final norm, head): ``bytes_on_disk`` less the
  card's ``bytes_in_layers``, which a card read from disk has from its safetensors headers (an
  untied head and 8-bit embeddings beside 4-bit experts are then counted as they are). A card
  without it counts one ``vocab x hidden`` matrix at the card's stored bits per weight (its
  quantization's scales included): an untied head then lands in the per-layer share instead.
  Either way the total over one node is exactly ``bytes_on_disk``. Every rank holds these
  weights (mlx-lm keeps them on every pipeline and tensor rank), so every shard counts them.
- *Layer weights*: ``bytes_on_disk`` minus the above, split evenly over the layers. A pipeline
  shard holds its layers' share; a tensor shard holds ``1/N`` of every layer.
- *KV-cache headroom* for the chosen context (capped at the model's own context length):
  ``2 (K and V) x layers x kv_heads x head_dim x context x bytes``, where bytes is 4 for a
  float32 model and 2 otherwise (fp16 / bf16, and quantized models, whose activations are 16-bit).
  A tensor shard holds ``kv_heads / N`` of the heads for every layer.

A node fits when the bytes it needs are at most its available memory.

Pipeline ranges follow the given node order (rank 0 gets the first layers), are contiguous and
give every node at least one layer: more nodes than layers is an error (the caller picks fewer
nodes). Layers are shared in proportion to each node's *usable* memory: its available memory less
the bytes every shard needs whatever its range (the weights outside the layers), so that a small
node is not handed layers its fixed costs leave no room for. The split uses largest remainders, so
a node with more available memory never gets fewer layers than one with less.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol

from pydantic import Field

from engine.kv_memory import format_bytes, kv_bytes_per_position
from engine.types import Frozen, ModelCard, ShardSpec, Strategy

PlacementErrorKind = Literal[
    "no_nodes",
    "duplicate_nodes",
    "no_layers",
    "too_many_nodes",
    "tensor_unsupported",
    "heads_indivisible",
    "memory",
]


class PlacementNode(Protocol):
    """What placement reads of a node; `NodeStats` is one."""

    @property
    def node_id(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def memory_available_bytes(self) -> int: ...


class PlacedShard(Frozen):
    """One node's part: the shard it runs as its rank, and the memory that shard needs."""

    node_id: str
    spec: ShardSpec
    bytes_needed: int = Field(ge=0)
    bytes_available: int

    @property
    def fits(self) -> bool:
        return self.bytes_needed <= self.bytes_available

    @property
    def bytes_spare(self) -> int:
        """Available memory left once the shard is loaded (negative when it does not fit)."""
        return self.bytes_available - self.bytes_needed


class Placement(Frozen):
    """A placement that fits: one shard per node, in rank order."""

    strategy: Strategy
    model: str
    context_length: int = Field(ge=1)
    shards: tuple[PlacedShard, ...] = Field(min_length=1)

    @property
    def world_size(self) -> int:
        return len(self.shards)

    @property
    def node_ids(self) -> tuple[str, ...]:
        """Node ids in rank order: the ring order."""
        return tuple(s.node_id for s in self.shards)

    @property
    def num_layers(self) -> int:
        return max(s.spec.end_layer for s in self.shards)

    @property
    def bytes_needed(self) -> int:
        """Bytes over the whole cluster."""
        return sum(s.bytes_needed for s in self.shards)

    def specs_for(self, node_id: str) -> tuple[ShardSpec, ...]:
        """The shards `node_id` runs, in rank order (one, unless it was chosen more than once)."""
        return tuple(s.spec for s in self.shards if s.node_id == node_id)

    def describe(self) -> str:
        """One line per shard, for logs and the headless CLI."""
        return "\n".join(
            f"rank {s.spec.rank} {s.node_id}: layers {s.spec.start_layer}-{s.spec.end_layer - 1} "
            f"({s.spec.num_layers}), needs {format_bytes(s.bytes_needed)} "
            f"of {format_bytes(s.bytes_available)}"
            for s in self.shards
        )


class Shortfall(Frozen):
    """A node that lacks memory for its shard."""

    node_id: str
    name: str
    bytes_needed: int
    bytes_available: int

    @property
    def short_by(self) -> int:
        return self.bytes_needed - self.bytes_available

    def describe(self) -> str:
        return (
            f"node {self.name} needs {format_bytes(self.bytes_needed)}, has "
            f"{format_bytes(self.bytes_available)} available: short by "
            f"{format_bytes(self.short_by)}"
        )


class PlacementError(Frozen):
    """Why a model cannot be placed: a human message, and per-node shortfalls for memory.

    For ``kind == "memory"`` ``shards`` is the layout that was tried, so a preview can still show
    which layers would go where.
    """

    strategy: Strategy
    model: str
    kind: PlacementErrorKind
    message: str
    shortfalls: tuple[Shortfall, ...] = ()
    shards: tuple[PlacedShard, ...] = ()

    def __str__(self) -> str:
        return self.message


# Estimates from the card.


def weight_bytes_per_param(card: ModelCard) -> float:
    """Bytes per weight as stored: quantized bits and the groups' scales (and biases)."""
    if card.quantization is not None:
        return card.quantization.bits_per_weight / 8
    match card.dtype:
        case "float32":
            return 4
        case "float64":
            return 8
        case str(d) if d.startswith(("float8", "int8", "uint8")):
            return 1
        case _:
            return 2


def non_layer_bytes(card: ModelCard) -> int:
    """Embeddings, final norm and head: what the card's layers leave of the model, or else one
    vocab x hidden matrix; never more than the model."""
    if card.bytes_in_layers is not None:
        return max(0, card.bytes_on_disk - card.bytes_in_layers)
    estimate = int(card.vocab_size * card.hidden_size * weight_bytes_per_param(card))
    return max(0, min(card.bytes_on_disk, estimate))


def layer_weight_bytes(card: ModelCard, layers: int) -> int:
    """The weights of ``layers`` of the model's layers."""
    if card.num_layers <= 0:
        return 0
    return (card.bytes_on_disk - non_layer_bytes(card)) * layers // card.num_layers


def effective_context(card: ModelCard, context_length: int) -> int:
    """KV headroom is never reserved beyond what the model can attend to."""
    if card.context_length is not None and card.context_length > 0:
        return min(context_length, card.context_length)
    return context_length


def kv_cache_bytes(card: ModelCard, layers: int, context_length: int, kv_heads: int) -> int:
    return kv_bytes_per_position(card, layers, kv_heads) * effective_context(card, context_length)


def pipeline_shard_bytes(card: ModelCard, layers: int, context_length: int) -> int:
    return (
        non_layer_bytes(card)
        + layer_weight_bytes(card, layers)
        + kv_cache_bytes(card, layers, context_length, card.num_kv_heads)
    )


def tensor_shard_bytes(card: ModelCard, world_size: int, context_length: int) -> int:
    return (
        non_layer_bytes(card)
        + layer_weight_bytes(card, card.num_layers) // world_size
        + kv_cache_bytes(card, card.num_layers, context_length, card.num_kv_heads // world_size)
    )


# Placement.


def place(
    nodes: Sequence[PlacementNode],
    card: ModelCard,
    strategy: Strategy,
    *,
    context_length: int = 4096,
) -> Placement | PlacementError:
    """Place ``card`` over ``nodes`` (in ring order; pass a subset to use only those)."""
    if context_length < 1:
        raise ValueError(f"context_length must be at least 1, got {context_length}")

    def error(kind: PlacementErrorKind, message: str) -> PlacementError:
        return PlacementError(strategy=strategy, model=card.name, kind=kind, message=message)

    if not nodes:
        return error("no_nodes", "No nodes to place the model on: choose at least one node.")
    ids = [n.node_id for n in nodes]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        return error("duplicate_nodes", f"Node chosen more than once: {', '.join(duplicates)}.")
    if card.num_layers < 1:
        return error("no_layers", f"{card.name} has no transformer layers to place.")

    if strategy == "pipeline":
        if len(nodes) > card.num_layers:
            return error(
                "too_many_nodes",
                f"{card.name} has {card.num_layers} layers, too few for {len(nodes)} nodes: "
                f"choose at most {card.num_layers} nodes.",
            )
        counts = _pipeline_counts(nodes, card, context_length)
        shards: list[PlacedShard] = []
        start = 0
        for rank, (node, count) in enumerate(zip(nodes, counts, strict=True)):
            spec = ShardSpec(
                strategy="pipeline",
                start_layer=start,
                end_layer=start + count,
                rank=rank,
                world_size=len(nodes),
            )
            shards.append(
                PlacedShard(
                    node_id=node.node_id,
                    spec=spec,
                    bytes_needed=pipeline_shard_bytes(card, count, context_length),
                    bytes_available=node.memory_available_bytes,
                )
            )
            start += count
    else:
        problem = _tensor_problem(card, len(nodes))
        if problem is not None:
            kind, message = problem
            return error(kind, message)
        needed = tensor_shard_bytes(card, len(nodes), context_length)
        shards = [
            PlacedShard(
                node_id=node.node_id,
                spec=ShardSpec(
                    strategy="tensor",
                    start_layer=0,
                    end_layer=card.num_layers,
                    rank=rank,
                    world_size=len(nodes),
                ),
                bytes_needed=needed,
                bytes_available=node.memory_available_bytes,
            )
            for rank, node in enumerate(nodes)
        ]

    context = effective_context(card, context_length)
    shortfalls = tuple(
        Shortfall(
            node_id=node.node_id,
            name=node.name,
            bytes_needed=shard.bytes_needed,
            bytes_available=shard.bytes_available,
        )
        for node, shard in zip(nodes, shards, strict=True)
        if not shard.fits
    )
    if shortfalls:
        over = f"over {len(nodes)} nodes" if len(nodes) > 1 else "on one node"
        return PlacementError(
            strategy=strategy,
            model=card.name,
            kind="memory",
            message=f"{card.name} does not fit ({strategy} {over}, {context} tokens of context): "
            + "; ".join(s.describe() for s in shortfalls)
            + ".",
            shortfalls=shortfalls,
            shards=tuple(shards),
        )
    return Placement(
        strategy=strategy, model=card.name, context_length=context, shards=tuple(shards)
    )


def _tensor_problem(card: ModelCard, world_size: int) -> tuple[PlacementErrorKind, str] | None:
    if not card.supports_tensor:
        why = card.tensor_unsupported_reason or (
            f"the {card.model_type} architecture does not support tensor sharding"
        )
        return "tensor_unsupported", f"{card.name} cannot be split by tensor: {why}."
    heads, kv_heads = card.num_attention_heads, card.num_kv_heads
    if heads % world_size or kv_heads % world_size:
        fitting = [
            n for n in range(1, min(heads, kv_heads) + 1) if not heads % n and not kv_heads % n
        ]
        return (
            "heads_indivisible",
            f"Tensor sharding over {world_size} nodes needs {world_size} to divide both the "
            f"attention heads ({heads}) and the KV heads ({kv_heads}) of {card.name}; "
            f"use {_or_list(fitting)} nodes.",
        )
    return None


def _or_list(numbers: list[int]) -> str:
    words = [str(n) for n in numbers]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def _pipeline_counts(
    nodes: Sequence[PlacementNode], card: ModelCard, context_length: int
) -> list[int]:
    """Layers per node: largest-remainder shares of usable memory, at least one each."""
    total_layers = card.num_layers
    available = [max(0, n.memory_available_bytes) for n in nodes]
    fixed = non_layer_bytes(card)
    weights = [max(0, a - fixed) for a in available]
    if sum(weights) == 0:
        weights = available
    if sum(weights) == 0:
        weights = [1] * len(nodes)
    total_weight = sum(weights)

    counts = [total_layers * w // total_weight for w in weights]
    remainders = [total_layers * w % total_weight for w in weights]
    # Ties go to the node with more memory, then to the earlier rank, so shares stay monotone.
    by_claim = sorted(range(len(nodes)), key=lambda i: (-remainders[i], -available[i], i))
    for i in by_claim[: total_layers - sum(counts)]:
        counts[i] += 1

    for i in range(len(nodes)):
        if counts[i] == 0:
            # Take from the node with the most layers; among equals, the one with least memory.
            donor = max(range(len(nodes)), key=lambda j: (counts[j], -available[j], -j))
            counts[donor] -= 1
            counts[i] = 1
    return counts


def fit(
    nodes: Sequence[PlacementNode], card: ModelCard, *, context_length: int = 4096
) -> tuple[bool, str]:
    """Whether `card` fits `nodes` (pipeline first, else tensor), and a note saying how or why
    not: "fits (pipeline)", or the pipeline placement's reason."""
    result = place(nodes, card, "pipeline", context_length=context_length)
    if isinstance(result, PlacementError) and card.supports_tensor:
        tensor = place(nodes, card, "tensor", context_length=context_length)
        result = tensor if isinstance(tensor, Placement) else result
    if isinstance(result, Placement):
        return True, f"fits ({result.strategy})"
    return False, result.message
