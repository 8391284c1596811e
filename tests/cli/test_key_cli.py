"""`exo-tui key` as a user runs it: real subprocesses on a temporary exo-tui home."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from exo_tui.cluster.identity import KEY_ENV, ClusterKey

EXO_TUI = [sys.executable, "-m", "exo_tui.cli"]


def exo_tui_key(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Runs with the test's environment, where the exo_home fixture has set EXO_TUI_HOME."""
    return subprocess.run(
        [*EXO_TUI, "key", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def printed_key(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1, result.stdout
    return lines[0]


def test_the_same_key_is_printed_every_time(exo_home: Path) -> None:
    first = exo_tui_key()
    key = printed_key(first)
    assert printed_key(exo_tui_key()) == key
    assert (exo_home / "config" / "cluster.key").read_text().strip() == key
    fingerprint = ClusterKey(text=key).fingerprint
    assert fingerprint in first.stderr
    assert f"exo-tui node --key {key}" in first.stderr and f"{KEY_ENV}={key}" in first.stderr


def test_new_replaces_the_key(exo_home: Path) -> None:
    old = printed_key(exo_tui_key())
    replaced = exo_tui_key("--new")
    new = printed_key(replaced)
    assert new != old
    assert "refused" in replaced.stderr
    assert printed_key(exo_tui_key()) == new


def test_show_fingerprint_prints_only_the_fingerprint(exo_home: Path) -> None:
    key = printed_key(exo_tui_key())
    shown = exo_tui_key("--show-fingerprint")
    assert printed_key(shown) == ClusterKey(text=key).fingerprint
    assert shown.stderr == ""


def test_a_key_from_the_environment_is_shown_but_not_stored(exo_home: Path) -> None:
    key = "a-key-from-the-environment-gkQF7kE62AC5FXJGgPYYQn7L_aj0VdyzzkzmjAbqieI"
    result = exo_tui_key(env={KEY_ENV: key})
    assert printed_key(result) == key
    assert KEY_ENV in result.stderr
    assert not (exo_home / "config" / "cluster.key").exists()


def test_a_bad_key_is_one_clear_line(exo_home: Path) -> None:
    result = exo_tui_key(env={KEY_ENV: "short"})
    assert result.returncode == 2
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1
    assert KEY_ENV in result.stderr and "exo-tui key" in result.stderr


def test_nodes_started_together_agree_on_one_key(exo_home: Path) -> None:
    starts = [
        subprocess.Popen([*EXO_TUI, "key"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        for _ in range(6)
    ]
    keys = {process.communicate(timeout=60)[0] for process in starts}
    assert all(process.returncode == 0 for process in starts)
    assert len(keys) == 1
    assert keys.pop().decode().strip() == (exo_home / "config" / "cluster.key").read_text().strip()


def test_a_node_given_a_guessable_key_refuses_to_start_in_one_clear_line(exo_home: Path) -> None:
    result = subprocess.run(
        [*EXO_TUI, "node", "--no-mdns", "--port", "0", "--key", "correct-horse-battery-staple"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1
    assert "too easy to guess" in result.stderr and "exo-tui key --new" in result.stderr
