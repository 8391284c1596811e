"""A reopened chat shows the stats lines its answers had, and a turn cut off by quitting says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.types import DoneChunk, FinishReason, Message, Stats, ToolCall, Usage
from exo_tui.app.turn_stats import stats_of, turn_stats
from exo_tui.app.widgets.chat import AnswerView, StatsLine
from exo_tui.app.widgets.prompt import PromptInput
from tests.app.helpers import HeldBackend, wait_until
from tests.app.test_app import SIZE, launch, make_app
from tests.app.test_chat_redo import answered

pytestmark = pytest.mark.anyio


async def test_a_reopened_chat_has_its_stats_lines_and_marks_a_turn_stopped_by_quitting(
    models_dir: Path,
) -> None:
    app = make_app(models_dir)
    app.conversation.max_tokens = 3
    async with app.run_test(size=SIZE) as pilot:
        await launch(app, pilot)
        await pilot.click(PromptInput)
        await pilot.press(*"Hello", "enter")
        await wait_until(pilot, lambda: answered(app, 3))
        live = str(app.query_one(StatsLine).render())
        assert app.conversation.backend is not None
        app.conversation.backend = HeldBackend(app.conversation.backend)  # type: ignore[assignment]
        await pilot.press(*"And then?", "enter")
        await wait_until(pilot, lambda: len(app.query(AnswerView)) == 2)
        assert app.conversation.generating
    # The app quit while the second answer had not begun (a long prefill, say).

    again = make_app(models_dir)
    async with again.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: len(again.query(StatsLine)) == 2)
        first, second = again.query(StatsLine)
        # Drawn: each stats line lies inside its answer (outside it, it is never painted).
        for line in (first, second):
            await wait_until(pilot, lambda line=line: line.region.height > 0)
            answer = next(a for a in line.ancestors if isinstance(a, AnswerView))
            assert answer.region.contains_region(line.region), (answer.region, line.region)
        assert str(first.render()) == live
        assert not first.has_class("-cancelled")
        assert "cancelled" in str(second.render()) and second.has_class("-cancelled")


def test_each_round_s_stats_go_with_the_assistant_message_it_made() -> None:
    def done(reason: FinishReason, tokens: int) -> DoneChunk:
        usage = Usage(prompt_tokens=10, completion_tokens=tokens)
        stats = Stats(ttft_s=0.1, prefill_tps=100.0, decode_tps=20.0, peak_memory_bytes=1)
        return DoneChunk(finish_reason=reason, usage=usage, stats=stats, token_ids=(1, 2))

    call = ToolCall(id="c1", name="calculator", arguments={"expression": "1+1"})
    added = [
        Message(role="assistant", content="", tool_calls=(call,)),
        Message(role="tool", content="2", tool_call_id="c1", name="calculator"),
        Message(role="assistant", content="It is 2."),
    ]
    first, last = done("tool_calls", 5), done("stop", 4)
    records = turn_stats(added, [first, last])
    assert records[1] is None
    assert "token_ids" not in (records[0] or {})
    assert [stats_of(r) for r in records] == [
        first.model_copy(update={"token_ids": ()}),
        None,
        last.model_copy(update={"token_ids": ()}),
    ]
    assert stats_of({"finish_reason": "from a newer version"}) is None
