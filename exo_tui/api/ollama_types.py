"""Ollama's chat, generate, tags, show and version, as pydantic models: requests as its API
takes them, responses as the `ollama` package parses them (its _types.py)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, StrictBool

from engine.types import Frozen
from exo_tui.api.wire import ToolDef, WireRequest

# Requests.


class Options(WireRequest):
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    num_predict: int | None = None  # -1 (or unset): until the context is full
    seed: int | None = Field(default=None, ge=0, lt=2**64)
    stop: list[str] | None = None


class FunctionCallIn(WireRequest):
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict[str, Any])


class ToolCallIn(WireRequest):
    function: FunctionCallIn


class MessageIn(WireRequest):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    thinking: str | None = None
    images: list[str] | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_name: str | None = None


# Structured output: "json" or a JSON schema ("" is what clients send for none).
OutputFormat = Literal["", "json"] | dict[str, Any] | None


class ChatIn(WireRequest):
    model: str
    messages: list[MessageIn] = Field(default_factory=list[MessageIn])
    tools: list[ToolDef] | None = None
    stream: StrictBool = True
    options: Options | None = None
    think: StrictBool | None = None
    format: OutputFormat = None


class GenerateIn(WireRequest):
    model: str
    prompt: str = ""
    system: str | None = None
    stream: StrictBool = True
    options: Options | None = None
    think: StrictBool | None = None
    format: OutputFormat = None
    raw: StrictBool = False  # the prompt is already in the model's format: no template


class ShowIn(WireRequest):
    model: str | None = None
    name: str | None = None  # what older clients send


# Responses.


class FunctionCallOut(Frozen):
    name: str
    arguments: dict[str, Any]


class ToolCallOut(Frozen):
    function: FunctionCallOut


class MessageOut(Frozen):
    role: Literal["assistant"] = "assistant"
    content: str = ""
    thinking: str | None = None
    tool_calls: list[ToolCallOut] | None = None


class Timings(Frozen):
    """The final line's counts and durations (nanoseconds)."""

    total_duration: int
    load_duration: int = 0
    prompt_eval_count: int
    prompt_eval_duration: int
    eval_count: int
    eval_duration: int


class ChatLine(Frozen):
    model: str
    created_at: str
    message: MessageOut
    done: bool
    done_reason: str | None = None
    total_duration: int | None = None
    load_duration: int | None = None
    prompt_eval_count: int | None = None
    prompt_eval_duration: int | None = None
    eval_count: int | None = None
    eval_duration: int | None = None
    # Not in Ollama's API (clients ignore it): the first line of a queued request, 1 = next.
    queue_position: int | None = None


class GenerateLine(Frozen):
    model: str
    created_at: str
    response: str
    thinking: str | None = None
    done: bool
    done_reason: str | None = None
    total_duration: int | None = None
    load_duration: int | None = None
    prompt_eval_count: int | None = None
    prompt_eval_duration: int | None = None
    eval_count: int | None = None
    eval_duration: int | None = None
    queue_position: int | None = None


class ModelDetails(Frozen):
    parent_model: str = ""
    format: str = "safetensors"
    family: str
    families: list[str]
    parameter_size: str
    quantization_level: str


class TagModel(Frozen):
    name: str
    model: str
    modified_at: str
    size: int
    digest: str
    details: ModelDetails


class Tags(Frozen):
    models: list[TagModel]


class RunningModel(Frozen):
    name: str
    model: str
    size: int
    size_vram: int = 0  # MLX here runs on the CPU
    digest: str
    details: ModelDetails
    expires_at: str
    context_length: int | None = None


class Running(Frozen):
    models: list[RunningModel]


class Show(Frozen):
    modelfile: str
    parameters: str
    template: str
    details: ModelDetails
    model_info: dict[str, Any]
    capabilities: list[str]
    modified_at: str


class Version(Frozen):
    version: str


class ErrorOut(Frozen):
    error: str
