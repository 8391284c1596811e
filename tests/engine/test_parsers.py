"""The output parser splits streamed text into answer, reasoning and tool calls."""

from __future__ import annotations

from mlx_lm.tool_parsers import json_tools

from engine.parsers import OutputParser, ParsedChunk
from engine.types import ErrorChunk, ReasoningChunk, TextChunk, ToolCallChunk, ToolSpec

CALC = ToolSpec(
    name="calculator",
    description="Evaluate an arithmetic expression",
    parameters={"type": "object", "properties": {"expression": {"type": "string"}}},
)


def make_parser(start_in_reasoning: bool = False) -> OutputParser:
    return OutputParser(
        think_start="<think>",
        think_end="</think>",
        tool_call_start=json_tools.tool_call_start,
        tool_call_end=json_tools.tool_call_end,
        tool_parser=json_tools.parse_tool_call,
        tools=[CALC],
        start_in_reasoning=start_in_reasoning,
    )


def run(pieces: list[str], start_in_reasoning: bool = False) -> list[ParsedChunk]:
    parser = make_parser(start_in_reasoning)
    chunks: list[ParsedChunk] = []
    for piece in pieces:
        chunks.extend(parser.feed(piece))
    chunks.extend(parser.finish())
    return chunks


def merged(chunks: list[ParsedChunk]) -> list[tuple[str, str]]:
    """Adjacent text or reasoning pieces joined, so tests do not depend on where splits fall."""
    out: list[tuple[str, str]] = []
    for chunk in chunks:
        match chunk:
            case TextChunk(text=t) | ReasoningChunk(text=t):
                if out and out[-1][0] == chunk.type:
                    out[-1] = (chunk.type, out[-1][1] + t)
                else:
                    out.append((chunk.type, t))
            case ToolCallChunk(name=name, arguments=arguments):
                out.append(("tool_call", f"{name} {sorted(arguments.items())}"))
            case ErrorChunk(message=message):
                out.append(("error", message))
    return out


TEXT = (
    "<think>The user wants 12*34.</think>Let me compute.<tool_call>\n"
    '{"name": "calculator", "arguments": {"expression": "12 * 34"}}\n</tool_call>'
)
EXPECTED = [
    ("reasoning", "The user wants 12*34."),
    ("text", "Let me compute."),
    ("tool_call", "calculator [('expression', '12 * 34')]"),
]


def test_whole_text_in_one_piece() -> None:
    assert merged(run([TEXT])) == EXPECTED


def test_every_split_into_single_characters() -> None:
    assert merged(run(list(TEXT))) == EXPECTED


def test_every_two_way_split() -> None:
    for cut in range(1, len(TEXT)):
        assert merged(run([TEXT[:cut], TEXT[cut:]])) == EXPECTED, cut


def test_text_that_looks_like_a_marker_start_is_released_at_the_end() -> None:
    assert merged(run(["a < b and <thin", "g>"])) == [("text", "a < b and <thing>")]
    assert merged(run(["ends with <tool_"])) == [("text", "ends with <tool_")]


def test_starting_inside_reasoning_when_the_prompt_opened_it() -> None:
    assert merged(run(["pondering</think>answer"], start_in_reasoning=True)) == [
        ("reasoning", "pondering"),
        ("text", "answer"),
    ]


def test_unclosed_tool_call_is_an_error_not_a_hang() -> None:
    chunks = run(['<tool_call>{"name": "calculator", "argu'])
    assert len(chunks) == 1
    assert isinstance(chunks[0], ErrorChunk)
    assert "middle of a tool call" in chunks[0].message
    assert chunks[0].output == '<tool_call>{"name": "calculator", "argu'  # as the model wrote it


def test_invalid_json_is_an_error_naming_the_text() -> None:
    chunks = run(["<tool_call>{name: calculator}</tool_call>"])
    assert isinstance(chunks[0], ErrorChunk)
    assert "not valid JSON" in chunks[0].message
    assert "{name: calculator}" in chunks[0].message
    assert chunks[0].output == "<tool_call>{name: calculator}</tool_call>"


def test_arguments_given_as_a_json_string_are_parsed() -> None:
    chunks = run(['<tool_call>{"name": "clock", "arguments": "{\\"tz\\": \\"UTC\\"}"}</tool_call>'])
    assert merged(chunks) == [("tool_call", "clock [('tz', 'UTC')]")]


def test_two_tool_calls_get_distinct_ids() -> None:
    call = '<tool_call>{"name": "clock", "arguments": {}}</tool_call>'
    chunks = [c for c in run([call, call]) if isinstance(c, ToolCallChunk)]
    assert len(chunks) == 2
    assert chunks[0].id != chunks[1].id
