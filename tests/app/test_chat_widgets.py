"""Chat widgets driven by Pilot and a scripted chunk stream: streaming, tools, scrolling, prompt."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
from textual.app import App, ComposeResult
from textual.color import Color
from textual.pilot import Pilot
from textual.widgets import Collapsible, Markdown, Static
from textual.widgets.markdown import MarkdownFence

from engine.types import (
    DoneChunk,
    ErrorChunk,
    FinishReason,
    Message,
    PrefillProgress,
    ReasoningChunk,
    Stats,
    TextChunk,
    ToolCall,
    ToolCallChunk,
    ToolResult,
    Usage,
)
from exo_tui.app.widgets.chat import (
    AnswerView,
    ChatPane,
    ErrorLine,
    StatsLine,
    UserMessage,
    format_stats,
)
from exo_tui.app.widgets.prompt import PromptInput
from exo_tui.app.widgets.tool_card import ToolCallView
from tests.app.helpers import wait_until

SIZE = (100, 30)


class ChatApp(App[None]):
    """A chat pane above a prompt, nothing else."""

    AUTO_FOCUS = "PromptInput"

    def __init__(self, history: Sequence[str] = ()) -> None:
        super().__init__()
        self._history = history
        self.submitted: list[str] = []

    def compose(self) -> ComposeResult:
        yield ChatPane()
        yield PromptInput(history=self._history)

    def on_mount(self) -> None:
        # A blinking cursor would make snapshots flaky.
        self.query_one(PromptInput).cursor_blink = False

    def on_prompt_input_submitted(self, message: PromptInput.Submitted) -> None:
        self.submitted.append(message.text)


def done(
    finish_reason: FinishReason = "stop",
    *,
    ttft_s: float = 0.12,
    decode_tps: float = 42.1,
    prompt_tokens: int = 12,
    completion_tokens: int = 80,
    cached_tokens: int = 8,
) -> DoneChunk:
    return DoneChunk(
        finish_reason=finish_reason,
        usage=Usage(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cached_tokens=cached_tokens,
        ),
        stats=Stats(ttft_s=ttft_s, prefill_tps=300.0, decode_tps=decode_tps, peak_memory_bytes=0),
        token_ids=(),
    )


def plain(widget: ErrorLine | StatsLine | UserMessage | Static) -> str:
    return str(widget.render())


async def start(pilot: Pilot[None]) -> tuple[ChatPane, AnswerView]:
    pane = pilot.app.query_one(ChatPane)
    return pane, await pane.start_answer()


@pytest.mark.anyio
async def test_markdown_split_mid_fence_renders_one_code_block() -> None:
    pieces = ["Here is code:\n\n``", "`py", "thon\nprint(", "'hi')\n", "x = 1\n``", "`\n\nDone."]
    async with ChatApp().run_test(size=SIZE) as pilot:
        _, answer = await start(pilot)
        for piece in pieces:
            await answer.feed(TextChunk(text=piece))
            await pilot.pause()
        await answer.feed(done())
        await pilot.pause()

        fences = list(answer.query(MarkdownFence))
        assert len(fences) == 1
        assert fences[0].lexer == "python"
        assert fences[0].code.strip() == "print('hi')\nx = 1"
        markdown = answer.query_one(Markdown)
        assert markdown.source == "".join(pieces)
        assert answer.text == "".join(pieces)


@pytest.mark.anyio
async def test_tool_call_then_result_flips_status_and_answer_continues() -> None:
    async with ChatApp().run_test(size=SIZE) as pilot:
        _, answer = await start(pilot)
        await answer.feed(TextChunk(text="Let me compute that."))
        await answer.feed(
            ToolCallChunk(id="call-1", name="calculator", arguments={"expression": "2+2"})
        )
        await answer.feed(ToolCallChunk(id="call-2", name="clock", arguments={}))
        await answer.feed(done("tool_calls"))
        views = list(answer.query(ToolCallView))
        assert [(view.tool_name, view.status) for view in views] == [
            ("calculator", "running"),
            ("clock", "running"),
        ]
        arguments = views[0].query_one(".tool-arguments")
        assert str(arguments.render()) == '{"expression": "2+2"}'

        answer.tool_result(ToolResult(id="call-2", name="clock", content="no clock", ok=False))
        answer.tool_result(ToolResult(id="call-1", name="calculator", content="4", ok=True))
        await wait_until(pilot, lambda: bool(views[0].query(".tool-result")))
        assert (views[0].status, views[1].status) == ("ok", "error")
        assert views[0].has_class("-ok") and views[1].has_class("-error")
        assert str(views[0].query_one(".tool-result").render()) == "→ 4"
        assert views[0].border_subtitle == "ok"

        # The model goes on in the same answer: a new text part after the tool calls.
        await answer.feed(TextChunk(text="2+2 is **4**."))
        await answer.feed(done())
        await pilot.pause()
        assert [type(child).__name__ for child in answer.children] == [
            "AnswerMarkdown",
            "ToolCallView",
            "ToolCallView",
            "StatsLine",
            "AnswerMarkdown",
            "StatsLine",
        ]
        assert answer.text == "Let me compute that.\n\n2+2 is **4**."


@pytest.mark.anyio
async def test_error_chunk_is_shown_in_the_error_colour() -> None:
    async with ChatApp().run_test(size=SIZE) as pilot:
        _, answer = await start(pilot)
        await answer.feed(TextChunk(text="Partial"))
        await answer.feed(ErrorChunk(message="runner exited [code 9]"))
        await pilot.pause()
        line = answer.query_one(ErrorLine)
        assert plain(line) == "error: runner exited [code 9]"
        error = Color.parse(pilot.app.theme_variables["error"])
        assert line.styles.color.rgb == error.rgb
        assert answer.text == "Partial"


@pytest.mark.anyio
async def test_reasoning_then_text_collapses_the_reasoning() -> None:
    async with ChatApp().run_test(size=SIZE) as pilot:
        _, answer = await start(pilot)
        await answer.feed(ReasoningChunk(text="The user wants "))
        await answer.feed(ReasoningChunk(text="a greeting."))
        block = answer.query_one(Collapsible)
        assert block.title == "reasoning"
        assert not block.collapsed

        await answer.feed(TextChunk(text="Hello!"))
        assert block.collapsed
        await answer.feed(done())
        await pilot.pause()
        assert block.query_one(Markdown).source == "The user wants a greeting."
        assert answer.text == "Hello!"
        children = [type(child).__name__ for child in answer.children]
        assert children == ["ReasoningView", "AnswerMarkdown", "StatsLine"]


@pytest.mark.anyio
async def test_stats_line() -> None:
    async with ChatApp().run_test(size=SIZE) as pilot:
        _, answer = await start(pilot)
        await answer.feed(TextChunk(text="Hi."))
        await answer.feed(done())
        await pilot.pause()
        line = answer.query_one(StatsLine)
        assert plain(line) == "TTFT 120 ms · 42.1 tok/s · 12+80 tokens (8 cached) · stop"
        assert not line.has_class("-cancelled")


def test_stats_text_when_cancelled_and_nothing_cached() -> None:
    chunk = done("cancelled", ttft_s=1.5, decode_tps=7.25, cached_tokens=0)
    assert format_stats(chunk) == "TTFT 1500 ms · 7.2 tok/s · 12+80 tokens · cancelled"
    assert format_stats(done("tool_calls")).endswith("· tool calls")


def lines(first: int, count: int) -> str:
    return "".join(f"line {i}\n\n" for i in range(first, first + count))


@pytest.mark.anyio
async def test_follows_the_bottom_while_at_the_bottom() -> None:
    async with ChatApp().run_test(size=SIZE) as pilot:
        pane, answer = await start(pilot)
        await answer.feed(TextChunk(text=lines(0, 30)))
        await wait_until(pilot, lambda: pane.max_scroll_y > 10)
        await wait_until(pilot, lambda: pane.scroll_y == pane.max_scroll_y)
        before = pane.max_scroll_y

        for i in range(30, 40):
            await answer.feed(TextChunk(text=lines(i, 1)))
        await wait_until(pilot, lambda: pane.max_scroll_y >= before + 15)
        await wait_until(pilot, lambda: pane.scroll_y == pane.max_scroll_y)


@pytest.mark.anyio
async def test_scrolled_up_view_stays_put_while_streaming() -> None:
    async with ChatApp().run_test(size=SIZE) as pilot:
        pane, answer = await start(pilot)
        await answer.feed(TextChunk(text=lines(0, 30)))
        await wait_until(pilot, lambda: pane.max_scroll_y > 10)
        await wait_until(pilot, lambda: pane.scroll_y == pane.max_scroll_y)

        pane.focus()
        await pilot.press("pageup")
        await pilot.wait_for_scheduled_animations()
        await wait_until(pilot, lambda: pane.scroll_y < pane.max_scroll_y)
        assert not pane.following
        scrolled_to, before = pane.scroll_y, pane.max_scroll_y

        for i in range(30, 40):
            await answer.feed(TextChunk(text=lines(i, 1)))
        await pane.add_user("another question")
        await wait_until(pilot, lambda: pane.max_scroll_y >= before + 15)
        await pilot.pause()
        assert pane.scroll_y == scrolled_to

        # Back at the end, it follows again.
        await pilot.press("end")
        await pilot.wait_for_scheduled_animations()
        await wait_until(pilot, lambda: pane.scroll_y == pane.max_scroll_y)
        before = pane.max_scroll_y
        await answer.feed(TextChunk(text=lines(40, 10)))
        await wait_until(pilot, lambda: pane.max_scroll_y >= before + 15)
        await wait_until(pilot, lambda: pane.scroll_y == pane.max_scroll_y)


@pytest.mark.anyio
async def test_show_messages_renders_a_stored_chat() -> None:
    messages = [
        Message(role="system", content="You are terse."),
        Message(role="user", content="What is [b]2+2[/b]?"),
        Message(
            role="assistant",
            reasoning="Use the calculator.",
            tool_calls=(ToolCall(id="c1", name="calculator", arguments={"expression": "2+2"}),),
        ),
        Message(role="tool", content="4", tool_call_id="c1", name="calculator"),
        Message(role="assistant", content="It is 4."),
        Message(role="user", content="Thanks"),
    ]
    async with ChatApp().run_test(size=SIZE) as pilot:
        pane = pilot.app.query_one(ChatPane)
        await pane.show_messages(messages)
        await pilot.pause()
        kinds = [type(entry).__name__ for entry in pane.query("UserMessage, AnswerView")]
        assert kinds == ["UserMessage", "AnswerView", "UserMessage"]
        assert plain(pane.query_one(UserMessage)) == "What is [b]2+2[/b]?"
        answer = pane.query_one(AnswerView)
        assert answer.query_one(Collapsible).collapsed
        view = answer.query_one(ToolCallView)
        assert view.status == "done"
        assert str(view.query_one(".tool-result").render()) == "→ 4"
        assert answer.text == "It is 4."

        # A new chat: the pane empties and takes new entries.
        await pane.remove_children()
        assert not pane.query("UserMessage, AnswerView")
        await pane.add_user("Hello again")
        await pane.show_messages(messages[:2])
        assert [plain(user) for user in pane.query(UserMessage)] == ["What is [b]2+2[/b]?"]
        await pane.remove_children()
        assert not pane.query("UserMessage, AnswerView")


async def type_text(pilot: Pilot[None], text: str) -> None:
    await pilot.press(*["space" if char == " " else char for char in text])


@pytest.mark.anyio
async def test_enter_sends_and_clears() -> None:
    app = ChatApp()
    async with app.run_test(size=SIZE) as pilot:
        prompt = pilot.app.query_one(PromptInput)
        assert prompt.has_focus
        await type_text(pilot, "hello there")
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.submitted == ["hello there"])
        assert prompt.text == ""

        await pilot.press("space", "space", "enter")
        await pilot.pause()
        assert app.submitted == ["hello there"]


@pytest.mark.anyio
async def test_ctrl_j_and_shift_enter_insert_a_newline() -> None:
    app = ChatApp()
    async with app.run_test(size=SIZE) as pilot:
        prompt = pilot.app.query_one(PromptInput)
        await pilot.press("a", "ctrl+j", "b", "shift+enter", "c")
        assert prompt.text == "a\nb\nc"
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.submitted == ["a\nb\nc"])


@pytest.mark.anyio
async def test_up_and_down_walk_the_history() -> None:
    app = ChatApp(history=["first", "second"])
    async with app.run_test(size=SIZE) as pilot:
        prompt = pilot.app.query_one(PromptInput)
        await type_text(pilot, "draft")
        await pilot.press("up")
        assert prompt.text == "second"
        await pilot.press("up")
        assert prompt.text == "first"
        await pilot.press("up")
        assert prompt.text == "first"
        await pilot.press("down")
        assert prompt.text == "second"
        await pilot.press("down")
        assert prompt.text == "draft"
        assert prompt.cursor_location == (0, 5)

        # Inside a multi-line prompt, Up and Down move the cursor first.
        await pilot.press("ctrl+j", "x")
        await pilot.press("up")
        assert prompt.text == "draft\nx"
        assert prompt.cursor_location[0] == 0
        await pilot.press("up")
        assert prompt.text == "second"

        await pilot.press("down", "down")
        assert prompt.text == "draft\nx"
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.submitted == ["draft\nx"])
        await pilot.press("up")
        assert prompt.text == "draft\nx"
        assert prompt.prompt_history == ["first", "second", "draft\nx"]


def test_snapshot_finished_answer(snap_compare: Callable[..., bool]) -> None:
    async def run_before(pilot: Pilot[None]) -> None:
        pane = pilot.app.query_one(ChatPane)
        await pane.add_user("What is 17 * 23?")
        answer = await pane.start_answer()
        for piece in ["The user wants ", "a product; use the calculator."]:
            await answer.feed(ReasoningChunk(text=piece))
        await answer.feed(TextChunk(text="Let me compute that."))
        await answer.feed(
            ToolCallChunk(id="c1", name="calculator", arguments={"expression": "17 * 23"})
        )
        await answer.feed(done("tool_calls", ttft_s=0.08, decode_tps=51.3, completion_tokens=24))
        answer.tool_result(ToolResult(id="c1", name="calculator", content="391", ok=True))
        for piece in ["17 × 23 = **3", "91**.\n\n```python\n", "17 * 23\n```"]:
            await answer.feed(TextChunk(text=piece))
        await answer.feed(done(ttft_s=0.12, prompt_tokens=60, completion_tokens=18))
        await pilot.pause()

    assert snap_compare(ChatApp(), terminal_size=(80, 32), run_before=run_before)


@pytest.fixture
def layouts(monkeypatch: pytest.MonkeyPatch) -> list[None]:
    """One entry per layout of the screen from now on (each places every widget again)."""
    from textual.screen import Screen

    counted: list[None] = []
    refresh_layout = Screen._refresh_layout

    def counting(screen: Screen[None], *args: object, **kwargs: object) -> None:
        counted.append(None)
        refresh_layout(screen, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Screen, "_refresh_layout", counting)
    return counted


@pytest.mark.anyio
@pytest.mark.parametrize("chunk", [TextChunk, ReasoningChunk])
async def test_a_streamed_append_costs_one_layout_and_the_answer_fits_its_text(
    layouts: list[None], chunk: type[TextChunk | ReasoningChunk]
) -> None:
    words = " ".join(f"word{i}" for i in range(400)).split(" ")
    async with ChatApp().run_test(size=SIZE) as pilot:
        pane, answer = await start(pilot)
        await pilot.pause()
        layouts.clear()
        for start_word in range(0, len(words), 20):
            await answer.feed(chunk(text=" ".join(words[start_word : start_word + 20]) + " "))
            await pilot.pause()
        appends = len(words) // 20
        # One layout per append (Textual's own echo layout made it two), give or take a few
        # (the scrollbar appearing).
        assert appends <= len(layouts) <= appends + appends // 4
        # The answer grew to hold all its text, and the view followed it to the bottom.
        markdown = answer.query_one(Markdown)
        characters = len(" ".join(words))
        assert markdown.size.height >= characters // markdown.content_size.width
        assert pane.scroll_y == pane.max_scroll_y > 0
        screen = [strip.text for strip in pilot.app.screen._compositor.render_strips()]
        assert any("word399" in line for line in screen[-8:])  # above the prompt and margins


@pytest.mark.anyio
async def test_a_turn_and_its_first_words_go_on_screen_in_two_layouts(
    layouts: list[None],
) -> None:
    # Each is a layout of the whole screen, the costliest redraw: the question with its empty
    # answer, then the first words with the Markdown that holds them (mounted one after the
    # other, and with each widget's own request for a layout before it was mounted: five).
    async with ChatApp().run_test(size=SIZE) as pilot:
        pane = pilot.app.query_one(ChatPane)
        await pilot.pause()
        layouts.clear()
        answer = AnswerView()
        await pane.add_turn("what is a pipeline?", answer)
        await pilot.pause()
        await answer.feed(TextChunk(text="Layers in order, "))
        await pilot.pause()
        await pilot.pause()
        assert len(layouts) == 2
        screen = [strip.text for strip in pilot.app.screen._compositor.render_strips()]
        assert any("Layers in order" in line for line in screen)
        # The rest of the part streams into the same Markdown; done parses it whole once.
        await answer.feed(TextChunk(text="a range per node."))
        await answer.feed(done())
        await pilot.pause()
        assert len(answer.query(Markdown)) == 1
        assert answer.query_one(Markdown).source == "Layers in order, a range per node."


@pytest.mark.anyio
async def test_a_part_that_came_whole_is_not_parsed_again_when_it_ends() -> None:
    async with ChatApp().run_test(size=SIZE) as pilot:
        _, answer = await start(pilot)
        await answer.feed(TextChunk(text="All of it **at once**."))
        markdown = answer.query_one(Markdown)
        blocks = list(markdown.children)
        await answer.feed(done())
        await pilot.pause()
        assert list(markdown.children) == blocks  # the same blocks: no second parse
        assert markdown.source == "All of it **at once**."


@pytest.mark.anyio
async def test_an_answer_says_it_waits_then_shows_its_first_words() -> None:
    async with ChatApp().run_test(size=SIZE) as pilot:
        pane, answer = await start(pilot)
        assert str(answer.render()) == "waiting for the model · 0 s · Esc stops"
        await wait_until(pilot, lambda: "· 1 s ·" in str(answer.render()), timeout=5)
        await answer.feed(TextChunk(text="Hello"))
        await wait_until(pilot, lambda: bool(answer.children))
        assert "waiting" not in str(answer.render())  # a container from now on
        assert answer.text == "Hello"


@pytest.mark.anyio
async def test_stopping_is_said_at_once_and_goes_with_the_stats() -> None:
    async with ChatApp().run_test(size=SIZE) as pilot:
        pane, answer = await start(pilot)
        await answer.feed(TextChunk(text="Hello"))
        answer.stopping()
        wait = answer.query_one(".answer-wait", Static)
        await wait_until(pilot, lambda: plain(wait) == "Stopping…")
        await answer.feed(done("cancelled", completion_tokens=1))
        await wait_until(pilot, lambda: not answer.query(".answer-wait"))
        assert answer.query(StatsLine)
        assert "tok/s" not in plain(answer.query_one(StatsLine))  # one token gives no rate


@pytest.mark.anyio
async def test_a_stepped_prefill_shows_how_far_it_has_gone_until_the_first_words() -> None:
    async with ChatApp().run_test(size=SIZE) as pilot:
        pane, answer = await start(pilot)
        await answer.feed(PrefillProgress(done=12, total=51))
        assert str(answer.render()) == "prefilling 12 / 51 tokens · 0 s · Esc stops"
        assert answer.prefilling
        await answer.feed(PrefillProgress(done=1024, total=2048))
        assert str(answer.render()).startswith("prefilling 1,024 / 2,048 tokens · ")
        await wait_until(pilot, lambda: "· 1 s ·" in str(answer.render()), timeout=5)
        await answer.feed(TextChunk(text="Hello"))
        await wait_until(pilot, lambda: bool(answer.children))
        assert not answer.prefilling
        assert "prefilling" not in str(answer.render())
        assert answer.text == "Hello"


@pytest.mark.anyio
async def test_a_round_after_a_tool_call_shows_its_prefill_under_what_came_before() -> None:
    async with ChatApp().run_test(size=SIZE) as pilot:
        pane, answer = await start(pilot)
        call = ToolCallChunk(id="call-1", name="calculator", arguments={"expression": "2+2"})
        await answer.feed(call)
        await answer.feed(done("tool_calls"))
        answer.tool_result(ToolResult(id="call-1", name="calculator", content="4", ok=True))
        await answer.feed(PrefillProgress(done=12, total=51))
        assert answer.prefilling
        line = answer.query_one(".answer-wait", Static)
        assert plain(line) == "prefilling 12 / 51 tokens · 0 s · Esc stops"
        assert answer.children[-1] is line  # under the tool card and its stats line
        await answer.feed(PrefillProgress(done=1024, total=2048))
        assert plain(line).startswith("prefilling 1,024 / 2,048 tokens · ")
        await wait_until(pilot, lambda: "· 1 s ·" in plain(line), timeout=5)

        await answer.feed(TextChunk(text="It is 4."))
        assert not answer.prefilling
        assert not answer.query(".answer-wait")
        await answer.feed(done())
        children = [type(child).__name__ for child in answer.children]
        assert children == ["ToolCallView", "StatsLine", "AnswerMarkdown", "StatsLine"]


@pytest.mark.anyio
async def test_a_later_rounds_prefill_and_its_words_in_one_batch_leave_no_line() -> None:
    async with ChatApp().run_test(size=SIZE) as pilot:
        pane, answer = await start(pilot)
        call = ToolCallChunk(id="call-1", name="calculator", arguments={"expression": "2+2"})
        result = ToolResult(id="call-1", name="calculator", content="4", ok=True)
        events = [call, done("tool_calls"), result, PrefillProgress(done=3, total=9)]
        answer.post_message(AnswerView.Feed([*events, TextChunk(text="4."), done()]))
        await wait_until(pilot, lambda: len(answer.query(StatsLine)) == 2)
        await pilot.pause()
        children = [type(child).__name__ for child in answer.children]
        assert children == ["ToolCallView", "StatsLine", "AnswerMarkdown", "StatsLine"]
        assert not answer.prefilling
