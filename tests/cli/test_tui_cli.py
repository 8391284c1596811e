"""`exo-tui` with no subcommand starts the TUI: with no --model (as `make run` does) it loads the
bundled demo by itself, so a newcomer's first key is a question (issue 19)."""

from __future__ import annotations

from typing import Any

import pytest

from exo_tui import cli
from exo_tui.app import main as app_main


@pytest.mark.parametrize(("argv", "load_demo"), [([], True), (["--model", "m1b-4bit"], False)])
def test_the_demo_loads_by_itself_only_when_no_model_is_asked_for(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], load_demo: bool
) -> None:
    started: list[dict[str, Any]] = []

    def run_app(**kwargs: Any) -> int:  # the terminal UI itself: tests/app drives it
        started.append(kwargs)
        return 0

    monkeypatch.setattr(app_main, "run_app", run_app)
    assert cli.main(argv) == 0
    assert [kwargs["load_demo"] for kwargs in started] == [load_demo]
