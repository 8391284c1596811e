"""One chat turn with tools: generate, run each tool call, feed the results back, generate again.

A generator, like loading: it yields every chunk and tool result as it happens and returns the
messages the turn added (assistant messages with their tool calls, tool results, the answer), so
the CLI prints them, the TUI draws them and the chat store keeps them, each in its own way.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import TypeVar, cast

from engine.generate import CancelToken
from engine.types import (
    ChatRequest,
    Chunk,
    DoneChunk,
    Message,
    PrefillProgress,
    ReasoningChunk,
    TextChunk,
    ToolCall,
    ToolCallChunk,
    ToolResult,
)
from exo_tui.chat.backend import Backend
from exo_tui.chat.tools import ToolRegistry

MAX_TOOL_ROUNDS = 5

TurnEvent = Chunk | ToolResult
T = TypeVar("T")


def joined(events: Sequence[T]) -> list[T]:
    """`events` with each run of text (or of reasoning) as one chunk, made once for the run, and
    of a run of prefill reports only the latest: a reader that fell behind the tokens takes
    fewer, longer pieces."""
    out: list[T] = []
    run: list[TextChunk | ReasoningChunk] = []

    def close_run() -> None:
        if len(run) > 1:
            out.append(cast(T, type(run[0])(text="".join(chunk.text for chunk in run))))
        else:
            out.extend(cast(list[T], run))
        run.clear()

    for event in events:
        if isinstance(event, TextChunk | ReasoningChunk):
            if run and type(run[0]) is not type(event):
                close_run()
            run.append(event)
            continue
        close_run()
        if isinstance(event, PrefillProgress) and out and isinstance(out[-1], PrefillProgress):
            out[-1] = event
        else:
            out.append(event)
    close_run()
    return out


def chat_turn(
    backend: Backend,
    request: ChatRequest,
    tools: ToolRegistry,
    cancel: CancelToken | None = None,
    max_tool_rounds: int = MAX_TOOL_ROUNDS,
) -> Generator[TurnEvent, None, list[Message]]:
    """Answer the last message of `request`, running tool calls; returns the new messages."""
    messages = list(request.messages)
    added: list[Message] = []
    for round_ in range(max_tool_rounds + 1):
        text: list[str] = []
        reasoning: list[str] = []
        calls: list[ToolCallChunk] = []
        finish = "stop"
        for chunk in backend.generate(
            request.model_copy(update={"messages": tuple(messages)}), cancel
        ):
            yield chunk
            match chunk:
                case TextChunk():
                    text.append(chunk.text)
                case ReasoningChunk():
                    reasoning.append(chunk.text)
                case ToolCallChunk():
                    calls.append(chunk)
                case DoneChunk():
                    finish = chunk.finish_reason
                case _:
                    pass
        answer = Message(
            role="assistant",
            content="".join(text).strip(),
            reasoning="".join(reasoning).strip() or None,
            tool_calls=tuple(ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in calls),
        )
        messages.append(answer)
        added.append(answer)
        if finish != "tool_calls" or round_ == max_tool_rounds:
            return added
        for call in calls:
            content, ok = tools.run(call.name, call.arguments)
            yield ToolResult(id=call.id, name=call.name, content=content, ok=ok)
            result = Message(role="tool", content=content, tool_call_id=call.id, name=call.name)
            messages.append(result)
            added.append(result)
    return added
