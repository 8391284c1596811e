"""`exo-tui chat --cluster`: this process and a real node share the model; same tokens as one."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from tests.cli.test_chat_cli import events, run_cli
from tests.cluster.node_process import KEY, StartNode


def test_chat_over_the_cluster_matches_one_process(
    start: StartNode, tiny_llama: Path, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    shutil.copytree(tiny_llama, models / "tiny-llama")
    peer = start("peer", "--models-dir", str(models))
    common = ("--model", "tiny-llama", "--models-dir", str(models), "--prompt", "hello there",
              "--max-tokens", "24", "--temperature", "0", "--json")  # fmt: skip
    alone = run_cli("chat", *common)
    assert alone.returncode == 0, alone.stderr
    env = {**os.environ, "EXO_TUI_HOME": str(tmp_path / "me")}
    together = run_cli(
        "chat", *common, "--cluster", "--no-mdns", "--port", "0", "--peer", peer.address,
        "--key", KEY, "--discover", "2", env=env,
    )  # fmt: skip
    assert together.returncode == 0, together.stderr
    lines = events(together.stdout)
    loads = [e for e in lines if e["type"] == "load"]
    loaded_on = {e["node_id"] for e in loads}
    assert peer.node_id in loaded_on and len(loaded_on) == 2  # the peer and this process
    for node_id in {e["node_id"] for e in loads}:
        last = [e for e in loads if e["node_id"] == node_id][-1]
        assert last["layers_loaded"] == last["total"] > 0
    done = [e for e in lines if e["type"] == "done"][-1]
    assert (
        done["token_ids"]
        == [e for e in events(alone.stdout) if e["type"] == "done"][-1]["token_ids"]
    )


def test_a_node_that_is_not_there_is_a_clear_error(tmp_path: Path) -> None:
    env = {**os.environ, "EXO_TUI_HOME": str(tmp_path / "me")}
    result = run_cli(
        "chat", "--cluster", "--no-mdns", "--port", "0", "--key", KEY, "--discover", "0.5",
        "--nodes", "nowhere", "--prompt", "hi", env=env,
    )  # fmt: skip
    assert result.returncode == 2
    assert "node nowhere was not found" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_node_without_the_model_is_refused_before_anything_loads(
    start: StartNode, tiny_llama: Path, tmp_path: Path
) -> None:
    models, empty = tmp_path / "models", tmp_path / "empty"
    shutil.copytree(tiny_llama, models / "tiny-llama")
    empty.mkdir()
    peer = start("bare", "--models-dir", str(empty))
    env = {**os.environ, "EXO_TUI_HOME": str(tmp_path / "me")}
    result = run_cli(
        "chat", "--model", "tiny-llama", "--models-dir", str(models), "--prompt", "hi", "--json",
        "--cluster", "--no-mdns", "--port", "0", "--peer", peer.address, "--key", KEY,
        "--discover", "2", env=env,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "node bare has no model called tiny-llama" in result.stderr
    assert '"load"' not in result.stdout


def test_a_prompt_past_the_context_fails_on_the_cluster_as_on_one_machine(
    start: StartNode, tiny_model_factory: Callable[..., Path], tmp_path: Path
) -> None:
    models = tmp_path / "models"
    shutil.copytree(tiny_model_factory("llama", max_position_embeddings=64), models / "short")
    peer = start("peer", "--models-dir", str(models))
    common = ("--model", "short", "--models-dir", str(models), "--prompt", "many words " * 100,
              "--temperature", "0")  # fmt: skip
    alone = run_cli("chat", *common)
    assert alone.returncode == 2 and "holds at most 64" in alone.stderr, alone.stderr
    message = alone.stderr.strip().splitlines()[-1].removeprefix("exo-tui: ")
    env = {**os.environ, "EXO_TUI_HOME": str(tmp_path / "me")}
    cluster = ("--cluster", "--no-mdns", "--port", "0", "--peer", peer.address, "--key", KEY,
               "--discover", "2")  # fmt: skip
    together = run_cli("chat", *common, *cluster, "--json", env=env)
    assert together.returncode == alone.returncode, together.stdout
    assert "Traceback" not in together.stderr, together.stderr
    # The ranks' refusal is raised as one machine's is: no answer events, the same message.
    types = [e["type"] for e in events(together.stdout)]
    assert types[-1] == "ready" and not {"text", "error", "done"} & set(types), types
    assert together.stderr.strip().splitlines()[-1].removeprefix("exo-tui: ") == message
    as_text = run_cli("chat", *common, *cluster, env=env)
    assert as_text.returncode != 0
    assert message in as_text.stderr.replace("\n", " "), as_text.stderr
