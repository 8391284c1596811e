"""What a runner and its parent say over the pipe: one JSON line per message, one union each way.

Parent -> runner (stdin): a LoadCommand first (and a JoinCommand when it says wait_to_join),
then chats, cancels and a shutdown.
Runner -> parent (stdout): heartbeats all along, joining / joined around the ring's start-up (a
pipeline rank loads its layers first, so it can load while its peers still download),
per-layer progress, ready, then chunks (rank 0 only), request errors and idle (every rank, after
each request). A runner that fails says RankFailed and exits non-zero.
Events are named Rank* (what one rank says), apart from the runner states of state.py.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, TypeAdapter

from engine.types import ChatRequest, Chunk, Frozen, LoadProgress, ShardSpec

# ---------------------------------------------------------------------- parent -> runner


class LoadCommand(Frozen):
    """Join the ring named by MLX_HOSTFILE / MLX_RANK and load this rank's shard."""

    type: Literal["load"] = "load"
    model_path: str
    spec: ShardSpec
    # The ring's own start-up waits forever for a peer that never connects.
    join_timeout_s: float = 60.0
    # Join only on a JoinCommand (a pipeline rank loads first): other nodes still download.
    wait_to_join: bool = False


class JoinCommand(Frozen):
    """Every rank of the ring can start now: join it (after a LoadCommand with wait_to_join)."""

    type: Literal["join"] = "join"


class ChatCommand(Frozen):
    type: Literal["chat"] = "chat"
    request_id: int
    request: ChatRequest


class CancelCommand(Frozen):
    """Stop request `request_id`; the ranks agree on the token to stop at."""

    type: Literal["cancel"] = "cancel"
    request_id: int


class ShutdownCommand(Frozen):
    type: Literal["shutdown"] = "shutdown"


RunnerCommand = Annotated[
    LoadCommand | JoinCommand | ChatCommand | CancelCommand | ShutdownCommand,
    Field(discriminator="type"),
]

# ---------------------------------------------------------------------- runner -> parent


class RankHeartbeat(Frozen):
    """Sent every HEARTBEAT_S from a thread of its own: the process is alive and not stopped."""

    type: Literal["heartbeat"] = "heartbeat"


class RankJoining(Frozen):
    """About to join the ring: MLX's start-up holds the GIL, so no heartbeats until joined.
    The runner exits after `timeout_s` if the ring has not formed."""

    type: Literal["joining"] = "joining"
    timeout_s: float


class RankJoined(Frozen):
    type: Literal["joined"] = "joined"
    rank: int
    world_size: int


class RankLoadProgress(Frozen):
    type: Literal["load_progress"] = "load_progress"
    progress: LoadProgress


class RankReady(Frozen):
    """This rank's shard is in memory."""

    type: Literal["ready"] = "ready"
    rank: int
    model: str
    load_seconds: float
    blas: str
    kernels: str = "mlx"
    weights_bytes: int  # MLX active memory after loading
    peak_memory_bytes: int  # MLX peak memory while loading


class RankChunk(Frozen):
    """A chunk of request `request_id` (rank 0 only)."""

    type: Literal["chunk"] = "chunk"
    request_id: int
    chunk: Chunk


class RankRequestError(Frozen):
    """The request cannot be served (the same on every rank); the runner keeps serving."""

    type: Literal["request_error"] = "request_error"
    request_id: int
    cause: str
    fix: str


class RankIdle(Frozen):
    """This rank has finished request `request_id` and waits for the next command."""

    type: Literal["idle"] = "idle"
    request_id: int


class RankFailed(Frozen):
    """The runner cannot go on (a peer was lost, a bad shard, a bug); it exits next."""

    type: Literal["failed"] = "failed"
    rank: int | None
    reason: str


RunnerEvent = Annotated[
    RankHeartbeat
    | RankJoining
    | RankJoined
    | RankLoadProgress
    | RankReady
    | RankChunk
    | RankRequestError
    | RankIdle
    | RankFailed,
    Field(discriminator="type"),
]

_commands: TypeAdapter[RunnerCommand] = TypeAdapter(RunnerCommand)
_events: TypeAdapter[RunnerEvent] = TypeAdapter(RunnerEvent)


def encode(message: Frozen) -> str:
    """One line of JSON, newline included."""
    return message.model_dump_json() + "\n"


def decode_command(line: str | bytes) -> RunnerCommand:
    """Strict: raises pydantic.ValidationError on anything but one well-formed command."""
    return _commands.validate_json(line)


def decode_event(line: str | bytes) -> RunnerEvent:
    """Strict: raises pydantic.ValidationError on anything but one well-formed event."""
    return _events.validate_json(line)
