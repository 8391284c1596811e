"""Ollama's wire to the engine's types and back: a chat or generate request to a ChatRequest,
each engine chunk to the message part that carries it, and the last line's timings."""

from __future__ import annotations

import datetime
import hashlib

from engine.types import (
    ChatRequest,
    DoneChunk,
    Message,
    ModelCard,
    ReasoningChunk,
    TextChunk,
    ToolCall,
    ToolCallChunk,
    ToolSpec,
)
from exo_tui.api.errors import bad_request
from exo_tui.api.ollama_types import (
    ChatIn,
    FunctionCallOut,
    GenerateIn,
    MessageIn,
    MessageOut,
    ModelDetails,
    Options,
    Timings,
    ToolCallOut,
)

# Ollama's own defaults, for a client that sets no options.
DEFAULT_TEMPERATURE = 0.8
DEFAULT_TOP_P = 0.9
UNSPECIFIED_MAX_TOKENS = 4096  # no num_predict and no known context: the engine caps it anyway


def chat_request(body: ChatIn, card: ModelCard) -> ChatRequest:
    _refuse_format(body.format)
    tools = tuple(t.spec() for t in body.tools or ())
    return _sampled(messages(body.messages), tools, body.options, body.think, card)


def generate_request(body: GenerateIn, card: ModelCard) -> ChatRequest:
    _refuse_format(body.format)
    prompt = (Message(role="user", content=body.prompt),)
    if body.raw:  # as Ollama: no template, so no system prompt either
        return _sampled(prompt, (), body.options, body.think, card).model_copy(update={"raw": True})
    system = (Message(role="system", content=body.system),) if body.system else ()
    return _sampled(system + prompt, (), body.options, body.think, card)


def _refuse_format(format: object) -> None:
    # Output held to JSON needs decoding constrained by a grammar, which the engine has not:
    # a free-text answer where JSON was asked for would break the client later, and worse.
    if format:
        raise bad_request(
            "format (JSON output) is not supported: this server's answers are free text. "
            "Leave out format and ask for JSON in the prompt",
            "format",
        )


def _sampled(
    chat: tuple[Message, ...],
    tools: tuple[ToolSpec, ...],
    options: Options | None,
    think: bool | None,
    card: ModelCard,
) -> ChatRequest:
    options = options or Options()
    return ChatRequest(
        messages=chat,
        tools=tools,
        max_tokens=_max_tokens(options.num_predict, card),
        temperature=DEFAULT_TEMPERATURE if options.temperature is None else options.temperature,
        top_p=DEFAULT_TOP_P if options.top_p is None else options.top_p,
        seed=options.seed,
        stop=tuple(options.stop or ()),
        enable_thinking=think,
    )


def _max_tokens(num_predict: int | None, card: ModelCard) -> int:
    if num_predict is None or num_predict in (-1, -2):  # Ollama's "until the end"
        return card.context_length or UNSPECIFIED_MAX_TOKENS
    if num_predict < 1:
        raise bad_request(
            f"options.num_predict is {num_predict}: use 1 or more tokens, or -1 for no limit",
            "options.num_predict",
        )
    return num_predict


def messages(wire: list[MessageIn]) -> tuple[Message, ...]:
    """Ollama's calls carry no ids: each gets one, and a tool message answers the oldest
    unanswered call of its tool's name (or the oldest at all)."""
    out: list[Message] = []
    unanswered: list[ToolCall] = []
    for index, message in enumerate(wire):
        if message.images:
            raise bad_request(
                f"messages.{index} holds images: this server reads text only. Send text",
                f"messages.{index}.images",
            )
        if message.role == "assistant":
            calls = tuple(
                ToolCall(
                    id=f"call_{index}_{j}", name=c.function.name, arguments=c.function.arguments
                )
                for j, c in enumerate(message.tool_calls or ())
            )
            unanswered.extend(calls)
            out.append(
                Message(
                    role="assistant",
                    content=message.content,
                    reasoning=message.thinking,
                    tool_calls=calls,
                )
            )
        elif message.role == "tool":
            call = next((c for c in unanswered if c.name == message.tool_name), None) or (
                unanswered[0] if unanswered else None
            )
            if call is not None:
                unanswered.remove(call)
            out.append(
                Message(
                    role="tool",
                    content=message.content,
                    tool_call_id=call.id if call else f"call_{index}",
                    name=message.tool_name or (call.name if call else None),
                )
            )
        else:
            out.append(Message(role=message.role, content=message.content))
    return tuple(out)


def message_part(chunk: TextChunk | ReasoningChunk | ToolCallChunk) -> MessageOut:
    """The part of the assistant's message that carries `chunk`."""
    if isinstance(chunk, TextChunk):
        return MessageOut(content=chunk.text)
    if isinstance(chunk, ReasoningChunk):
        return MessageOut(thinking=chunk.text)
    call = ToolCallOut(function=FunctionCallOut(name=chunk.name, arguments=chunk.arguments))
    return MessageOut(tool_calls=[call])


def merged(parts: list[MessageOut]) -> MessageOut:
    content = "".join(p.content for p in parts)
    thinking = "".join(p.thinking or "" for p in parts)
    calls = [call for p in parts for call in p.tool_calls or ()]
    return MessageOut(content=content, thinking=thinking or None, tool_calls=calls or None)


def timings(done: DoneChunk, elapsed_s: float) -> Timings:
    decode_s = done.usage.completion_tokens / done.stats.decode_tps if done.stats.decode_tps else 0
    return Timings(
        total_duration=int(elapsed_s * 1e9),
        prompt_eval_count=done.usage.prompt_tokens,
        prompt_eval_duration=int(done.stats.ttft_s * 1e9),
        eval_count=done.usage.completion_tokens,
        eval_duration=int(decode_s * 1e9),
    )


def done_reason(done: DoneChunk) -> str:
    """Ollama says stop or length; a tool call ends with stop there too."""
    return "length" if done.finish_reason == "length" else "stop"


def details(card: ModelCard) -> ModelDetails:
    billions = card.num_parameters / 1e9
    size = f"{billions:.1f}B" if billions >= 0.1 else f"{card.num_parameters / 1e6:.1f}M"
    quant = f"Q{card.quantization.bits}" if card.quantization else (card.dtype or "unknown")
    return ModelDetails(
        family=card.model_type,
        families=[card.model_type],
        parameter_size=size,
        quantization_level=quant.upper(),
    )


def digest(card: ModelCard) -> str:
    return hashlib.sha256(f"{card.name}\0{card.path}".encode()).hexdigest()


def now() -> str:
    """RFC 3339, as Ollama writes created_at."""
    return datetime.datetime.now(datetime.UTC).isoformat().replace("+00:00", "Z")
