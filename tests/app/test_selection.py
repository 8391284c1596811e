"""The user's selection: the nodes to place on, from the cluster's facts and the user's choice."""

from __future__ import annotations

from functools import reduce

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.types import ModelCard
from exo_tui.app.selection import Selection, candidates
from exo_tui.cluster.control.placement import Placement
from exo_tui.cluster.control.state import NodeLost, apply
from tests import cards
from tests.cluster.test_state import cluster, stats


def tiny_card(supports_tensor: bool = True) -> ModelCard:
    return cards.tiny_card(supports_tensor=supports_tensor)


def test_candidates_are_the_chosen_online_nodes_in_the_order_chosen() -> None:
    state = apply(cluster("a", "b", "c"), NodeLost(node_id="b"))
    assert [s.node_id for s in candidates(state, None)] == ["a", "c"]
    chosen = ("c", "b", "zz", "a", "c")
    assert [s.node_id for s in candidates(state, chosen)] == ["c", "a"]  # online only
    assert candidates(state, None) == (stats("a"), stats("c"))


def test_a_model_without_tensor_support_goes_back_to_pipeline() -> None:
    selection = Selection()
    selection.strategy = "tensor"
    selection.choose_model(tiny_card(supports_tensor=False))
    assert selection.strategy == "pipeline"
    selection.strategy = "tensor"
    selection.choose_model(tiny_card(supports_tensor=True))
    assert selection.strategy == "tensor"


def test_the_placement_preview_follows_the_chosen_nodes() -> None:
    state = cluster("a", "b")
    selection = Selection()
    selection.refresh(state)
    assert selection.placement is None  # no model yet
    selection.choose_model(tiny_card())
    selection.chosen_nodes = ("b",)
    selection.refresh(state)
    assert isinstance(selection.placement, Placement)
    assert selection.placement.node_ids == ("b",)


ids = st.sampled_from(["a", "b", "c", "d"])


@settings(max_examples=200, deadline=None)
@given(st.lists(ids, max_size=3, unique=True), st.none() | st.lists(ids, max_size=6).map(tuple))
def test_candidates_are_online_and_unique(lost: list[str], chosen: tuple[str, ...] | None) -> None:
    state = reduce(apply, [NodeLost(node_id=i) for i in lost], cluster("a", "b", "c"))
    found = [c.node_id for c in candidates(state, chosen)]
    online = {n.node_id for n in state.online_nodes}
    assert set(found) <= online
    assert len(found) == len(set(found))
