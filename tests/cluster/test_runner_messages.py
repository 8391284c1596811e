"""The runner's pipe protocol: every message round-trips, and a bad frame fails at the edge."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from engine.parallel import pipeline_specs
from engine.types import ChatRequest, LoadProgress, Message, PrefillProgress, TextChunk
from exo_tui.cluster.worker.runner_messages import (
    CancelCommand,
    ChatCommand,
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
    ShutdownCommand,
    decode_command,
    decode_event,
    encode,
)

ROOT = Path(__file__).resolve().parents[2]
REQUEST = ChatRequest(messages=(Message(role="user", content="hi"),), max_tokens=3)

COMMANDS = [
    LoadCommand(model_path="/m", spec=pipeline_specs([2, 2])[1], join_timeout_s=5),
    ChatCommand(request_id=3, request=REQUEST),
    CancelCommand(request_id=3),
    ShutdownCommand(),
]
EVENTS = [
    RankHeartbeat(),
    RankJoining(timeout_s=5),
    RankJoined(rank=1, world_size=2),
    RankLoadProgress(progress=LoadProgress(layers_loaded=1, total=2, rank=1)),
    RankReady(rank=1, model="m", load_seconds=1.0, blas="x", weights_bytes=1, peak_memory_bytes=2),
    RankChunk(request_id=3, chunk=TextChunk(text="a")),
    RankChunk(request_id=3, chunk=PrefillProgress(done=12, total=51)),
    RankRequestError(request_id=3, cause="c", fix="f"),
    RankIdle(request_id=3),
    RankFailed(rank=None, reason="r"),
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.type)
def test_commands_round_trip(command: object) -> None:
    assert decode_command(encode(command)) == command  # type: ignore[arg-type]


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: e.type)
def test_events_round_trip(event: object) -> None:
    line = encode(event)  # type: ignore[arg-type]
    assert line.endswith("\n") and line.count("\n") == 1
    assert decode_event(line) == event


@pytest.mark.parametrize(
    "line",
    [
        "not json",
        '{"type": "reboot"}',
        '{"type": "cancel"}',
        '{"type": "cancel", "request_id": 1, "extra": true}',
        '{"type": "idle", "request_id": 1}',  # an event is not a command
    ],
)
def test_a_bad_command_fails_at_the_edge(line: str) -> None:
    with pytest.raises(ValidationError):
        decode_command(line)


def test_a_runner_given_a_bad_frame_says_so_and_exits() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "exo_tui.cluster.worker.runner"],
        input=b'{"type": "reboot"}\n',
        capture_output=True,
        cwd=ROOT,
        timeout=60,
    )
    assert result.returncode == 2
    events = [decode_event(line) for line in result.stdout.splitlines()]
    failed = events[-1]
    assert isinstance(failed, RankFailed) and "bad command" in failed.reason
