"""One rank of an MLX ring in a process of its own: join the ring, load a shard, serve chats.

    MLX_HOSTFILE=hosts.json MLX_RANK=1 python -m exo_tui.cluster.worker.runner

It reads RunnerCommands on stdin and writes RunnerEvents on stdout, one JSON line each (see
runner_messages); whoever started it (a local supervisor, a node) speaks only that. Without
MLX_HOSTFILE it runs alone, as a ring of one.

Every rank runs every request with the same seed, in lockstep; only rank 0 sends chunks. A cancel
is agreed with a collective on every token, so all ranks stop on the same one. When a peer dies,
MLX raises ("connection to a peer was lost"): the runner says RankFailed and exits non-zero.
"""
# pyright: reportMissingTypeStubs=false, reportUnknownMemberType=false

from __future__ import annotations

import faulthandler
import gc
import os
import queue
import random
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, BinaryIO, TextIO, cast

from pydantic import ValidationError

from engine.errors import EngineError, RequestError
from engine.types import Frozen
from exo_tui.cluster.worker.runner_messages import (
    CancelCommand,
    ChatCommand,
    JoinCommand,
    LoadCommand,
    RankChunk,
    RankFailed,
    RankHeartbeat,
    RankIdle,
    RankJoined,
    RankJoining,
    RankLoadProgress,
    RankReady,
    RankRequestError,
    RunnerCommand,
    ShutdownCommand,
    decode_command,
    encode,
)

if TYPE_CHECKING:
    # Imported where used at run time: the engine must pick the BLAS before MLX loads.
    import mlx.core as mx

    from engine.loading import LoadedModel

HEARTBEAT_S = 0.5
# With the parent gone, the main thread may sit in a ring step that never ends.
PARENT_GONE_GRACE_S = 3.0


class Outbox:
    """Events to the parent, from any thread, one whole line at a time."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def send(self, event: Frozen) -> None:
        line = encode(event)
        with self._lock:
            try:
                self._stream.write(line)
                self._stream.flush()
            except (OSError, ValueError):
                os._exit(1)  # the parent is gone: nobody to serve


class Inbox:
    """Reads commands in a thread of its own, so a cancel lands while a request runs."""

    def __init__(self, stream: BinaryIO, outbox: Outbox, rank: int) -> None:
        self._stream = stream
        self._outbox = outbox
        self._rank = rank
        self._queue: queue.Queue[RunnerCommand | None] = queue.Queue()
        self._cancelled: set[int] = set()
        self.parent_gone = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._read, name="runner-inbox", daemon=True).start()

    def next(self) -> RunnerCommand | None:
        """The next command; None when the parent has closed the pipe."""
        return self._queue.get()

    def cancelled(self, request_id: int) -> bool:
        return request_id in self._cancelled or self.parent_gone.is_set()

    def _read(self) -> None:
        for line in self._stream:
            if not line.strip():
                continue
            try:
                command = decode_command(line)
            except ValidationError as error:
                reason = f"a bad command from the parent: {error.errors()[0]['msg']}"
                self._outbox.send(RankFailed(rank=self._rank, reason=reason))
                os._exit(2)
            if isinstance(command, CancelCommand):
                self._cancelled.add(command.request_id)
            else:
                self._queue.put(command)
        self.parent_gone.set()
        self._queue.put(None)
        timer = threading.Timer(PARENT_GONE_GRACE_S, os._exit, (1,))
        timer.daemon = True
        timer.start()


class RingCancel:
    """A cancel token every rank agrees on: each check sums every rank's local flag.

    generate() checks it once per token on every rank, so the sums line up and all ranks stop
    on the same token. It runs on mlx-lm's generation stream, behind the step already queued
    there, so the collectives keep the same order on every rank.
    """

    def __init__(self, group: mx.distributed.Group, local: Callable[[], bool]) -> None:
        from mlx_lm.generate import generation_stream  # pyright: ignore[reportUnknownVariableType]

        self._group = group
        self._local = local
        self._stream = generation_stream

    def is_set(self) -> bool:
        import mlx.core as mx

        if self._group.size() == 1:
            # Alone, nobody to agree with: a collective would only wait for the queued step
            # (mlx-lm overlaps building the next step with computing this one).
            return self._local()
        flag = mx.array(1 if self._local() else 0, dtype=mx.int32)
        with mx.stream(self._stream):
            total = mx.distributed.all_sum(flag, group=self._group)
        return cast(int, total.item()) > 0


def agree_seed(group: mx.distributed.Group) -> int:
    """Rank 0's random seed, on every rank (a sum where the other ranks add 0)."""
    import mlx.core as mx
    from mlx_lm.generate import generation_stream  # pyright: ignore[reportUnknownVariableType]

    mine = random.randrange(2**31 - 1) if group.rank() == 0 else 0

    with mx.stream(generation_stream):
        total = mx.distributed.all_sum(mx.array(mine, dtype=mx.int32), group=group)
    return cast(int, total.item())


def agree_step(group: mx.distributed.Group) -> Callable[[int], int]:
    """Rank 0's size of each prefill step, on every rank (engine.prefill): each rank measures
    its own speed, and the ranks' passes must match."""
    import mlx.core as mx
    from mlx_lm.generate import generation_stream  # pyright: ignore[reportUnknownVariableType]

    def agree(size: int) -> int:
        if group.size() == 1:
            return size
        mine = mx.array(size if group.rank() == 0 else 0, dtype=mx.int32)
        with mx.stream(generation_stream):
            total = mx.distributed.all_sum(mine, group=group)
        return cast(int, total.item())

    return agree


def join_ring(outbox: Outbox, timeout_s: float) -> mx.distributed.Group:
    """The ring of MLX_HOSTFILE (a ring of one without it).

    MLX's start-up holds the GIL and waits forever for a peer that never connects, so no Python
    thread can time it out: faulthandler's C watchdog ends the process instead.
    """
    import mlx.core as mx

    if not os.environ.get("MLX_HOSTFILE"):
        return mx.distributed.init()
    outbox.send(RankJoining(timeout_s=timeout_s))
    faulthandler.dump_traceback_later(timeout_s, exit=True)
    try:
        return mx.distributed.init(backend="ring", strict=True)
    finally:
        faulthandler.cancel_dump_traceback_later()


def load(
    outbox: Outbox, command: LoadCommand, group: mx.distributed.Group | None
) -> tuple[LoadedModel, float]:
    """This rank's shard with per-layer progress (before the ring exists when `group` is None:
    a pipeline rank), and how long it took."""
    import mlx.core as mx

    from engine.loading import run_loading
    from engine.parallel import load_shard

    started = time.perf_counter()
    mx.reset_peak_memory()
    loaded = run_loading(
        load_shard(command.model_path, command.spec, group),
        lambda progress: outbox.send(RankLoadProgress(progress=progress)),
    )
    gc.collect()
    mx.clear_cache()
    return loaded, time.perf_counter() - started


def ready(outbox: Outbox, rank: int, loaded: LoadedModel, load_seconds: float) -> None:
    import mlx.core as mx

    from engine import blas

    outbox.send(
        RankReady(
            rank=rank,
            model=loaded.card.name,
            load_seconds=load_seconds,
            blas=blas.describe(),
            kernels=loaded.kernels,
            weights_bytes=int(mx.get_active_memory()),
            peak_memory_bytes=int(mx.get_peak_memory()),
        )
    )


def chat(
    outbox: Outbox,
    inbox: Inbox,
    loaded: LoadedModel,
    group: mx.distributed.Group,
    command: ChatCommand,
) -> None:
    from engine.generate import generate

    request_id, request = command.request_id, command.request
    if request.seed is None:
        request = request.model_copy(update={"seed": agree_seed(group)})
    cancel = RingCancel(group, lambda: inbox.cancelled(request_id))
    leader = group.rank() == 0
    try:
        for chunk in generate(loaded, request, cancel, agree_step(group)):
            if leader:
                outbox.send(RankChunk(request_id=request_id, chunk=chunk))
    except RequestError as error:
        # Every rank refuses the same request the same way, before any collective.
        if leader:
            outbox.send(RankRequestError(request_id=request_id, cause=error.cause, fix=error.fix))
    outbox.send(RankIdle(request_id=request_id))


def serve(outbox: Outbox, inbox: Inbox, rank: int) -> int:
    first = inbox.next()
    if first is None or isinstance(first, ShutdownCommand):
        return 0
    if not isinstance(first, LoadCommand):
        outbox.send(RankFailed(rank=rank, reason=f"expected a load command, got {first.type}"))
        return 2
    spec = first.spec
    if spec.strategy == "pipeline" and spec.world_size > 1:
        # A pipeline rank's weights need nothing from the ring: load while the other nodes
        # are still loading or downloading their share, then join.
        from engine.parallel import join_pipeline

        loaded, seconds = load(outbox, first, None)
        if first.wait_to_join and not wait_for_join(outbox, inbox, rank):
            return 0
        group = join_ring(outbox, first.join_timeout_s)
        join_pipeline(loaded.model, group, spec)
    else:
        if first.wait_to_join and not wait_for_join(outbox, inbox, rank):
            return 0
        group = join_ring(outbox, first.join_timeout_s)
        loaded, seconds = None, 0.0
    rank = group.rank()
    outbox.send(RankJoined(rank=rank, world_size=group.size()))
    if loaded is None:
        loaded, seconds = load(outbox, first, group)
    ready(outbox, rank, loaded, seconds)  # the ring has formed: chats can come
    while True:
        command = inbox.next()
        match command:
            case None | ShutdownCommand():
                return 0
            case ChatCommand():
                chat(outbox, inbox, loaded, group, command)
            case LoadCommand() | JoinCommand() | CancelCommand():
                reason = f"unexpected {command.type} command: this runner has loaded its shard"
                outbox.send(RankFailed(rank=rank, reason=reason))
                return 2


def wait_for_join(outbox: Outbox, inbox: Inbox, rank: int) -> bool:
    """Wait (heartbeating, and leaving when the parent goes) for the word to join the ring;
    False when told to shut down instead."""
    command = inbox.next()
    match command:
        case JoinCommand():
            return True
        case None | ShutdownCommand():
            return False
        case _:
            raise RuntimeError(f"expected a join command, got {command.type}")


def _claim_stdout() -> TextIO:
    """The pipe to the parent, private: anything else printing (MLX's ring does) goes to
    stderr instead of between our lines."""
    fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(fd, "w", encoding="utf-8")


def _heartbeat(outbox: Outbox) -> None:
    while True:
        outbox.send(RankHeartbeat())
        time.sleep(HEARTBEAT_S)


def main() -> int:
    outbox = Outbox(_claim_stdout())
    threading.Thread(target=_heartbeat, args=(outbox,), name="heartbeat", daemon=True).start()
    rank = int(os.environ.get("MLX_RANK", "0") or 0)
    inbox = Inbox(sys.stdin.buffer, outbox, rank)
    inbox.start()
    try:
        return serve(outbox, inbox, rank)
    except EngineError as error:
        outbox.send(RankFailed(rank=rank, reason=str(error)))
    except Exception as error:
        traceback.print_exc()
        outbox.send(RankFailed(rank=rank, reason=f"{type(error).__name__}: {error}"))
    return 1


if __name__ == "__main__":
    code = main()
    sys.stderr.flush()
    # Not a normal exit: MLX's ring threads may still wait on a peer that is gone.
    os._exit(code)
