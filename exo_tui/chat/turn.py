"""One chat turn with tools: generate, run each tool call, feed the results back, generate again.

A generator, like loading: it yields every chunk and tool result as it happens and returns the
messages the turn added (assistant messages with their tool calls, tool results, the answer), so
the CLI prints them, the TUI draws them and the chat store keeps them, each in its own way.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from functools import partial

from engine.generate import CancelToken, generate
from engine.loading import LoadedModel
from engine.types import (
    ChatRequest,
    Chunk,
    DoneChunk,
    Message,
    ReasoningChunk,
    TextChunk,
    ToolCall,
    ToolCallChunk,
    ToolResult,
)
from exo_tui.chat.tools import ToolRegistry

MAX_TOOL_ROUNDS = 5

TurnEvent = Chunk | ToolResult
# What answers one request: engine.generate over a loaded model, or a ring's chat.
GenerateFn = Callable[[ChatRequest, CancelToken | None], Iterator[Chunk]]


def chat_turn(
    model: LoadedModel | GenerateFn,
    request: ChatRequest,
    tools: ToolRegistry,
    cancel: CancelToken | None = None,
    max_tool_rounds: int = MAX_TOOL_ROUNDS,
) -> Generator[TurnEvent, None, list[Message]]:
    """Answer the last message of `request`, running tool calls; returns the new messages."""
    answer_with: GenerateFn = partial(generate, model) if isinstance(model, LoadedModel) else model
    messages = list(request.messages)
    added: list[Message] = []
    for round_ in range(max_tool_rounds + 1):
        text: list[str] = []
        reasoning: list[str] = []
        calls: list[ToolCallChunk] = []
        finish = "stop"
        for chunk in answer_with(request.model_copy(update={"messages": tuple(messages)}), cancel):
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
