"""`exo-tui models`: the models on disk, then the catalogue with whether each fits this machine
(or the nodes found on the cluster)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

from engine.types import ModelCard

if TYPE_CHECKING:
    from exo_tui.cluster.control.state import NodeStats
    from exo_tui.cluster.node import ClusterSetup


def card_lines(cards: list[ModelCard]) -> Iterator[str]:
    for card in cards:
        quant = f"{card.quantization.bits}-bit" if card.quantization else (card.dtype or "?")
        tensor = "tensor ok" if card.supports_tensor else "pipeline only"
        yield (
            f"{card.name:<40} {card.source:<10} {card.model_type:<12} {card.num_layers:>3} layers "
            f"{card.bytes_on_disk / 1e6:>9.1f} MB {quant:<8} {tensor}  {card.path}"
            + (f"  ({card.partial_note})" if card.partial_note else "")
        )


def catalogue_lines(cards: list[ModelCard], nodes: list[NodeStats], as_json: bool) -> Iterator[str]:
    """Every catalogue model, with its size, whether it is on disk and whether (and how) it
    fits `nodes` (JSON: `type` catalogue)."""
    from exo_tui.cluster.control.placement import fit
    from exo_tui.hub.catalogue import entry_card, load_catalogue

    paths = {card.name.lower(): card.path for card in cards}
    if not as_json:
        where = "this machine" if len(nodes) == 1 else f"the {len(nodes)} nodes found"
        yield f"\nCatalogue (exo-tui models download REPO); fit on {where}:"
    for entry in load_catalogue():
        path = paths.get(entry.repo.lower())
        fits, note = fit(nodes, entry_card(entry))
        if as_json:
            line = {"type": "catalogue", "name": entry.repo, "path": path,
                    "downloaded": path is not None, "fits": fits, "fit": note,
                    **entry.model_dump()}  # fmt: skip
            yield json.dumps(line)
        else:
            yield (
                f"{entry.repo:<52} {entry.parameters / 1e9:>6.1f}B params "
                f"{entry.bytes / 1e9:>7.1f} GB {entry.bits}-bit  "
                + ("downloaded" if path else "not downloaded")
                + f"  {note}"
            )


def list_models(args: argparse.Namespace, cluster: ClusterSetup | None = None) -> int:
    """The models on disk, then the catalogue with whether each fits this machine (or, with
    `cluster`, the nodes found on it)."""
    from engine.models.finding import find_models_with_errors
    from exo_tui.cluster.this_machine import local_node_stats

    cards, skipped = find_models_with_errors(args.models_dir)
    if cluster is not None:
        from exo_tui.commands.cluster_chat import discover_nodes

        nodes = discover_nodes(cluster, args.models_dir, args.discover)
    else:
        nodes = [local_node_stats(cards=cards)]
    if args.json:
        for card in cards:
            print(card.model_dump_json())
    else:
        for node in nodes:
            print(f"{node.name}: {node.backend}, cpu kernels: {node.kernels}")
        if not cards:
            print("No models found. Pass --models-dir DIR or download one from Hugging Face.")
        for line in card_lines(cards):
            print(line)
    for line in catalogue_lines(cards, nodes, args.json):
        print(line)
    for skip in skipped:
        print(f"exo-tui: skipped {skip.path}: {skip.error}", file=sys.stderr)
    return 0
