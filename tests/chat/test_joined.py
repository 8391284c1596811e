"""What a reader that fell behind the tokens takes: runs of text (or reasoning) as one chunk."""

from __future__ import annotations

from engine.types import (
    Chunk,
    PrefillProgress,
    ReasoningChunk,
    TextChunk,
    ToolCallChunk,
)
from exo_tui.chat.backend import cancelled_done
from exo_tui.chat.turn import joined


def test_runs_of_text_and_of_reasoning_join_and_nothing_else_moves() -> None:
    call = ToolCallChunk(id="call-1", name="calculator", arguments={"expression": "2 * 3"})
    done = cancelled_done()
    events: list[Chunk] = [
        ReasoningChunk(text="let me "),
        ReasoningChunk(text="think"),
        TextChunk(text="It is "),
        TextChunk(text="six"),
        TextChunk(text="."),
        call,
        TextChunk(text="alone"),
        ReasoningChunk(text="again"),
        done,
    ]
    assert joined(events) == [
        ReasoningChunk(text="let me think"),
        TextChunk(text="It is six."),
        call,
        TextChunk(text="alone"),
        ReasoningChunk(text="again"),
        done,
    ]


def test_of_a_run_of_prefill_reports_only_the_latest_counts() -> None:
    events: list[Chunk] = [
        PrefillProgress(done=512, total=2048),
        PrefillProgress(done=1024, total=2048),
        TextChunk(text="a"),
        PrefillProgress(done=2048, total=2048),
    ]
    assert joined(events) == [
        PrefillProgress(done=1024, total=2048),
        TextChunk(text="a"),
        PrefillProgress(done=2048, total=2048),
    ]


def test_nothing_and_one_chunk_come_back_as_they_were() -> None:
    one = TextChunk(text="x")
    assert joined([]) == []
    assert joined([one])[0] is one
