"""The cluster reducer: feed events, compare states."""

from __future__ import annotations

from functools import reduce
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from engine.types import ShardSpec
from exo_tui.cluster.control.placement import PlacedShard, Placement, place
from exo_tui.cluster.control.state import (
    FOREIGN_LISTED,
    ClusterEvent,
    ClusterState,
    ForeignNode,
    ForeignSeen,
    GenerationFinished,
    GenerationStarted,
    Instance,
    InstanceCleared,
    InstancePlaced,
    LoadFailed,
    LoadFinished,
    LoadProgressed,
    LoadStarted,
    NodeLost,
    NodeSeen,
    NodeStats,
    NodeView,
    RunnerFailed,
    RunnerGenerating,
    RunnerIdle,
    RunnerLoading,
    RunnerReady,
    StatsUpdated,
    Unloaded,
    apply,
)
from tests.cards import tiny_card

GB = 1_000_000_000
EMPTY = ClusterState()


def stats(node_id: str, available: int = 8 * GB, **overrides: Any) -> NodeStats:
    fields: dict[str, Any] = {
        "node_id": node_id,
        "name": f"host-{node_id}",
        "backend": "cpu",
        "blas": "openblas",
        "memory_total_bytes": 16 * GB,
        "memory_available_bytes": available,
        "models": ("tiny",),
    }
    fields.update(overrides)
    return NodeStats(**fields)


def two_node_placement() -> Placement:
    return Placement(
        strategy="pipeline",
        model="tiny",
        context_length=4096,
        shards=(
            PlacedShard(
                node_id="a",
                spec=ShardSpec(strategy="pipeline", start_layer=0, end_layer=2, world_size=2),
                bytes_needed=1,
                bytes_available=GB,
            ),
            PlacedShard(
                node_id="b",
                spec=ShardSpec(
                    strategy="pipeline", start_layer=2, end_layer=4, rank=1, world_size=2
                ),
                bytes_needed=1,
                bytes_available=GB,
            ),
        ),
    )


def cluster(*ids: str) -> ClusterState:
    return reduce(apply, [NodeSeen(stats=stats(i), at=1.0) for i in ids], EMPTY)


def runner(state: ClusterState, node_id: str) -> object:
    view = state.node(node_id)
    assert view is not None
    return view.runner


def test_nodes_appear_in_the_order_seen() -> None:
    state = cluster("b", "a")
    assert [n.node_id for n in state.nodes] == ["b", "a"]
    assert state.nodes[0] == NodeView(
        stats=stats("b"), runner=RunnerIdle(), online=True, last_seen=1.0
    )
    assert ClusterState() == EMPTY  # apply never mutates


def test_stats_update_memory_and_last_seen_and_keep_the_runner() -> None:
    state = reduce(
        apply,
        [
            LoadStarted(node_id="a", model="tiny", total=4),
            StatsUpdated(stats=stats("a", available=3 * GB), at=5.0),
        ],
        cluster("a"),
    )
    view = state.node("a")
    assert view is not None
    assert view.stats.memory_available_bytes == 3 * GB
    assert view.stats.memory_used_bytes == 13 * GB
    assert view.last_seen == 5.0
    assert view.runner == RunnerLoading(model="tiny", layers_loaded=0, layers_total=4)


def test_stats_from_an_unknown_node_add_it() -> None:
    state = apply(EMPTY, StatsUpdated(stats=stats("x"), at=2.0))
    assert state.node("x") is not None


def test_a_full_load_generate_unload_cycle() -> None:
    state = apply(cluster("a", "b"), InstancePlaced(placement=two_node_placement()))
    assert state.instance_status == "placed"
    state = reduce(apply, [LoadStarted(node_id=i, model="tiny", total=2) for i in "ab"], state)
    assert state.instance_status == "loading"
    state = apply(state, LoadProgressed(node_id="a", layers_loaded=1, total=2))
    assert runner(state, "a") == RunnerLoading(model="tiny", layers_loaded=1, layers_total=2)
    state = reduce(apply, [LoadFinished(node_id=i, model="tiny", total=2) for i in "ab"], state)
    assert runner(state, "a") == RunnerReady(model="tiny", layers_total=2)
    assert state.instance_status == "ready"
    state = apply(state, GenerationStarted(node_id="a"))
    assert runner(state, "a") == RunnerGenerating(model="tiny", layers_total=2)
    assert state.instance_status == "generating"
    state = apply(state, GenerationFinished(node_id="a"))
    assert state.instance_status == "ready"
    state = apply(state, Unloaded(node_id="a"))
    assert runner(state, "a") == RunnerIdle()
    assert state.instance_status == "loading"  # half unloaded
    state = apply(state, Unloaded(node_id="b"))
    assert state.instance is None


def test_progress_is_clamped_and_ignored_when_not_loading() -> None:
    state = reduce(
        apply,
        [
            LoadProgressed(node_id="a", layers_loaded=1, total=4),  # not loading: stale
        ],
        cluster("a"),
    )
    assert runner(state, "a") == RunnerIdle()
    state = reduce(
        apply,
        [
            LoadStarted(node_id="a", model="tiny", total=4),
            LoadProgressed(node_id="a", layers_loaded=9, total=4),
        ],
        state,
    )
    assert runner(state, "a") == RunnerLoading(model="tiny", layers_loaded=4, layers_total=4)


def test_load_failure_fails_the_runner_and_the_instance_with_the_reason() -> None:
    state = reduce(
        apply,
        [
            InstancePlaced(placement=two_node_placement()),
            LoadStarted(node_id="a", model="tiny", total=2),
            LoadFailed(node_id="a", reason="out of memory"),
            LoadProgressed(node_id="a", layers_loaded=1, total=2),  # late: ignored
            LoadFinished(node_id="a", model="tiny", total=2),  # late: ignored
        ],
        cluster("a", "b"),
    )
    assert runner(state, "a") == RunnerFailed(reason="out of memory", model="tiny")
    assert state.instance is not None
    assert state.instance.failed_reason == "node host-a: out of memory"
    assert state.instance_status == "failed"
    # The failure stays while the other ranks are stopped, until placed again or cleared.
    state = reduce(apply, [Unloaded(node_id="a"), Unloaded(node_id="b")], state)
    assert state.instance_status == "failed"
    assert apply(state, InstanceCleared()).instance is None
    again = apply(state, InstancePlaced(placement=two_node_placement()))
    assert again.instance == Instance(placement=two_node_placement())


def test_losing_a_node_fails_its_runner_and_the_instance_and_ignores_it_after() -> None:
    state = reduce(
        apply,
        [
            InstancePlaced(placement=two_node_placement()),
            LoadStarted(node_id="b", model="tiny", total=2),
            NodeLost(node_id="b"),
            LoadProgressed(node_id="b", layers_loaded=1, total=2),
        ],
        cluster("a", "b"),
    )
    b = state.node("b")
    assert b is not None and not b.online
    assert b.runner == RunnerFailed(reason="node host-b stopped answering", model="tiny")
    assert state.instance is not None
    assert state.instance.failed_reason == "node host-b stopped answering"
    assert [n.node_id for n in state.online_nodes] == ["a"]
    assert apply(state, NodeLost(node_id="b")) == state


def test_placing_on_an_offline_node_fails_the_instance_at_once() -> None:
    state = reduce(
        apply,
        [NodeLost(node_id="b"), InstancePlaced(placement=two_node_placement())],
        cluster("a", "b"),
    )
    assert state.instance is not None
    assert state.instance.failed_reason == "node host-b is offline"
    assert state.instance_status == "failed"


def test_a_node_that_comes_back_is_usable_again() -> None:
    state = reduce(
        apply,
        [
            LoadStarted(node_id="a", model="tiny", total=2),
            NodeLost(node_id="a", reason="was killed"),
            NodeSeen(stats=stats("a"), at=9.0),
        ],
        cluster("a"),
    )
    view = state.node("a")
    assert view is not None
    assert view.online and view.runner == RunnerIdle() and view.last_seen == 9.0


def test_idle_node_lost_keeps_an_idle_runner() -> None:
    state = apply(cluster("a"), NodeLost(node_id="a"))
    assert runner(state, "a") == RunnerIdle()


def test_events_for_unknown_nodes_change_nothing() -> None:
    state = cluster("a")
    for event in (
        NodeLost(node_id="zz"),
        LoadStarted(node_id="zz", model="m", total=1),
        LoadProgressed(node_id="zz", layers_loaded=1, total=1),
        LoadFinished(node_id="zz", model="m", total=1),
        LoadFailed(node_id="zz", reason="x"),
        GenerationStarted(node_id="zz"),
        GenerationFinished(node_id="zz"),
        Unloaded(node_id="zz"),
    ):
        assert apply(state, event) == state


def test_generation_events_only_move_ready_and_generating_runners() -> None:
    state = apply(cluster("a"), GenerationStarted(node_id="a"))
    assert runner(state, "a") == RunnerIdle()
    state = apply(state, GenerationFinished(node_id="a"))
    assert runner(state, "a") == RunnerIdle()


def test_online_nodes_feed_placement() -> None:
    card = tiny_card()
    state = cluster("a", "b")
    result = place(tuple(n.stats for n in state.online_nodes), card, "pipeline")
    assert isinstance(result, Placement)
    state = apply(state, InstancePlaced(placement=result))
    assert state.instance_status == "placed"


def test_stats_refresh_when_a_node_was_seen_and_a_lost_node_goes_offline() -> None:
    state = reduce(
        apply, [StatsUpdated(stats=stats("b"), at=10.0), NodeLost(node_id="a")], cluster("a", "b")
    )
    a, b = state.node("a"), state.node("b")
    assert a is not None and not a.online and a.last_seen == 1.0
    assert b is not None and b.online and b.last_seen == 10.0


def test_invalid_states_are_refused() -> None:
    with pytest.raises(ValidationError):
        RunnerLoading(model="m", layers_loaded=3, layers_total=2)
    with pytest.raises(ValidationError):
        RunnerFailed(reason="")
    with pytest.raises(ValidationError):
        LoadFailed(node_id="a", reason="")
    view = NodeView(stats=stats("a"), last_seen=0.0)
    with pytest.raises(ValidationError):
        ClusterState(nodes=(view, view))


EVENTS: TypeAdapter[ClusterEvent] = TypeAdapter(ClusterEvent)


def test_events_round_trip_through_the_union() -> None:
    for event in (
        NodeSeen(stats=stats("a"), at=1.0),
        LoadProgressed(node_id="a", layers_loaded=1, total=2),
        InstancePlaced(placement=two_node_placement()),
        InstanceCleared(),
    ):
        assert EVENTS.validate_json(EVENTS.dump_json(event)) == event
    with pytest.raises(ValidationError):
        EVENTS.validate_python({"type": "nope"})


# Any sequence of events.

ids = st.sampled_from(["a", "b", "c", "d"])
counts = st.integers(0, 8)
texts = st.text(min_size=1, max_size=8)
times = st.floats(0, 1e6, allow_nan=False)
node_stats = st.builds(lambda i, a: stats(i, available=a), ids, st.integers(0, 16 * GB))
placements = st.lists(ids, min_size=1, max_size=4, unique=True).map(
    lambda chosen: Placement(
        strategy="pipeline",
        model="tiny",
        context_length=1024,
        shards=tuple(
            PlacedShard(
                node_id=i,
                spec=ShardSpec(
                    strategy="pipeline",
                    start_layer=r,
                    end_layer=r + 1,
                    rank=r,
                    world_size=len(chosen),
                ),
                bytes_needed=1,
                bytes_available=GB,
            )
            for r, i in enumerate(chosen)
        ),
    )
)
events: st.SearchStrategy[ClusterEvent] = st.one_of(
    st.builds(NodeSeen, stats=node_stats, at=times),
    st.builds(NodeLost, node_id=ids, reason=texts),
    st.builds(StatsUpdated, stats=node_stats, at=times),
    st.builds(LoadStarted, node_id=ids, model=texts, total=counts),
    st.builds(LoadProgressed, node_id=ids, layers_loaded=counts, total=counts),
    st.builds(LoadFinished, node_id=ids, model=texts, total=counts),
    st.builds(LoadFailed, node_id=ids, reason=texts),
    st.builds(GenerationStarted, node_id=ids),
    st.builds(GenerationFinished, node_id=ids),
    st.builds(Unloaded, node_id=ids),
    st.builds(InstancePlaced, placement=placements),
    st.just(InstanceCleared()),
    st.builds(
        ForeignSeen,
        foreign=st.builds(
            ForeignNode, name=ids.map(lambda i: f"host-{i}"), address=texts, reason=texts
        ),
    ),  # fmt: skip
)


@settings(max_examples=400, deadline=None)
@given(st.lists(events, max_size=40))
def test_any_sequence_of_events_keeps_the_invariants(sequence: list[ClusterEvent]) -> None:
    state = EMPTY
    for event in sequence:
        before = state
        state = apply(state, event)
        assert ClusterState.model_validate(state.model_dump()) == state
        node_ids = [n.node_id for n in state.nodes]
        assert len(node_ids) == len(set(node_ids))
        # Nodes are never forgotten, and keep their order.
        assert node_ids[: len(before.nodes)] == [n.node_id for n in before.nodes]
        for view in state.nodes:
            r = view.runner
            if isinstance(r, RunnerLoading):
                assert 0 <= r.layers_loaded <= r.layers_total
            if isinstance(r, RunnerFailed):
                assert r.reason
            if not view.online:
                assert isinstance(r, RunnerIdle | RunnerFailed)
        if state.instance is not None and state.instance.failed_reason is None:
            for node_id in state.instance.placement.node_ids:
                view = state.node(node_id)
                assert view is None or view.online
        if state.instance_status == "failed":
            assert state.instance is not None


def test_foreign_peers_are_listed_once_each_and_cleared_when_they_join() -> None:
    refused = ForeignNode(name="host-x", address="10.0.0.9:52525", fingerprint="ab", reason="key")
    state = reduce(
        apply, [ForeignSeen(foreign=refused), ForeignSeen(foreign=refused)], cluster("a")
    )
    assert state.foreign == (refused.model_copy(update={"count": 2}),)
    assert [n.node_id for n in state.online_nodes] == ["a"]  # never a node, never placed on
    state = apply(state, NodeSeen(stats=stats("x"), at=2.0))  # given the key, it joins
    assert state.foreign == ()


def test_an_address_claiming_a_new_name_each_time_is_one_entry_with_a_count() -> None:
    fakes = [
        ForeignNode(name=f"fake-{n}", address=f"10.0.0.66:{40000 + n}", reason=f"version {n}")
        for n in range(300)
    ]
    state = reduce(apply, [ForeignSeen(foreign=f) for f in fakes], cluster("a"))
    (entry,) = state.foreign
    assert (entry.count, entry.name, entry.host) == (300, "fake-299", "10.0.0.66")


def test_a_flood_from_many_addresses_keeps_only_the_latest_listed() -> None:
    fakes = [ForeignNode(name="fake", address=f"10.1.{n // 250}.{n % 250}:1", reason="key")
             for n in range(1000)]  # fmt: skip
    state = reduce(apply, [ForeignSeen(foreign=f) for f in fakes], cluster("a"))
    assert len(state.foreign) == FOREIGN_LISTED
    assert state.foreign[-1].host == fakes[-1].host
