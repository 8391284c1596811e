"""The pure parts: requests to ChatRequests, chunks to deltas, the stop-string cut."""

from __future__ import annotations

import pytest

from engine.types import ReasoningChunk, TextChunk, ToolCallChunk
from exo_tui.api.errors import ApiError
from exo_tui.api.ollama_convert import messages as ollama_messages
from exo_tui.api.ollama_types import MessageIn
from exo_tui.api.openai_convert import chat_request, delta, merged
from exo_tui.api.openai_types import ChatCompletionRequest
from tests.cards import tiny_card

TOOLS = [
    {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
    for n in ("calculator", "clock")
]


def request(**fields: object) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    )


def test_tool_choice_decides_the_tools_the_template_shows() -> None:
    card = tiny_card()
    assert len(chat_request(request(tools=TOOLS), card).tools) == 2
    assert chat_request(request(tools=TOOLS, tool_choice="none"), card).tools == ()
    assert len(chat_request(request(tools=TOOLS, tool_choice="required"), card).tools) == 2
    named = {"type": "function", "function": {"name": "clock"}}
    assert [t.name for t in chat_request(request(tools=TOOLS, tool_choice=named), card).tools] == [
        "clock"
    ]
    with pytest.raises(ApiError, match="no tools"):
        chat_request(request(tool_choice="required"), card)


SUM = {"name": "calculator", "arguments": '{"expression": "2+2"}'}


def test_messages_of_every_role_and_text_parts() -> None:
    body = request(
        messages=[
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "what is "},
                                         {"type": "text", "text": "2+2"}]},
            {"role": "assistant", "content": None, "reasoning_content": "use the tool",
             "tool_calls": [{"id": "c1", "type": "function", "function": SUM}]},
            {"role": "tool", "tool_call_id": "c1", "content": "4"},
        ],
        stop="\n\n", max_completion_tokens=7, seed=3,
    )  # fmt: skip
    chat = chat_request(body, tiny_card())
    system, user, assistant, tool = chat.messages
    assert (system.role, system.content) == ("system", "be brief")
    assert user.content == "what is 2+2"
    assert assistant.reasoning == "use the tool"
    assert assistant.tool_calls[0].arguments == {"expression": "2+2"}
    assert (tool.tool_call_id, tool.name, tool.content) == ("c1", "calculator", "4")
    assert (chat.stop, chat.max_tokens, chat.seed) == (("\n\n",), 7, 3)


def test_arguments_that_are_not_a_json_object_are_refused() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "[1]"}}
    body = request(messages=[{"role": "assistant", "tool_calls": [call]}])
    with pytest.raises(ApiError, match="not a JSON object"):
        chat_request(body, tiny_card())


def test_deltas_merge_into_the_whole_message() -> None:
    chunks = [
        ReasoningChunk(text="think "),
        ReasoningChunk(text="hard"),
        TextChunk(text="It is "),
        ToolCallChunk(id="c9", name="clock", arguments={"zone": "UTC"}),
    ]
    deltas = [delta(c, 0) for c in chunks]
    assert deltas[0].reasoning_content == "think " and deltas[2].content == "It is "
    call = deltas[3].tool_calls
    assert call is not None and call[0].id == "c9" and call[0].index == 0
    message = merged(deltas)
    assert message.reasoning_content == "think hard" and message.content == "It is "
    assert message.tool_calls is not None
    assert message.tool_calls[0].function.arguments == '{"zone": "UTC"}'


def test_ollama_tool_messages_answer_the_call_of_their_name() -> None:
    wire = [
        MessageIn(role="user", content="time and sum"),
        MessageIn.model_validate({"role": "assistant", "tool_calls": [
            {"function": {"name": "clock", "arguments": {}}},
            {"function": {"name": "calculator", "arguments": {"expression": "1+1"}}}]}),
        MessageIn(role="tool", content="2", tool_name="calculator"),
        MessageIn(role="tool", content="noon", tool_name="clock"),
    ]  # fmt: skip
    _, assistant, sum_result, clock_result = ollama_messages(wire)
    ids = {call.name: call.id for call in assistant.tool_calls}
    assert sum_result.tool_call_id == ids["calculator"]
    assert clock_result.tool_call_id == ids["clock"]
