"""The tiny random-weight models the other tests and the benchmarks stand on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten
from mlx_lm import load, stream_generate
from mlx_lm.tokenizer_utils import TokenizerWrapper

from tests.tiny_models import (
    BENCH_LLAMA,
    EOS_TOKEN_IDS,
    SPECIAL_TOKEN_IDS,
    SPECIAL_TOKENS,
    build_tiny_model,
    build_tokenizer,
    model_config,
    parameter_count,
    silent_token_ids,
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


def test_loads_with_markers_and_a_consistent_index(
    tiny_model: Path, request: pytest.FixtureRequest
) -> None:
    model, tokenizer, config = cast(
        "tuple[nn.Module, TokenizerWrapper, dict[str, Any]]",
        load(str(tiny_model), return_config=True),
    )
    assert config["model_type"] == request.node.callspec.params["tiny_model"]
    assert config["vocab_size"] >= len(tokenizer._tokenizer)
    assert set(tokenizer.eos_token_ids) == set(EOS_TOKEN_IDS)
    assert tokenizer.has_tool_calling and tokenizer.tool_call_start == "<tool_call>"
    assert tokenizer.tool_call_end == "</tool_call>"
    assert tokenizer.has_thinking and tokenizer.think_start == "<think>"
    assert tokenizer.think_end == "</think>"

    index = json.loads((tiny_model / "model.safetensors.index.json").read_text())
    weight_map: dict[str, str] = index["weight_map"]
    files = sorted(set(weight_map.values()))
    assert files == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert sorted(p.name for p in tiny_model.glob("*.safetensors")) == files
    stored: dict[str, mx.array] = {}
    for name in files:
        tensors = mx.load(str(tiny_model / name))
        assert isinstance(tensors, dict)
        assert {k for k, f in weight_map.items() if f == name} == set(tensors)
        stored.update(tensors)
    assert index["metadata"]["total_size"] == sum(t.nbytes for t in stored.values())
    # Exactly the model's own parameters, nothing to sanitise away.
    params = dict(tree_flatten(model.parameters()))
    assert set(params) == set(stored)
    assert all(params[k].shape == stored[k].shape for k in stored)
    assert parameter_count(tiny_model) == sum(t.size for t in stored.values())
    # Split by layer: the first two layers (and the embedding) in the first file.
    assert weight_map["model.embed_tokens.weight"] == files[0]
    assert weight_map["model.layers.1.input_layernorm.weight"] == files[0]
    assert weight_map["model.layers.2.input_layernorm.weight"] == files[1]
    assert weight_map["model.norm.weight"] == files[1]


def test_greedy_decoding_wanders_and_runs_to_max_tokens(tiny_model: Path) -> None:
    model, tokenizer = load(str(tiny_model))[:2]
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hello! Who are you?"}], add_generation_prompt=True
    )
    ids: list[int] = []
    text = ""
    last = None
    for last in stream_generate(model, tokenizer, prompt, max_tokens=100):
        ids.append(last.token)
        text += last.text
    assert last is not None and last.finish_reason == "length"
    assert len(ids) == 100
    assert len(set(ids)) >= 30, ids
    assert len(set(ids[-50:])) >= 10, ids  # not stuck in a short cycle
    # Silent ids (special tokens, non-printable bytes) never come out: plain ASCII text.
    assert not set(ids) & set(silent_token_ids(tiny_model, len(tokenizer._tokenizer)))
    assert text and all(c == "\n" or " " <= c <= "~" for c in text), text


def test_same_seed_same_model_other_seed_other_weights(tmp_path: Path) -> None:
    a = build_tiny_model(tmp_path / "a", num_layers=2, shards=1)
    b = build_tiny_model(tmp_path / "b", num_layers=2, shards=1)
    c = build_tiny_model(tmp_path / "c", num_layers=2, shards=1, seed=1)
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()


def test_special_tokens_are_single_ids_and_round_trip(tiny_llama: Path) -> None:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(tiny_llama)
    assert hf.eos_token == "<|im_end|>" and hf.pad_token == "<|endoftext|>"
    for token in SPECIAL_TOKENS:
        assert hf.encode(token, add_special_tokens=False) == [SPECIAL_TOKEN_IDS[token]]
    assert hf.encode("hello world") == hf.encode("hello world", add_special_tokens=False)

    _, tokenizer = load(str(tiny_llama))[:2]
    text = (
        '<think>\nhmm, 42</think>\n\nSure.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n'
        "</tool_call> café, 日本 {}<|im_end|>"
    )
    ids = hf.encode(text, add_special_tokens=False)
    detokenizer = tokenizer.detokenizer
    detokenizer.reset()
    for i in ids:
        detokenizer.add_token(i)
    detokenizer.finalize()
    assert detokenizer.text == text == hf.decode(ids)


def test_chat_template_tools_tool_calls_and_thinking(tiny_llama: Path) -> None:
    _, tokenizer = load(str(tiny_llama))[:2]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris and Lyon?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                },  # noqa: E501
                {
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Lyon"}'},
                },  # noqa: E501
            ],
        },
        {"role": "tool", "content": "sunny"},
        {"role": "tool", "content": "rain"},
    ]
    text = tokenizer.apply_chat_template(
        messages, tools=TOOLS, add_generation_prompt=True, tokenize=False
    )
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert "<tools>\n" + json.dumps(TOOLS[0]) + "\n</tools>" in text
    tool_parser = tokenizer.tool_parser
    assert tool_parser is not None
    calls = [
        tool_parser(part.split("</tool_call>")[0])
        for part in text.split("<|im_start|>assistant\n")[1].split("<tool_call>")[1:]
    ]
    assert calls == [
        {"name": "get_weather", "arguments": {"city": "Paris"}},
        {"name": "get_weather", "arguments": {"city": "Lyon"}},
    ]
    assert text.endswith(
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n"
        "<tool_response>\nrain\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True)
    assert tokenizer.decode(ids) == text

    user = [{"role": "user", "content": "Hi"}]
    plain = tokenizer.apply_chat_template(user, add_generation_prompt=True, tokenize=False)
    assert plain == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    off = tokenizer.apply_chat_template(
        user, add_generation_prompt=True, tokenize=False, enable_thinking=False
    )
    assert off == plain + "<think>\n\n</think>\n\n"
    no_prompt = tokenizer.apply_chat_template(user, tokenize=False)
    assert no_prompt == "<|im_start|>user\nHi<|im_end|>\n"


def test_bench_config_is_about_fifty_million_parameters(tmp_path: Path) -> None:
    from mlx_lm.models import llama

    kwargs = {k: v for k, v in BENCH_LLAMA.items() if k != "shards"}
    config = model_config("llama", **kwargs)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    params = cast("list[tuple[str, mx.array]]", tree_flatten(model.parameters()))
    count = sum(p.size for _, p in params)
    assert 45_000_000 <= count <= 60_000_000
    assert build_tokenizer(tmp_path, BENCH_LLAMA["vocab_size"]) == BENCH_LLAMA["vocab_size"]


def test_silent_rows_are_zero_and_padding_is_silent(tmp_path: Path) -> None:
    folder = build_tiny_model(tmp_path / "m", vocab_size=300, num_layers=1, shards=1)
    weights = mx.load(str(folder / "model.safetensors"))
    assert isinstance(weights, dict)
    head = weights["lm_head.weight"]
    silent = silent_token_ids(folder, 300)
    assert set(SPECIAL_TOKEN_IDS.values()) <= set(silent)
    assert mx.all(head[mx.array(silent)] == 0).item()
    speaking = sorted(set(range(300)) - set(silent))
    assert len(speaking) > 100
    assert not mx.any(mx.all(head[mx.array(speaking)] == 0, axis=1)).item()
    # Rows past the tokenizer (a padded embedding) are silent too.
    assert set(range(300, 320)) <= set(silent_token_ids(folder, 320))


@pytest.mark.parametrize("arch", ["llama", "qwen3_moe"])
def test_config_has_the_fields_mlx_lm_needs(arch: str) -> None:
    import importlib

    config = model_config(arch)
    args_cls = importlib.import_module(f"mlx_lm.models.{arch}").ModelArgs
    args = args_cls.from_dict(config)
    assert args.num_hidden_layers == 4 and args.vocab_size == 768
    assert config["eos_token_id"] == list(EOS_TOKEN_IDS)
