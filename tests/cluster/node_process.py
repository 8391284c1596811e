"""`exo-tui node` processes for tests: start one, read its JSON lines, clean them all up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.cluster.json_lines import JsonLines, Line

# Keys as `exo-tui key --new` makes them: a guessable key is refused.
KEY = "test-cluster-key-mGv8CSBpCI8-EsaOHO3mey2qazaChBGTLmgcNoTgCZI"
FOREIGN_KEY = "another-key-entirely-oEvKjUoWJGTekLYvLQEwD9llF38ygixuzwvFKlZ3A5s"
ROOT = Path(__file__).resolve().parents[2]


class NodeProcess:
    def __init__(self, process: subprocess.Popen[str], lines: JsonLines) -> None:
        self.process = process
        self.lines = lines
        listening = lines.wait_for(lambda seen: any(_is(x, "listening") for x in seen), 30)
        first = next(x for x in listening if _is(x, "listening"))
        self.node_id: str = first["node_id"]
        self.port: int = first["port"]
        self.fingerprint: str = first["fingerprint"]

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def sees(self, other: NodeProcess, timeout: float = 10.0) -> None:
        self.lines.wait_for(lambda seen: _joined(seen, other.node_id), timeout)

    def lost(self, other: NodeProcess, timeout: float) -> Line:
        seen = self.lines.wait_for(lambda lines: _lost(lines, other.node_id) is not None, timeout)
        found = _lost(seen, other.node_id)
        assert found is not None
        return found


def _is(line: Line, kind: str) -> bool:
    return line.get("type") == kind


def _joined(lines: list[Line], node_id: str) -> bool:
    return any(_is(x, "peer_stats") and x["node_id"] == node_id for x in lines)


def _lost(lines: list[Line], node_id: str) -> Line | None:
    return next((x for x in lines if _is(x, "peer_lost") and x["node_id"] == node_id), None)


StartNode = Callable[..., "NodeProcess"]


@pytest.fixture
def start(tmp_path: Path) -> Iterator[StartNode]:
    started: list[subprocess.Popen[str]] = []

    def start_node(
        name: str, *args: str, key: str = KEY, env: dict[str, str] | None = None
    ) -> NodeProcess:
        """`env`: more environment for this node (e.g. its own Hugging Face cache)."""
        env = {k: v for k, v in os.environ.items() if k != "EXO_TUI_KEY"} | (env or {})
        env["EXO_TUI_HOME"] = str(tmp_path / name)
        # Its ring folders too: a node killed by a test cannot remove them.
        env["TMPDIR"] = str(tmp_path / name)
        (tmp_path / name).mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "exo_tui.cli", "node", "--json", "--no-mdns", "--port", "0"]
        argv += ["--key", key, "--name", name, *args]
        process = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        started.append(process)
        assert process.stdout is not None
        return NodeProcess(process, JsonLines(process.stdout))

    yield start_node
    for process in started:
        if process.poll() is None:
            process.send_signal(signal.SIGCONT)
            process.kill()
        process.wait(timeout=10)
