"""gpt-oss behind both APIs, with the official `openai` and `ollama` packages: its analysis
channel comes as reasoning, its tool call as a tool call, its final channel as the answer.

The model is tests/scripted_gpt_oss.py's: a real gpt_oss run by the engine, whose weights write
reasoning and a calculator call, then after the tool's result its answer."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ollama
import openai
import pytest

from engine.loading import load_model, run_loading
from exo_tui.chat.backend import LocalBackend
from exo_tui.chat.tools import CALCULATOR, calculate
from tests.api.conftest import Serve
from tests.scripted_gpt_oss import Script

SCRIPT = Script()
QUESTION = "What is 6 times 7?"
SYSTEM = "Answer with the tool."
OPENAI_TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": CALCULATOR.name,
            "description": CALCULATOR.description,
            "parameters": CALCULATOR.parameters,
        },
    }
]


@pytest.fixture(scope="module")
def gpt_oss_backend(scripted_gpt_oss: Path) -> Iterator[LocalBackend]:
    backend = LocalBackend(run_loading(load_model(scripted_gpt_oss), lambda _: None))
    yield backend
    backend.unload()


def test_openai_streams_reasoning_and_the_call_then_answers_the_result(
    serve: Serve, gpt_oss_backend: LocalBackend
) -> None:
    url = serve(gpt_oss_backend).url
    api = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    name = gpt_oss_backend.card.name
    messages: Any = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    stream = api.chat.completions.create(
        model=name, messages=messages, tools=OPENAI_TOOLS, temperature=0, max_tokens=64,
        stream=True,
    )  # fmt: skip
    reasoning: list[str] = []
    text: list[str] = []
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        extra = delta.model_extra or {}
        if extra.get("reasoning_content"):
            assert not calls, "reasoning after the call"
            reasoning.append(extra["reasoning_content"])
        text.append(delta.content or "")
        for call in delta.tool_calls or ():
            entry = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
            entry["id"] += call.id or ""
            entry["name"] += call.function.name or "" if call.function else ""
            entry["arguments"] += call.function.arguments or "" if call.function else ""
        finish = chunk.choices[0].finish_reason or finish
    assert len(reasoning) > 1 and "".join(reasoning) == SCRIPT.reasoning  # streamed in pieces
    assert "".join(text) == ""
    assert finish == "tool_calls" and list(calls) == [0]
    call = calls[0]
    assert call["name"] == "calculator" and call["id"]
    result = calculate(json.loads(call["arguments"])["expression"])
    assert str(result) == SCRIPT.result_marker

    messages += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": call["name"], "arguments": call["arguments"]},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call["id"], "content": str(result)},
    ]
    answer = api.chat.completions.create(
        model=name, messages=messages, tools=OPENAI_TOOLS, temperature=0, max_tokens=64
    )
    choice = answer.choices[0]
    assert choice.message.content == SCRIPT.answer and not choice.message.tool_calls
    assert (choice.message.model_extra or {}).get("reasoning_content") is None
    assert choice.finish_reason == "stop"
    assert answer.usage is not None and answer.usage.prompt_tokens_details is not None
    assert (answer.usage.prompt_tokens_details.cached_tokens or 0) > 0


def test_openai_whole_answer_carries_reasoning_and_the_call(
    serve: Serve, gpt_oss_backend: LocalBackend
) -> None:
    api = openai.OpenAI(base_url=f"{serve(gpt_oss_backend).url}/v1", api_key="x", max_retries=0)
    answer = api.chat.completions.create(
        model=gpt_oss_backend.card.name,
        messages=[{"role": "user", "content": QUESTION}],
        tools=OPENAI_TOOLS,
        temperature=0,
        max_tokens=64,
    )
    message = answer.choices[0].message
    assert (message.model_extra or {}).get("reasoning_content") == SCRIPT.reasoning
    assert not message.content
    (call,) = message.tool_calls or []
    assert call.type == "function" and call.function.name == "calculator"
    assert json.loads(call.function.arguments) == {"expression": "6*7"}
    assert answer.choices[0].finish_reason == "tool_calls"


def test_ollama_thinking_then_the_call_then_the_answer(
    serve: Serve, gpt_oss_backend: LocalBackend
) -> None:
    api = ollama.Client(host=serve(gpt_oss_backend).url)
    name = gpt_oss_backend.card.name
    question = {"role": "user", "content": QUESTION}
    parts = list(
        api.chat(
            model=name,
            messages=[question],
            tools=OPENAI_TOOLS,
            options={"temperature": 0, "num_predict": 64},
            stream=True,
        )
    )
    thinking = [p.message.thinking for p in parts if p.message.thinking]
    assert len(thinking) > 1 and "".join(thinking) == SCRIPT.reasoning
    assert "".join(p.message.content or "" for p in parts) == ""
    calls = [c for p in parts for c in p.message.tool_calls or ()]
    assert [c.function.name for c in calls] == ["calculator"]
    assert dict(calls[0].function.arguments) == {"expression": "6*7"}
    assert parts[-1].done and parts[-1].done_reason == "stop"

    followed = api.chat(
        model=name,
        messages=[
            question,
            {
                "role": "assistant",
                "content": "",
                "thinking": "".join(thinking),
                "tool_calls": [c.model_dump() for c in calls],
            },
            {"role": "tool", "content": SCRIPT.result_marker, "tool_name": "calculator"},
        ],
        tools=OPENAI_TOOLS,
        options={"temperature": 0, "num_predict": 64},
        stream=False,
    )
    assert followed.message.content == SCRIPT.answer
    assert not followed.message.thinking and not followed.message.tool_calls
