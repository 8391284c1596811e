"""Quitting the real TUI while a slow model is inside one long step (a prefill of many seconds):
it exits at once, with status 0, and the turn is kept as it stood, marked cancelled.

The model: 4-bit, wide enough that MLX's own kernels (EXO_TUI_KERNELS=mlx) take many seconds for
one pass over a long prompt, which no cancel can cut short.
"""

from __future__ import annotations

import json
import os
import pty
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.app.test_quit import _read
from tests.tiny_models import build_tiny_model

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "Summarise this: " + "many words about the sea and the ships " * 60
QUIT_WITHIN_S = 4.0  # the app waits QUIT_WAIT_S for the model, then ends; slack for a busy CI


@pytest.fixture(scope="module")
def slow_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mlx_lm import convert

    folder = tmp_path_factory.mktemp("slow")
    source = build_tiny_model(
        folder / "source", "llama", hidden_size=1024, intermediate_size=4096, num_layers=2,
        num_heads=8, num_kv_heads=4, shards=1,
    )  # fmt: skip
    convert(str(source), mlx_path=str(folder / "slow-q4"), quantize=True, q_bits=4)
    return folder / "slow-q4"


def test_quitting_mid_prefill_exits_at_once_and_keeps_the_turn(
    slow_model: Path, tmp_path: Path
) -> None:
    master, slave = pty.openpty()
    env = dict(os.environ, EXO_TUI_HOME=str(tmp_path), TERM="xterm-256color", EXO_TUI_KERNELS="mlx")
    app = subprocess.Popen(
        [sys.executable, "-m", "exo_tui.cli", "--no-cluster", "--model", str(slow_model), "--load"],
        stdin=slave, stdout=slave, stderr=slave, cwd=ROOT, env=env, start_new_session=True,
    )  # fmt: skip
    os.close(slave)
    out = bytearray()
    try:
        deadline = time.monotonic() + 120
        while b"Ask away" not in out and time.monotonic() < deadline:
            _read(master, out, 0.2)
        assert b"Ask away" in out, out[-2000:].decode(errors="replace")
        os.write(master, b"\x1b[200~" + PROMPT.encode() + b"\x1b[201~")  # one paste
        _read(master, out, 0.5)
        os.write(master, b"\r")
        mark = len(out)
        deadline = time.monotonic() + 60

        def started() -> bool:  # the answer waits, then counts the prefill's steps
            return b"waiting for the model" in out[mark:] or b"prefilling" in out[mark:]

        while not started() and time.monotonic() < deadline:
            _read(master, out, 0.1)
        assert started(), "the turn never started"
        _read(master, out, 1.0)  # well inside the prefill's one long step
        os.write(master, b"\x11")  # Ctrl+Q
        asked = time.monotonic()
        while app.poll() is None and time.monotonic() < asked + 120:
            _read(master, out, 0.05)
        took = time.monotonic() - asked
    finally:
        if app.poll() is None:
            app.kill()
        os.close(master)
    assert app.wait() == 0, out[-3000:].decode(errors="replace")
    with sqlite3.connect(tmp_path / "data" / "chats.db") as db:
        rows = db.execute("SELECT role, content, stats FROM messages ORDER BY position").fetchall()
    assert took < QUIT_WITHIN_S, f"quitting took {took:.1f} s"
    assert [role for role, _, _ in rows] == ["system", "user", "assistant"]
    assert rows[1][1] == PROMPT.strip()
    assert json.loads(rows[2][2])["finish_reason"] == "cancelled"  # the mark a reopen shows
