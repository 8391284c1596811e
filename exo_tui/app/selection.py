"""What the user chose to run: the model, the strategy and the nodes; and where it would go."""

from __future__ import annotations

from engine.types import ModelCard, Strategy
from exo_tui.cluster.control.placement import Placement, PlacementError, fit, place
from exo_tui.cluster.control.state import ClusterState, NodeStats

CONTEXT_LENGTH = 4096


def candidates(state: ClusterState, chosen: tuple[str, ...] | None) -> tuple[NodeStats, ...]:
    """Stats of the nodes to place on, in ring order: the `chosen` ones that are online, in the
    order first chosen, or every online node when none were chosen."""
    if chosen is None:
        return tuple(n.stats for n in state.online_nodes)
    found = (state.node(i) for i in dict.fromkeys(chosen))
    return tuple(n.stats for n in found if n is not None and n.online)


class Selection:
    """The user's choices (the cluster's facts are in ClusterState) and the placement preview."""

    def __init__(self) -> None:
        self.card: ModelCard | None = None
        self.strategy: Strategy = "pipeline"
        self.chosen_nodes: tuple[str, ...] | None = None
        self.placement: Placement | PlacementError | None = None

    def choose_model(self, card: ModelCard) -> None:
        self.card = card
        if not card.supports_tensor and self.strategy == "tensor":
            self.strategy = "pipeline"

    def candidates(self, state: ClusterState) -> tuple[NodeStats, ...]:
        return candidates(state, self.chosen_nodes)

    def fit(self, state: ClusterState, card: ModelCard) -> tuple[bool, str]:
        """Whether `card` fits the chosen nodes (pipeline, else tensor), and a note saying so."""
        return fit(self.candidates(state), card, context_length=CONTEXT_LENGTH)

    def refresh(self, state: ClusterState) -> None:
        """The placement: the running instance's, else where the chosen model would go."""
        if self.card is None:
            self.placement = None
        elif state.instance is not None:
            self.placement = state.instance.placement
        else:
            self.placement = place(
                self.candidates(state), self.card, self.strategy, context_length=CONTEXT_LENGTH
            )
