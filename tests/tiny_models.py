"""Tiny random-weight models in mlx-lm format, built offline.

Used by the tests (through the fixtures in ``tests/conftest.py``) and by the benchmark scripts
under ``bench/``. Nothing here touches the network or any global cache: every call writes a
fresh folder that ``mlx_lm.load(str(folder))`` loads like a converted Hugging Face model:

- ``config.json`` for one of :data:`ARCHITECTURES` (mlx-lm's ``ModelArgs`` fields),
- weights in ``model-0000k-of-0000n.safetensors`` files split by layer, with a
  ``model.safetensors.index.json``,
- a byte-level BPE tokenizer (``tokenizer.json``) trained with the ``tokenizers`` package on a
  generated English corpus, and ``tokenizer_config.json`` with a Qwen-style chat template that
  mlx-lm recognises as JSON tool calling (``<tool_call>``) with ``<think>`` reasoning.

The random weights are spread so that greedy decoding wanders over many token ids instead of
repeating one. By default the output rows of the special tokens (and of any padding rows beyond
the tokenizer's size) are zero, so a greedy random model never ends its answer by itself nor
emits markup: ``max_tokens`` decides the length. Pass ``suppress_special=False`` to keep them.

Example::

    from tests.tiny_models import build_tiny_model, BENCH_LLAMA
    path = build_tiny_model(tmp / "tiny", "qwen3")
    path = build_tiny_model(tmp / "bench", "llama", **BENCH_LLAMA)   # ~50M parameters
"""

from __future__ import annotations

import importlib
import json
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
from mlx.utils import tree_flatten

from engine.models.weights import layer_of

ARCHITECTURES: tuple[str, ...] = ("llama", "qwen2", "qwen3", "qwen3_moe")

# Special tokens, in id order: they take ids 0..8 in every tokenizer built here.
SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)
SPECIAL_TOKEN_IDS: dict[str, int] = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"
BOS_TOKEN = "<|endoftext|>"
# config.json's eos_token_id: <|im_end|> first, then <|endoftext|>.
EOS_TOKEN_IDS: tuple[int, ...] = (SPECIAL_TOKEN_IDS[EOS_TOKEN], SPECIAL_TOKEN_IDS[PAD_TOKEN])

# A ~50M-parameter llama for benchmarks: build_tiny_model(path, "llama", **BENCH_LLAMA).
BENCH_LLAMA: dict[str, Any] = {
    "hidden_size": 512,
    "num_layers": 12,
    "num_heads": 8,
    "num_kv_heads": 8,
    "intermediate_size": 2048,
    "vocab_size": 4096,
    "shards": 4,
}

# Qwen-style chat template. It names both `<tool_call>` and `tool_call.name`, which is what
# mlx-lm's `_infer_tool_parser` needs to pick the `json_tools` parser.
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    'arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": '
    '<function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\' }}'
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' %}"
    "{%- if not loop.first %}"
    "{{- '<|im_start|>system\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- elif message.role == 'user' %}"
    "{{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if message.content %}{{- message.content }}{%- endif %}"
    "{%- if message.tool_calls %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{%- if not loop.first or message.content %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": ' }}{{- tool_call.name | tojson }}"
    "{{- ', \"arguments\": ' }}"
    "{%- if tool_call.arguments is string %}{{- tool_call.arguments }}"
    "{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}"
    "{{- '<|im_start|>user' }}"
    "{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)


# --------------------------------------------------------------------------- corpus


_NAMES = [
    "Alice", "Bob", "Carol", "Dave", "Erin", "Frank", "Grace", "Heidi", "Ivan", "Judy",
    "Mallory", "Niaj", "Olivia", "Peggy", "Rupert", "Sybil", "Trent", "Victor", "Walter",
]  # fmt: skip
_NOUNS = [
    "cat", "dog", "river", "mountain", "computer", "garden", "city", "library", "teacher",
    "window", "engine", "network", "cluster", "model", "token", "answer", "question", "story",
    "kitchen", "market", "train", "planet", "forest", "letter", "window", "bridge", "song",
    "machine", "number", "weather", "morning", "evening", "server", "message", "journey",
]  # fmt: skip
_ADJECTIVES = [
    "quick", "lazy", "bright", "quiet", "large", "small", "ancient", "modern", "happy", "cold",
    "warm", "distant", "simple", "complex", "green", "blue", "red", "careful", "strange", "new",
]  # fmt: skip
_VERBS = [
    "runs", "jumps", "reads", "writes", "builds", "opens", "closes", "finds", "sends", "loads",
    "computes", "returns", "watches", "carries", "explains", "remembers", "follows", "answers",
]  # fmt: skip
_PLACES = [
    "near the station", "in the morning", "after lunch", "under the bridge", "on the table",
    "across the river", "before midnight", "at the office", "inside the box", "by the sea",
]  # fmt: skip
_SYLLABLES = [
    "ka", "lo", "mi", "ten", "ra", "vo", "shi", "nu", "pe", "dor", "an", "ex", "qui", "zu",
    "bel", "tor", "gri", "ph", "th", "str", "ion", "ing", "er", "al", "ous", "ment", "ly",
]  # fmt: skip
_QUESTIONS = [
    "What is the capital of France?",
    "How many legs does a spider have?",
    "Can you explain how a hash table works?",
    "Why is the sky blue?",
    "What time is it in Tokyo?",
    "Please write a short poem about the sea.",
]


def _word(rng: random.Random) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 4)))


def _sentence(rng: random.Random) -> str:
    kind = rng.randrange(10)
    name, noun, adj = rng.choice(_NAMES), rng.choice(_NOUNS), rng.choice(_ADJECTIVES)
    verb, place = rng.choice(_VERBS), rng.choice(_PLACES)
    n = rng.randint(0, 99999)
    if kind == 0:
        return f"The {adj} {noun} {verb} {place}."
    if kind == 1:
        return f"{name} {verb} {rng.randint(2, 40)} {noun}s and pays ${n / 100:.2f} for them."
    if kind == 2:
        return f"On {rng.randint(1, 28)}/{rng.randint(1, 12)}/{rng.randint(1990, 2030)}, {name} met {rng.choice(_NAMES)} {place}."  # noqa: E501
    if kind == 3:
        fn, arg = f"{rng.choice(_VERBS)[:-1]}_{noun}", rng.choice(_NOUNS)
        return f"def {fn}({arg}, count={rng.randint(1, 9)}):\n    return [{arg}] * count  # {adj}"  # noqa: E501
    if kind == 4:
        obj = {
            "name": name.lower(),
            "id": n,
            "tags": [adj, noun],
            "ok": rng.random() < 0.5,
            "score": round(rng.random() * 10, 3),
        }
        return json.dumps(obj)
    if kind == 5:
        return rng.choice(_QUESTIONS) + f" {name} asked {rng.randint(2, 12)} times."
    if kind == 6:
        return f"{rng.randint(1, 999)} + {rng.randint(1, 999)} = {rng.randint(2, 1998)}; x[{rng.randint(0, 9)}] == {n}"  # noqa: E501
    if kind == 7:
        return f"The {_word(rng)} of {_word(rng)} is {adj}, said {name} to the {_word(rng)}."
    if kind == 8:
        return f"- [{rng.choice(' x')}] {verb.capitalize()} the **{noun}** `{_word(rng)}()` ({n})"
    return f'{{"name": "get_{noun}", "arguments": {{"city": "{_word(rng).title()}", "days": {rng.randint(1, 14)}}}}}'  # noqa: E501


def corpus(lines: int = 600, seed: int = 0) -> list[str]:
    """A deterministic, varied English corpus: prose, numbers, code, JSON, markdown."""
    rng = random.Random(seed)
    return [_sentence(rng) for _ in range(lines)]


# --------------------------------------------------------------------------- tokenizer


def build_tokenizer(
    folder: Path,
    vocab_size: int = 768,
    *,
    seed: int = 0,
    texts: Iterable[str] | None = None,
    split_digits: bool = False,
) -> int:
    """Train a byte-level BPE tokenizer and write tokenizer.json + tokenizer_config.json.

    The special tokens take ids 0..8 (see :data:`SPECIAL_TOKEN_IDS`). Returns the size of the
    tokenizer, which is at most ``vocab_size`` (a small corpus may not fill it). ``texts`` replaces
    the generated corpus; ``split_digits`` makes every digit its own token.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    minimum = len(SPECIAL_TOKENS) + 256
    if vocab_size < minimum:
        raise ValueError(f"vocab_size must be at least {minimum}")

    tokenizer = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.pre_tokenizer = (
        pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
        if split_digits
        else byte_level
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # More merges need more text; a vocabulary of a few thousand needs a few thousand lines.
    lines = max(600, vocab_size * 3 // 2)
    tokenizer.train_from_iterator(corpus(lines, seed) if texts is None else texts, trainer=trainer)
    for tok in SPECIAL_TOKENS:
        assert tokenizer.token_to_id(tok) == SPECIAL_TOKEN_IDS[tok], tok
    tokenizer.save(str(folder / "tokenizer.json"))

    added = {
        str(i): {
            "content": tok,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for i, tok in enumerate(SPECIAL_TOKENS)
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": [t for t in SPECIAL_TOKENS if t not in (EOS_TOKEN, PAD_TOKEN)],
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "model_max_length": 131072,
        "split_special_tokens": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return tokenizer.get_vocab_size()


# --------------------------------------------------------------------------- model


def model_config(
    arch: str = "llama",
    *,
    hidden_size: int = 64,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    vocab_size: int = 768,
    max_position_embeddings: int = 2048,
    tie_word_embeddings: bool = False,
    num_experts: int = 4,
    num_experts_per_tok: int = 2,
    dtype: str = "float32",
) -> dict[str, Any]:
    """The config.json of a tiny model: mlx-lm's ModelArgs fields for ``arch``."""
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {arch!r}; expected one of {ARCHITECTURES}")
    if hidden_size % num_heads or num_heads % num_kv_heads:
        raise ValueError("num_heads must divide hidden_size and num_kv_heads divide num_heads")
    head_dim = hidden_size // num_heads
    config: dict[str, Any] = {
        "model_type": arch,
        "architectures": [
            {
                "llama": "LlamaForCausalLM",
                "qwen2": "Qwen2ForCausalLM",
                "qwen3": "Qwen3ForCausalLM",
                "qwen3_moe": "Qwen3MoeForCausalLM",
            }[arch]
        ],
        "hidden_size": hidden_size,
        "num_hidden_layers": num_layers,
        "intermediate_size": intermediate_size,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab_size,
        "max_position_embeddings": max_position_embeddings,
        "rope_theta": 10000.0 if arch == "llama" else 1000000.0,
        "tie_word_embeddings": tie_word_embeddings,
        "bos_token_id": SPECIAL_TOKEN_IDS[BOS_TOKEN],
        "eos_token_id": list(EOS_TOKEN_IDS),
        "pad_token_id": SPECIAL_TOKEN_IDS[PAD_TOKEN],
        "torch_dtype": dtype,
        "hidden_act": "silu",
    }
    if arch == "llama":
        config.update(head_dim=head_dim, attention_bias=False, mlp_bias=False)
    if arch in ("qwen3", "qwen3_moe"):
        config["head_dim"] = head_dim
    if arch == "qwen3_moe":
        config.update(
            num_experts=num_experts,
            num_experts_per_tok=num_experts_per_tok,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            moe_intermediate_size=max(1, intermediate_size // 2),
            norm_topk_prob=True,
        )
    return config


def _model_classes(arch: str) -> tuple[Any, Any]:
    module = importlib.import_module(f"mlx_lm.models.{arch}")
    return module.Model, module.ModelArgs


def _random_weights(
    model: Any,
    config: dict[str, Any],
    *,
    seed: int,
    dtype: mx.Dtype,
    silent_ids: list[int],
) -> dict[str, mx.array]:
    """Normal-initialised weights, scaled so a greedy random model does not get stuck."""
    hidden = config["hidden_size"]
    params = sorted(cast("list[tuple[str, mx.array]]", tree_flatten(model.parameters())))
    keys = mx.random.split(mx.random.key(seed), num=len(params))
    weights: dict[str, mx.array] = {}
    for k, (name, value) in zip(keys, params, strict=True):
        if name.endswith(("q_norm.weight", "k_norm.weight")):
            # qwen3's per-head norms undo any gain on q and k; sharpen attention here instead.
            w = mx.full(value.shape, 2.0)
        elif name.endswith("norm.weight"):
            w = mx.ones(value.shape)
        elif name.endswith(".bias"):
            w = 0.02 * mx.random.normal(value.shape, key=k)
        elif name.endswith("embed_tokens.weight"):
            w = mx.random.normal(value.shape, key=k)
        elif name.endswith("lm_head.weight"):
            w = (2.0 / hidden**0.5) * mx.random.normal(value.shape, key=k)
        else:
            # Measured: a gain above 1 on the queries, keys, MLP and router (sharper attention,
            # stronger non-linearity) keeps greedy decoding from settling into a short cycle; a
            # gain on values and outputs does the opposite.
            gain = 1.0 if name.endswith(("v_proj.weight", "o_proj.weight")) else 2.5
            w = mx.random.normal(value.shape, key=k) * (gain / value.shape[-1] ** 0.5)
        weights[name] = w
    out_name = "model.embed_tokens.weight" if config["tie_word_embeddings"] else "lm_head.weight"
    if silent_ids:
        rows = weights[out_name]
        mask = mx.ones((rows.shape[0], 1))
        mask[mx.array(silent_ids)] = 0.0
        weights[out_name] = rows * mask
    return {name: w.astype(dtype) for name, w in weights.items()}


def _byte_values() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the character standing for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars: dict[str, int] = {chr(b): b for b in printable}
    n = 0
    for b in range(256):
        if b not in printable:
            chars[chr(256 + n)] = b
            n += 1
    return chars


def silent_token_ids(folder: Path, vocab_size: int) -> list[int]:
    """Ids a model built with ``suppress_special`` never emits greedily.

    The special tokens, the padding rows past the tokenizer's size, and every token holding a
    byte that is not printable ASCII or a newline (lone UTF-8 pieces and control characters).
    """
    vocab = json.loads((Path(folder) / "tokenizer.json").read_text())["model"]["vocab"]
    byte_of = _byte_values()
    allowed = {*range(0x20, 0x7F), 0x0A}
    silent = set(SPECIAL_TOKEN_IDS.values())
    silent.update(range(max(vocab.values()) + 1, vocab_size))
    for token, i in vocab.items():
        if i not in silent and any(byte_of.get(c, -1) not in allowed for c in token):
            silent.add(i)
    return sorted(silent)


def _write_shards(folder: Path, weights: dict[str, mx.array], num_layers: int, shards: int) -> None:
    """Split weights by layer into ``shards`` files and write the index."""
    shards = max(1, min(shards, num_layers))
    files: list[dict[str, mx.array]] = [{} for _ in range(shards)]
    for name, w in weights.items():
        layer = layer_of(name)
        if layer is not None:
            part = layer * shards // num_layers
        elif name.startswith("model.embed_tokens"):
            part = 0
        else:  # final norm, lm_head
            part = shards - 1
        files[part][name] = w
    weight_map: dict[str, str] = {}
    for i, part in enumerate(files):
        fname = (
            f"model-{i + 1:05d}-of-{shards:05d}.safetensors" if shards > 1 else "model.safetensors"
        )
        mx.save_safetensors(str(folder / fname), part, metadata={"format": "mlx"})
        weight_map.update(dict.fromkeys(part, fname))
    index = {
        "metadata": {
            "total_size": sum(w.nbytes for w in weights.values()),
            "total_parameters": sum(w.size for w in weights.values()),
        },
        "weight_map": dict(sorted(weight_map.items())),
    }
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def build_tiny_model(
    folder: Path,
    arch: str = "llama",
    *,
    hidden_size: int = 64,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    vocab_size: int = 768,
    seed: int = 0,
    dtype: str = "float32",
    max_position_embeddings: int = 2048,
    shards: int = 2,
    tie_word_embeddings: bool = False,
    num_experts: int = 4,
    num_experts_per_tok: int = 2,
    suppress_special: bool = True,
) -> Path:
    """Write a random-weight model folder that ``mlx_lm.load`` loads; return ``folder``.

    ``vocab_size`` is both the tokenizer's training target and the embedding size; if the
    corpus cannot fill the tokenizer to that size, the embedding keeps padding rows. With
    ``suppress_special`` the output rows of :func:`silent_token_ids` (special tokens, padding,
    non-printable bytes) are zero, so greedy decoding never picks them: no end of turn, no
    markup, only printable ASCII text.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = model_config(
        arch,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        vocab_size=vocab_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        num_experts=num_experts,
        num_experts_per_tok=num_experts_per_tok,
        dtype=dtype,
    )
    build_tokenizer(folder, vocab_size, seed=seed)

    model_cls, args_cls = _model_classes(arch)
    model = model_cls(args_cls.from_dict(config))
    silent = silent_token_ids(folder, vocab_size)
    weights = _random_weights(
        model,
        config,
        seed=seed,
        dtype=getattr(mx, dtype),
        silent_ids=silent if suppress_special else [],
    )
    model.load_weights(list(weights.items()), strict=True)  # checks names and shapes
    mx.eval(weights)
    _write_shards(folder, weights, num_layers, shards)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (folder / "generation_config.json").write_text(
        json.dumps(
            {
                "bos_token_id": SPECIAL_TOKEN_IDS[BOS_TOKEN],
                "eos_token_id": list(EOS_TOKEN_IDS),
                "pad_token_id": SPECIAL_TOKEN_IDS[PAD_TOKEN],
                "do_sample": False,
            },
            indent=2,
        )
        + "\n"
    )
    return folder


def parameter_count(folder: Path) -> int:
    """Number of parameters of a built model, read from its index."""
    index = json.loads((Path(folder) / "model.safetensors.index.json").read_text())
    return int(index["metadata"]["total_parameters"])
