"""A tool card is one line (the call and what it returned) until Enter or a click opens it."""

from __future__ import annotations

import pytest
from textual.widgets._collapsible import CollapsibleTitle

from engine.types import ToolCallChunk, ToolResult
from exo_tui.app.widgets.tool_card import ToolCallView, ToolDetails, tool_line
from tests.app.helpers import wait_until
from tests.app.test_chat_widgets import SIZE, ChatApp, done, start


def test_the_folded_line_is_one_line_cut_short_and_never_markup() -> None:
    assert tool_line({"expression": "2+2"}, "4") == '{"expression": "2+2"} → 4'
    long = tool_line({"text": "x" * 200}, "line one\nline two")
    assert len(long) <= 72 and long.endswith("…") and "\n" not in long
    assert tool_line({}, "[b]bold?[/b]") == "{} → \\[b]bold?\\[/b]"


@pytest.mark.anyio
async def test_a_tool_card_opens_on_click_and_on_enter() -> None:
    async with ChatApp().run_test(size=SIZE) as pilot:
        _, answer = await start(pilot)
        await answer.feed(
            ToolCallChunk(id="call-1", name="calculator", arguments={"expression": "2+2"})
        )
        await answer.feed(done("tool_calls"))
        answer.tool_result(ToolResult(id="call-1", name="calculator", content="4", ok=True))
        view = answer.query_one(ToolCallView)
        details = view.query_one(ToolDetails)
        title = details.query_one(CollapsibleTitle)
        await wait_until(pilot, lambda: '{"expression": "2+2"} → 4' in str(title.render()))
        assert details.collapsed
        await wait_until(pilot, lambda: view.region.height == 3)  # the border and one line
        assert not view.query_one(".tool-result").region.height

        await pilot.click(title)
        await wait_until(pilot, lambda: not details.collapsed)
        await wait_until(pilot, lambda: view.query_one(".tool-result").region.height == 1)
        assert str(view.query_one(".tool-arguments").render()) == '{"expression": "2+2"}'

        title.focus()
        await pilot.press("enter")
        await wait_until(pilot, lambda: details.collapsed and view.region.height == 3)
