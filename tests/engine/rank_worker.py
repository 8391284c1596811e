"""One rank of a local MLX ring for the tests: load a shard, chat greedily, print JSON lines.

Run as ``python -m tests.engine.rank_worker JOBS.json`` with ``MLX_HOSTFILE`` and ``MLX_RANK``
set (or with neither, for the single-process reference). JOBS.json is a list of :class:`Job`;
for each job the worker loads the model (``load_shard`` with ``specs[rank]``, or ``load_model``
with no ring), runs the turns of one conversation and prints one :class:`JobResult` line.

From a test, :func:`run_ranks` (or :func:`start_ranks` then :func:`collect`) writes the
hostfile and the jobs, starts the ranks on free 127.0.0.1 ports, waits for them and returns
each rank's results. Every rank runs the same jobs in the same order, so one ring serves many
models. MLX's ring spins on its sockets while it waits for a peer: keep rings small and run
them one at a time on a small machine.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import mlx.core as mx
from mlx_lm.generate import stream_generate
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.models.switch_layers import QuantizedSwitchLinear
from mlx_lm.sample_utils import make_sampler
from pydantic import TypeAdapter

from engine.generate import generate
from engine.loading import LoadedModel, load_model, run_loading
from engine.parallel import load_shard
from engine.types import ChatRequest, DoneChunk, Frozen, LoadProgress, Message, ShardSpec, TextChunk

REPO = Path(__file__).resolve().parents[2]


class Job(Frozen):
    """One model to load and one conversation to have with it."""

    path: str
    specs: tuple[ShardSpec, ...] = ()  # one per rank; empty for the single-process reference
    turns: tuple[str, ...] = ("Tell me a story.",)
    max_tokens: tuple[int, ...] = (200,)  # per turn
    # Set: run the first turn's prompt through mlx-lm's stream_generate with this prefill step
    # (many prefill chunks), instead of engine.generate.
    prefill_step_size: int | None = None


class TurnResult(Frozen):
    tokens: tuple[int, ...]
    cached_tokens: int
    text: str


class JobResult(Frozen):
    job: int
    rank: int
    world_size: int
    progress: tuple[LoadProgress, ...]
    weights_bytes: int  # active MLX memory added by loading
    kernel_layers: int  # layers whose forward pass runs on the CPU kernels
    # mlx-lm's QuantizedSwitchLinear layers (a MoE's experts) on the CPU kernels, and on MLX's
    expert_kernel_layers: int = 0
    expert_mlx_layers: int = 0
    turns: tuple[TurnResult, ...]
    seconds: float  # loading and generating


def converse(loaded: LoadedModel, job: Job) -> list[TurnResult]:
    """Greedy chat, one turn per prompt, each turn seeing the answers before it."""
    history: list[Message] = []
    results: list[TurnResult] = []
    for prompt, max_tokens in zip(job.turns, job.max_tokens, strict=True):
        history.append(Message(role="user", content=prompt))
        request = ChatRequest(messages=tuple(history), max_tokens=max_tokens, temperature=0.0)
        chunks = list(generate(loaded, request))
        done = chunks[-1]
        assert isinstance(done, DoneChunk)
        text = "".join(c.text for c in chunks if isinstance(c, TextChunk))
        history.append(Message(role="assistant", content=text))
        results.append(
            TurnResult(tokens=done.token_ids, cached_tokens=done.usage.cached_tokens, text=text)
        )
    return results


def chunked_prefill(loaded: LoadedModel, job: Job, step: int) -> list[TurnResult]:
    """The first turn through mlx-lm with a small prefill step: most of the prompt is
    evaluated through the caches only, never through the logits."""
    tokenizer = loaded.tokenizer
    prompt = tokenizer.encode(job.turns[0])
    tokens = [
        response.token
        for response in stream_generate(
            loaded.model,
            tokenizer,
            mx.array(prompt),
            max_tokens=job.max_tokens[0],
            sampler=make_sampler(temp=0.0),
            prompt_cache=make_prompt_cache(loaded.model),
            prefill_step_size=step,
        )
    ]
    return [TurnResult(tokens=tuple(tokens), cached_tokens=0, text="")]


def run_job(index: int, job: Job, group: mx.distributed.Group | None) -> JobResult:
    started = time.perf_counter()
    gc.collect()
    mx.clear_cache()
    before = mx.get_active_memory()
    if group is None:
        loading = load_model(job.path)
    else:
        loading = load_shard(job.path, job.specs[group.rank()], group)
    progress: list[LoadProgress] = []
    loaded = run_loading(loading, progress.append)
    gc.collect()
    mx.clear_cache()
    weights = mx.get_active_memory() - before
    routed = [type(layer).__name__.startswith("Cpu") for _, layer in loaded.model.named_modules()]
    experts = [
        type(layer).__name__.startswith("Cpu")
        for _, layer in loaded.model.named_modules()
        if isinstance(layer, QuantizedSwitchLinear)
    ]
    if job.prefill_step_size is not None:
        turns = chunked_prefill(loaded, job, job.prefill_step_size)
    else:
        turns = converse(loaded, job)
    loaded.unload()
    return JobResult(
        job=index,
        rank=0 if group is None else group.rank(),
        world_size=1 if group is None else group.size(),
        progress=tuple(progress),
        weights_bytes=weights,
        kernel_layers=sum(routed),
        expert_kernel_layers=sum(experts),
        expert_mlx_layers=len(experts) - sum(experts),
        turns=tuple(turns),
        seconds=time.perf_counter() - started,
    )


def main(argv: Sequence[str]) -> None:
    jobs = TypeAdapter(list[Job]).validate_json(Path(argv[0]).read_text())
    group = None
    if os.environ.get("MLX_HOSTFILE"):
        group = mx.distributed.init(backend="ring", strict=True)
    for index, job in enumerate(jobs):
        result = run_job(index, job, group)
        print(result.model_dump_json(), flush=True)


# ---------------------------------------------------------------------------- for the tests


def write_hostfile(folder: Path, world_size: int) -> Path:
    """MLX's ring hostfile: a JSON list with one list of "ip:port" per rank."""
    from exo_tui.cluster.worker.local_ring import free_ports

    hostfile = folder / f"hosts-{world_size}.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{p}"] for p in free_ports(world_size)]))
    return hostfile


def start_ranks(jobs: Sequence[Job], world_size: int, folder: Path) -> list[subprocess.Popen[str]]:
    """Start the ranks of a local ring (or one plain process for world_size 0)."""
    folder.mkdir(parents=True, exist_ok=True)
    jobs_file = folder / f"jobs-{world_size}.json"
    jobs_file.write_text(TypeAdapter(list[Job]).dump_json(list(jobs)).decode())
    hostfile = write_hostfile(folder, world_size) if world_size else None
    processes: list[subprocess.Popen[str]] = []
    for rank in range(max(world_size, 1)):
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_")}
        if hostfile is not None:
            env.update(MLX_HOSTFILE=str(hostfile), MLX_RANK=str(rank))
        processes.append(
            subprocess.Popen(
                [sys.executable, "-m", "tests.engine.rank_worker", str(jobs_file)],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    return processes


def collect(processes: Sequence[subprocess.Popen[str]], timeout: float) -> list[list[JobResult]]:
    """Each rank's results, in job order; kills every rank and raises if any fails."""
    outputs: list[list[JobResult]] = []
    try:
        for rank, process in enumerate(processes):
            stdout, stderr = process.communicate(timeout=timeout)
            if process.returncode != 0:
                raise RuntimeError(f"rank {rank} exited with {process.returncode}:\n{stderr}")
            outputs.append(
                [JobResult.model_validate_json(line) for line in stdout.splitlines() if line]
            )
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    return outputs


def run_ranks(
    jobs: Sequence[Job], world_size: int, folder: Path, timeout: float = 120
) -> list[list[JobResult]]:
    """Run `jobs` on a local ring of `world_size` ranks (0: one process without a ring)."""
    return collect(start_ranks(jobs, world_size, folder), timeout)


if __name__ == "__main__":
    main(sys.argv[1:])
