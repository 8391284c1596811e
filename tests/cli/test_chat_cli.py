"""`exo-tui chat` and `exo-tui models` as a user runs them: real subprocesses, real tiny models."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from engine.blas import find_openblas
from engine.parsers import tool_schema
from engine.prefill import FIRST_STEP
from exo_tui.chat.tools import BUILTIN_TOOLS

EXO_TUI = [sys.executable, "-m", "exo_tui.cli"]


def run_cli(*args: str, stdin: str | None = None, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return subprocess.run(
        [*EXO_TUI, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, **(env or {})},
    )


def events(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def test_json_lines_match_mlx_lm_greedy(tiny_llama: Path) -> None:
    from mlx_lm import load, stream_generate

    prompt = "Name three rivers."
    result = run_cli(
        "chat",
        "--model",
        str(tiny_llama),
        "--prompt",
        prompt,
        "--json",
        "--temperature",
        "0",
        "--max-tokens",
        "60",
    )
    assert result.returncode == 0, result.stderr
    out = events(result.stdout)
    kinds = [e["type"] for e in out]
    layers = [e for e in out if e["type"] == "load"]
    assert [e["layers_loaded"] for e in layers] == list(range(1, layers[0]["total"] + 1))
    assert kinds.index("ready") > kinds.index("load")
    assert kinds[-1] == "done"
    assert "text" in kinds
    done = out[-1]
    assert set(done) >= {"usage", "stats", "token_ids", "finish_reason"}

    # The same prompt by hand: the chat template with the built-in tools `chat` offers.
    model, tokenizer = load(str(tiny_llama))[:2]
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}],
        tools=[tool_schema(tool) for tool in BUILTIN_TOOLS],
        add_generation_prompt=True,
    )
    reference = [r.token for r in stream_generate(model, tokenizer, ids, max_tokens=60)]
    assert done["token_ids"] == reference
    text = "".join(e["text"] for e in out if e["type"] == "text")
    assert text == tokenizer.decode(reference).removeprefix(" ")  # mlx-lm trims the first space


def test_prompt_from_stdin_and_plain_text_output(tiny_llama: Path) -> None:
    result = run_cli(
        "chat",
        "--model",
        str(tiny_llama),
        "--temperature",
        "0",
        "--max-tokens",
        "10",
        stdin="Hello from a pipe",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    assert "decode" in result.stderr and "tok/s" in result.stderr


def test_models_lists_cards(tiny_llama: Path) -> None:
    models_dir = tiny_llama.parent
    result = run_cli("models", "--json", "--models-dir", str(models_dir))
    assert result.returncode == 0, result.stderr
    cards = [c for c in events(result.stdout) if c["path"] == str(tiny_llama)]
    assert len(cards) == 1
    card = cards[0]
    assert card["model_type"] == "llama"
    assert card["num_layers"] == 4
    assert card["source"] == "models_dir"


def expect_clean_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in result.stderr, result.stderr


def test_missing_path(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    result = run_cli("chat", "--model", str(missing), "--prompt", "hi")
    expect_clean_error(result, "nowhere", "exo-tui models")


def test_folder_without_config(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    result = run_cli("chat", "--model", str(tmp_path / "empty"), "--prompt", "hi")
    expect_clean_error(result, "config.json", str(tmp_path / "empty"))


@pytest.fixture
def model_copy(tiny_llama: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(tiny_llama, copy)
    return copy


def test_unknown_model_type(model_copy: Path) -> None:
    config = json.loads((model_copy / "config.json").read_text())
    config["model_type"] = "llamazing"
    (model_copy / "config.json").write_text(json.dumps(config))
    result = run_cli("chat", "--model", str(model_copy), "--prompt", "hi")
    expect_clean_error(result, "llamazing")


def test_truncated_safetensors(model_copy: Path) -> None:
    shard = sorted(model_copy.glob("*.safetensors"))[-1]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    result = run_cli("chat", "--model", str(model_copy), "--prompt", "hi")
    expect_clean_error(result, shard.name, "truncated")


def test_missing_tokenizer(model_copy: Path) -> None:
    (model_copy / "tokenizer.json").unlink()
    (model_copy / "tokenizer_config.json").unlink()
    result = run_cli("chat", "--model", str(model_copy), "--prompt", "hi")
    expect_clean_error(result, "tokenizer")


def test_empty_prompt(tiny_llama: Path) -> None:
    result = run_cli("chat", "--model", str(tiny_llama), "--prompt", "  ")
    expect_clean_error(result, "prompt is empty")


def test_prompt_longer_than_context(tiny_model_factory) -> None:  # type: ignore[no-untyped-def]
    path = tiny_model_factory("llama", max_position_embeddings=64)
    result = run_cli("chat", "--model", str(path), "--prompt", "many words " * 100)
    expect_clean_error(result, "holds at most 64", "new chat")


def test_blas_choice_keeps_tokens_identical(tiny_llama: Path) -> None:
    args = (
        "chat",
        "--model",
        str(tiny_llama),
        "--prompt",
        "Compare BLAS.",
        "--json",
        "--temperature",
        "0",
        "--max-tokens",
        "40",
    )
    fast = events(run_cli(*args).stdout)
    reference = events(run_cli(*args, env={"EXO_TUI_BLAS": "off"}).stdout)
    ready_fast = next(e for e in fast if e["type"] == "ready")
    ready_ref = next(e for e in reference if e["type"] == "ready")
    assert ready_ref["blas"].startswith("reference")
    if find_openblas() is None:
        pytest.skip("no system OpenBLAS on this machine (apt install libopenblas0-pthread)")
    assert ready_fast["blas"].startswith("openblas")
    assert fast[-1]["token_ids"] == reference[-1]["token_ids"]


def test_json_lines_carry_the_prefills_progress_and_text_leaves_it_out(tiny_llama: Path) -> None:
    prompt = "Tell me about the sea and the ships. " * 10
    args = ("chat", "--model", str(tiny_llama), "--prompt", prompt, "--max-tokens", "4")
    result = run_cli(*args, "--json", "--temperature", "0")
    assert result.returncode == 0, result.stderr
    out = events(result.stdout)
    done = out[-1]
    total = done["usage"]["prompt_tokens"] - done["usage"]["cached_tokens"]
    progress = [e for e in out if e["type"] == "prefill"]
    # A model's first prompt starts with a small step: its speed is not known yet.
    assert progress and progress[0] == {"type": "prefill", "done": FIRST_STEP, "total": total}
    steps = [e["done"] for e in progress]
    assert steps == sorted(set(steps)) and steps[-1] == total
    kinds = [e["type"] for e in out]
    assert len(kinds) - kinds[::-1].index("prefill") <= kinds.index("text")  # then the words

    text = run_cli(*args)
    assert text.returncode == 0, text.stderr
    assert text.stdout.strip() and "prefill" not in text.stdout  # (stderr: the stats line)
