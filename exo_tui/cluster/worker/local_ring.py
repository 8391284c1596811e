"""A local MLX ring: N runner processes on 127.0.0.1, supervised, loaded and chatted with.

    ring = yield from start_local_ranks(card, "pipeline", 2)   # LoadProgress of every rank
    with ring:
        for chunk in ring.chat(request, cancel):               # rank 0's chunks
            ...

Specs are checked before any process starts. A rank that exits, reports a failure, says nothing
for `silence_timeout` s or does not join the ring in time fails the whole ring: every runner is
killed and the caller gets an error naming the rank (an ErrorChunk from chat, RingError from
loading). No runner outlives the ring: close() on exit, on errors and at interpreter exit.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO

from pydantic import ValidationError

from engine.answer import failure_chunks
from engine.blas import machine_cores
from engine.errors import RequestError
from engine.generate import CancelToken
from engine.parallel import (
    ShardError,
    check_shard_spec,
    check_shard_specs,
    even_layer_counts,
    pipeline_specs,
    tensor_specs,
)
from engine.types import (
    ChatRequest,
    Chunk,
    Frozen,
    LoadProgress,
    ModelCard,
    ShardSpec,
    Strategy,
)
from exo_tui.cluster.errors import RingError
from exo_tui.cluster.worker.failures import lost_a_peer
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
    RunnerEvent,
    ShutdownCommand,
    decode_event,
    encode,
)

# How long to gather the other ranks' reports after the first failure: the rank that died
# is named first, the ranks that only lost it after.
GATHER_S = 0.5
POLL_S = 0.05


class _Ring(Exception):
    """Internal: the ring failed with this message (already stopped)."""


@dataclass(frozen=True)
class _Exited:
    returncode: int


@dataclass(frozen=True)
class _Garbled:
    line: str


_Item = tuple[int, RunnerEvent | _Exited | _Garbled]


@dataclass
class _Rank:
    rank: int
    process: subprocess.Popen[bytes]
    log: Path
    started: float
    last_heard: float | None = None
    joining_until: float | None = None  # set while MLX's ring start-up blocks the runner
    exit_code: int | None = None
    reported: bool = False  # said RankFailed: its exit adds nothing
    index: int = 0  # its place in LocalRing._ranks, which its events are queued under


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Ports free on `host` right now (held open together, so they differ)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((host, 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def ring_specs(
    card: ModelCard, strategy: Strategy, world_size: int, layer_counts: Sequence[int] | None = None
) -> list[ShardSpec]:
    """One spec per rank; ShardError when `world_size` ranks cannot split `card`."""
    if world_size < 1:
        raise ShardError(f"A ring of {world_size} ranks runs nothing", "Use 1 rank or more")
    if strategy == "pipeline" and layer_counts is None and world_size > card.num_layers:
        raise ShardError(
            f"{world_size} pipeline ranks need a layer each, but {card.name} has "
            f"{card.num_layers} layers",
            f"Use at most {card.num_layers} ranks (--ranks {card.num_layers})",
        )
    if strategy == "tensor":
        return tensor_specs(card.num_layers, world_size)
    return pipeline_specs(layer_counts or even_layer_counts(card.num_layers, world_size))


_live: weakref.WeakSet[LocalRing] = weakref.WeakSet()


@atexit.register
def _close_live_rings() -> None:
    for ring in list(_live):
        ring.close()


class LocalRing:
    """Runners on this machine, one per spec. Nothing starts until load().

    Without `hosts` the specs are the whole ring, on 127.0.0.1. With `hosts` (one "host:port"
    per rank of a ring that spans machines) the specs are this machine's ranks of it; the ring's
    other ranks run elsewhere, and chat() then yields chunks only if rank 0 is here.

    start_timeout: a runner's first message (Python and MLX imports); silence_timeout: then
    the longest a rank may say nothing (it heartbeats all along); join_timeout: the ring's
    start-up, after which a runner still waiting for a peer exits.
    """

    def __init__(
        self,
        card: ModelCard,
        specs: Sequence[ShardSpec],
        *,
        start_timeout: float = 60.0,
        silence_timeout: float = 10.0,
        join_timeout: float = 60.0,
        hosts: Sequence[str] | None = None,
        wait_to_join: bool = False,
    ) -> None:
        if hosts is None:
            check_shard_specs(card, specs)  # before anything starts
        elif not specs or any(not 0 <= s.rank < len(hosts) for s in specs):
            raise ValueError(f"ranks {[s.rank for s in specs]} are not ranks of {len(hosts)} hosts")
        else:
            for spec in specs:  # a peer's specs: refused here, before a runner starts
                check_shard_spec(card, spec, len(hosts))
        self.card = card
        self.specs = list(specs)
        self.hosts = list(hosts) if hosts is not None else None
        self.start_timeout = start_timeout
        self.silence_timeout = silence_timeout
        self.join_timeout = join_timeout
        # The ranks load (pipeline) and then wait for join(): peers elsewhere still download.
        self.wait_to_join = wait_to_join
        self._join = threading.Event()
        self._joined: set[int] = set()  # indices of ranks told to join
        self._join_lock = threading.Lock()
        self._loads_sent = False
        self.ready: list[RankReady] = []
        self._ranks: list[_Rank] = []
        self._events: queue.Queue[_Item] = queue.Queue()
        self._folder: Path | None = None
        self._failure: str | None = None
        self._closing = False
        self._next_request = 0
        self._busy = False

    @property
    def world_size(self) -> int:
        """The ranks this ring supervises (those on this machine)."""
        return len(self.specs)

    @property
    def pids(self) -> list[int]:
        return [r.process.pid for r in self._ranks]

    @property
    def failure(self) -> str | None:
        return self._failure

    # ------------------------------------------------------------------------------ public

    def load(self) -> Generator[LoadProgress, None, list[RankReady]]:
        """Start every runner, join the ring and load; yields each rank's LoadProgress.
        Raises RingError (after stopping every rank) when a rank fails."""
        if self._ranks:
            raise RuntimeError("this ring has already been started")
        _live.add(self)
        self._folder = Path(tempfile.mkdtemp(prefix="exo-tui-ring-"))
        hostfile = self._folder / "hosts.json"
        hosts = self.hosts or [f"127.0.0.1:{port}" for port in free_ports(self.world_size)]
        hostfile.write_text(json.dumps([[host] for host in hosts]))
        try:
            for spec in self.specs:
                self._ranks.append(self._launch(spec.rank, hostfile))
                if self._closing:  # close() ran meanwhile (another thread) and missed this one
                    self._kill_all()
                    raise _Ring("the ring was stopped while its runners started")
            with self._join_lock:  # a join() meanwhile waits, so no join precedes a load
                for rank, spec in zip(self._ranks, self.specs, strict=True):
                    command = LoadCommand(
                        model_path=self.card.path,
                        spec=spec,
                        join_timeout_s=self.join_timeout,
                        wait_to_join=self.wait_to_join,
                    )
                    self._send(rank, command)
                self._loads_sent = True
            if self._join.is_set():
                self.join()
            ready: dict[int, RankReady] = {}
            while len(ready) < self.world_size:
                for rank, event in self._pump():
                    match event:
                        case RankLoadProgress(progress=progress):
                            yield progress
                        case RankReady():
                            ready[rank] = event
                        case _:
                            pass
        except BaseException as error:
            self.close()
            if isinstance(error, _Ring):
                raise RingError(str(error), "Load the model again") from None
            raise
        self.ready = [ready[index] for index in range(self.world_size)]
        return self.ready

    def join(self) -> None:
        """Let ranks started with `wait_to_join` join the ring (from any thread, before or
        while load() runs); load() returns once they have joined and loaded."""
        self._join.set()
        if not self.wait_to_join:
            return
        with self._join_lock:
            if not self._loads_sent:
                return  # load() sends the joins right after the loads
            for rank in self._ranks:
                if rank.index not in self._joined:
                    self._joined.add(rank.index)
                    self._send(rank, JoinCommand())

    def chat(self, request: ChatRequest, cancel: CancelToken | None = None) -> Generator[Chunk]:
        """Run `request` on every rank in lockstep and yield rank 0's chunks; the last is a
        DoneChunk. A failed ring yields an ErrorChunk naming the rank, then a DoneChunk."""
        if self._failure is not None or not self.ready:
            yield from failure_chunks(self._failure or "The ring is not loaded")
            return
        if self._busy:
            raise RuntimeError("one request at a time per ring")
        self._busy = True
        self._next_request += 1
        request_id = self._next_request
        idle: set[int] = set()
        request_error: RankRequestError | None = None
        cancelled = False
        try:
            for rank in self._ranks:
                self._send(rank, ChatCommand(request_id=request_id, request=request))
            while len(idle) < self.world_size:
                if not cancelled and cancel is not None and cancel.is_set():
                    cancelled = True
                    self._cancel(request_id)
                for rank, event in self._pump():
                    match event:
                        case RankChunk(request_id=rid, chunk=chunk) if rid == request_id:
                            yield chunk
                        case RankIdle(request_id=rid) if rid == request_id:
                            idle.add(rank)
                        case RankRequestError(request_id=rid) if rid == request_id:
                            request_error = event
                        case _:
                            pass
        except _Ring as failed:
            yield from failure_chunks(str(failed))
            return
        except GeneratorExit:
            # The caller stopped listening: stop the ranks on the same token, then wait for them
            # so the ring is ready for the next request.
            self._cancel(request_id)
            self._drain(request_id, idle)
            raise
        finally:
            self._busy = False
        if request_error is not None:
            raise RequestError(request_error.cause, request_error.fix)

    def close(self) -> None:
        """Ask every runner to stop, kill those still there after a moment; idempotent."""
        if self._closing:
            return
        self._closing = True
        _live.discard(self)
        alive = [r for r in self._ranks if r.process.poll() is None]
        for rank in alive:
            self._send_quietly(rank, encode(ShutdownCommand()))
            self._close_stdin(rank)
        deadline = time.monotonic() + 2.0
        for rank in alive:
            with contextlib.suppress(subprocess.TimeoutExpired):
                rank.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        self._kill_all()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)

    def __enter__(self) -> LocalRing:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------------------------ processes

    def _launch(self, rank: int, hostfile: Path) -> _Rank:
        """Start the runner of `rank` (tests override this to start something else)."""
        assert self._folder is not None
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_")}
        env.update(MLX_RANK=str(rank))
        if len(self.hosts or self.specs) > 1:
            # A ring of one runs alone: MLX's ring backend cannot connect a rank to itself.
            env.update(MLX_HOSTFILE=str(hostfile))
        # The ranks share this machine's cores: BLAS threads of every rank on every core
        # oversubscribe it, and each rank's decode then waits on the others' threads.
        env.setdefault("OPENBLAS_NUM_THREADS", str(max(1, machine_cores() // self.world_size)))
        return self._popen(rank, [sys.executable, "-m", "exo_tui.cluster.worker.runner"], env)

    def _popen(self, rank: int, argv: list[str], env: dict[str, str]) -> _Rank:
        """Start `argv` as `rank`; its events are queued under its index in `_ranks`."""
        assert self._folder is not None
        index = len(self._ranks)
        log = self._folder / f"rank-{rank}.log"
        with log.open("wb") as stderr:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=env,
                # Its own session: a Ctrl+C in the terminal reaches the parent, which stops it.
                start_new_session=True,
            )
        assert process.stdout is not None
        threading.Thread(
            target=self._read, args=(index, process.stdout, process), daemon=True
        ).start()
        return _Rank(rank=rank, process=process, log=log, started=time.monotonic(), index=index)

    def _read(self, index: int, stream: IO[bytes], process: subprocess.Popen[bytes]) -> None:
        for line in stream:
            try:
                self._events.put((index, decode_event(line)))
            except ValidationError:
                self._events.put((index, _Garbled(line.decode(errors="replace")[:200])))
        self._events.put((index, _Exited(process.wait())))

    def _send(self, rank: _Rank, command: Frozen) -> None:
        if not self._send_quietly(rank, encode(command)):
            self._fail([f"rank {rank.rank}: its pipe is closed"])

    @staticmethod
    def _send_quietly(rank: _Rank, line: str) -> bool:
        stdin = rank.process.stdin
        if stdin is None:
            return False
        try:
            stdin.write(line.encode())
            stdin.flush()
        except (OSError, ValueError):
            return False
        return True

    @staticmethod
    def _close_stdin(rank: _Rank) -> None:
        if rank.process.stdin is not None:
            with contextlib.suppress(OSError):
                rank.process.stdin.close()

    def _kill_all(self) -> None:
        for rank in self._ranks:
            if rank.process.poll() is None:
                rank.process.kill()
        for rank in self._ranks:
            rank.process.wait()
            self._close_stdin(rank)

    def _cancel(self, request_id: int) -> None:
        for rank in self._ranks:
            self._send_quietly(rank, encode(CancelCommand(request_id=request_id)))

    def _drain(self, request_id: int, idle: set[int]) -> None:
        try:
            while len(idle) < self.world_size:
                for rank, event in self._pump():
                    if isinstance(event, RankIdle) and event.request_id == request_id:
                        idle.add(rank)
        except _Ring:
            pass

    # ------------------------------------------------------------------------------ watchdog

    def _pump(self) -> list[tuple[int, RunnerEvent]]:
        """The events of the next POLL_S, minus heartbeats; raises _Ring on any fault."""
        items: list[_Item] = []
        try:
            items.append(self._events.get(timeout=POLL_S))
            while True:
                items.append(self._events.get_nowait())
        except queue.Empty:
            pass
        out: list[tuple[int, RunnerEvent]] = []
        problems: list[str] = []
        for rank, event in items:
            problem = self._note(rank, event)
            if problem is not None:
                problems.append(problem)
            elif not isinstance(event, _Exited | _Garbled):
                out.append((rank, event))
        problems += self._overdue()
        if problems:
            self._fail(problems)
        return out

    def _note(self, index: int, event: RunnerEvent | _Exited | _Garbled) -> str | None:
        """Record what `event` says about its rank; a description when it is a fault."""
        rank = self._ranks[index]
        number = rank.rank
        now = time.monotonic()
        rank.last_heard = now
        match event:
            case RankJoining(timeout_s=timeout):
                rank.joining_until = now + timeout + 5.0
            case RankJoined():
                rank.joining_until = None
            case RankFailed(reason=reason):
                rank.reported = True
                return f"rank {number} failed: {reason}"
            case _Garbled(line=line):
                return f"rank {number} sent something that is not a runner message: {line!r}"
            case _Exited(returncode=code):
                rank.exit_code = code
                if rank.reported:
                    return None
                if rank.joining_until is not None:
                    return (
                        f"rank {number} could not join the ring within {self.join_timeout:g} s "
                        "(a peer never connected)"
                    )
                return f"rank {number} {_describe_exit(code)}{_log_tail(rank.log)}"
            case RankHeartbeat():
                pass
            case _:
                pass
        return None

    def _overdue(self) -> list[str]:
        now = time.monotonic()
        problems: list[str] = []
        for rank in self._ranks:
            if rank.exit_code is not None:
                continue
            if rank.joining_until is not None:
                if now > rank.joining_until:
                    problems.append(
                        f"rank {rank.rank} could not join the ring within {self.join_timeout:g} s"
                    )
            elif rank.last_heard is None:
                if now - rank.started > self.start_timeout:
                    problems.append(
                        f"rank {rank.rank} did not start within {self.start_timeout:g} s"
                    )
            elif now - rank.last_heard > self.silence_timeout:
                problems.append(
                    f"rank {rank.rank} sent nothing for {self.silence_timeout:g} s "
                    "(hung or stopped), so it was killed"
                )
        return problems

    def _fail(self, problems: list[str]) -> None:
        """Gather the other ranks' last words, kill every rank and raise _Ring."""
        deadline = time.monotonic() + GATHER_S
        while time.monotonic() < deadline:
            try:
                rank, event = self._events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            problem = self._note(rank, event)
            if problem is not None and problem not in problems:
                problems.append(problem)
        self._kill_all()
        # The rank that went away first, the ranks that only lost it after.
        lost = [p for p in problems if lost_a_peer(p)]
        message = "; ".join([p for p in problems if p not in lost] + lost)
        self._failure = f"The ring of {self.world_size} ranks stopped: {message}"
        raise _Ring(self._failure)


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def _log_tail(log: Path) -> str:
    try:
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return f" ({lines[-1].strip()[:300]})" if lines else ""


def start_local_ranks(
    card: ModelCard,
    strategy: Strategy,
    world_size: int,
    layer_counts: Sequence[int] | None = None,
    *,
    start_timeout: float = 60.0,
    silence_timeout: float = 10.0,
    join_timeout: float = 60.0,
) -> Generator[LoadProgress, None, LocalRing]:
    """`ring = yield from start_local_ranks(card, "pipeline", 2)`: a loaded local ring.

    Bad specs raise ShardError before any process starts; the caller closes the ring (it is a
    context manager). Timeouts in seconds, see LocalRing.
    """
    ring = LocalRing(
        card,
        ring_specs(card, strategy, world_size, layer_counts),
        start_timeout=start_timeout,
        silence_timeout=silence_timeout,
        join_timeout=join_timeout,
    )
    yield from ring.load()
    return ring
