"""The chat pane: the conversation, and each answer streamed part by part."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Literal

from markdown_it import MarkdownIt
from textual.actions import SkipAction
from textual.app import ComposeResult, RenderResult
from textual.await_complete import AwaitComplete
from textual.await_remove import AwaitRemove
from textual.containers import Vertical, VerticalScroll
from textual.content import Content
from textual.css.query import QueryType
from textual.geometry import Size
from textual.message import Message
from textual.widget import AwaitMount, Widget
from textual.widgets import Collapsible, Markdown, Static
from textual.widgets.markdown import MarkdownBlock, MarkdownStream

from engine.types import (
    Chunk,
    DoneChunk,
    ErrorChunk,
    PrefillProgress,
    ReasoningChunk,
    TextChunk,
    ToolCallChunk,
    ToolResult,
)
from engine.types import Message as ChatMessage
from exo_tui.app.keys import shown
from exo_tui.app.widgets import quiet
from exo_tui.app.widgets.sized import SizedByTheLayout
from exo_tui.app.widgets.tool_card import ToolCallView


def code_blocks(markdown: str) -> list[str]:
    """The fenced and indented code blocks of a Markdown text, in order, as Textual's Markdown
    parses them (markdown-it)."""
    tokens = MarkdownIt("gfm-like").parse(markdown)
    return [t.content.rstrip("\n") for t in tokens if t.type in ("fence", "code_block")]


def format_stats(done: DoneChunk) -> str:
    """The stats line under an answer: "TTFT 120 ms · 42.1 tok/s · 12+80 tokens · stop"."""
    usage, stats = done.usage, done.stats
    tokens = f"{usage.prompt_tokens}+{usage.completion_tokens} tokens"
    if usage.cached_tokens:
        tokens += f" ({usage.cached_tokens} cached)"
    parts = [f"TTFT {stats.ttft_s * 1000:.0f} ms"]
    if usage.completion_tokens > 1:  # one token has a time to it, not a rate
        parts.append(f"{stats.decode_tps:.1f} tok/s")
    ending = done.finish_reason.replace("_", " ")
    if done.finish_reason == "length":  # the answer did not end: say where, and what lifts it
        ending = (
            f"stopped at the {usage.completion_tokens:,}-token cap "
            f"({shown('chat.settings')} raises it)"
        )
    return " · ".join((*parts, tokens, ending))


class AnswerMarkdown(SizedByTheLayout, Markdown):
    """Markdown of an answer, its blocks sized by the layout (see SizedByTheLayout)."""

    BLOCKS: dict[str, type[MarkdownBlock]] = {
        name: type(block.__name__, (SizedByTheLayout, block), {})
        for name, block in Markdown.BLOCKS.items()
    }


class ReasoningView(SizedByTheLayout, Collapsible):
    """An answer's reasoning, collapsible, sized by the layout (see SizedByTheLayout)."""

    Contents = type("Contents", (SizedByTheLayout, Collapsible.Contents), {})


class UserMessage(SizedByTheLayout, Static):
    """What the user asked, shown as typed (no markup, no Markdown)."""

    DEFAULT_CSS = """
    UserMessage {
        margin: 1 0 0 0;
        padding: 0 1;
        background: $boost;
        border-left: thick $primary;
    }
    """

    def __init__(self, text: str) -> None:
        super().__init__(Content(text))
        self.text = text


class ErrorLine(SizedByTheLayout, Static):
    """An error the generation reported."""

    DEFAULT_CSS = """
    ErrorLine {
        padding: 0 1;
        color: $error;
        text-style: bold;
    }
    """

    def __init__(self, message: str) -> None:
        super().__init__(Content(f"error: {message}"))
        self.message = message


class StatsLine(SizedByTheLayout, Static):
    """Timing and token counts of one generation round."""

    DEFAULT_CSS = """
    StatsLine {
        padding: 0 1;
        color: $text-muted;
        &.-cancelled { color: $warning; }
        &.-mid-answer { margin-bottom: 1; }
    }
    """

    def __init__(self, done: DoneChunk) -> None:
        super().__init__(Content(format_stats(done)))
        self.done = done
        self.set_class(done.finish_reason == "cancelled", "-cancelled")


class _StreamedPart:
    """One Markdown part of an answer (text or reasoning) while its deltas arrive."""

    def __init__(self, kind: Literal["text", "reasoning"], markdown: Markdown, first: str) -> None:
        self.kind = kind
        self.markdown = markdown
        self.pieces: list[str] = [first]  # the markdown was made with its first words
        self.stream: MarkdownStream | None = None  # from the second delta on

    async def write(self, delta: str) -> None:
        self.pieces.append(delta)
        if self.stream is None:
            self.stream = Markdown.get_stream(self.markdown)
        await self.stream.write(delta)

    async def finish(self) -> None:
        if self.stream is None:
            return  # all of it came at once: the markdown was parsed whole when it was made
        # Appends re-parse only the tail of the document, so the final full parse is the truth.
        await self.stream.stop()
        await self.markdown.update("".join(self.pieces))


class AnswerView(SizedByTheLayout, Widget):
    """One assistant answer: reasoning, text, tool calls, errors and stats, in arrival order.

    Streamed with `feed`, or built finished from stored assistant and tool messages.
    """

    DEFAULT_CSS = """
    AnswerView {
        height: auto;
        margin: 1 0 0 0;
        & > Markdown { padding: 0 1; margin: 0; }
        & > .answer-wait { padding: 0 1; color: $text-muted; }
        & > Collapsible {
            margin: 0 1 1 1;
            padding-bottom: 0;
            border-top: none;
            & Markdown { padding: 0 1; color: $text-muted; }
        }
    }
    """

    class Feed(Message):
        """Chunks and tool results for this answer, handled in the answer's own queue.

        Posted straight to the AnswerView (from any thread), so drawing a long answer never holds
        up the app's queue, where key presses arrive.
        """

        def __init__(self, events: Sequence[Chunk | ToolResult]) -> None:
            super().__init__()
            self.events = list(events)

    class Prefilling(Message):
        """The answer's prompt started going through the model in steps, or its prefill
        ended: the chat's border says which (`prefilling`, `answering`)."""

    def __init__(
        self, messages: Sequence[ChatMessage] = (), stats: Sequence[DoneChunk | None] = ()
    ) -> None:
        """A finished answer from `messages` (each with its stats line in `stats`, if any), or
        with none, one to stream."""
        super().__init__()
        self._texts: list[list[str]] = []
        self._part: _StreamedPart | None = None
        self._reasoning: Collapsible | None = None
        self._fold_later = False  # the reasoning stayed open for a user scrolled up
        self._tools: dict[str, ToolCallView] = {}
        self._stored: list[Widget] = self._stored_widgets(messages, stats)
        # A streamed answer says it is waiting (and for how long) until its first chunk. It
        # draws that itself while it holds nothing (a widget with nothing to show would show
        # its own name), so the first words replace it in the layout they cost anyway.
        # What the wait's seconds are counted on (a snapshot's scene stops it).
        self.clock: Callable[[], float] = time.monotonic
        self.wait_started = self.clock()
        self._streamed = not messages
        self._stopping: Static | None = None  # "Stopping…", once the user asked
        self._prefill: PrefillProgress | None = None  # how far the prompt has gone, until words
        # A later round's prefill (after a tool call), shown as a line under what came before.
        self._prefill_line: Static | None = None

    @classmethod
    def stored(cls, messages: Sequence[tuple[ChatMessage, DoneChunk | None]]) -> AnswerView:
        """A finished answer: its messages, each with its stats line or None."""
        return cls([message for message, _ in messages], [done for _, done in messages])

    @property
    def prefilling(self) -> bool:
        """Whether the model reports its prefill's progress and no words have come yet."""
        return self._prefill is not None

    @property
    def text(self) -> str:
        """The answer's text so far, every part (for copying)."""
        return "\n\n".join(text for part in self._texts if (text := "".join(part)))

    def compose(self) -> ComposeResult:
        yield from self._stored

    def on_mount(self) -> None:
        if self._streamed:
            self.set_interval(1.0, self._tick)

    def render(self) -> RenderResult:
        if self.children or not self._streamed:
            return super().render()
        return Content.styled(self._wait_text(), "dim")

    def _wait_text(self) -> str:
        waited = self.clock() - self.wait_started
        doing = "waiting for the model"
        if self._prefill is not None:
            doing = f"prefilling {self._prefill.done:,} / {self._prefill.total:,} tokens"
        return f"{doing} · {waited:.0f} s · {shown('app.stop')} stops"

    def _tick(self) -> None:
        if not self.children:
            self.refresh()  # the same one line: a repaint, not a layout
        elif self._prefill_line is not None:
            self._prefill_line.update(self._wait_text())

    async def _show_prefill(self) -> None:
        """The prefill's progress: the answer's one line until it holds anything, then (a
        round after a tool call) a line of its own under what came before."""
        if not self.children:
            self.refresh()  # the one line: a repaint, not a layout
        elif self._prefill_line is None:
            self._prefill_line = Static(self._wait_text(), classes="answer-wait")
            await self._add(self._prefill_line)
        else:
            self._prefill_line.update(self._wait_text())

    def stopping(self) -> None:
        """The user asked to stop: say so at once (the model stops at its next step)."""
        if self._stopping is None:
            self._stopping = Static("Stopping…", classes="answer-wait")
            self.mount(self._stopping)

    async def feed(self, chunk: Chunk) -> None:
        """Show one more chunk of the generation."""
        if self._prefill is not None and not isinstance(chunk, PrefillProgress):
            self._prefill = None  # the first words (or the end) replace the line
            self.post_message(self.Prefilling())
            line, self._prefill_line = self._prefill_line, None
            if line is not None:
                await line.remove()
        match chunk:
            case PrefillProgress():
                started = self._prefill is None
                self._prefill = chunk
                if started:
                    self.post_message(self.Prefilling())
                await self._show_prefill()
            case TextChunk(text=text):
                if text:
                    await self._write("text", text)
            case ReasoningChunk(text=text):
                if text:
                    await self._write("reasoning", text)
            case ToolCallChunk():
                await self._end_part()
                view = self._tools.get(chunk.id)
                if view is None:
                    view = self._tools[chunk.id] = ToolCallView(
                        chunk.id, chunk.name, chunk.arguments
                    )
                    await self._add(view)
            case ErrorChunk(message=message):
                await self._end_part()
                await self._add(ErrorLine(message))
            case DoneChunk():
                with self.app.batch_update():  # the final text and the stats: one redraw
                    await self._end_part()
                    await self._add(StatsLine(chunk))
                    if self._fold_later and self._reasoning is not None and self._followed():
                        self._fold_later, self._reasoning.collapsed = False, True
                self.wait_started = self.clock()  # a next round (after tool calls) waits anew

    async def on_answer_view_feed(self, message: Feed) -> None:
        for event in message.events:
            if isinstance(event, ToolResult):
                self.tool_result(event)
            else:
                await self.feed(event)

    def tool_result(self, result: ToolResult) -> None:
        """A tool call of this answer ran: show its result and status."""
        view = self._tools.get(result.id)
        if view is None:
            view = self._tools[result.id] = ToolCallView(result.id, result.name, {})
            self._add(view)
        view.set_result(result.content, result.ok)

    async def _write(self, kind: Literal["text", "reasoning"], text: str) -> None:
        if self._part is not None and self._part.kind == kind:
            await self._part.write(text)
            return
        await self._end_part()
        # A new part goes on screen with its first words: one layout (the screen's costliest
        # redraw), not one for the part and one more for its first block.
        markdown = AnswerMarkdown(text)
        with self.app.batch_update():
            if kind == "reasoning":
                self._reasoning = ReasoningView(markdown, title="reasoning", collapsed=False)
                await self._add(self._reasoning)
            else:
                # Folded once the answer starts, unless the user has scrolled up (reading it,
                # maybe): the view would lose what it shows, as the content shrank under it.
                # Then it folds at the answer's end, if the user is back at the end by then.
                if self._reasoning is not None:
                    self._fold_later = not self._followed()
                    self._reasoning.collapsed = not self._fold_later
                await self._add(markdown)
        self._part = _StreamedPart(kind, markdown, text)
        if kind == "text":
            self._texts.append(self._part.pieces)

    def _followed(self) -> bool:
        """Whether the chat shows the end of the conversation (or this answer is in none)."""
        pane = next((node for node in self.ancestors if isinstance(node, ChatPane)), None)
        return pane is None or pane.following

    def _add(self, widget: Widget) -> AwaitMount:
        if self._stopping is not None and isinstance(widget, StatsLine):
            self._stopping.remove()  # the stats line says how it ended
        # A round that ended in tool calls has its stats line mid-answer: give it air below.
        if self.children and isinstance(last := self.children[-1], StatsLine):
            last.add_class("-mid-answer")
        return self.mount(widget)

    async def _end_part(self) -> None:
        part, self._part = self._part, None
        if part is not None:
            await part.finish()

    def _stored_widgets(
        self, messages: Sequence[ChatMessage], stats: Sequence[DoneChunk | None]
    ) -> list[Widget]:
        widgets: list[Widget] = []
        padded = [*stats, *[None] * (len(messages) - len(stats))]
        for message, done in zip(messages, padded, strict=False):
            if message.role == "assistant":
                if message.reasoning:
                    reasoning = AnswerMarkdown(message.reasoning)
                    widgets.append(ReasoningView(reasoning, title="reasoning", collapsed=True))
                if message.content:
                    widgets.append(AnswerMarkdown(message.content))
                    self._texts.append([message.content])
                for call in message.tool_calls:
                    view = self._tools[call.id] = ToolCallView(call.id, call.name, call.arguments)
                    widgets.append(view)
                if done is not None:
                    widgets.append(StatsLine(done))
            elif message.role == "tool":
                call_id = message.tool_call_id or ""
                view = self._tools.get(call_id)
                if view is None:
                    view = self._tools[call_id] = ToolCallView(call_id, message.name or "tool", {})
                    widgets.append(view)
                view.set_result(message.content, None)
        for line in widgets[:-1]:  # as `_add` leaves a streamed answer's
            if isinstance(line, StatsLine):
                line.add_class("-mid-answer")
        return widgets


class _ChatLog(SizedByTheLayout, Vertical):
    """The entries of the conversation, one under the other."""


class ChatPane(SizedByTheLayout, VerticalScroll):
    """The conversation. It follows new content only while the view is at the bottom."""

    DEFAULT_CSS = """
    ChatPane {
        height: 1fr;
        padding: 0 1 1 1;
        & > .chat-log { height: auto; min-height: 100%; }
        & .chat-hint { color: $text-muted; padding: 1 0; }
    }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        # Anchoring a scroll view shorter than its content sets a negative scroll_y (the
        # conversation would sit at the bottom, and the first scroll jumps it to the top);
        # a log at least as tall as the view avoids that.
        self._log = _ChatLog(classes="chat-log")
        self._hint = Static("", classes="chat-hint")

    def compose(self) -> ComposeResult:
        yield self._log

    def set_hint(self, text: str) -> None:
        """What an empty chat says to do; the first entry hides it."""
        quiet.show(self._hint, text)  # asked at every cluster event: most say the same
        if not self._hint.is_attached:
            self._log.mount(self._hint)
        self._hint.display = not self.entries()

    def entries(self) -> list[Widget]:
        """The conversation's entries on screen (the hint aside)."""
        return [child for child in self._log.children if child is not self._hint]

    def on_mount(self) -> None:
        # Anchoring keeps the view at the bottom as content grows, at layout time, which a
        # check before each append cannot do: streamed Markdown lands later, in a task.
        # Scrolling away releases the anchor; scrolling back to the end restores it.
        self.anchor()

    def action_scroll_end(self) -> None:
        # A jump, not Textual's one-second animation: the animation's frames go on toward the
        # end it started for, over the anchor's scroll to lines laid out meanwhile, so the view
        # went back up and could rest short of the end once an answer stopped.
        if not self.allow_vertical_scroll:
            raise SkipAction()
        self.scroll_end(animate=False)

    def _scroll_update(self, virtual_size: Size) -> None:
        # Content that shrank under a view scrolled up (a part folded, a line taken away)
        # brings the view to the new end, and Textual takes that for the user scrolling back
        # (the anchor holds again, and the view follows). The user has not: it stays released.
        released = self._anchor_released
        super()._scroll_update(virtual_size)
        self._anchor_released = released

    @property
    def following(self) -> bool:
        """Is the view at the bottom, so that new content keeps it there?"""
        return self.is_vertical_scroll_end or self._held_by_anchor

    @property
    def _held_by_anchor(self) -> bool:
        return self.is_anchored and not self._anchor_released

    def remove_children(
        self, selector: str | type[QueryType] | Iterable[Widget] = "*"
    ) -> AwaitRemove:
        """Remove conversation entries; the log that holds them (and the hint) stays."""
        if selector == "*":
            selector = self.entries()
        self._hint.display = True
        return self._log.remove_children(selector)

    def show_messages(
        self, messages: Sequence[ChatMessage], stats: Sequence[DoneChunk | None] = ()
    ) -> AwaitComplete:
        """Replace the pane's content with a stored chat (system messages are not shown), each
        answer with the stats lines in `stats` (one per message, in order; None for none)."""
        widgets: list[Widget] = []
        answer: list[tuple[ChatMessage, DoneChunk | None]] = []
        padded = [*stats, *[None] * (len(messages) - len(stats))]
        for message, done in zip(messages, padded, strict=False):
            if message.role in ("assistant", "tool"):
                answer.append((message, done))
                continue
            if answer:
                widgets.append(AnswerView.stored(answer))
                answer = []
            if message.role == "user":
                widgets.append(UserMessage(message.content))
        if answer:
            widgets.append(AnswerView.stored(answer))

        async def show() -> None:
            await self._log.remove_children(self.entries())
            self._hint.display = not widgets
            await self._log.mount_all(widgets)
            self.scroll_end(animate=False)

        return AwaitComplete(show())

    def add_user(self, text: str) -> AwaitMount:
        """Show what the user sent."""
        return self._append(UserMessage(text))

    async def start_answer(self) -> AnswerView:
        """A new assistant answer, to be fed chunks as they are generated."""
        answer = AnswerView()
        await self._append(answer)
        return answer

    def add_answer(self, answer: AnswerView) -> AwaitMount:
        """An answer in place of the one `drop_from_last_user` took away."""
        return self._append(answer)

    def drop_from_last_user(self, keep_user: bool) -> AwaitRemove:
        """Take away what came after the last message the user sent (and that message too,
        unless `keep_user`): the answer to regenerate, or the message to send again."""
        entries = self.entries()
        users = [i for i, entry in enumerate(entries) if isinstance(entry, UserMessage)]
        start = (users[-1] + (1 if keep_user else 0)) if users else len(entries)
        return self._log.remove_children(entries[start:])

    def add_turn(self, text: str, answer: AnswerView) -> AwaitMount:
        """What the user sent and its answer, mounted together (one layout, not two).

        The answer takes chunks before it is mounted: they wait in its queue."""
        return self._append(UserMessage(text), answer)

    def _append(self, *widgets: Widget) -> AwaitMount:
        # An anchored view follows at layout time; scrolling as well would cost one more.
        scroll = self.is_vertical_scroll_end and not self._held_by_anchor
        self._hint.display = False
        mounted = self._log.mount_all(widgets)
        if scroll:
            self.scroll_end(animate=False)
        return mounted
