"""Local rings of runner processes: the CLI over ranks, lockstep cancel, and every fault ending.

Real subprocesses on 127.0.0.1 with the tiny llama (4 layers). MLX's ring spins on its sockets
while it waits for a peer, so the rings run one at a time and stay at 2 ranks.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from engine.generate import generate
from engine.loading import load_model_sync, run_loading
from engine.models.cards import read_card
from engine.parallel import ShardError, pipeline_specs, tensor_specs
from engine.types import (
    ChatRequest,
    Chunk,
    DoneChunk,
    ErrorChunk,
    Message,
    ModelCard,
    PrefillProgress,
    ShardSpec,
    TextChunk,
)
from exo_tui.cluster.errors import RingError
from exo_tui.cluster.worker.local_ring import LocalRing, _Rank, start_local_ranks

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "Tell me a story about a dog."
MAX_TOKENS = 200
STRATEGIES = ("pipeline", "tensor")


def request(max_tokens: int = MAX_TOKENS) -> ChatRequest:
    return ChatRequest(
        messages=(Message(role="user", content=PROMPT),), max_tokens=max_tokens, temperature=0.0
    )


def cli_chat(model: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """`exo-tui chat --json` greedy; without tools unless `extra` holds "--tools"."""
    if "--tools" in extra:
        extra = tuple(e for e in extra if e != "--tools")
    else:
        extra = ("--no-tools", *extra)
    return subprocess.run(
        [sys.executable, "-m", "exo_tui.cli", "chat", "--model", str(model), "--prompt", PROMPT,
         "--json", "--temperature", "0", "--max-tokens", str(MAX_TOKENS), *extra],
        capture_output=True, text=True, cwd=ROOT, timeout=100,
    )  # fmt: skip


def runners() -> list[psutil.Process]:
    """Runner processes started from this test process, still alive (zombies excluded)."""
    found: list[psutil.Process] = []
    for child in psutil.Process().children(recursive=True):
        try:
            runner = "exo_tui.cluster.worker.runner" in " ".join(child.cmdline())
            if runner and child.status() != psutil.STATUS_ZOMBIE:
                found.append(child)
        except psutil.NoSuchProcess:
            pass
    return found


def wait_until(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return bool(predicate())


def loaded_ring(card: ModelCard, silence_timeout: float = 10.0) -> LocalRing:
    return run_loading(start_local_ranks(card, "pipeline", 2, silence_timeout=silence_timeout))


@pytest.fixture(scope="module")
def card(tiny_llama: Path) -> ModelCard:
    return read_card(tiny_llama)


@pytest.fixture(scope="module")
def reference(tiny_llama: Path) -> DoneChunk:
    done = list(generate(load_model_sync(tiny_llama), request()))[-1]
    assert isinstance(done, DoneChunk)
    assert len(done.token_ids) == MAX_TOKENS
    return done


@pytest.fixture(scope="module")
def cli_runs(tiny_llama: Path) -> dict[str, list[dict[str, Any]]]:
    """`exo-tui chat --ranks 2 --json` once per strategy, one after the other."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for strategy in STRATEGIES:
        result = cli_chat(tiny_llama, "--ranks", "2", "--strategy", strategy)
        assert result.returncode == 0, result.stderr[-3000:]
        runs[strategy] = [json.loads(line) for line in result.stdout.splitlines()]
    return runs


# ------------------------------------------------------------------------------------ the CLI


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_two_ranks_give_the_tokens_of_one_process(
    cli_runs: dict[str, list[dict[str, Any]]], reference: DoneChunk, strategy: str
) -> None:
    events = cli_runs[strategy]
    assert [e["type"] for e in events].count("ready") == 1
    done = events[-1]
    assert done["type"] == "done" and done["finish_reason"] == "length"
    assert tuple(done["token_ids"]) == reference.token_ids


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_load_events_carry_each_rank_up_to_its_own_layers(
    cli_runs: dict[str, list[dict[str, Any]]], card: ModelCard, strategy: str
) -> None:
    specs = pipeline_specs([2, 2]) if strategy == "pipeline" else tensor_specs(4, 2)
    loads = [e for e in cli_runs[strategy] if e["type"] == "load"]
    for spec in specs:
        mine = [(e["layers_loaded"], e["total"]) for e in loads if e["rank"] == spec.rank]
        owned = spec.num_layers
        assert mine == [(i, owned) for i in range(1, owned + 1)]
    assert card.num_layers == 4


def test_the_turn_with_tools_on_ranks_is_the_turn_in_one_process(tiny_llama: Path) -> None:
    # Tools on: the chat template renders them into a long prompt, and chat_turn drives the
    # ring's chat as it drives the engine.
    answers: list[list[dict[str, Any]]] = []
    for extra in ((), ("--ranks", "2")):
        result = cli_chat(tiny_llama, "--tools", *extra)
        assert result.returncode == 0, result.stderr[-3000:]
        events = [json.loads(line) for line in result.stdout.splitlines()]
        # (Without the prefill's progress: its steps follow each run's measured speed.)
        answers.append([e for e in events if e["type"] not in ("load", "ready", "prefill")])
    one, ranks = answers
    assert one[-1]["usage"]["prompt_tokens"] > 300
    assert ranks == [
        {**e, "stats": r["stats"]} if e["type"] == "done" else e
        for e, r in zip(one, ranks, strict=True)
    ]


def test_the_cli_refuses_a_ring_that_cannot_split_the_model(tiny_llama: Path) -> None:
    result = cli_chat(tiny_llama, "--ranks", "3", "--strategy", "tensor")
    assert result.returncode == 2
    assert "3 ranks cannot split evenly" in result.stderr
    assert not runners()


# ------------------------------------------------------------------------ refused before start


@pytest.mark.parametrize(
    "specs",
    [
        pytest.param([ShardSpec(strategy="pipeline", start_layer=0, end_layer=0,
                                world_size=2, rank=0),
                      *pipeline_specs([0, 4])[1:]], id="empty-range"),
        pytest.param(pipeline_specs([2, 3]), id="past-the-last-layer"),
        pytest.param(tensor_specs(4, 2), id="tensor-on-an-unsupported-architecture"),
    ],
)  # fmt: skip
def test_a_bad_spec_is_refused_before_any_process_starts(
    card: ModelCard, specs: list[ShardSpec]
) -> None:
    if specs[0].strategy == "tensor":
        card = card.model_copy(update={"supports_tensor": False})
    before = psutil.Process().children(recursive=True)
    with pytest.raises(ShardError):
        LocalRing(card, specs)
    with pytest.raises(ShardError):
        next(start_local_ranks(card, specs[0].strategy, 2, [s.num_layers for s in specs]))
    assert psutil.Process().children(recursive=True) == before


# --------------------------------------------------------------------------- lockstep cancel


def test_a_cancel_stops_every_rank_on_the_same_token_and_the_ring_goes_on(
    card: ModelCard, reference: DoneChunk
) -> None:
    with loaded_ring(card) as ring:
        cancel = threading.Event()
        chunks: list[Chunk] = []
        for chunk in ring.chat(request(max_tokens=1500), cancel):
            if isinstance(chunk, PrefillProgress):
                continue  # (a step of the prompt, before the tokens)
            chunks.append(chunk)
            if len(chunks) == 5:
                cancel.set()
        done = chunks[-1]
        assert isinstance(done, DoneChunk)
        assert done.finish_reason == "cancelled"
        assert 5 <= done.usage.completion_tokens < 1500
        # Every rank is idle and still in the ring: the next request runs to the end.
        # A caller that stops listening cancels too, and waits for every rank to stop.
        answer = ring.chat(request(max_tokens=1500))
        next(answer)
        answer.close()
        again = list(ring.chat(request(max_tokens=20)))[-1]
        assert isinstance(again, DoneChunk)
        assert again.finish_reason == "length"
        assert len(runners()) == 2
    assert wait_until(lambda: not runners(), 10)


# ------------------------------------------------------------------------------------ faults


def answer_until(chunks: Iterator[Chunk], action: Any, after: int) -> tuple[list[Chunk], float]:
    """Read chunks, call `action` after `after` text chunks; return them and its time."""
    seen: list[Chunk] = []
    acted = 0.0
    for chunk in chunks:
        seen.append(chunk)
        if acted == 0.0 and sum(isinstance(c, TextChunk) for c in seen) == after:
            action()
            acted = time.monotonic()
    return seen, acted


def test_a_rank_killed_mid_answer_ends_the_answer_with_an_error_naming_it(
    card: ModelCard,
) -> None:
    with loaded_ring(card) as ring:
        pids = ring.pids
        chunks, killed = answer_until(
            ring.chat(request(max_tokens=1800)), lambda: os.kill(pids[1], signal.SIGKILL), 5
        )
        reported = time.monotonic()
        errors = [c for c in chunks if isinstance(c, ErrorChunk)]
        assert len(errors) == 1 and "rank 1 was killed by SIGKILL" in errors[0].message
        assert reported - killed < 5
        done = chunks[-1]
        assert isinstance(done, DoneChunk) and done.finish_reason == "error"
        assert wait_until(lambda: not any(psutil.pid_exists(p) for p in pids), 10 - (
            time.monotonic() - killed))  # fmt: skip
        # The ring stays failed, with the same message.
        after = list(ring.chat(request()))
        assert isinstance(after[0], ErrorChunk) and "rank 1" in after[0].message
    assert not runners()


def test_a_stopped_rank_is_killed_after_the_silence_timeout(card: ModelCard) -> None:
    with loaded_ring(card, silence_timeout=2.0) as ring:
        pids = ring.pids
        chunks, stopped = answer_until(
            ring.chat(request(max_tokens=1800)), lambda: os.kill(pids[1], signal.SIGSTOP), 5
        )
        assert time.monotonic() - stopped < 6
        errors = [c for c in chunks if isinstance(c, ErrorChunk)]
        assert len(errors) == 1 and "rank 1 sent nothing for 2 s" in errors[0].message
    assert wait_until(lambda: not any(psutil.pid_exists(p) for p in pids), 5)


class RingWithASilentRank(LocalRing):
    """Rank 1 is a process that never becomes a runner."""

    def _launch(self, rank: int, hostfile: Path) -> _Rank:
        if rank == 1:
            return self._popen(rank, [sys.executable, "-c", "import time; time.sleep(60)"], {})
        return super()._launch(rank, hostfile)


def test_a_rank_that_never_starts_fails_the_others_after_a_bounded_wait(
    card: ModelCard,
) -> None:
    ring = RingWithASilentRank(card, pipeline_specs([2, 2]), join_timeout=3.0)
    started = time.monotonic()
    with pytest.raises(RingError, match="rank 0 could not join the ring within 3 s"):
        list(ring.load())
    assert time.monotonic() - started < 30
    assert wait_until(lambda: not any(psutil.pid_exists(p) for p in ring.pids), 5)
