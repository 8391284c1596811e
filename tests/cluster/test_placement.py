"""Placement: layer ranges, memory fit and the reasons a model cannot be placed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.types import ModelCard, Quantization, ShardSpec
from exo_tui.cluster.control.placement import (
    PlacedShard,
    Placement,
    PlacementError,
    format_bytes,
    kv_cache_bytes,
    layer_weight_bytes,
    non_layer_bytes,
    pipeline_shard_bytes,
    place,
    tensor_shard_bytes,
)

GB = 1_000_000_000


def card(**overrides: Any) -> ModelCard:
    fields: dict[str, Any] = {
        "name": "tiny",
        "path": "/models/tiny",
        "source": "models_dir",
        "model_type": "llama",
        "num_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_kv_heads": 8,
        "head_dim": 128,
        "vocab_size": 32000,
        "context_length": 8192,
        "quantization": None,
        "dtype": "bfloat16",
        "bytes_on_disk": 16 * GB,
        "num_parameters": 8_000_000_000,
        "supports_tensor": True,
    }
    fields.update(overrides)
    return ModelCard(**fields)


@dataclass(frozen=True)
class Node:
    """Placement reads only these of a node (`Node` has them too; see test_state)."""

    node_id: str
    name: str
    memory_available_bytes: int


def node(node_id: str, available: int, name: str | None = None) -> Node:
    return Node(node_id=node_id, name=name or node_id, memory_available_bytes=available)


def ok(result: Placement | PlacementError) -> Placement:
    assert isinstance(result, Placement), str(result)
    return result


def failed(result: Placement | PlacementError) -> PlacementError:
    assert isinstance(result, PlacementError), result
    return result


# Estimates.


def test_one_node_needs_the_whole_model_plus_kv() -> None:
    c = card()
    kv = 2 * 32 * 8 * 128 * 4096 * 2  # K and V, layers, kv heads, head dim, context, bf16
    shard = ok(place([node("a", 64 * GB)], c, "pipeline")).shards[0]
    assert shard.bytes_needed == c.bytes_on_disk + kv
    assert shard.spec == ShardSpec(strategy="pipeline", start_layer=0, end_layer=32)


def test_kv_bytes_follow_dtype_and_cap_at_the_model_context() -> None:
    c32 = card(dtype="float32", context_length=1024)
    assert kv_cache_bytes(c32, 1, 4096, 8) == 2 * 8 * 128 * 1024 * 4
    assert kv_cache_bytes(card(dtype="float16", context_length=None), 1, 4096, 8) == (
        2 * 8 * 128 * 4096 * 2
    )
    assert ok(place([node("a", 64 * GB)], c32, "pipeline")).context_length == 1024


def test_embeddings_are_counted_on_every_pipeline_shard() -> None:
    c = card()
    embed = 32000 * 4096 * 2
    assert non_layer_bytes(c) == embed
    assert layer_weight_bytes(c, 32) == c.bytes_on_disk - embed
    p = ok(place([node("a", 64 * GB), node("b", 64 * GB)], c, "pipeline"))
    assert [s.spec.num_layers for s in p.shards] == [16, 16]
    for s in p.shards:
        assert s.bytes_needed == pipeline_shard_bytes(c, 16, 4096)
        assert s.bytes_needed > embed + layer_weight_bytes(c, 16)


def test_quantized_embeddings_use_bits_and_group_overhead() -> None:
    c = card(quantization=Quantization(bits=4, group_size=64), bytes_on_disk=5 * GB)
    assert non_layer_bytes(c) == int(32000 * 4096 * (0.5 + 4 / 64))


def test_embedding_estimate_never_exceeds_the_model() -> None:
    c = card(bytes_on_disk=1000)
    assert non_layer_bytes(c) == 1000
    assert layer_weight_bytes(c, 32) == 0


# Pipeline examples.


def test_layers_follow_available_memory_in_ring_order() -> None:
    c = card(bytes_on_disk=8 * GB)
    p = ok(place([node("small", 8 * GB), node("big", 24 * GB)], c, "pipeline"))
    assert p.node_ids == ("small", "big")
    small, big = (s.spec for s in p.shards)
    assert (small.rank, small.start_layer, small.end_layer) == (0, 0, small.num_layers)
    assert (big.rank, big.start_layer, big.end_layer) == (1, small.num_layers, 32)
    assert big.num_layers > 2 * small.num_layers
    assert (small.world_size, big.world_size) == (2, 2)
    assert p.specs_for("big") == (big,) and p.specs_for("nope") == ()
    assert p.num_layers == 32 and p.world_size == 2
    assert p.bytes_needed == sum(s.bytes_needed for s in p.shards)
    assert "rank 0 small: layers 0-" in p.describe()


def test_more_nodes_than_layers_is_an_error() -> None:
    c = card(num_layers=2)
    e = failed(place([node(str(i), 64 * GB) for i in range(3)], c, "pipeline"))
    assert e.kind == "too_many_nodes"
    assert "at most 2 nodes" in e.message


def test_a_node_without_room_still_gets_one_layer_and_is_reported_short() -> None:
    c = card()
    e = failed(place([node("a", 64 * GB), node("tiny", GB // 2)], c, "pipeline"))
    assert e.kind == "memory"
    assert [s.node_id for s in e.shortfalls] == ["tiny"]
    assert [s.spec.num_layers for s in e.shards] == [31, 1]


def test_short_node_message() -> None:
    c = card(num_layers=1, vocab_size=1, hidden_size=1, bytes_on_disk=3_100_000_000)
    c = c.model_copy(update={"num_kv_heads": 0})  # no KV headroom: weights alone
    e = failed(place([node("n1", 2 * GB, name="studio")], c, "pipeline"))
    (short,) = e.shortfalls
    assert short.describe() == "node studio needs 3.1 GB, has 2.0 GB available: short by 1.1 GB"
    assert short.short_by == 1_100_000_000
    assert "node studio needs 3.1 GB" in e.message
    assert e.message.startswith("tiny does not fit (pipeline on one node")
    assert str(e) == e.message


def test_empty_and_duplicate_node_lists() -> None:
    assert failed(place([], card(), "pipeline")).kind == "no_nodes"
    e = failed(place([node("a", GB), node("a", GB)], card(), "tensor"))
    assert e.kind == "duplicate_nodes" and "a" in e.message


def test_context_length_must_be_positive() -> None:
    with pytest.raises(ValueError):
        place([node("a", GB)], card(), "pipeline", context_length=0)


# Tensor examples.


def test_tensor_gives_every_node_every_layer_and_a_slice_of_the_heads() -> None:
    c = card()
    p = ok(place([node("a", 64 * GB), node("b", 64 * GB)], c, "tensor"))
    assert p.strategy == "tensor"
    assert [s.spec for s in p.shards] == [
        ShardSpec(strategy="tensor", start_layer=0, end_layer=32, rank=r, world_size=2)
        for r in (0, 1)
    ]
    expected = non_layer_bytes(c) + layer_weight_bytes(c, 32) // 2 + kv_cache_bytes(c, 32, 4096, 4)
    assert tensor_shard_bytes(c, 2, 4096) == expected
    assert all(s.bytes_needed == expected for s in p.shards)


def test_tensor_refuses_an_unsupported_architecture_with_its_reason() -> None:
    c = card(supports_tensor=False, tensor_unsupported_reason="mixture of experts is not sharded")
    e = failed(place([node("a", 64 * GB), node("b", 64 * GB)], c, "tensor"))
    assert e.kind == "tensor_unsupported"
    assert "mixture of experts is not sharded" in e.message
    e = failed(
        place([node("a", 64 * GB)], card(supports_tensor=False, model_type="gpt_oss"), "tensor")
    )
    assert "gpt_oss" in e.message


def test_tensor_refuses_head_counts_the_nodes_do_not_divide() -> None:
    nodes = [node(str(i), 64 * GB) for i in range(3)]
    e = failed(place(nodes, card(), "tensor"))
    assert e.kind == "heads_indivisible"
    assert "attention heads (32)" in e.message and "KV heads (8)" in e.message
    assert "use 1, 2, 4 or 8 nodes" in e.message
    # Attention heads divide but KV heads do not.
    e = failed(place(nodes[:2], card(num_attention_heads=6, num_kv_heads=3), "tensor"))
    assert e.kind == "heads_indivisible" and "use 1 or 3 nodes" in e.message


def test_tensor_memory_shortfall_names_each_short_node() -> None:
    c = card()
    e = failed(
        place(
            [node("a", 64 * GB), node("b", 2 * GB), node("c", 3 * GB), node("d", 64 * GB)],
            c,
            "tensor",
        )
    )
    assert e.kind == "memory"
    assert [s.node_id for s in e.shortfalls] == ["b", "c"]
    assert e.message.count("short by") == 2


def test_format_bytes() -> None:
    assert format_bytes(512) == "512 B"
    assert format_bytes(15_000_000) == "15.0 MB"
    assert format_bytes(3_100_000_000) == "3.1 GB"
    assert format_bytes(-2_000) == "-2.0 KB"
    assert format_bytes(2_500_000_000_000) == "2.5 TB"


def test_placements_round_trip_as_json() -> None:
    p = ok(place([node("a", 64 * GB), node("b", 32 * GB)], card(), "pipeline"))
    assert Placement.model_validate_json(p.model_dump_json()) == p
    e = failed(place([node("a", GB)], card(), "pipeline"))
    assert PlacementError.model_validate_json(e.model_dump_json()) == e


# Properties.

cards = st.builds(
    lambda layers, hidden, heads, kv_div, vocab, size, dtype, ctx: card(
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=max(1, heads // kv_div),
        head_dim=max(1, hidden // heads),
        vocab_size=vocab,
        bytes_on_disk=size,
        dtype=dtype,
        context_length=ctx,
    ),
    layers=st.integers(1, 96),
    hidden=st.integers(16, 8192),
    heads=st.sampled_from([1, 2, 4, 6, 8, 12, 16, 32, 64]),
    kv_div=st.sampled_from([1, 2, 4, 8]),
    vocab=st.integers(1, 200_000),
    size=st.integers(1, 200 * GB),
    dtype=st.sampled_from(["float32", "float16", "bfloat16", None]),
    ctx=st.one_of(st.none(), st.integers(1, 131072)),
)

node_lists = st.lists(st.integers(0, 256 * GB), min_size=1, max_size=12).map(
    lambda mems: [node(f"n{i}", m) for i, m in enumerate(mems)]
)
contexts = st.integers(1, 65536)


def check_shards_match_nodes(shards: tuple[PlacedShard, ...], nodes: list[Node]) -> None:
    assert [s.node_id for s in shards] == [n.node_id for n in nodes]
    assert [s.spec.rank for s in shards] == list(range(len(nodes)))
    assert all(s.spec.world_size == len(nodes) for s in shards)
    assert [s.bytes_available for s in shards] == [n.memory_available_bytes for n in nodes]


@settings(max_examples=300, deadline=None)
@given(cards, node_lists, contexts)
def test_pipeline_properties(c: ModelCard, nodes: list[Node], context: int) -> None:
    result = place(nodes, c, "pipeline", context_length=context)
    if len(nodes) > c.num_layers:
        assert isinstance(result, PlacementError) and result.kind == "too_many_nodes"
        return
    shards = result.shards
    check_shards_match_nodes(shards, nodes)
    specs = [s.spec for s in shards]
    # Contiguous, every layer exactly once, at least one layer each.
    assert all(spec.strategy == "pipeline" for spec in specs)
    assert specs[0].start_layer == 0
    assert specs[-1].end_layer == c.num_layers
    for before, after in zip(specs, specs[1:], strict=False):
        assert before.end_layer == after.start_layer
    assert all(spec.num_layers >= 1 for spec in specs)
    assert sum(spec.num_layers for spec in specs) == c.num_layers
    # More available memory never means fewer layers.
    for a in shards:
        for b in shards:
            if a.bytes_available > b.bytes_available:
                assert a.spec.num_layers >= b.spec.num_layers, (a, b)
    # Bytes follow the documented estimate.
    for s in shards:
        assert s.bytes_needed == pipeline_shard_bytes(c, s.spec.num_layers, context)
    if isinstance(result, Placement):
        assert all(s.bytes_needed <= s.bytes_available for s in shards)
    else:
        assert result.kind == "memory"
        short = {s.node_id for s in result.shortfalls}
        assert short == {s.node_id for s in shards if s.bytes_needed > s.bytes_available}
        assert all(sf.short_by > 0 for sf in result.shortfalls)
        assert result.message.count("short by") == len(short)


@settings(max_examples=200, deadline=None)
@given(cards, st.lists(st.integers(0, 256 * GB), min_size=2, max_size=8), contexts)
def test_pipeline_shares_are_roughly_proportional(
    c: ModelCard, mems: list[int], context: int
) -> None:
    """Each node's layer count is within one layer of its share of usable memory, except
    where the at-least-one-layer rule moved layers."""
    nodes = [node(f"n{i}", m) for i, m in enumerate(mems)]
    if len(nodes) > c.num_layers:
        return
    result = place(nodes, c, "pipeline", context_length=context)
    usable = [max(0, m - non_layer_bytes(c)) for m in mems]
    if sum(usable) == 0:
        return
    counts = [s.spec.num_layers for s in result.shards]
    bumped = sum(1 for u in usable if c.num_layers * u < sum(usable))
    for u, n in zip(usable, counts, strict=True):
        share = c.num_layers * u / sum(usable)
        assert share - 1 - bumped <= n <= share + 1 or n == 1


@settings(max_examples=200, deadline=None)
@given(cards, node_lists, contexts)
def test_tensor_properties(c: ModelCard, nodes: list[Node], context: int) -> None:
    result = place(nodes, c, "tensor", context_length=context)
    n = len(nodes)
    if c.num_attention_heads % n or c.num_kv_heads % n:
        assert isinstance(result, PlacementError) and result.kind == "heads_indivisible"
        return
    shards = result.shards
    check_shards_match_nodes(shards, nodes)
    assert all((s.spec.start_layer, s.spec.end_layer) == (0, c.num_layers) for s in shards)
    assert all(s.spec.strategy == "tensor" for s in shards)
    assert len({s.bytes_needed for s in shards}) == 1
    if isinstance(result, Placement):
        assert all(s.fits for s in shards)
    else:
        assert {s.node_id for s in result.shortfalls} == {s.node_id for s in shards if not s.fits}


@settings(max_examples=100, deadline=None)
@given(cards, node_lists)
def test_choosing_a_subset_places_only_those_nodes(c: ModelCard, nodes: list[Node]) -> None:
    subset = nodes[::2]
    result = place(subset, c, "pipeline")
    if isinstance(result, Placement) or result.shards:
        assert [s.node_id for s in result.shards] == [n.node_id for n in subset]
