"""The official `openai` package against the server: sync, async, streaming, tools, stop."""

from __future__ import annotations

import asyncio
import http.client
import json
import time
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionChunk

from engine.prefill import PrefillPace
from exo_tui.chat.backend import LocalBackend
from exo_tui.chat.tools import BUILTIN_TOOLS, calculate
from tests.api.conftest import Serve

QUESTION = "what is 12 times 34"
TOOLS: Any = [
    {
        "type": "function",
        "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
    }
    for t in BUILTIN_TOOLS
]


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def test_models_and_a_whole_answer(serve: Serve, demo_backend: LocalBackend) -> None:
    api = client(serve(demo_backend).url)
    assert [m.id for m in api.models.list()] == ["demo"]
    answer = api.chat.completions.create(
        model="demo",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}],
        temperature=0,
        max_tokens=40,
    )
    choice = answer.choices[0]
    assert choice.message.role == "assistant" and (choice.message.content or "").strip()
    assert choice.finish_reason in ("stop", "length") and not choice.message.tool_calls
    assert answer.usage is not None and answer.usage.prompt_tokens > 0
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens
    assert answer.usage.prompt_tokens_details is not None
    assert answer.usage.prompt_tokens_details.cached_tokens is not None


def test_async_stream_is_the_whole_answer_in_pieces(
    serve: Serve, demo_backend: LocalBackend
) -> None:
    url = serve(demo_backend).url
    messages: Any = [{"role": "user", "content": "hello"}]
    whole = client(url).chat.completions.create(
        model="demo",
        messages=messages,
        temperature=0,
        max_tokens=40,
    )

    async def streamed() -> tuple[str, list[ChatCompletionChunk]]:
        # Closed in its own loop: left to the garbage collector, its connections' close ran
        # into a later test's loop after this one had closed.
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as api:
            stream = await api.chat.completions.create(
                model="demo",
                messages=messages,
                temperature=0,
                max_tokens=40,
                stream=True,
                stream_options={"include_usage": True},
            )
            chunks = [chunk async for chunk in stream]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return text, chunks

    text, chunks = asyncio.run(streamed())
    assert text == whole.choices[0].message.content  # greedy: the same tokens
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == whole.choices[0].finish_reason and not any(finishes[:-1])
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None and whole.usage is not None
    assert last.usage.completion_tokens == whole.usage.completion_tokens
    assert last.usage.prompt_tokens_details is not None
    # The same conversation again: its prompt was cached by the answers before.
    assert (last.usage.prompt_tokens_details.cached_tokens or 0) > 0


def test_tool_round_trip_streamed(serve: Serve, demo_backend: LocalBackend) -> None:
    """The demo calls the calculator; the client runs it, sends the result back and the answer
    holds 408. The call comes as the spec's deltas."""
    api = client(serve(demo_backend).url)
    messages: Any = [{"role": "user", "content": QUESTION}]
    stream = api.chat.completions.create(
        model="demo",
        messages=messages,
        tools=TOOLS,
        temperature=0,
        max_tokens=96,
        stream=True,
    )
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in stream:
        for call in chunk.choices[0].delta.tool_calls or () if chunk.choices else ():
            entry = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
            entry["id"] += call.id or ""
            entry["name"] += call.function.name or "" if call.function else ""
            entry["arguments"] += call.function.arguments or "" if call.function else ""
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    assert finish == "tool_calls" and list(calls) == [0]
    call = calls[0]
    assert call["name"] == "calculator" and call["id"]
    calculate(json.loads(call["arguments"])["expression"])  # arguments the tool accepts
    messages += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": "calculator", "arguments": call["arguments"]},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call["id"], "content": "408"},
    ]
    answer = api.chat.completions.create(
        model="demo",
        messages=messages,
        tools=TOOLS,
        temperature=0,
        max_tokens=96,
    )
    assert "408" in (answer.choices[0].message.content or "")
    assert answer.choices[0].finish_reason == "stop"


def test_a_whole_tool_call_and_a_named_tool_choice(
    serve: Serve, demo_backend: LocalBackend
) -> None:
    api = client(serve(demo_backend).url)
    answer = api.chat.completions.create(
        model="demo",
        messages=[{"role": "user", "content": QUESTION}],
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "calculator"}},
        temperature=0,
        max_tokens=96,
    )
    message = answer.choices[0].message
    assert answer.choices[0].finish_reason == "tool_calls" and message.tool_calls
    call = message.tool_calls[0]
    assert call.type == "function" and call.id
    assert call.function.name == "calculator"
    assert "expression" in json.loads(call.function.arguments)
    with pytest.raises(openai.BadRequestError, match="not in tools"):
        api.chat.completions.create(
            model="demo",
            messages=[{"role": "user", "content": QUESTION}],
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "weather"}},
        )


def test_a_tool_call_cut_by_max_tokens_comes_as_the_text_it_had(
    serve: Serve, demo_backend: LocalBackend
) -> None:
    """Out of tokens in the middle of its tool call, the demo's answer is what it wrote so far,
    with finish_reason "length", whole or streamed: not an error that loses it."""
    api = client(serve(demo_backend).url)
    ask: Any = {
        "model": "demo",
        "messages": [{"role": "user", "content": QUESTION}],
        "tools": TOOLS,
        "temperature": 0,
        "max_tokens": 6,
    }
    whole = api.chat.completions.create(**ask)
    choice = whole.choices[0]
    assert choice.finish_reason == "length" and not choice.message.tool_calls
    assert (choice.message.content or "").startswith('<tool_call>\n{"name"')
    chunks = list(api.chat.completions.create(**ask, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == choice.message.content
    assert chunks[-1].choices[0].finish_reason == "length"


def test_stop_strings_cut_the_answer(serve: Serve, demo_backend: LocalBackend) -> None:
    api = client(serve(demo_backend).url)
    ask = {"model": "demo", "messages": [{"role": "user", "content": "hello"}], "temperature": 0}
    full = api.chat.completions.create(**ask, max_tokens=40).choices[0].message.content or ""
    stop = full.strip()[3:5]
    assert len(stop) == 2, full
    cut = api.chat.completions.create(**ask, max_tokens=40, stop=[stop, "zzz"])
    assert cut.choices[0].message.content == full[: full.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    streamed = api.chat.completions.create(**ask, max_tokens=40, stop=stop, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == full[: full.index(stop)]


def test_a_stepped_prefill_sends_nothing_until_the_first_words(
    serve: Serve, tiny_backend: LocalBackend
) -> None:
    loaded = tiny_backend.loaded
    pace = loaded.prefill_pace
    loaded.prefill_pace = PrefillPace(step_s=1e-6)  # too slow for one step: one token a step
    loaded.prompt_cache.clear()
    try:
        stream = client(serve(tiny_backend).url).chat.completions.create(
            model=tiny_backend.card.name,
            messages=[{"role": "user", "content": "Tell me about the sea. " * 20}],
            temperature=0,
            max_tokens=4,
            stream=True,
        )
        chunks = list(stream)
    finally:
        loaded.prefill_pace = pace
        loaded.prompt_cache.clear()
    deltas = [c.choices[0] for c in chunks if c.choices]
    assert deltas[0].delta.role == "assistant" and deltas[-1].finish_reason == "length"
    # Between the role and the end: words only (a prefill step has no delta to send).
    assert all(d.delta.content for d in deltas[1:-1]), deltas
    assert len(deltas) - 2 >= 1


def test_a_connection_idle_as_long_as_a_client_pool_keeps_it_is_still_served(
    serve: Serve, demo_backend: LocalBackend
) -> None:
    """Clients keep idle connections in a pool and reuse them (httpx, which the openai client
    uses, for 5 s). A server that closes one first races the client's next request on it, which
    then fails; it is kept open longer here."""
    served = serve(demo_backend)
    host, port = served.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        for pause in (6, 0):  # past httpx's 5 s (uvicorn's own default closes it at 5)
            connection.request("GET", "/v1/models")
            response = connection.getresponse()
            assert response.status == 200 and json.loads(response.read())["data"]
            time.sleep(pause)
    finally:
        connection.close()
