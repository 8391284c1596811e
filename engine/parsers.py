"""Split streamed model text into answer, reasoning and tool calls with mlx-lm's markers.

The tokenizer wrapper knows the model's reasoning markers (`<think>` / `</think>`, from the
vocabulary) and its tool-call markers and parser (from the chat template). Markers may arrive
split across tokens, so text that could be the start of a marker is held back until it is decided.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Literal, cast

from engine.types import ErrorChunk, ReasoningChunk, TextChunk, ToolCallChunk, ToolSpec

ParsedChunk = TextChunk | ReasoningChunk | ToolCallChunk | ErrorChunk
ToolParser = Callable[[str, Any], Any]
State = Literal["text", "reasoning", "tool"]


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:12]}"


class OutputParser:
    """Feed it decoded text as it streams; it returns the chunks that are settled so far."""

    def __init__(
        self,
        *,
        think_start: str | None,
        think_end: str | None,
        tool_call_start: str | None,
        tool_call_end: str | None,
        tool_parser: ToolParser | None,
        tools: Sequence[ToolSpec] = (),
        start_in_reasoning: bool = False,
    ) -> None:
        self._think = (think_start, think_end) if think_start and think_end else None
        self._tool = (tool_call_start, tool_call_end) if tool_call_start and tool_call_end else None
        self._tool_parser = tool_parser
        self._tools = [tool_schema(tool) for tool in tools] or None
        self._state: State = "reasoning" if start_in_reasoning and self._think else "text"
        self._buffer = ""

    def feed(self, text: str) -> list[ParsedChunk]:
        self._buffer += text
        chunks: list[ParsedChunk] = []
        while True:
            marker, next_state = self._exit_marker()
            if marker is None:
                break
            index = self._buffer.find(marker)
            if index < 0:
                break
            chunks.extend(self._emit(self._buffer[:index], final=True))
            self._buffer = self._buffer[index + len(marker) :]
            self._state = next_state
        # Hold back a tail that may be the beginning of a marker.
        keep = self._held_back_length()
        settled, self._buffer = (
            self._buffer[: len(self._buffer) - keep],
            self._buffer[len(self._buffer) - keep :],
        )
        chunks.extend(self._emit(settled, final=False))
        return chunks

    def finish(self) -> list[ParsedChunk]:
        """Flush what is left; an unclosed tool call becomes an error, never a hang."""
        rest, self._buffer = self._buffer, ""
        if self._state == "tool":
            self._state = "text"
            opening = self._tool[0] if self._tool else ""
            return [
                ErrorChunk(
                    message="The model stopped in the middle of a tool call "
                    f"(no closing marker): {rest.strip()[:200]!r}",
                    output=opening + rest,
                )
            ]
        return self._emit(rest, final=False)

    def _markers(self) -> list[tuple[str, State]]:
        if self._state == "text":
            found: list[tuple[str, State]] = []
            if self._think:
                found.append((self._think[0], "reasoning"))
            if self._tool:
                found.append((self._tool[0], "tool"))
            return found
        if self._state == "reasoning" and self._think:
            return [(self._think[1], "text")]
        if self._state == "tool" and self._tool:
            return [(self._tool[1], "text")]
        return []

    def _exit_marker(self) -> tuple[str | None, State]:
        """The marker that appears first in the buffer, and the state it leads to."""
        best: tuple[int, str, State] | None = None
        for marker, state in self._markers():
            index = self._buffer.find(marker)
            if index >= 0 and (best is None or index < best[0]):
                best = (index, marker, state)
        if best is None:
            return None, self._state
        return best[1], best[2]

    def _held_back_length(self) -> int:
        if self._state == "tool":
            return len(self._buffer)  # a tool call is parsed whole, at its closing marker
        longest = 0
        for marker, _ in self._markers():
            for size in range(min(len(marker) - 1, len(self._buffer)), 0, -1):
                if self._buffer.endswith(marker[:size]):
                    longest = max(longest, size)
                    break
        return longest

    def _emit(self, text: str, *, final: bool) -> list[ParsedChunk]:
        if self._state == "tool":
            return self._parse_tool_call(text) if final else []
        if not text:
            return []
        if self._state == "reasoning":
            return [ReasoningChunk(text=text)]
        return [TextChunk(text=text)]

    def _parse_tool_call(self, text: str) -> list[ParsedChunk]:
        """The calls in `text` (a tool call's body); an error where it cannot be read, which
        carries the call as the model wrote it."""
        opening, closing = self._tool or ("", "")
        return [
            chunk.model_copy(update={"output": opening + text + closing})
            if isinstance(chunk, ErrorChunk)
            else chunk
            for chunk in self._read_tool_call(text)
        ]

    def _read_tool_call(self, text: str) -> list[ParsedChunk]:
        if self._tool_parser is None:
            return [
                ErrorChunk(message=f"The model emitted a tool call but has no parser: {text!r}")
            ]
        try:
            parsed: Any = self._tool_parser(text, self._tools)
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            return [
                ErrorChunk(
                    message=f"The model's tool call is not valid JSON ({error}): "
                    f"{text.strip()[:200]!r}"
                )
            ]
        calls: list[Any] = parsed if isinstance(parsed, list) else [parsed]  # pyright: ignore[reportUnknownVariableType]
        return [_tool_call_chunk(call, text) for call in calls]


def _tool_call_chunk(call: Any, text: str) -> ToolCallChunk | ErrorChunk:
    fields = cast(dict[str, Any], call) if isinstance(call, dict) else {}
    name = fields.get("name")
    if not isinstance(name, str):
        return ErrorChunk(message=f"The model's tool call has no tool name: {text.strip()[:200]!r}")
    return tool_call_chunk(name, fields.get("arguments", {}))


def tool_call_chunk(name: str, arguments: object) -> ToolCallChunk | ErrorChunk:
    """A call to `name`; `arguments` may be JSON text (empty means none) or already parsed."""
    if isinstance(arguments, str):
        try:
            arguments = cast(object, json.loads(arguments)) if arguments.strip() else {}
        except json.JSONDecodeError as error:
            return ErrorChunk(
                message=f"The arguments of the model's call to {name} are not valid JSON "
                f"({error}): {arguments[:200]!r}"
            )
    if not isinstance(arguments, dict):
        return ErrorChunk(
            message=f"The arguments of the model's call to {name} are not a JSON object: "
            f"{arguments!r}"
        )
    return ToolCallChunk(id=new_call_id(), name=name, arguments=cast(dict[str, Any], arguments))


def tool_schema(tool: ToolSpec) -> dict[str, Any]:
    """A tool in the OpenAI function format that chat templates expect."""
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        },
    }
