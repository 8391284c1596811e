"""Frozen pydantic models shared by every layer: cards, shards, requests, progress and chunks."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class Frozen(BaseModel):
    """Base for every message: immutable, and unknown fields are an error at the edge."""

    model_config = ConfigDict(frozen=True, extra="forbid")


ModelSource = Literal["bundled", "path", "models_dir", "hf_cache"]

# How a model is split over a ring: contiguous layers per rank, or a slice of every layer.
Strategy = Literal["pipeline", "tensor"]


class ShardSpec(Frozen):
    """What one rank runs: layers [start_layer, end_layer) of the model, as rank `rank` of
    `world_size`. A tensor shard always names the full range: it holds a slice of every layer."""

    strategy: Strategy
    start_layer: int
    end_layer: int
    rank: int = 0
    world_size: int = 1

    @property
    def num_layers(self) -> int:
        return self.end_layer - self.start_layer


QuantizationMode = Literal["affine", "mxfp4", "mxfp8", "nvfp4"]


class Quantization(Frozen):
    """How a model's weights are packed (mlx-lm's `quantization`: its default for a mixed one)."""

    bits: int
    group_size: int
    mode: QuantizationMode = "affine"

    @property
    def bits_per_weight(self) -> float:
        """Stored bits per weight, the group's scale (and bias) included: affine keeps a 16-bit
        scale and a 16-bit bias per group; the microscaling modes one 8-bit scale and no bias."""
        if self.group_size <= 0:
            return float(self.bits)
        if self.mode == "affine":
            return self.bits + 32 / self.group_size
        return self.bits + 8 / self.group_size


class ModelCard(Frozen):
    """What a model is, read from its config.json and safetensors headers without loading it."""

    name: str
    path: str
    source: ModelSource
    model_type: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    context_length: int | None
    quantization: Quantization | None
    dtype: str | None
    bytes_on_disk: int
    num_parameters: int
    supports_tensor: bool
    tensor_unsupported_reason: str | None = None
    # None: every weight file is on disk. Else only part of a download is (a pipeline node's
    # share): the layers whose weights are here, and the bytes and parameters above are the
    # whole model's, from its index.
    layers_on_disk: tuple[int, ...] | None = None
    # The bytes of the transformer layers' weights, all layers together (None: not known, the
    # card of a model not on disk). The rest of bytes_on_disk is outside the layers (embeddings,
    # final norm, head).
    bytes_in_layers: int | None = None

    @property
    def partial_note(self) -> str | None:
        """ "layers 0-11, 23 of 24 on disk" for part of a download, None for a whole model."""
        if self.layers_on_disk is None:
            return None
        spans: list[str] = []
        for layer in self.layers_on_disk:
            if spans and spans[-1].rsplit("-", 1)[-1] == str(layer - 1):
                spans[-1] = f"{spans[-1].split('-')[0]}-{layer}"
            else:
                spans.append(str(layer))
        return f"layers {', '.join(spans) or 'none'} of {self.num_layers} on disk"

    def holds_layers(self, start: int, end: int) -> bool:
        """Whether the weights of layers [start, end) (and those outside layers) are on disk."""
        held = self.layers_on_disk
        return held is None or set(range(start, end)) <= set(held)


class LoadProgress(Frozen):
    """One more transformer layer is in memory."""

    type: Literal["load"] = "load"
    layers_loaded: int
    total: int
    rank: int = 0


class ModelReady(Frozen):
    """Loading finished: which model, how long it took and which BLAS does the maths."""

    type: Literal["ready"] = "ready"
    model: str
    load_seconds: float
    blas: str
    kernels: str = "mlx"  # which CPU matmul kernels run (engine.kernels.describe())
    rank: int = 0


class ToolCall(Frozen):
    id: str
    name: str
    arguments: dict[str, Any]


class Message(Frozen):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    reasoning: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None


class ToolSpec(Frozen):
    """A tool as the chat template sees it: a name, what it does and a JSON schema."""

    name: str
    description: str
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class ChatRequest(Frozen):
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    max_tokens: int = 512
    temperature: float = 0.7
    top_p: float = 1.0
    seed: int | None = None
    enable_thinking: bool | None = None
    # The answer ends before the first of these strings (which is not shown).
    stop: tuple[str, ...] = ()
    # The messages' text is the prompt as it stands, already in the model's format: no chat
    # template (Ollama's `raw`).
    raw: bool = False


# Chunks: what generation yields, one discriminated union.


class TextChunk(Frozen):
    type: Literal["text"] = "text"
    text: str


class ReasoningChunk(Frozen):
    type: Literal["reasoning"] = "reasoning"
    text: str


class ToolCallChunk(Frozen):
    type: Literal["tool_call"] = "tool_call"
    id: str
    name: str
    arguments: dict[str, Any]


class ToolResult(Frozen):
    """A tool call was run; its result goes back to the model as a `tool` message.

    Not a chunk (generation never yields it): the caller that runs the tools emits it between
    one generation and the next.
    """

    type: Literal["tool_result"] = "tool_result"
    id: str
    name: str
    content: str
    ok: bool


class PrefillProgress(Frozen):
    """`done` of the `total` prompt tokens this answer prefills (those not cached) have gone
    through the model. Only a prompt prefilled in more than one pass reports it, after each
    step, before its first token; the last report says all of them."""

    type: Literal["prefill"] = "prefill"
    done: int
    total: int


class ErrorChunk(Frozen):
    type: Literal["error"] = "error"
    message: str
    # The request was refused before it ran, for a cause in the request itself (a prompt past
    # the context, a bad value): an API answers it with a 400, as a refusal on one machine.
    refused: bool = False
    # What the model wrote that its parser could not read (a tool call cut off or malformed):
    # the TUI says the error, an API gives the client the text, as other servers do.
    output: str = ""


FinishReason = Literal["stop", "length", "cancelled", "tool_calls", "error"]


class Usage(Frozen):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0


class Stats(Frozen):
    ttft_s: float
    prefill_tps: float
    decode_tps: float
    peak_memory_bytes: int


class DoneChunk(Frozen):
    type: Literal["done"] = "done"
    finish_reason: FinishReason
    usage: Usage
    stats: Stats
    token_ids: tuple[int, ...]


Chunk = Annotated[
    TextChunk | ReasoningChunk | ToolCallChunk | ErrorChunk | PrefillProgress | DoneChunk,
    Field(discriminator="type"),
]
