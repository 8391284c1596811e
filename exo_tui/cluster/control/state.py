"""Cluster state and the one pure reducer that folds events into it: `apply(state, event)`.

The TUI renders a `ClusterState`; discovery, the control connections and the user's choices
produce `ClusterEvent`s; nothing else changes the state. Rules the reducer keeps:

- A node exists once it has sent stats (`NodeSeen`, or `StatsUpdated` from a node not yet
  known: stats are proof of life). Runner events for a node that is unknown or offline are
  stale and ignored, so a late progress report cannot undo a failure.
- A node that comes back after `NodeLost` starts with an idle runner: its runners were stopped.
- Layer counts are clamped to ``0 <= layers_loaded <= layers_total``; a failure always has a
  reason.
- The instance (the placement being loaded or served) fails, with the first reason, when one of
  its nodes is lost or fails to load; the failure stays until a new placement or
  `InstanceCleared`. Once every node of a healthy instance has unloaded, the instance is gone.
"""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import Field, model_validator

from engine.types import Frozen, ModelCard
from exo_tui.cluster.control.placement import Placement
from exo_tui.hub.progress import DownloadProgress

Backend = Literal["cpu", "metal", "cuda"]


class HostedRunner(Frozen):
    """Ranks a node runs for an instance, as the node itself sees them."""

    instance_id: str
    ranks: tuple[int, ...] = ()
    state: Literal["downloading", "starting", "loading", "ready", "failed"]


class NodeStats(Frozen):
    """What a node reports about itself, every second."""

    node_id: str = Field(min_length=1)
    name: str
    backend: Backend
    blas: str
    kernels: str = "mlx"  # which CPU matmul kernels run (engine.kernels.describe())
    memory_total_bytes: int = Field(ge=0)
    memory_available_bytes: int = Field(ge=0)
    models: tuple[str, ...] = ()
    cards: tuple[ModelCard, ...] = ()  # the models' cards, for placing them from any node
    runners: tuple[HostedRunner, ...] = ()

    @property
    def memory_used_bytes(self) -> int:
        return max(0, self.memory_total_bytes - self.memory_available_bytes)


# Runner states: one discriminated union on `state`.


class RunnerIdle(Frozen):
    state: Literal["idle"] = "idle"


class RunnerLoading(Frozen):
    state: Literal["loading"] = "loading"
    model: str
    layers_loaded: int = Field(default=0, ge=0)
    layers_total: int = Field(ge=0)

    @model_validator(mode="after")
    def _loaded_within_total(self) -> Self:
        if self.layers_loaded > self.layers_total:
            raise ValueError(f"layers_loaded {self.layers_loaded} > total {self.layers_total}")
        return self


class RunnerDownloading(Frozen):
    """The node fetches its share of the model's files from the hub before loading it."""

    state: Literal["downloading"] = "downloading"
    model: str
    progress: DownloadProgress = DownloadProgress()


class RunnerReady(Frozen):
    state: Literal["ready"] = "ready"
    model: str
    layers_total: int = Field(ge=0)


class RunnerGenerating(Frozen):
    state: Literal["generating"] = "generating"
    model: str
    layers_total: int = Field(ge=0)


class RunnerFailed(Frozen):
    state: Literal["failed"] = "failed"
    reason: str = Field(min_length=1)
    model: str | None = None


RunnerState = Annotated[
    RunnerIdle | RunnerDownloading | RunnerLoading | RunnerReady | RunnerGenerating | RunnerFailed,
    Field(discriminator="state"),
]


class NodeView(Frozen):
    """A node as the cluster sees it."""

    stats: NodeStats
    runner: RunnerState = RunnerIdle()
    online: bool = True
    last_seen: float

    @property
    def node_id(self) -> str:
        return self.stats.node_id

    @property
    def name(self) -> str:
        return self.stats.name


class ForeignNode(Frozen):
    """A peer that answered without our cluster key (or in another protocol version): shown,
    never trusted, never placed on."""

    name: str
    address: str
    fingerprint: str = ""
    reason: str = Field(min_length=1)
    count: int = Field(default=1, ge=1)  # refusals of this address so far

    @property
    def host(self) -> str:
        """The address without its port: a peer dials from a new port every time."""
        return self.address.rsplit(":", 1)[0]


InstanceStatus = Literal["placed", "loading", "ready", "generating", "failed"]


class Instance(Frozen):
    """A placed model: the placement, and why it failed if it did."""

    placement: Placement
    failed_reason: str | None = Field(default=None, min_length=1)

    @property
    def model(self) -> str:
        return self.placement.model


class ClusterState(Frozen):
    """Every node (in the order first seen) and the running instance: facts, not choices."""

    nodes: tuple[NodeView, ...] = ()
    instance: Instance | None = None
    foreign: tuple[ForeignNode, ...] = ()

    @model_validator(mode="after")
    def _unique_ids(self) -> Self:
        ids = [n.node_id for n in self.nodes]
        if len(ids) != len(set(ids)):
            raise ValueError(f"node ids must be unique: {ids}")
        return self

    def node(self, node_id: str) -> NodeView | None:
        return next((n for n in self.nodes if n.node_id == node_id), None)

    @property
    def online_nodes(self) -> tuple[NodeView, ...]:
        return tuple(n for n in self.nodes if n.online)

    @property
    def instance_status(self) -> InstanceStatus | None:
        if self.instance is None:
            return None
        if self.instance.failed_reason is not None:
            return "failed"
        runners = [
            n.runner for i in self.instance.placement.node_ids if (n := self.node(i)) is not None
        ]
        states = {r.state for r in runners}
        if states <= {"idle"}:
            return "placed"
        if "failed" in states:
            return "failed"
        if states <= {"ready", "generating"}:
            return "generating" if "generating" in states else "ready"
        return "loading"


# Events: one discriminated union on `type`.


class NodeSeen(Frozen):
    type: Literal["node_seen"] = "node_seen"
    stats: NodeStats
    at: float


class NodeLost(Frozen):
    type: Literal["node_lost"] = "node_lost"
    node_id: str
    reason: str = Field(default="stopped answering", min_length=1)


class StatsUpdated(Frozen):
    type: Literal["stats_updated"] = "stats_updated"
    stats: NodeStats
    at: float


class LoadStarted(Frozen):
    type: Literal["load_started"] = "load_started"
    node_id: str
    model: str
    total: int = Field(ge=0)


class DownloadProgressed(Frozen):
    """More of a node's share of the model's files has landed (the first report starts it)."""

    type: Literal["download_progressed"] = "download_progressed"
    node_id: str
    model: str
    progress: DownloadProgress


class LoadProgressed(Frozen):
    type: Literal["load_progressed"] = "load_progressed"
    node_id: str
    layers_loaded: int = Field(ge=0)
    total: int = Field(ge=0)


class LoadFinished(Frozen):
    type: Literal["load_finished"] = "load_finished"
    node_id: str
    model: str
    total: int = Field(ge=0)


class LoadFailed(Frozen):
    type: Literal["load_failed"] = "load_failed"
    node_id: str
    reason: str = Field(min_length=1)


class GenerationStarted(Frozen):
    type: Literal["generation_started"] = "generation_started"
    node_id: str


class GenerationFinished(Frozen):
    type: Literal["generation_finished"] = "generation_finished"
    node_id: str


class Unloaded(Frozen):
    type: Literal["unloaded"] = "unloaded"
    node_id: str


class InstancePlaced(Frozen):
    """A placement was accepted for launch; it replaces any previous instance."""

    type: Literal["instance_placed"] = "instance_placed"
    placement: Placement


class InstanceCleared(Frozen):
    type: Literal["instance_cleared"] = "instance_cleared"


# The addresses listed as foreign, the most recent first kept: a flood from many addresses
# must not grow the state without end.
FOREIGN_LISTED = 32


class ForeignSeen(Frozen):
    """A peer was refused; it is listed as foreign, once per address with a count (it may claim
    another name at every attempt), showing what it said last."""

    type: Literal["foreign_seen"] = "foreign_seen"
    foreign: ForeignNode


NodeEvent = (
    DownloadProgressed
    | LoadStarted
    | LoadProgressed
    | LoadFinished
    | LoadFailed
    | GenerationStarted
    | GenerationFinished
    | Unloaded
)

ClusterEvent = Annotated[
    NodeSeen | NodeLost | StatsUpdated | NodeEvent | InstancePlaced | InstanceCleared | ForeignSeen,
    Field(discriminator="type"),
]


def apply(state: ClusterState, event: ClusterEvent) -> ClusterState:
    """The state after ``event``; ``state`` is left as it was."""
    match event:
        case NodeSeen(stats=stats, at=at) | StatsUpdated(stats=stats, at=at):
            return _seen(state, stats, at)
        case NodeLost(node_id=node_id, reason=reason):
            return _lost(state, node_id, reason)
        case (
            DownloadProgressed()
            | LoadStarted()
            | LoadProgressed()
            | LoadFinished()
            | LoadFailed()
            | GenerationStarted()
            | GenerationFinished()
            | Unloaded()
        ):
            return _runner_event(state, event)
        case InstancePlaced(placement=placement):
            return _placed(state, placement)
        case InstanceCleared():
            return _with(state, instance=None)
        case ForeignSeen(foreign=foreign):
            return _with(state, foreign=_refused(state.foreign, foreign))


# Helpers. Every new model is built through the constructor so validators run.


def _with(state: ClusterState, **changes: object) -> ClusterState:
    return ClusterState.model_validate({**dict(state), **changes})


def _replace_node(state: ClusterState, view: NodeView) -> ClusterState:
    if state.node(view.node_id) is None:
        nodes = (*state.nodes, view)
    else:
        nodes = tuple(view if n.node_id == view.node_id else n for n in state.nodes)
    return _with(state, nodes=nodes)


def _refused(listed: tuple[ForeignNode, ...], foreign: ForeignNode) -> tuple[ForeignNode, ...]:
    before = next((f for f in listed if f.host == foreign.host), None)
    if before is not None:
        foreign = foreign.model_copy(update={"count": before.count + foreign.count})
    others = tuple(f for f in listed if f.host != foreign.host)
    return (*others, foreign)[-FOREIGN_LISTED:]


def _seen(state: ClusterState, stats: NodeStats, at: float) -> ClusterState:
    old = state.node(stats.node_id)
    if old is None or not old.online:
        view = NodeView(stats=stats, runner=RunnerIdle(), online=True, last_seen=at)
    else:
        view = NodeView(
            stats=stats, runner=old.runner, online=True, last_seen=max(at, old.last_seen)
        )
    state = _replace_node(state, view)
    if any(f.name == stats.name for f in state.foreign):  # it holds the key now
        state = _with(state, foreign=tuple(f for f in state.foreign if f.name != stats.name))
    return state


def _lost(state: ClusterState, node_id: str, reason: str) -> ClusterState:
    old = state.node(node_id)
    if old is None or not old.online:
        return state
    why = f"node {old.name} {reason}"
    runner: RunnerState = old.runner
    if not isinstance(runner, RunnerIdle | RunnerFailed):
        runner = RunnerFailed(reason=why, model=runner.model)
    view = NodeView(stats=old.stats, runner=runner, online=False, last_seen=old.last_seen)
    return _fail_instance(_replace_node(state, view), node_id, why)


def _placed(state: ClusterState, placement: Placement) -> ClusterState:
    """A new instance; it is failed from the start if one of its nodes is offline or unknown."""
    for node_id in placement.node_ids:
        view = state.node(node_id)
        if view is None or not view.online:
            reason = f"node {view.name if view else node_id} is offline"
            return _with(state, instance=Instance(placement=placement, failed_reason=reason))
    return _with(state, instance=Instance(placement=placement))


def _fail_instance(state: ClusterState, node_id: str, reason: str) -> ClusterState:
    instance = state.instance
    if (
        instance is None
        or instance.failed_reason is not None
        or node_id not in instance.placement.node_ids
    ):
        return state
    return _with(state, instance=Instance(placement=instance.placement, failed_reason=reason))


def _runner_event(state: ClusterState, event: NodeEvent) -> ClusterState:
    old = state.node(event.node_id)
    if old is None or not old.online:
        return state
    runner = _next_runner(old.runner, event)
    if runner is old.runner:
        return state
    view = NodeView(stats=old.stats, runner=runner, online=True, last_seen=old.last_seen)
    state = _replace_node(state, view)
    match event:
        case LoadFailed(reason=reason):
            return _fail_instance(state, event.node_id, f"node {old.name}: {reason}")
        case Unloaded():
            return _drop_unloaded_instance(state)
        case _:
            return state


def _next_runner(runner: RunnerState, event: NodeEvent) -> RunnerState:
    """The runner after ``event``, or ``runner`` itself when the event does not apply to it."""
    match event:
        case DownloadProgressed(model=model, progress=progress):
            if isinstance(runner, RunnerLoading | RunnerGenerating):
                return runner  # past downloading
            return RunnerDownloading(model=model, progress=progress)
        case LoadStarted(model=model, total=total):
            return RunnerLoading(model=model, layers_loaded=0, layers_total=total)
        case LoadProgressed(layers_loaded=loaded, total=total):
            if not isinstance(runner, RunnerLoading):
                return runner
            return RunnerLoading(
                model=runner.model, layers_loaded=min(loaded, total), layers_total=total
            )
        case LoadFinished(model=model, total=total):
            if isinstance(runner, RunnerFailed):
                return runner
            return RunnerReady(model=model, layers_total=total)
        case LoadFailed(reason=reason):
            model = None if isinstance(runner, RunnerIdle | RunnerFailed) else runner.model
            return RunnerFailed(reason=reason, model=model)
        case GenerationStarted():
            if not isinstance(runner, RunnerReady):
                return runner
            return RunnerGenerating(model=runner.model, layers_total=runner.layers_total)
        case GenerationFinished():
            if not isinstance(runner, RunnerGenerating):
                return runner
            return RunnerReady(model=runner.model, layers_total=runner.layers_total)
        case Unloaded():
            return runner if isinstance(runner, RunnerIdle) else RunnerIdle()


def _drop_unloaded_instance(state: ClusterState) -> ClusterState:
    instance = state.instance
    if instance is None or instance.failed_reason is not None:
        return state
    for node_id in instance.placement.node_ids:
        node = state.node(node_id)
        if node is not None and not isinstance(node.runner, RunnerIdle):
            return state
    return _with(state, instance=None)
