"""The control connection's frames: one frozen pydantic model per message, in one union on `type`.

Hello and Challenge keep their shape in every version, so that any two versions can at least tell
each other which one they speak.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from engine.types import ChatRequest, Chunk, Frozen, ShardSpec
from exo_tui.cluster.control.state import NodeStats
from exo_tui.hub.progress import DownloadProgress

# 2: per-node downloads (FetchShard ...), partial models in cards; 3: sealed sessions;
# 4: download progress as one nested type (FetchProgress.progress)
PROTOCOL_VERSION = 4

Hex256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]  # 32 random bytes, or a SHA-256 HMAC

# ---------------------------------------------------------------------- handshake frames


class Hello(Frozen):
    """The client's opening: who it is, and a fresh nonce the server must prove the key over."""

    type: Literal["hello"] = "hello"
    version: int
    node_id: str = Field(min_length=1)
    name: str
    fingerprint: str
    nonce: Hex256


class Challenge(Frozen):
    """The server's answer: who it is, its own nonce, and its proof over both openings."""

    type: Literal["challenge"] = "challenge"
    version: int
    node_id: str = Field(min_length=1)
    name: str
    fingerprint: str
    nonce: Hex256
    proof: Hex256


class Proof(Frozen):
    type: Literal["proof"] = "proof"
    proof: Hex256


class Welcome(Frozen):
    """The server accepted the client's proof: session frames may follow."""

    type: Literal["welcome"] = "welcome"


class Refused(Frozen):
    type: Literal["refused"] = "refused"
    reason: str


# ---------------------------------------------------------------------- session frames


class StatsFrame(Frozen):
    type: Literal["stats"] = "stats"
    stats: NodeStats


class Goodbye(Frozen):
    """The sender is closing the connection on purpose (shutting down, or a duplicate session)."""

    type: Literal["goodbye"] = "goodbye"
    reason: str = ""


# Instances: the coordinator (the node the user drives) asks the nodes of a placement for ring
# ports, launches their ranks, sends chats and stops them; nodes answer with progress, chunks
# (the node of rank 0) and failures. A node loads only models from its own store, by name.


class ReservePorts(Frozen):
    """Coordinator -> node: hold a free TCP port for each of `count` ranks of `instance_id`."""

    type: Literal["reserve_ports"] = "reserve_ports"
    instance_id: str = Field(min_length=1)
    count: int = Field(ge=1, le=64)


class PortsReserved(Frozen):
    type: Literal["ports_reserved"] = "ports_reserved"
    instance_id: str
    ports: tuple[int, ...]


class FetchShard(Frozen):
    """Coordinator -> node: download, from the hub into the node's own cache, the files of
    `repo_id` that layers `layers` need (None: every file), before the launch."""

    type: Literal["fetch_shard"] = "fetch_shard"
    instance_id: str = Field(min_length=1)
    # A hub repo id ("org/name"), never a path: the node fetches into its own store.
    repo_id: str = Field(pattern=r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$", max_length=200)
    layers: tuple[int, int] | None = None
    total_layers: int = Field(ge=1)

    @field_validator("repo_id")
    @classmethod
    def _no_parent_parts(cls, repo_id: str) -> str:
        if ".." in repo_id:
            raise ValueError("a repo id has no '..'")
        return repo_id


class FetchProgress(Frozen):
    """Node -> coordinator: bytes and files of the node's share that have landed."""

    type: Literal["fetch_progress"] = "fetch_progress"
    instance_id: str
    progress: DownloadProgress


class FetchDone(Frozen):
    type: Literal["fetch_done"] = "fetch_done"
    instance_id: str


class LaunchRanks(Frozen):
    """Coordinator -> node: join the ring `hosts` (one "host:port" per rank) as `specs`' ranks,
    loading the model called `model` from the node's own store."""

    type: Literal["launch_ranks"] = "launch_ranks"
    instance_id: str = Field(min_length=1)
    model: str = Field(min_length=1)
    specs: tuple[ShardSpec, ...] = Field(min_length=1)
    hosts: tuple[str, ...] = Field(min_length=1)
    join_timeout_s: float = Field(default=60.0, gt=0, le=3600)
    # Load, then join the ring only on JoinRing: other nodes still download their share.
    wait_to_join: bool = False


class JoinRing(Frozen):
    """Coordinator -> node: every node has its files; the ranks told to wait may join."""

    type: Literal["join_ring"] = "join_ring"
    instance_id: str


class RanksProgress(Frozen):
    """Node -> coordinator: layers loaded so far by the node's ranks, of their total."""

    type: Literal["ranks_progress"] = "ranks_progress"
    instance_id: str
    layers_loaded: int = Field(ge=0)
    total: int = Field(ge=0)


class RanksReady(Frozen):
    type: Literal["ranks_ready"] = "ranks_ready"
    instance_id: str
    total: int = Field(ge=0)


class InstanceFailed(Frozen):
    """Either way: the instance cannot go on (the node's ranks are stopped), and why."""

    type: Literal["instance_failed"] = "instance_failed"
    instance_id: str
    reason: str = Field(min_length=1)


class ChatFrame(Frozen):
    type: Literal["chat"] = "chat"
    instance_id: str
    request_id: int = Field(ge=0)
    request: ChatRequest


class ChunkFrame(Frozen):
    """Node of rank 0 -> coordinator: one chunk of the answer."""

    type: Literal["chunk"] = "chunk"
    instance_id: str
    request_id: int
    chunk: Chunk


class ChatFinished(Frozen):
    """Node -> coordinator: every rank of this node is done with the request."""

    type: Literal["chat_finished"] = "chat_finished"
    instance_id: str
    request_id: int


class CancelChat(Frozen):
    type: Literal["cancel_chat"] = "cancel_chat"
    instance_id: str
    request_id: int


class StopInstance(Frozen):
    """Coordinator -> node: stop and unload the instance's ranks."""

    type: Literal["stop_instance"] = "stop_instance"
    instance_id: str


class InstanceStopped(Frozen):
    type: Literal["instance_stopped"] = "instance_stopped"
    instance_id: str


class CommandRefused(Frozen):
    """Node -> a coordinator: that command is not yours to give (another session launched the
    instance); the instance goes on untouched."""

    type: Literal["command_refused"] = "command_refused"
    instance_id: str
    command: str
    reason: str


# What a coordinator tells the nodes of an instance, and what they report back.
HostCommand = (
    FetchShard | ReservePorts | LaunchRanks | JoinRing | ChatFrame | CancelChat | StopInstance
)  # fmt: skip
InstanceReport = (
    FetchProgress | FetchDone | PortsReserved | RanksProgress | RanksReady | InstanceFailed
    | ChunkFrame | ChatFinished | InstanceStopped | CommandRefused
)  # fmt: skip
InstanceFrame = HostCommand | InstanceReport

# A new frame is a Frozen model with its own `type` literal, added to this union.
Frame = Annotated[
    Hello | Challenge | Proof | Welcome | Refused | StatsFrame | Goodbye | InstanceFrame,
    Field(discriminator="type"),
]


# Sends a frame to the node with this id (the node's own, or over its session).
SendFrame = Callable[[str, Frame], Coroutine[Any, Any, None]]
