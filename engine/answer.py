"""One answer's tokens as chunks: decoded, parsed into answer, reasoning and tool calls, cut at
its stop strings, and ended by its DoneChunk.

Decoding one request at a time (`engine.generate`) and in a batch (`engine.batching`) feed
their tokens through the same `Answer`, so both give the same chunks for the same tokens."""
# pyright: reportUnknownVariableType=false, reportUnknownMemberType=false, reportMissingTypeStubs=false
# (mlx-lm ships no type information.)

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

import mlx.core as mx

from engine.harmony import HarmonyStreamParser
from engine.loading import LoadedModel
from engine.parsers import OutputParser, ParsedChunk
from engine.stops import StopText
from engine.types import (
    ChatRequest,
    Chunk,
    DoneChunk,
    ErrorChunk,
    FinishReason,
    Stats,
    TextChunk,
    ToolCallChunk,
    Usage,
)


def failure_chunks(message: str, *, prompt_tokens: int = 0, refused: bool = False) -> list[Chunk]:
    """How a request that could not run ends: an ErrorChunk, then a DoneChunk saying so.
    `refused`: for a cause in the request (an EngineError), not a fault of the model or ring."""
    return [
        ErrorChunk(message=message, refused=refused),
        DoneChunk(
            finish_reason="error",
            usage=Usage(prompt_tokens=prompt_tokens, completion_tokens=0),
            stats=Stats(ttft_s=0.0, prefill_tps=0.0, decode_tps=0.0, peak_memory_bytes=0),
            token_ids=(),
        ),
    ]


class StreamParser(Protocol):
    def feed(self, token: int, text: str) -> Sequence[ParsedChunk]: ...
    def finish(self) -> Sequence[ParsedChunk]: ...


class _TextStreamParser:
    """Adapts the text-level `OutputParser` to the token stream."""

    def __init__(self, parser: OutputParser) -> None:
        self._parser = parser

    def feed(self, token: int, text: str) -> Sequence[ParsedChunk]:
        return self._parser.feed(text) if text else ()

    def finish(self) -> Sequence[ParsedChunk]:
        return self._parser.finish()


class _HarmonyTokenParser:
    """gpt-oss speaks harmony: openai-harmony parses its tokens, not the decoded text."""

    def __init__(self) -> None:
        self._parser = HarmonyStreamParser()

    def feed(self, token: int, text: str) -> Sequence[ParsedChunk]:
        return self._parser.feed(token)

    def finish(self) -> Sequence[ParsedChunk]:
        return self._parser.finish()


def is_harmony(loaded: LoadedModel) -> bool:
    return loaded.card.model_type == "gpt_oss"


def parser_for(loaded: LoadedModel, request: ChatRequest, prompt: list[int]) -> StreamParser:
    if is_harmony(loaded):
        return _HarmonyTokenParser()
    tokenizer: Any = loaded.tokenizer  # mlx-lm's wrapper is untyped
    think_start_tokens: tuple[int, ...] | None = tokenizer.think_start_tokens
    starts_thinking = bool(
        think_start_tokens and tuple(prompt[-len(think_start_tokens) :]) == think_start_tokens
    )
    return _TextStreamParser(
        OutputParser(
            think_start=tokenizer.think_start,
            think_end=tokenizer.think_end,
            tool_call_start=tokenizer.tool_call_start,
            tool_call_end=tokenizer.tool_call_end,
            tool_parser=tokenizer.tool_parser,
            tools=request.tools,
            start_in_reasoning=starts_thinking,
        )
    )


class Answer:
    """The chunks of one answer, fed a token at a time; `finish` is set once it has ended."""

    def __init__(
        self,
        loaded: LoadedModel,
        request: ChatRequest,
        prompt: list[int],
        cached: int,
        max_tokens: int,
        started: float,
    ) -> None:
        self.prompt = prompt
        self.cached = cached
        self.max_tokens = max_tokens
        self.token_ids: list[int] = []
        self.finish: FinishReason | None = None
        self._parser = parser_for(loaded, request, prompt)
        self._stops = StopText(request.stop)
        tokenizer: Any = loaded.tokenizer  # mlx-lm's wrapper is untyped
        self._eos: set[int] = set(tokenizer.eos_token_ids)
        self._detokenizer: Any = tokenizer.detokenizer
        self._detokenizer.reset()
        self._started = started
        self._prefill_started = started
        self._first_at = 0.0
        self._ttft = 0.0
        self._prefill_tps = 0.0
        self._decode_tps = 0.0
        self._tool_calls = 0

    def prefilling(self) -> None:
        """The prompt starts going through the model now (for the prefill's speed)."""
        self._prefill_started = time.perf_counter()

    def token(self, token: int) -> list[Chunk]:
        """The chunks `token` settles; it may end the answer (its end, its length, a stop
        string)."""
        now = time.perf_counter()
        if not self.token_ids:
            self._first_at = now
            self._ttft = now - self._started
            rest = len(self.prompt) - self.cached
            self._prefill_tps = rest / max(now - self._prefill_started, 1e-9)
        self.token_ids.append(token)
        self._decode_tps = len(self.token_ids) / max(now - self._first_at, 1e-9)
        # As mlx-lm's stream_generate: the end-of-sequence token is kept but not shown.
        if token in self._eos:
            self._detokenizer.finalize()
            self.finish = "stop"
        else:
            self._detokenizer.add_token(token)
            if len(self.token_ids) >= self.max_tokens:
                self._detokenizer.finalize()
                self.finish = "length"
        shown = self._shown(self._parser.feed(token, self._detokenizer.last_segment))
        if self._stops.stopped:
            self.finish = "stop"
        return shown

    def cancel(self) -> None:
        if self.finish is None:
            self.finish = "cancelled"

    def done(self) -> list[Chunk]:
        """The last chunks: what the parser held back, and the DoneChunk."""
        finish: FinishReason = self.finish or "stop"
        out: list[Chunk] = []
        if not self._stops.stopped:
            for chunk in self._shown(self._parser.finish()):
                if isinstance(chunk, ErrorChunk) and finish == "stop":
                    finish = "error"
                out.append(chunk)
            if held := self._stops.flush():
                out.append(TextChunk(text=held))
        if self._tool_calls and finish == "stop":
            finish = "tool_calls"
        out.append(
            DoneChunk(
                finish_reason=finish,
                usage=Usage(
                    prompt_tokens=len(self.prompt),
                    completion_tokens=len(self.token_ids),
                    cached_tokens=self.cached,
                ),
                stats=Stats(
                    ttft_s=self._ttft,
                    prefill_tps=self._prefill_tps,
                    decode_tps=self._decode_tps,
                    peak_memory_bytes=int(mx.get_peak_memory()),
                ),
                token_ids=tuple(self.token_ids),
            )
        )
        return out

    def _shown(self, chunks: Sequence[ParsedChunk]) -> list[Chunk]:
        """`chunks` as far as the stop strings let them be shown."""
        out: list[Chunk] = []
        for chunk in chunks:
            if self._stops.stopped:
                break
            if isinstance(chunk, TextChunk):
                text = self._stops.feed(chunk.text)
                if text == chunk.text:
                    out.append(chunk)
                elif text:
                    out.append(TextChunk(text=text))
                continue
            if held := self._stops.flush():
                out.append(TextChunk(text=held))
            self._tool_calls += isinstance(chunk, ToolCallChunk)
            out.append(chunk)
        return out
