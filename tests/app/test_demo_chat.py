"""The TUI with the bundled demo model: a question about the cluster runs a live tool call."""

from __future__ import annotations

import json

import pytest

from exo_tui.app.main import ExoTuiApp
from exo_tui.app.widgets.chat import AnswerView, StatsLine
from exo_tui.app.widgets.prompt import PromptInput
from exo_tui.app.widgets.tool_card import ToolCallView
from exo_tui.cluster.control.state import RunnerReady
from tests.app.helpers import fixed_stats, wait_until

pytestmark = pytest.mark.anyio


async def test_cluster_question_calls_cluster_status_and_answers_from_it() -> None:
    app = ExoTuiApp(model="demo", node_stats=fixed_stats())
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(
            pilot, lambda: app.selection.card is not None and app.selection.card.source == "bundled"
        )
        await pilot.press("ctrl+l")
        await wait_until(pilot, lambda: isinstance(app.state.nodes[0].runner, RunnerReady))
        await wait_until(pilot, lambda: app.conversation.backend is not None)
        app.query_one(PromptInput).text = "how much memory does my cluster have?"
        await pilot.press("enter")
        # Both rounds' stats lines (the tool call's, then the answer's): the answer's last
        # words reach its widget in its own queue, not before the turn's end.
        await wait_until(
            pilot, lambda: not app.conversation.generating and len(app.query(StatsLine)) == 2, 60
        )
        call = app.query_one(ToolCallView)
        assert call.tool_name == "cluster_status"
        assert call.status == "ok"
        status = json.loads(call.result or "{}")
        assert status["nodes"][0]["name"] == "studio"  # read from the live state
        answer = app.query_one(AnswerView).text
        assert str(status["total_memory_gb"]) in answer  # the answer uses the tool's result
        roles = [m.role for m in app.conversation.messages]
        assert roles == ["system", "user", "assistant", "tool", "assistant"]
