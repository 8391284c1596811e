"""`exo-tui serve` as a user runs it: a real process, the URL it prints, Ctrl+C; and on a
cluster with a real `exo-tui node` peer, the same greedy tokens as on one machine."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.cluster.node_process import KEY, ROOT, StartNode

OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


class ServeProcess:
    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "exo_tui.cli", "serve", "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**os.environ, **OFFLINE, **(env or {})},
        )
        assert self.process.stdout is not None
        self.url = ""
        for line in self.process.stdout:
            found = re.search(r"on (http://127\.0\.0\.1:\d+) ", line)
            if found:
                self.url = found.group(1)
                break
        assert self.url, self.process.stderr.read() if self.process.stderr else ""

    def interrupt(self) -> tuple[int, str]:
        self.process.send_signal(signal.SIGINT)
        _, err = self.process.communicate(timeout=60)
        return self.process.returncode, err


@pytest.fixture
def serving() -> Iterator[list[ServeProcess]]:
    started: list[ServeProcess] = []
    yield started
    for served in started:
        if served.process.poll() is None:
            served.process.kill()
            served.process.wait()


def test_serve_answers_the_openai_client_and_stops_on_ctrl_c(
    serving: list[ServeProcess], tmp_path: Path
) -> None:
    served = ServeProcess(env={"EXO_TUI_HOME": str(tmp_path / "home")})
    serving.append(served)
    api = openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0)
    answer = api.chat.completions.create(
        model="demo", messages=[{"role": "user", "content": "hello"}], temperature=0, max_tokens=20
    )
    assert (answer.choices[0].message.content or "").strip()
    code, err = served.interrupt()
    assert code == 0, err
    assert "Traceback" not in err


def test_serve_refuses_an_open_address_without_a_key() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "exo_tui.cli", "serve", "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert result.returncode == 2
    assert "not a loopback address" in result.stderr and "--api-key" in result.stderr


def test_max_batch_sets_how_many_answer_at_once_and_the_rest_queue(
    serving: list[ServeProcess], tiny_llama: Path, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    shutil.copytree(tiny_llama, models / "tiny-llama")
    served = ServeProcess(
        "--model", "tiny-llama", "--models-dir", str(models), "--max-batch", "1",
        env={"EXO_TUI_HOME": str(tmp_path / "home")},
    )  # fmt: skip
    serving.append(served)
    # The tiny model's greedy answer never ends early: the first answer is still decoding when
    # the second request comes.
    body = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 1500, "temperature": 0, "stream": True}  # fmt: skip
    url = f"{served.url}/v1/chat/completions"
    with (
        httpx.Client(timeout=120) as first_client,
        httpx.Client(timeout=120) as second_client,
        first_client.stream("POST", url, json=body) as first,
    ):
        lines = first.iter_lines()
        assert "queue_position" not in next(lines)  # it answers at once
        with second_client.stream("POST", url, json=body) as second:
            head = json.loads(next(second.iter_lines()).removeprefix("data: "))
            assert head["queue_position"] == 1  # one at a time: it waits its turn
        assert any('"finish_reason":"length"' in line for line in lines)  # it ran to the end
    code, err = served.interrupt()
    assert code == 0, err


def test_max_batch_is_refused_with_the_cluster_and_below_one() -> None:
    for options, said in (
        (("--cluster", "--max-batch", "4", "--no-mdns", "--discover", "0"), "--no-cluster"),
        (("--max-batch", "0"), "0 is not a number of requests: use a whole number of 1 or more"),
    ):
        result = subprocess.run(
            [sys.executable, "-m", "exo_tui.cli", "serve", "--port", "0", *options],
            capture_output=True, text=True, cwd=ROOT, timeout=120,
            env={**os.environ, **OFFLINE},
        )  # fmt: skip
        assert result.returncode == 2, result.stderr
        assert said in result.stderr


def test_the_help_gives_the_engines_default_batch() -> None:
    from engine.batching import DEFAULT_BATCH

    result = subprocess.run(
        [sys.executable, "-m", "exo_tui.cli", "serve", "--help"],
        capture_output=True, text=True, cwd=ROOT, timeout=120, env={**os.environ, "COLUMNS": "400"},
    )  # fmt: skip
    assert f"(default {DEFAULT_BATCH}; each holds its own KV cache)" in result.stdout


def test_serve_on_the_cluster_gives_the_tokens_of_one_machine(
    start: StartNode, tiny_llama: Path, tmp_path: Path, serving: list[ServeProcess]
) -> None:
    models = tmp_path / "models"
    shutil.copytree(tiny_llama, models / "tiny-llama")
    peer = start("peer", "--models-dir", str(models))
    common = ("--model", "tiny-llama", "--models-dir", str(models))
    body = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hello there"}],
            "max_tokens": 24, "temperature": 0}  # fmt: skip
    alone = ServeProcess(*common, env={"EXO_TUI_HOME": str(tmp_path / "alone")})
    serving.append(alone)
    expected = httpx.post(f"{alone.url}/v1/chat/completions", json=body, timeout=120).json()
    assert alone.interrupt()[0] == 0
    together = ServeProcess(
        *common, "--cluster", "--no-mdns", "--node-port", "0", "--peer", peer.address,
        "--key", KEY, "--discover", "2", env={"EXO_TUI_HOME": str(tmp_path / "me")},
    )  # fmt: skip
    serving.append(together)
    answer = httpx.post(f"{together.url}/v1/chat/completions", json=body, timeout=120).json()
    assert answer["choices"][0]["message"] == expected["choices"][0]["message"]
    assert answer["usage"]["completion_tokens"] == expected["usage"]["completion_tokens"] == 24
    # The ranks refuse a prompt past the context: a 400 with the numbers, as on one machine.
    long = {**body, "messages": [{"role": "user", "content": "hello there " * 3000}]}
    refused = httpx.post(f"{together.url}/v1/chat/completions", json=long, timeout=120)
    assert refused.status_code == 400, refused.text
    assert "2048" in refused.json()["error"]["message"]
    again = httpx.post(f"{together.url}/v1/chat/completions", json=body, timeout=120).json()
    assert again["choices"][0]["message"] == expected["choices"][0]["message"]  # it goes on
    code, err = together.interrupt()
    assert code == 0, err
