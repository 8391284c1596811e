"""OpenAI's wire to the engine's types and back: a request to a ChatRequest, and each engine
chunk to the one delta that carries it (a whole answer is those deltas merged)."""

from __future__ import annotations

import json
import uuid
from typing import Any, cast

from engine.types import (
    ChatRequest,
    FinishReason,
    Message,
    ModelCard,
    ReasoningChunk,
    TextChunk,
    ToolCall,
    ToolCallChunk,
    ToolSpec,
    Usage,
)
from exo_tui.api.errors import bad_request
from exo_tui.api.openai_types import (
    AssistantMessage,
    ChatCompletionRequest,
    ChatMessage,
    Delta,
    FunctionCallOut,
    FunctionDelta,
    NamedToolChoice,
    OpenAIFinish,
    PromptTokensDetails,
    ToolCallDelta,
    ToolCallIn,
    ToolCallOut,
    UsageOut,
)

UNSPECIFIED_MAX_TOKENS = 4096  # no max_tokens and no known context: the engine caps it anyway


def chat_request(body: ChatCompletionRequest, card: ModelCard) -> ChatRequest:
    if body.response_format is not None and body.response_format.type != "text":
        # JSON output needs decoding constrained by a grammar, which the engine has not.
        raise bad_request(
            f"response_format {body.response_format.type} is not supported: this server's "
            "answers are free text. Leave it out (or send type text) and ask for JSON in the "
            "prompt",
            "response_format",
        )
    limit = body.max_completion_tokens or body.max_tokens
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    return ChatRequest(
        messages=messages(body.messages),
        tools=tools_offered(body),
        max_tokens=limit or card.context_length or UNSPECIFIED_MAX_TOKENS,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        seed=body.seed,
        stop=stop,
        enable_thinking=_thinking(body),
    )


def _thinking(body: ChatCompletionRequest) -> bool | None:
    wanted = (body.chat_template_kwargs or {}).get("enable_thinking")
    if wanted is None or isinstance(wanted, bool):
        return wanted
    raise bad_request(
        f"chat_template_kwargs.enable_thinking is {wanted!r}: use true or false",
        "chat_template_kwargs",
    )


def tools_offered(body: ChatCompletionRequest) -> tuple[ToolSpec, ...]:
    """The tools the chat template shows the model. The template has no way to force a call,
    so: `none` shows no tools; `auto` and `required` show them all; a named function shows
    only that one. A model that answers without a call anyway gets its answer back, with
    finish_reason stop."""
    tools = [t.spec() for t in body.tools or ()]
    choice = body.tool_choice
    if choice == "none":
        return ()
    if isinstance(choice, NamedToolChoice):
        named = [t for t in tools if t.name == choice.function.name]
        if not named:
            offered = ", ".join(t.name for t in tools) or "none"
            raise bad_request(
                f"tool_choice names the function {choice.function.name!r}, which is not in "
                f"tools (offered: {offered}). Name one of the tools you send",
                "tool_choice",
            )
        return tuple(named)
    if choice == "required" and not tools:
        raise bad_request("tool_choice is required but no tools are given. Send tools", "tools")
    return tuple(tools)


def messages(wire: list[ChatMessage]) -> tuple[Message, ...]:
    names: dict[str, str] = {}  # tool call id -> function name, for the tool messages
    out: list[Message] = []
    for index, message in enumerate(wire):
        text = _text(message, index)
        if message.role == "assistant":
            calls = tuple(_call(call, index) for call in message.tool_calls or ())
            names.update({call.id: call.name for call in calls})
            out.append(
                Message(
                    role="assistant",
                    content=text,
                    reasoning=message.reasoning_content,
                    tool_calls=calls,
                )
            )
        elif message.role == "tool":
            if not message.tool_call_id:
                raise bad_request(
                    f"messages.{index} is a tool message without tool_call_id. Give the id of "
                    "the call it answers",
                    f"messages.{index}.tool_call_id",
                )
            name = message.name or names.get(message.tool_call_id)
            out.append(
                Message(role="tool", content=text, tool_call_id=message.tool_call_id, name=name)
            )
        else:
            role = "system" if message.role == "developer" else message.role
            out.append(Message(role=role, content=text))
    return tuple(out)


def _text(message: ChatMessage, index: int) -> str:
    if message.content is None or isinstance(message.content, str):
        return message.content or ""
    pieces: list[str] = []
    for part in message.content:
        if part.type != "text" or part.text is None:
            raise bad_request(
                f"messages.{index}.content holds a {part.type!r} part: this server reads text "
                'only. Send text parts ({"type": "text", "text": ...})',
                f"messages.{index}.content",
            )
        pieces.append(part.text)
    return "".join(pieces)


def _call(call: ToolCallIn, index: int) -> ToolCall:
    try:
        arguments: object = json.loads(call.function.arguments or "{}")
    except json.JSONDecodeError:
        arguments = None
    if not isinstance(arguments, dict):
        raise bad_request(
            f"messages.{index}.tool_calls: the arguments of {call.function.name!r} are not a "
            'JSON object. Send them as a JSON-encoded object, e.g. "{}"',
            f"messages.{index}.tool_calls",
        )
    return ToolCall(id=call.id, name=call.function.name, arguments=cast(dict[str, Any], arguments))


def delta(chunk: TextChunk | ReasoningChunk | ToolCallChunk, tool_index: int) -> Delta:
    """The delta that carries `chunk`; `tool_index` counts the answer's tool calls before it."""
    if isinstance(chunk, TextChunk):
        return Delta(content=chunk.text)
    if isinstance(chunk, ReasoningChunk):
        return Delta(reasoning_content=chunk.text)
    return Delta(
        tool_calls=[
            ToolCallDelta(
                index=tool_index,
                id=chunk.id,
                type="function",
                function=FunctionDelta(name=chunk.name, arguments=json.dumps(chunk.arguments)),
            )
        ]
    )


def merged(deltas: list[Delta]) -> AssistantMessage:
    """A whole answer from its deltas."""
    content = "".join(d.content or "" for d in deltas)
    reasoning = "".join(d.reasoning_content or "" for d in deltas)
    calls = [
        ToolCallOut(
            id=call.id or f"call_{call.index}",
            function=FunctionCallOut(
                name=call.function.name or "", arguments=call.function.arguments or "{}"
            ),
        )
        for d in deltas
        for call in d.tool_calls or ()
    ]
    return AssistantMessage(
        content=content if content or not calls else None,
        reasoning_content=reasoning or None,
        tool_calls=calls or None,
    )


def finish(reason: FinishReason) -> OpenAIFinish:
    """The spec has no cancelled or error: the answer stopped (an error is said before)."""
    return reason if reason in ("stop", "length", "tool_calls") else "stop"


def usage(used: Usage) -> UsageOut:
    return UsageOut(
        prompt_tokens=used.prompt_tokens,
        completion_tokens=used.completion_tokens,
        total_tokens=used.prompt_tokens + used.completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=used.cached_tokens),
    )


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex[:24]}"
