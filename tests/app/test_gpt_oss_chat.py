"""The TUI with a gpt-oss model (tests/scripted_gpt_oss.py): its reasoning shows as reasoning,
its calculator call runs, and its answer uses the result."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from textual.widgets import Markdown

from exo_tui.app.main import ExoTuiApp
from exo_tui.app.widgets.chat import AnswerView, ReasoningView, StatsLine
from exo_tui.app.widgets.prompt import PromptInput
from exo_tui.app.widgets.tool_card import ToolCallView
from exo_tui.cluster.control.state import RunnerReady
from tests.app.helpers import fixed_stats, wait_until
from tests.scripted_gpt_oss import Script

pytestmark = pytest.mark.anyio


async def test_reasoning_shows_the_call_runs_and_the_answer_uses_its_result(
    scripted_gpt_oss: Path, tmp_path: Path
) -> None:
    script = Script()
    models = tmp_path / "models"
    shutil.copytree(scripted_gpt_oss, models / "gpt-oss")
    app = ExoTuiApp(model="gpt-oss", models_dirs=[models], node_stats=fixed_stats(), bundled=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: app.selection.card is not None)
        await pilot.press("ctrl+l")
        await wait_until(pilot, lambda: isinstance(app.state.nodes[0].runner, RunnerReady), 60)
        await wait_until(pilot, lambda: app.conversation.backend is not None)
        app.query_one(PromptInput).text = "What is 6 times 7?"
        await pilot.press("enter")
        await wait_until(
            pilot, lambda: not app.conversation.generating and len(app.query(StatsLine)) == 2, 60
        )
        (reasoning,) = app.query(ReasoningView)
        assert reasoning.query_one(Markdown).source == script.reasoning
        call = app.query_one(ToolCallView)
        assert call.tool_name == "calculator" and call.status == "ok"
        assert call.result == script.result_marker
        assert app.query_one(AnswerView).text == script.answer
        roles = [m.role for m in app.conversation.messages]
        assert roles[-4:] == ["user", "assistant", "tool", "assistant"]
        assert app.conversation.messages[-3].reasoning == script.reasoning
