"""Quitting the real TUI (a subprocess on a pseudo-terminal) right after a prompt, many times.

Every exit must be status 0 (MLX work stopped and waited for, not cut off by the interpreter's
end), and the chat must be in chats.db itself, not only in its write-ahead log.
"""

from __future__ import annotations

import os
import pty
import select
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
QUITS = 20


def _read(master: int, out: bytearray, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        ready, _, _ = select.select([master], [], [], 0.05)
        if ready:
            try:
                out += os.read(master, 65536)
            except OSError:  # the app closed the terminal
                return


def _ask_then_quit(home: Path) -> tuple[int, str]:
    """Start exo-tui with the bundled demo model, ask, quit at once; status and screen tail."""
    master, slave = pty.openpty()
    env = dict(os.environ, EXO_TUI_HOME=str(home), TERM="xterm-256color")
    app = subprocess.Popen(
        [sys.executable, "-m", "exo_tui.cli", "--no-cluster", "--load"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        cwd=ROOT,
        env=env,
        start_new_session=True,
    )
    os.close(slave)
    out = bytearray()
    try:
        deadline = time.monotonic() + 120
        while b"Ask away" not in out and time.monotonic() < deadline:
            _read(master, out, 0.2)
        assert b"Ask away" in out, "the demo model never became ready"
        os.write(master, b"What is 2+3?")
        _read(master, out, 0.3)
        os.write(master, b"\r")
        _read(master, out, 0.05)  # mid-answer, or in the next turn's prefill
        os.write(master, b"\x11")  # Ctrl+Q
        deadline = time.monotonic() + 120
        while app.poll() is None and time.monotonic() < deadline:
            _read(master, out, 0.1)
        if app.poll() is None:
            app.kill()
        return app.wait(), out[-3000:].decode(errors="replace")
    finally:
        os.close(master)


def test_quitting_right_after_a_prompt_exits_0_with_the_chat_in_the_file(tmp_path: Path) -> None:
    statuses: list[int] = []
    for run in range(QUITS):
        home = tmp_path / f"home-{run}"
        status, screen = _ask_then_quit(home)
        statuses.append(status)
        assert status == 0, f"quit {run + 1} of {QUITS} ended with {status}:\n{screen}"
        db = home / "data" / "chats.db"
        wal = db.with_name("chats.db-wal")
        assert not wal.exists() or wal.stat().st_size == 0, "writes left in the -wal file"
        copy = tmp_path / f"copy-{run}.db"
        shutil.copyfile(db, copy)  # the file alone, as a backup would take it
        with sqlite3.connect(copy) as raw:
            roles = [r for (r,) in raw.execute("SELECT role FROM messages ORDER BY position")]
        # The turn is whole: nothing, or the system prompt and the question and what followed.
        assert roles == [] or roles[:2] == ["system", "user"], roles
    assert statuses == [0] * QUITS
