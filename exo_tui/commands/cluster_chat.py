"""`exo-tui chat --cluster`: find the nodes, place the model across them, load, chat, stop
(`exo-tui serve --cluster` places and loads the same way, then serves).

This process is a node too (it holds a rank when the placement gives it one). Load events name
the node they come from; the answer and tool calls are the same JSON Lines as a local chat.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import anyio.to_thread

from engine.errors import EngineError
from engine.types import ChatRequest, ModelCard, ModelReady
from exo_tui.chat.backend import ClusterBackend
from exo_tui.chat.turn import chat_turn
from exo_tui.cluster.control.coordinator import plan_fetches
from exo_tui.cluster.control.placement import Placement, place
from exo_tui.cluster.control.state import (
    ClusterEvent,
    ClusterState,
    DownloadProgressed,
    InstancePlaced,
    LoadProgressed,
    NodeSeen,
    NodeStats,
    apply,
)
from exo_tui.cluster.errors import ClusterError
from exo_tui.cluster.node import ClusterSetup, machine_node
from exo_tui.commands.printing import JsonLines, TextOutput, print_turn
from exo_tui.hub.errors import HubError

if TYPE_CHECKING:
    from exo_tui.chat.tools import ToolRegistry


def choose(state: ClusterState, wanted: str | None) -> tuple[NodeStats, ...]:
    """The online nodes named in `wanted` (ids or names, comma separated, in ring order)."""
    if not wanted:
        return tuple(n.stats for n in state.online_nodes)
    chosen: list[NodeStats] = []
    for name in (w.strip() for w in wanted.split(",") if w.strip()):
        node = next((n for n in state.online_nodes if name in (n.node_id, n.name)), None)
        if node is None:
            seen = ", ".join(f"{n.name} ({n.node_id})" for n in state.online_nodes) or "none"
            raise EngineError(
                f"node {name} was not found in the cluster (online: {seen})",
                "Start `exo-tui node` there, pass --peer HOST:PORT, or wait longer with --discover",
            )
        chosen.append(node.stats)
    return tuple(chosen)


def discover_nodes(
    setup: ClusterSetup, models_dirs: list[Path] | None, seconds: float
) -> list[NodeStats]:
    """The nodes of the cluster (this one first) found within `seconds`."""
    return anyio.run(_discover, setup, models_dirs, seconds)


async def _discover(
    setup: ClusterSetup, models_dirs: list[Path] | None, seconds: float
) -> list[NodeStats]:
    state = ClusterState()

    def on_event(event: ClusterEvent) -> None:
        nonlocal state
        state = apply(state, event)

    node = machine_node(setup, models_dirs, on_event)
    async with anyio.create_task_group() as tasks:
        await tasks.start(node.run)
        on_event(NodeSeen(stats=node.stats(), at=time.time()))
        await anyio.sleep(seconds)
        tasks.cancel_scope.cancel()
    return [n.stats for n in state.online_nodes]


def run_chat_on_cluster(
    args: argparse.Namespace,
    setup: ClusterSetup,
    card: ModelCard,
    request: ChatRequest,
    registry: ToolRegistry,
    out: JsonLines | TextOutput,
) -> int:
    async def chat(backend: ClusterBackend) -> int:
        def turn() -> int:
            return print_turn(chat_turn(backend, request, registry), out)

        return await anyio.to_thread.run_sync(turn)

    return run_on_cluster(args, setup, card, out, chat)


def run_on_cluster(
    args: argparse.Namespace,
    setup: ClusterSetup,
    card: ModelCard,
    out: JsonLines | TextOutput,
    use: Callable[[ClusterBackend], Awaitable[int]],
) -> int:
    """Place `card` across the cluster, load it, `use` it (a chat turn, the API server), stop
    it on every node; `use`'s exit code."""
    try:
        return anyio.run(_on_cluster, args, setup, card, out, use)
    except BaseExceptionGroup as group:  # the task group wraps what went wrong
        from exo_tui.commands.node import listen_error

        raise _first_user_error(group) or listen_error(group, setup.options) or group from None


def _first_user_error(
    group: BaseExceptionGroup[BaseException],
) -> EngineError | ClusterError | HubError | None:
    for error in group.exceptions:
        if isinstance(error, EngineError | ClusterError | HubError):
            return error
        if isinstance(error, BaseExceptionGroup):
            found = _first_user_error(error)  # pyright: ignore[reportUnknownArgumentType]
            if found is not None:
                return found
    return None


async def _on_cluster(
    args: argparse.Namespace,
    setup: ClusterSetup,
    card: ModelCard,
    out: JsonLines | TextOutput,
    use: Callable[[ClusterBackend], Awaitable[int]],
) -> int:
    state = ClusterState()
    names: dict[str, str] = {}

    def on_event(event: ClusterEvent) -> None:
        nonlocal state
        state = apply(state, event)
        name = names.get(getattr(event, "node_id", ""), "")
        if isinstance(event, LoadProgressed):
            out.node_progress(event.node_id, name or event.node_id, event.layers_loaded,
                              event.total)  # fmt: skip
        elif isinstance(event, DownloadProgressed):
            out.node_download(event, name or event.node_id)

    node = machine_node(setup, args.models_dir, on_event)
    me = node.stats()
    code = 1
    async with anyio.create_task_group() as tasks:
        await tasks.start(node.run)
        on_event(NodeSeen(stats=me, at=time.time()))  # this node takes part too
        await anyio.sleep(args.discover)
        names.update({n.node_id: n.name for n in state.nodes})
        placement = place(choose(state, args.nodes), card, args.strategy)
        if not isinstance(placement, Placement):
            raise EngineError(
                placement.message, "Choose other nodes with --nodes, or a smaller model"
            )
        fetches = plan_fetches(placement, card, [n.stats for n in state.nodes])
        on_event(InstancePlaced(placement=placement))
        started = time.perf_counter()
        await node.coordinator.launch(placement, card, fetches=fetches)
        out.loaded(ModelReady(model=card.name, load_seconds=time.perf_counter() - started,
                              blas=f"cluster of {placement.world_size} nodes"))  # fmt: skip

        backend = ClusterBackend(node.coordinator, card, asyncio.get_running_loop())
        try:
            code = await use(backend)
        finally:
            with anyio.CancelScope(shield=True):
                await node.coordinator.stop()
        tasks.cancel_scope.cancel()
    return code
