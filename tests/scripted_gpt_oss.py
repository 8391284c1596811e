"""A tiny gpt-oss whose weights are set so that greedy decoding writes a harmony script: its
reasoning, a tool call, and after the tool's result its answer.

A random model never writes harmony, so the tests of gpt-oss end to end (engine, `chat --json`,
both APIs) use this one: the tokens come out of the real engine running a real gpt_oss model
(MXFP4 experts, 8-bit attention, sinks, sliding windows, yarn rope), only its weights are made
rather than trained. It is tests/tiny_gpt_oss.py's model with these weights:

- Every token of the script has a direction of its own (orthonormal, one per token); its
  embedding is that direction, every other embedding is orthogonal to them all.
- The head maps each token's direction to the token that follows it in the script, so the next
  token is a function of the current one...
- ...except where the script needs more: `<|channel|>` is followed by `analysis`, then by
  `commentary` for the tool call, and by `final` after the tool's result. Two attention heads of
  the first full-attention layer say where the conversation is: one looks for the reasoning's
  marker token in the context, the other for the result's. Each head's query is constant and
  only its marker's key answers it; the head's sink takes all the weight when the marker is
  absent, so the head writes ±1 into a direction of the residual. The head's rows of such
  tokens read those two directions (a linear score per stage, so each stage's successor wins).
- Every other weight is random and small: the experts, the other heads and layers run on every
  token but barely move the residual.

The tool's result must hold the result marker and the first prompt must hold neither marker.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx_lm.models import gpt_oss
from openai_harmony import Author, HarmonyEncoding, Message, Role

from tests.tiny_gpt_oss import VOCAB_SIZE, build_o200k_tokenizer, gpt_oss_config, write_gpt_oss
from tests.tiny_models import _random_weights

# The stages of the script: before the reasoning's marker, after it (the tool call), after the
# tool's result (the answer); and each stage's score over the heads' two outputs (d1, d2), as
# (a, b, k) in a*d1 + b*d2 + k: 1 in its own stage, -1 or less in the others.
STAGE_SCORES = {"reasoning": (-1, -1, -1), "call": (1, -1, -1), "answer": (0, 2, -1)}
# What the marker heads add to the residual, against the current token's direction (1).
STAGE_WEIGHT = 0.15
HEAD_GAIN = 4.0  # the logit of the token that follows, per unit of its direction
MARKER_SCORE = 40.0  # a marker's attention score, against the sink's
SINK = 15.0
NOISE = 1e-3  # the other heads', layers' and experts' outputs, against the residual's


@dataclass(frozen=True)
class Script:
    """What the model writes. Its first answer: `reasoning` (holding `reasoning_marker`), then
    a call of `tool` with `arguments`; once the context holds `result_marker` (the tool's result
    says it), `answer`."""

    reasoning: str = "Multiply six by seven with the tool."
    reasoning_marker: str = "Multiply"
    tool: str = "calculator"
    arguments: str = '{"expression": "6*7"}'
    result_marker: str = "42"
    answer: str = "Six times seven is 42."

    def first(self, encoding: HarmonyEncoding) -> list[int]:
        """The first answer's tokens, after the prompt's `<|start|>assistant`."""
        reasoning = Message.from_role_and_content(Role.ASSISTANT, self.reasoning)
        call = (
            Message.from_role_and_content(Role.ASSISTANT, self.arguments)
            .with_channel("commentary")
            .with_recipient(f"functions.{self.tool}")
            .with_content_type("<|constrain|>json")
        )
        ids = encoding.render(reasoning.with_channel("analysis")) + encoding.render(call)
        return ids[2:]  # the prompt ends with <|start|>assistant

    def second(self, encoding: HarmonyEncoding) -> list[int]:
        """The answer after the tool's result: the final channel, ended by <|return|>."""
        final = Message.from_role_and_content(Role.ASSISTANT, self.answer).with_channel("final")
        ids = encoding.render(final)
        return [*ids[2:-1], *encoding.encode("<|return|>", allowed_special="all")]

    def result_message(self, encoding: HarmonyEncoding, result: str) -> list[int]:
        author = Author.new(Role.TOOL, f"functions.{self.tool}")
        message = Message.from_author_and_content(author, result).with_recipient("assistant")
        return encoding.render(message.with_channel("commentary"))


def single_token(encoding: HarmonyEncoding, text: str) -> int:
    ids = encoding.encode(text, allowed_special="all")
    if len(ids) != 1:
        raise ValueError(f"{text!r} is {len(ids)} tokens; a marker must be one")
    return ids[0]


Successors = dict[int, dict[str, int]]  # token -> stage -> the token that follows


def successors(script: Script, encoding: HarmonyEncoding) -> Successors:
    """What follows each token of the script at each stage, from the prompt's last token on."""
    assistant = single_token(encoding, "assistant")
    reasoning_marker = single_token(encoding, script.reasoning_marker)
    table: Successors = {}

    def walk(tokens: Sequence[int], stage_of: Any) -> None:
        context = [assistant, *tokens]
        for i, (token, following) in enumerate(itertools.pairwise(context)):
            stage = stage_of(context[: i + 1])
            known = table.setdefault(token, {}).setdefault(stage, following)
            if known != following:
                raise ValueError(
                    f"{encoding.decode_utf8([token])!r} is followed by two tokens at the"
                    f" {stage} stage: reword the script"
                )

    walk(script.first(encoding), lambda seen: "call" if reasoning_marker in seen else "reasoning")
    walk(script.second(encoding), lambda seen: "answer")
    return table


def head_rows(table: Successors) -> list[tuple[int, int, float, int, int]]:
    """(current token, next token, weight of the current's direction, a, b): each row of the
    head's design, whose logit is gain * (weight + STAGE_WEIGHT * (a*d1 + b*d2))."""
    rows: list[tuple[int, int, float, int, int]] = []
    for token, by_stage in table.items():
        groups: dict[int, list[str]] = {}
        for stage, following in by_stage.items():
            groups.setdefault(following, []).append(stage)
        if len(groups) == 1:
            rows.append((token, next(iter(groups)), 1.0, 0, 0))
            continue
        singles = [stages[0] for stages in groups.values() if len(stages) == 1]
        for following, stages in groups.items():
            if len(stages) == 1:
                a, b, k = STAGE_SCORES[stages[0]]
            else:  # the stages but one: that one's score, negated
                (other,) = singles
                a, b, k = (-x for x in STAGE_SCORES[other])
            rows.append((token, following, 1.0 + STAGE_WEIGHT * k, a, b))
    return rows


def _orthonormal(size: int, seed: int) -> mx.array:
    q, _ = mx.linalg.qr(mx.random.normal((size, size), key=mx.random.key(seed)), stream=mx.cpu)
    return q.T  # rows


def scripted_weights(
    model: gpt_oss.Model, config: dict[str, Any], script: Script, encoding: HarmonyEncoding
) -> dict[str, mx.array]:
    """The weights of `model` that write `script` (float32)."""
    hidden, head_dim = config["hidden_size"], config["head_dim"]
    weights = _random_weights(model, config, seed=1, dtype=mx.float32, silent_ids=[])
    table = successors(script, encoding)
    markers = [single_token(encoding, m) for m in (script.reasoning_marker, script.result_marker)]
    tokens = sorted({*table, *(t for s in table.values() for t in s.values()), *markers})
    if len(tokens) + 2 > hidden:
        raise ValueError(f"the script has {len(tokens)} tokens: too many for {hidden} dimensions")
    basis = _orthonormal(hidden, 7)
    stage_dirs, token_dirs = basis[:2], basis[2 : 2 + len(tokens)]
    direction = {t: token_dirs[i] for i, t in enumerate(tokens)}
    ids = mx.array(tokens)

    others = mx.random.normal((VOCAB_SIZE, hidden), key=mx.random.key(3))
    used = basis[: 2 + len(tokens)]
    others = others - (others @ used.T) @ used
    embed = others / mx.linalg.norm(others, axis=-1, keepdims=True)
    embed[ids] = token_dirs
    weights["model.embed_tokens.weight"] = embed

    head = 0.01 * mx.random.normal((VOCAB_SIZE, hidden), key=mx.random.key(4))
    head[mx.arange(199998, VOCAB_SIZE)] = 0.0  # harmony's tokens, unless the script has them
    head[ids] = 0.0
    for token, following, weight, a, b in head_rows(table):
        row = weight * direction[token] + a * stage_dirs[0] + b * stage_dirs[1]
        head[following] = head[following] + HEAD_GAIN * row
    weights["lm_head.weight"] = head

    for name in list(weights):
        if name.endswith(("o_proj.weight", "o_proj.bias", "down_proj.weight", "down_proj.bias")):
            weights[name] = NOISE * weights[name]

    # The marker heads: query heads 0 and 2, on key/value heads 0 and 1 (of two).
    layer = f"model.layers.{config['layer_types'].index('full_attention')}.self_attn"
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    assert kv_heads == 2 and heads % 2 == 0, "the marker heads need two key/value heads"
    slow = head_dim // 2 - 1  # rope's slowest pair: its rotation stays near 0 over the context
    # A normed token's direction has length sqrt(hidden); rope's yarn scale multiplies both.
    mscale = 0.1 * math.log(config["rope_scaling"]["factor"]) + 1.0
    reach = MARKER_SCORE * head_dim**0.5 / (mscale**2 * hidden**0.5)
    q_bias = mx.zeros((heads * head_dim,))
    k = mx.zeros((kv_heads * head_dim, hidden))
    v = mx.zeros((kv_heads * head_dim, hidden))
    o = NOISE * weights[f"{layer}.o_proj.weight"]
    for kv, marker in enumerate(markers):
        query_head = kv * heads // kv_heads
        q_bias[query_head * head_dim + slow] = reach**0.5
        k[kv * head_dim + slow] = reach**0.5 * direction[marker]
        v[kv * head_dim] = direction[marker] / hidden**0.5
        o[:, query_head * head_dim] = 2 * STAGE_WEIGHT * stage_dirs[kv]
    weights[f"{layer}.q_proj.weight"] = mx.zeros_like(weights[f"{layer}.q_proj.weight"])
    weights[f"{layer}.q_proj.bias"] = q_bias
    weights[f"{layer}.k_proj.weight"] = k
    weights[f"{layer}.k_proj.bias"] = mx.zeros((kv_heads * head_dim,))
    weights[f"{layer}.v_proj.weight"] = v
    weights[f"{layer}.v_proj.bias"] = mx.zeros((kv_heads * head_dim,))
    weights[f"{layer}.o_proj.weight"] = o
    weights[f"{layer}.o_proj.bias"] = -STAGE_WEIGHT * (stage_dirs[0] + stage_dirs[1])
    weights[f"{layer}.sinks"] = mx.full((heads,), SINK)
    return weights


def build_scripted_gpt_oss(
    folder: Path, encoding: HarmonyEncoding, script: Script = Script(), **shape: Any
) -> Path:
    """Write the scripted model's folder (bf16, quantized as mlx-community's); return it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = gpt_oss_config(**shape)
    build_o200k_tokenizer(folder)
    model = gpt_oss.Model(gpt_oss.ModelArgs.from_dict(config))
    weights = scripted_weights(model, config, script, encoding)
    model.load_weights([(n, w.astype(mx.bfloat16)) for n, w in weights.items()], strict=True)
    return write_gpt_oss(folder, model, config, shards=2)
