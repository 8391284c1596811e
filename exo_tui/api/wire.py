"""The base of the API's request models: frozen, and fields the spec has that we do not read
are let through (clients send many), where engine messages refuse them. And the tool
definition both APIs share (Ollama takes OpenAI's)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from engine.types import ToolSpec


class WireRequest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class FunctionDef(WireRequest):
    name: str = Field(min_length=1)
    description: str = ""
    parameters: dict[str, Any] | None = None


class ToolDef(WireRequest):
    type: Literal["function"] = "function"
    function: FunctionDef

    def spec(self) -> ToolSpec:
        """The tool as the chat template sees it."""
        return ToolSpec(
            name=self.function.name,
            description=self.function.description,
            parameters=self.function.parameters or {"type": "object", "properties": {}},
        )
