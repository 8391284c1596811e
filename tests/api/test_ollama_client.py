"""The `ollama` package against the server: a streamed chat, tools, generate, list, ps, show."""

from __future__ import annotations

from typing import Any

import ollama

from exo_tui.chat.backend import LocalBackend
from exo_tui.chat.tools import BUILTIN_TOOLS
from tests.api.conftest import Serve

OPTIONS = {"temperature": 0, "num_predict": 40}


def test_streamed_chat_is_the_whole_answer_in_pieces(
    serve: Serve, demo_backend: LocalBackend
) -> None:
    api = ollama.Client(host=serve(demo_backend).url)
    messages = [{"role": "user", "content": "hello"}]
    whole = api.chat(model="demo", messages=messages, stream=False, options=OPTIONS)
    parts = list(api.chat(model="demo", messages=messages, stream=True, options=OPTIONS))
    assert "".join(p.message.content or "" for p in parts) == whole.message.content
    assert (whole.message.content or "").strip() and whole.message.role == "assistant"
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    last = parts[-1]
    assert last.done_reason in ("stop", "length") and last.done_reason == whole.done_reason
    assert last.eval_count == whole.eval_count and (last.eval_count or 0) > 0
    assert (last.prompt_eval_count or 0) > 0 and (last.total_duration or 0) > 0


TOOLS: Any = [
    {"type": "function", "function": {"name": t.name, "description": t.description,
                                      "parameters": t.parameters}}
    for t in BUILTIN_TOOLS
]  # fmt: skip


def test_tool_call_comes_with_arguments(serve: Serve, demo_backend: LocalBackend) -> None:
    api = ollama.Client(host=serve(demo_backend).url)
    tools = TOOLS
    question = {"role": "user", "content": "what is 12 times 34"}
    answer = api.chat(
        model="demo", messages=[question], tools=tools, options={"temperature": 0}, stream=False
    )
    calls = answer.message.tool_calls or []
    assert [c.function.name for c in calls] == ["calculator"]
    assert "expression" in calls[0].function.arguments
    followed = api.chat(
        model="demo",
        messages=[
            question,
            {"role": "assistant", "content": "", "tool_calls": [c.model_dump() for c in calls]},
            {"role": "tool", "content": "408", "tool_name": "calculator"},
        ],
        tools=tools,
        options={"temperature": 0},
    )
    assert "408" in (followed.message.content or "")


def test_a_tool_call_cut_by_num_predict_comes_as_the_text_it_had(
    serve: Serve, demo_backend: LocalBackend
) -> None:
    api = ollama.Client(host=serve(demo_backend).url)
    ask: Any = {
        "model": "demo",
        "messages": [{"role": "user", "content": "what is 12 times 34"}],
        "tools": TOOLS,
        "options": {"temperature": 0, "num_predict": 6},
    }
    whole = api.chat(**ask, stream=False)
    assert whole.done_reason == "length" and not whole.message.tool_calls
    assert (whole.message.content or "").startswith('<tool_call>\n{"name"')
    parts = list(api.chat(**ask, stream=True))
    assert "".join(p.message.content or "" for p in parts) == whole.message.content


def test_generate_list_show_version(serve: Serve, demo_backend: LocalBackend) -> None:
    api = ollama.Client(host=serve(demo_backend).url)
    listed = api.list()
    assert [m.model for m in listed.models] == ["demo"]
    assert listed.models[0].details is not None and listed.models[0].details.family == "llama"
    [loaded] = api.ps().models
    assert loaded.model == "demo" and loaded.context_length == 2048
    shown = api.show("demo:latest")
    assert shown.modelinfo is not None and shown.modelinfo["general.architecture"] == "llama"
    assert shown.capabilities is not None and "tools" in shown.capabilities
    parts = list(api.generate(model="demo", prompt="hello", stream=True, options=OPTIONS))
    assert "".join(p.response or "" for p in parts).strip() and parts[-1].done
    whole = api.generate(model="demo", prompt="hello", system="Be brief.", options=OPTIONS)
    assert (whole.response or "").strip() and whole.done and (whole.eval_count or 0) > 0


def test_generate_raw_takes_the_prompt_as_it_stands(
    serve: Serve, demo_backend: LocalBackend
) -> None:
    """`raw`: no template. The templated prompt sent raw gives the templated answer; the bare
    words sent raw are another prompt, with fewer tokens."""
    from engine.generate import render_prompt
    from engine.types import ChatRequest, Message

    api = ollama.Client(host=serve(demo_backend).url)
    loaded = demo_backend.loaded
    templated = render_prompt(
        loaded, ChatRequest(messages=(Message(role="user", content="hello"),))
    )
    text = loaded.tokenizer.decode(templated)
    cooked = api.generate(model="demo", prompt="hello", options=OPTIONS)
    as_sent = api.generate(model="demo", prompt=text, raw=True, options=OPTIONS)
    assert as_sent.response == cooked.response
    assert as_sent.prompt_eval_count == cooked.prompt_eval_count == len(templated)
    bare = api.generate(model="demo", prompt="hello", raw=True, options=OPTIONS)
    assert (bare.prompt_eval_count or 0) < len(templated)
    api.generate(model="demo", prompt="hello", format="", options=OPTIONS)  # "" asks for nothing
