"""gpt-oss through the engine on tiny models built as mlx-community's are: the tokenizer is
harmony's, the quantization mlx-community's, the sliding window right with the prompt cache, and
a chat with tools comes out as reasoning, a tool call and text."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from mlx_lm import stream_generate
from mlx_lm.models.cache import RotatingKVCache
from mlx_lm.models.switch_layers import QuantizedSwitchLinear

from engine.generate import generate, prefill_next_turn, render_prompt
from engine.harmony import load_gpt_oss_encoding, render_gpt_oss_prompt
from engine.loading import LoadedModel, load_model_sync
from engine.models.cards import read_card
from engine.types import (
    ChatRequest,
    Chunk,
    DoneChunk,
    Message,
    ReasoningChunk,
    TextChunk,
    ToolCall,
    ToolCallChunk,
)
from exo_tui.chat.tools import BUILTIN_TOOLS
from tests.scripted_gpt_oss import Script
from tests.tiny_gpt_oss import build_tiny_gpt_oss
from tests.tiny_models import corpus

WINDOW = 16  # the tiny model's sliding window


def done_of(chunks: Iterable[Chunk]) -> DoneChunk:
    collected = list(chunks)
    assert isinstance(collected[-1], DoneChunk)
    return collected[-1]


def joined(chunks: Iterable[Chunk], kind: type[TextChunk] | type[ReasoningChunk]) -> str:
    return "".join(c.text for c in chunks if isinstance(c, kind))


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory, harmony_vocabulary: Path) -> LoadedModel:
    """The tiny gpt-oss in float32: the prompt cache's tests compare tokens with mlx-lm's, which
    prefills in other steps; in bf16 the rounding of other shapes can swap two close logits of
    its 201088 (the kernels' products in particular), in float32 it does not."""
    folder = build_tiny_gpt_oss(tmp_path_factory.mktemp("gpt-oss-fp32"), dtype="float32")
    return load_model_sync(folder)


@pytest.fixture(scope="module")
def shipped(tiny_gpt_oss: Path) -> LoadedModel:
    """The tiny gpt-oss in bf16, as mlx-community's are, loaded on this (the main) thread."""
    return load_model_sync(tiny_gpt_oss)


@pytest.fixture(scope="module")
def scripted(scripted_gpt_oss: Path) -> LoadedModel:
    return load_model_sync(scripted_gpt_oss)


def mlx_lm_tokens(loaded: LoadedModel, prompt: list[int], max_tokens: int) -> list[int]:
    """mlx-lm's own greedy generation on the same model, from a fresh cache."""
    return [
        r.token
        for r in stream_generate(loaded.model, loaded.tokenizer, prompt, max_tokens=max_tokens)
    ]


# --- the tiny model is gpt-oss as mlx-community ships it ----------------------------------------


def test_the_tokenizer_encodes_and_decodes_as_harmony(loaded: LoadedModel) -> None:
    encoding = load_gpt_oss_encoding()
    texts = [*corpus(200, seed=5), "Grüße aus Zürich 🪿 — ½ × π ≈ 1.57", "  two  spaces\n\n\tend"]
    for text in texts:
        assert loaded.tokenizer.encode(text) == encoding.encode(text), text
    rendered = render_gpt_oss_prompt([Message(role="user", content="Hi")], BUILTIN_TOOLS)
    assert loaded.tokenizer.decode(rendered) == encoding.decode_utf8(rendered)
    assert loaded.tokenizer.encode("<|start|>assistant<|channel|>final") == [
        200006,
        173781,
        200005,
        17196,
    ]
    # The engine ends an answer at harmony's <|return|> and <|call|>.
    assert {200002, 200012} <= set(loaded.tokenizer.eos_token_ids)


def test_the_model_is_quantized_as_mlx_communitys_gpt_oss(
    tiny_gpt_oss: Path, shipped: LoadedModel
) -> None:
    config = json.loads((tiny_gpt_oss / "config.json").read_text())
    quantization = config["quantization"]
    assert {k: quantization[k] for k in ("group_size", "bits", "mode")} == {
        "group_size": 32,
        "bits": 4,
        "mode": "mxfp4",
    }
    named = {k for k, v in quantization.items() if isinstance(v, dict)}
    assert "model.embed_tokens" in named and "lm_head" in named
    assert {f"model.layers.0.self_attn.{p}_proj" for p in "qkvo"} <= named
    assert not any(".experts." in k for k in named)  # the experts take the default
    assert all(quantization[k]["bits"] == 8 for k in named)
    model: Any = shipped.model  # mlx-lm's models are untyped
    layer = model.layers[0]
    for projection in ("gate_proj", "up_proj", "down_proj"):
        experts = getattr(layer.mlp.experts, projection)
        assert isinstance(experts, QuantizedSwitchLinear) and experts.mode == "mxfp4"
    assert layer.self_attn.sinks.shape == (4,)
    assert config["rope_scaling"]["rope_type"] == "yarn" and config["vocab_size"] == 201088
    card = read_card(tiny_gpt_oss)
    assert card.quantization is not None and card.quantization.mode == "mxfp4"
    assert card.quantization.bits_per_weight == 4.25


# --- the sliding window with the prompt cache ----------------------------------------------------


def test_a_prompt_longer_than_the_window_gives_mlx_lms_tokens(loaded: LoadedModel) -> None:
    model: Any = loaded.model
    caches = model.make_cache()
    assert isinstance(caches[0], RotatingKVCache) and caches[0].max_size == WINDOW
    text = " ".join(corpus(8, seed=1))
    request = ChatRequest(
        messages=(Message(role="user", content=text),), raw=True, temperature=0.0, max_tokens=24
    )
    prompt = render_prompt(loaded, request)
    assert 2 * WINDOW < len(prompt) < 128  # one pass with its first token, past the window
    loaded.prompt_cache.clear()
    done = done_of(generate(loaded, request))
    assert list(done.token_ids) == mlx_lm_tokens(loaded, prompt, 24)
    assert len(set(done.token_ids)) > 8


def test_a_second_turn_from_a_cache_past_the_window_gives_mlx_lms_tokens(
    loaded: LoadedModel,
) -> None:
    """The second turn's start was prefilled while it was typed: its cache, past the window
    (its sliding layers rotated), is taken and extended."""
    loaded.prompt_cache.clear()
    first = ChatRequest(
        messages=(Message(role="system", content="Be brief."), Message(role="user", content="Hi")),
        temperature=0.0,
        max_tokens=20,
    )
    answer = list(generate(loaded, first))
    history = (*first.messages, Message(role="assistant", content=joined(answer, TextChunk)))
    typed = "Tell me about the garden"
    prefilled = prefill_next_turn(
        loaded, first.model_copy(update={"messages": history}), None, typed
    )
    assert prefilled > WINDOW
    second = first.model_copy(
        update={"messages": (*history, Message(role="user", content=typed + " in the morning"))}
    )
    prompt = render_prompt(loaded, second)
    done = done_of(generate(loaded, second))
    assert done.usage.cached_tokens > 2 * WINDOW  # the rotated cache was used, not rebuilt
    assert list(done.token_ids) == mlx_lm_tokens(loaded, prompt, 20)


def test_a_turn_sent_as_it_was_prefilled_gives_mlx_lms_tokens(loaded: LoadedModel) -> None:
    loaded.prompt_cache.clear()
    request = ChatRequest(
        messages=(Message(role="user", content="What do you know about rivers and bridges?"),),
        temperature=0.0,
        max_tokens=16,
    )
    prefill_next_turn(loaded, request.model_copy(update={"messages": ()}), None, "What do you")
    prefill_next_turn(
        loaded,
        request.model_copy(update={"messages": ()}),
        None,
        request.messages[0].content,
    )
    done = done_of(generate(loaded, request))
    assert done.usage.cached_tokens > 2 * WINDOW
    assert list(done.token_ids) == mlx_lm_tokens(loaded, render_prompt(loaded, request), 16)


# --- a chat with tools, through the engine -------------------------------------------------------


def test_reasoning_then_a_tool_call_then_the_answer(scripted: LoadedModel) -> None:
    script = Script()
    scripted.prompt_cache.clear()
    question = Message(role="user", content="What is 6 times 7?")
    request = ChatRequest(
        messages=(Message(role="system", content="Answer with the tool."), question),
        tools=BUILTIN_TOOLS,
        temperature=0.0,
        max_tokens=64,
    )
    chunks = list(generate(scripted, request))
    assert sum(isinstance(c, ReasoningChunk) for c in chunks) > 3  # streamed token by token
    assert joined(chunks, ReasoningChunk) == script.reasoning
    assert joined(chunks, TextChunk) == ""
    (call,) = [c for c in chunks if isinstance(c, ToolCallChunk)]
    assert call.name == "calculator" and call.arguments == {"expression": "6*7"}
    done = done_of(chunks)
    assert done.finish_reason == "tool_calls"

    calling = Message(
        role="assistant",
        reasoning=script.reasoning,
        tool_calls=(ToolCall(id=call.id, name=call.name, arguments=call.arguments),),
    )
    result = Message(role="tool", tool_call_id=call.id, content=script.result_marker)
    follow = request.model_copy(update={"messages": (*request.messages, calling, result)})
    # Harmony renders the call as the model wrote it: the second prompt continues the first
    # answer, whose cache (its sliding layers rotated) carries the second.
    answered = render_prompt(scripted, request) + list(done.token_ids)
    assert render_prompt(scripted, follow)[: len(answered)] == answered
    chunks = list(generate(scripted, follow))
    assert joined(chunks, TextChunk) == script.answer
    assert not any(isinstance(c, ReasoningChunk | ToolCallChunk) for c in chunks)
    done = done_of(chunks)
    assert done.finish_reason == "stop"
    assert done.usage.cached_tokens == len(answered)
    assert list(done.token_ids) == script.second(load_gpt_oss_encoding())


def test_a_result_sent_back_without_the_reasoning_continues_the_prompts_cache(
    scripted: LoadedModel,
) -> None:
    """API clients send back the call but not the reasoning: the second prompt leaves the first
    answer where it began, and the cache kept as it stood after the first prompt serves it."""
    scripted.prompt_cache.clear()
    request = ChatRequest(
        messages=(Message(role="user", content="What is 6 times 7?"),),
        tools=BUILTIN_TOOLS,
        temperature=0.0,
        max_tokens=64,
    )
    first = render_prompt(scripted, request)
    (call,) = [c for c in generate(scripted, request) if isinstance(c, ToolCallChunk)]
    calling = Message(
        role="assistant", tool_calls=(ToolCall(id=call.id, name=call.name, arguments={}),)
    )
    result = Message(role="tool", tool_call_id=call.id, content=Script().result_marker)
    follow = request.model_copy(update={"messages": (*request.messages, calling, result)})
    done = done_of(generate(scripted, follow))
    assert done.usage.cached_tokens == len(first)
    scripted.prompt_cache.clear()
    assert done_of(generate(scripted, follow)).token_ids == done.token_ids


def test_the_next_turn_continues_the_longest_prompt_it_shares(scripted: LoadedModel) -> None:
    """Harmony drops an earlier turn's reasoning: the next turn leaves the tool call's answer
    where it began. Of all the prompts and answers before it, the longest it shares a start
    with is cached, though every cache past the window has rotated."""
    script = Script()
    scripted.prompt_cache.clear()
    history: tuple[Message, ...] = (Message(role="user", content="What is 6 times 7?"),)
    request = ChatRequest(messages=history, tools=BUILTIN_TOOLS, temperature=0.0, max_tokens=64)
    written: list[list[int]] = []
    for _ in range(2):
        prompt = render_prompt(scripted, request)
        chunks = list(generate(scripted, request))
        written += [prompt, prompt + list(done_of(chunks).token_ids)]
        calls = [c for c in chunks if isinstance(c, ToolCallChunk)]
        history += tuple(
            Message(role="assistant", reasoning=script.reasoning, tool_calls=(
                ToolCall(id=call.id, name=call.name, arguments=call.arguments),))
            for call in calls
        ) + tuple(
            Message(role="tool", tool_call_id=call.id, content=script.result_marker)
            for call in calls
        )  # fmt: skip
        if not calls:
            history += (Message(role="assistant", content=joined(chunks, TextChunk)),)
        request = request.model_copy(update={"messages": history})
    history += (Message(role="user", content="And 7 times 8?"),)
    turn = request.model_copy(update={"messages": history})
    prompt = render_prompt(scripted, turn)
    assert prompt[: len(written[1])] != written[1]  # the call's answer: its reasoning is gone

    def shared(before: list[int]) -> int:
        pairs = enumerate(zip(prompt, before, strict=False))
        return next((i for i, (a, b) in pairs if a != b), min(len(prompt), len(before)))

    done = done_of(generate(scripted, turn))
    assert done.usage.cached_tokens == max(shared(before) for before in written)
    assert done.usage.cached_tokens > 2 * WINDOW


def test_a_model_loaded_on_one_thread_answers_on_another(shipped: LoadedModel) -> None:
    """Yarn's frequencies are built at load, beside the parameters: evaluated there, so the API's
    answering threads can run the model (left lazy, only the loading thread's stream could)."""
    request = ChatRequest(
        messages=(Message(role="user", content="Hello"),), temperature=0.0, max_tokens=8
    )
    answered: list[DoneChunk | BaseException] = []

    def answer() -> None:
        try:
            answered.append(done_of(generate(shipped, request)))
        except BaseException as error:  # the thread's failure, said in the test
            answered.append(error)

    thread = threading.Thread(target=answer)
    thread.start()
    thread.join()
    (done,) = answered
    assert isinstance(done, DoneChunk), done
    assert done.usage.completion_tokens == 8
