"""This machine as a node: live stats, and the cluster summary `cluster_status` returns."""

from __future__ import annotations

import platform
import socket
from collections.abc import Sequence
from typing import Any

import psutil

from engine import blas, kernels
from engine.types import ModelCard
from exo_tui.cluster.control.state import Backend, ClusterState, NodeStats
from exo_tui.cluster.identity import NodeIdentity

GB = 1_000_000_000  # decimal, as every other figure of memory is shown


def local_backend() -> Backend:
    return "metal" if platform.system() == "Darwin" else "cpu"


def local_node_id() -> str:
    # Persistent, unique node ids belong to a node of a cluster; a lone node needs only its name.
    return f"local-{socket.gethostname()}"


def local_node_stats(
    models: Sequence[str] = (),
    identity: NodeIdentity | None = None,
    cards: Sequence[ModelCard] = (),
) -> NodeStats:
    """This machine's stats now, under its persistent identity when it has one."""
    memory = psutil.virtual_memory()
    return NodeStats(
        node_id=identity.node_id if identity else local_node_id(),
        name=identity.name if identity else socket.gethostname(),
        backend=local_backend(),
        blas=blas.describe(),
        kernels=kernels.describe(),
        memory_total_bytes=int(memory.total),
        memory_available_bytes=int(memory.available),
        models=tuple(models) or tuple(card.name for card in cards),
        cards=tuple(cards),
    )


def cluster_summary(state: ClusterState, model: str | None) -> dict[str, Any]:
    """Online nodes, their memory and the loaded model: what a `cluster_status` call returns."""
    nodes = state.online_nodes
    total = sum(n.stats.memory_total_bytes for n in nodes)
    available = sum(n.stats.memory_available_bytes for n in nodes)
    return {
        "nodes": [
            {
                "name": n.name,
                "backend": n.stats.backend,
                "blas": n.stats.blas.split(" ", 1)[0],
                "cpu_kernels": n.stats.kernels.split(" ", 1)[0],
                "memory_total_gb": round(n.stats.memory_total_bytes / GB, 1),
                "memory_available_gb": round(n.stats.memory_available_bytes / GB, 1),
            }
            for n in nodes
        ],
        "total_memory_gb": round(total / GB, 1),
        "available_memory_gb": round(available / GB, 1),
        "model": model,
    }
