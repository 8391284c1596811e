"""OpenAI's chat completions and models, as pydantic models: requests as the spec allows them,
responses exactly as the official clients parse them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, StrictBool

from engine.types import Frozen
from exo_tui.api.wire import ToolDef, WireRequest

# Requests.


class ContentPart(WireRequest):
    type: str
    text: str | None = None


class FunctionCallIn(WireRequest):
    name: str
    arguments: str  # JSON, as the model wrote it


class ToolCallIn(WireRequest):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ChatMessage(WireRequest):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class NamedFunction(WireRequest):
    name: str


class NamedToolChoice(WireRequest):
    type: Literal["function"] = "function"
    function: NamedFunction


class StreamOptions(WireRequest):
    include_usage: StrictBool = False


class ResponseFormat(WireRequest):
    type: Literal["text", "json_object", "json_schema"]


class ChatCompletionRequest(WireRequest):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ToolDef] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    seed: int | None = Field(default=None, ge=0, lt=2**64)
    stop: str | list[str] | None = None
    n: int = Field(default=1, ge=1, le=1)  # one choice per request
    response_format: ResponseFormat | None = None
    # As mlx-lm's and vLLM's servers take it: {"enable_thinking": false} for Qwen3 and the like.
    chat_template_kwargs: dict[str, Any] | None = None


# Responses.


class FunctionCallOut(Frozen):
    name: str
    arguments: str


class ToolCallOut(Frozen):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class AssistantMessage(Frozen):
    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallOut] | None = None


OpenAIFinish = Literal["stop", "length", "tool_calls"]


class Choice(Frozen):
    index: int = 0
    message: AssistantMessage
    finish_reason: OpenAIFinish


class PromptTokensDetails(Frozen):
    cached_tokens: int


class UsageOut(Frozen):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class ChatCompletion(Frozen):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: UsageOut


class FunctionDelta(Frozen):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(Frozen):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionDelta


class Delta(Frozen):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(Frozen):
    index: int = 0
    delta: Delta
    finish_reason: OpenAIFinish | None = None


class ChatCompletionChunk(Frozen):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: UsageOut | None = None
    # Not in the spec (clients ignore it): the first chunk of a queued request, 1 = next.
    queue_position: int | None = None


class ModelObject(Frozen):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "exo-tui"


class ModelList(Frozen):
    object: Literal["list"] = "list"
    data: list[ModelObject]


class ErrorBody(Frozen):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(Frozen):
    error: ErrorBody
