"""Bad values on the command line: each one exits non-zero with a message that names the value
and what would be valid, never a traceback, and nothing runs on a value that makes no sense."""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.test_chat_cli import EXO_TUI, expect_clean_error, run_cli
from tests.cluster.node_process import KEY

# (arguments after `chat --model M --prompt hi`, words the error must contain)
BAD_CHAT_VALUES = [
    (["--seed", "-1"], ["seed is -1", "0 to 2^64 - 1"]),
    (["--seed", str(2**70)], [f"seed is {2**70}", "0 to 2^64 - 1"]),
    (["--temperature", "nan"], ["temperature is nan", "finite number of at least 0"]),
    (["--temperature", "inf"], ["temperature is inf", "finite number of at least 0"]),
    (["--temperature", "-1"], ["temperature is -1.0", "at least 0"]),
    (["--top-p", "0"], ["top_p is 0.0", "above 0 and at most 1"]),
    (["--top-p", "-1"], ["top_p is -1.0", "above 0 and at most 1"]),
    (["--top-p", "2"], ["top_p is 2.0", "above 0 and at most 1"]),
    (["--top-p", "nan"], ["top_p is nan", "above 0 and at most 1"]),
    (["--max-tokens", "0"], ["max_tokens is 0", "1 or more"]),
    (["--ranks", "0"], ["--ranks", "0 is not a number of processes", "1 or more"]),
    (["--ranks", "-2"], ["--ranks", "-2 is not a number of processes", "1 or more"]),
    (["--ranks", "9"], ["9 pipeline ranks", "has 4 layers", "at most 4 ranks"]),
    (["--model", ""], ["--model", "model name is empty"]),
    (["--port", "70000"], ["--port", "70000 is not a TCP port", "1 to 65535"]),
    (["--interface", "eth0"], ["--interface", "'eth0' is not an IP address"]),
    (["--discover", "-1"], ["--discover", "-1 is not a number of seconds"]),
]


@pytest.mark.parametrize(
    ("extra", "words"), BAD_CHAT_VALUES, ids=[" ".join(a) or "''" for a, _ in BAD_CHAT_VALUES]
)
def test_a_bad_chat_value_is_named_with_its_range(
    tiny_llama: Path, extra: list[str], words: list[str]
) -> None:
    result = run_cli("chat", "--model", str(tiny_llama), "--prompt", "hi", "--max-tokens", "3",
                     *extra)  # fmt: skip
    expect_clean_error(result, *words)
    assert not result.stdout.strip()  # nothing was generated


def run_with_bytes(*args: str, stdin: bytes, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return subprocess.run(
        [*EXO_TUI, *args],
        input=stdin,
        capture_output=True,
        timeout=240,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize(
    "mode", [[], ["--json"], ["--cluster", "--json"]], ids=["text", "json", "cluster"]
)
def test_standard_input_that_is_not_utf8_is_named(
    tiny_llama: Path, tmp_path: Path, mode: list[str]
) -> None:
    cluster = (
        ["--no-mdns", "--port", "0", "--key", KEY, "--discover", "0"]
        if mode[:1] == ["--cluster"]
        else []
    )
    result = run_with_bytes(
        "chat", "--model", str(tiny_llama), *mode, *cluster,
        stdin=b"caf\xe9 \xff\xfe", env={"EXO_TUI_HOME": str(tmp_path / "home")},
    )  # fmt: skip
    stderr = result.stderr.decode()
    assert result.returncode == 2, stderr
    assert "Traceback" not in stderr, stderr
    assert "Standard input is not UTF-8 text: byte 0xe9 at offset 3" in stderr
    assert not result.stdout.strip()


def test_a_prompt_argument_that_is_not_utf8_is_named(tiny_llama: Path) -> None:
    result = subprocess.run(
        [*EXO_TUI, "chat", "--model", str(tiny_llama), "--prompt", os.fsdecode(b"caf\xe9")],
        capture_output=True,
        text=True,
        timeout=240,
    )
    expect_clean_error(result, "--prompt is not UTF-8 text")


@pytest.fixture
def model_copy(tiny_llama: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(tiny_llama, copy)
    return copy


def test_a_broken_chat_template_names_the_file(model_copy: Path) -> None:
    config_path = model_copy / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = "{% for m in messages %}{{ m.content }{% endfor %}"
    config_path.write_text(json.dumps(config))
    result = run_cli("chat", "--model", str(model_copy), "--prompt", "hi", "--max-tokens", "3")
    expect_clean_error(result, "chat template of copy", "TemplateSyntaxError", str(config_path))


def test_weights_of_garbage_bytes_are_said_to_give_nan_logits(model_copy: Path) -> None:
    noise = random.Random(0)
    for shard in model_copy.glob("*.safetensors"):
        data = bytearray(shard.read_bytes())
        (header,) = struct.unpack("<Q", data[:8])  # the header stays: the file still loads
        data[8 + header :] = noise.randbytes(len(data) - 8 - header)
        shard.write_bytes(bytes(data))
    result = run_cli("chat", "--model", str(model_copy), "--prompt", "hi", "--max-tokens", "3")
    expect_clean_error(result, "copy computes NaN or infinite logits", "not numbers")
    assert not result.stdout.strip()


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        yield held.getsockname()[1]


def run_node(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "exo_tui.cli", "node", "--no-mdns", "--key", KEY, *args],
        capture_output=True,
        text=True,
        timeout=60,  # a hang guard: a node that starts would run until killed
        env={**os.environ, "EXO_TUI_HOME": str(home)},
    )


def test_a_node_on_a_port_in_use_says_so(busy_port: int, tmp_path: Path) -> None:
    result = run_node("--port", str(busy_port), home=tmp_path)
    expect_clean_error(result, f"port {busy_port} is in use", "--port N")
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--port", "70000"], ["70000 is not a TCP port", "1 to 65535"]),
        (["--interface", "not-an-address"], ["'not-an-address' is not an IP address"]),
        # 192.0.2.0/24 is kept for documentation (RFC 5737): no machine has it.
        (
            ["--interface", "192.0.2.7"],
            ["192.0.2.7 is not an address of this machine", "--interface"],
        ),
    ],
)
def test_a_node_with_a_bad_address_says_so(
    args: list[str], words: list[str], tmp_path: Path
) -> None:
    result = run_node(*args, home=tmp_path)
    expect_clean_error(result, *words)
    last = result.stderr.strip().splitlines()[-1]  # after argparse's usage, if any: the error
    assert last.startswith("exo-tui") and all(word in last for word in words), result.stderr


def test_a_hub_error_is_a_clean_error(tmp_path: Path) -> None:
    # A catalogue error is a HubError, not an EngineError: the command still prints it plainly.
    missing = tmp_path / "missing.toml"
    result = run_cli("models", env={"EXO_TUI_CATALOGUE": str(missing)})
    expect_clean_error(result, "missing.toml, named by EXO_TUI_CATALOGUE")
    assert result.returncode == 2
