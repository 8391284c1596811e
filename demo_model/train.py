"""Train the bundled demo model from scratch with MLX and export it to `engine/demo/model/`.

    python -m demo_model.train --minutes 25         # prepare the data, train, export
    python -m demo_model.train --minutes 25         # again: resumes from the last checkpoint
    python -m demo_model.train --export-only        # write engine/demo/model from the checkpoint

A 4-layer llama (hidden 256, tied embeddings, ~3.8M parameters) with its own byte-level BPE
tokenizer (digits split into single tokens) and the Qwen-style chat template of
`tests/tiny_models.py`, so mlx-lm reads its `<tool_call>` JSON. The corpus comes from
`demo_model/corpus.py` (fixed seed); the loss counts assistant tokens only, with extra weight on
tool calls, on the first token of each answer (tool call or text: the decision) and on the names
an answer copies from a `cluster_status` result (node names, the loaded model).

Work files (corpus, tokenizer, checkpoints, log) live in `demo_model/work/`, which git ignores.
The learning rate follows a warmup + cosine schedule over the *time* budget, so a run fits its
minutes on any machine; a checkpoint every `--checkpoint-minutes` makes it resumable.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any, cast

import engine  # noqa: F401  (preloads OpenBLAS before mlx.core: ~30x faster matmuls)

# isort: split
import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from demo_model import corpus
from tests import tiny_models

ROOT = Path(__file__).resolve().parent
WORK = ROOT / "work"
EXPORT = ROOT.parent / "engine" / "demo" / "model"
LOSS_PNG = ROOT / "loss.png"

VOCAB_SIZE = 1400
MODEL = {
    "hidden_size": 256,
    "num_layers": 4,
    "num_heads": 4,
    "num_kv_heads": 4,
    "intermediate_size": 768,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
}
CONVERSATIONS = 60_000
MAX_LENGTH = 768
TOOL_CALL_WEIGHT = 2.0
FIRST_TOKEN_WEIGHT = 3.0
COPY_WEIGHT = 4.0  # not FIRST_TOKEN_WEIGHT: `--decision-weight` finds first tokens by weight


def tools() -> list[dict[str, Any]]:
    """The tool schemas exactly as `engine.generate.render_prompt` renders the built-in tools."""
    from engine.parsers import tool_schema
    from exo_tui.chat.tools import BUILTIN_TOOLS

    return [tool_schema(t) for t in BUILTIN_TOOLS]


# --------------------------------------------------------------------------- data


def _load_tokenizer(folder: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def _render(tokenizer: Any, conversation: corpus.Conversation) -> str:
    kwargs: dict[str, Any] = {"tokenize": False}
    if conversation.tools:
        kwargs["tools"] = tools()
    return str(tokenizer.apply_chat_template(conversation.messages, **kwargs))


ASSISTANT = "<|im_start|>assistant\n"
END = "<|im_end|>"


def _segments(text: str) -> list[tuple[str, bool]]:
    """Split a rendered chat into (text, is_assistant_output) pieces; the output ends at END."""
    pieces: list[tuple[str, bool]] = []
    rest = text
    while (start := rest.find(ASSISTANT)) >= 0:
        head = start + len(ASSISTANT)
        end = rest.index(END, head) + len(END)
        pieces.append((rest[:head], False))
        pieces.append((rest[head:end], True))
        rest = rest[end:]
    if rest:
        pieces.append((rest, False))
    return pieces


def _copied_names(conversation: corpus.Conversation) -> list[list[str]]:
    """Per assistant message, in order: the names it should copy from the tool result before it
    (a `cluster_status` result's node names and loaded model; nothing after other messages)."""
    found: list[list[str]] = []
    previous: dict[str, Any] = {}
    for message in conversation.messages:
        if message["role"] == "assistant":
            names: list[str] = []
            if previous.get("role") == "tool" and previous.get("name") == "cluster_status":
                status = json.loads(previous["content"])
                names = [str(node["name"]) for node in status["nodes"]]
                names += [str(status["model"])] if status.get("model") else []
            found.append(names)
        previous = message
    return found


def _copy_mask(text: str, offsets: list[tuple[int, int]], names: list[str]) -> list[bool]:
    """Which tokens (by character offsets) overlap a whole-word occurrence of one of `names`,
    with its backticks if it has them (the closing one ends the copy)."""
    spans = [
        m.span()
        for name in names
        for m in re.finditer(rf"`{re.escape(name)}`|(?<![\w-]){re.escape(name)}(?![\w-])", text)
    ]
    return [any(a < e and s < b for s, e in spans) for a, b in offsets]


def prepare(work: Path) -> None:
    """Corpus -> tokenizer -> token ids and loss weights in `work/data.npz`.

    Delete `data.npz` to regenerate the corpus; an existing tokenizer is kept, so training can
    go on from its checkpoint (`--extend`)."""
    if (work / "data.npz").exists():
        return
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    conversations = corpus.training_conversations(CONVERSATIONS)
    tok_dir = work / "tokenizer"
    # The template needs a tokenizer to render with; render with a first one trained on the
    # message texts, then train the real one on the rendered chats (system prompt included).
    if (tok_dir / "tokenizer.json").exists():
        # A checkpoint trained with this tokenizer may continue on a regenerated corpus.
        tokenizer = _load_tokenizer(tok_dir)
        texts = [_render(tokenizer, c) for c in conversations]
        print(f"kept the tokenizer in {tok_dir}; rendered {len(texts)} chats", flush=True)
    else:
        contents = [str(m["content"]) for c in conversations[:5000] for m in c.messages]
        tiny_models.build_tokenizer(tok_dir, VOCAB_SIZE, texts=contents, split_digits=True)
        boot = _load_tokenizer(tok_dir)
        texts = [_render(boot, c) for c in conversations]
        size = tiny_models.build_tokenizer(
            tok_dir, VOCAB_SIZE, texts=texts[:20000], split_digits=True
        )
        tokenizer = _load_tokenizer(tok_dir)
        print(f"tokenizer: {size} tokens; rendered {len(texts)} chats", flush=True)

    all_segments = [_segments(t) for t in texts]
    flat = [s for segs in all_segments for s, _ in segs]
    encoded = tokenizer(flat, add_special_tokens=False, return_offsets_mapping=True)
    ids: list[np.ndarray] = []
    weights: list[np.ndarray] = []
    k = 0
    dropped = 0
    copied = 0
    for conversation, text, segs in zip(conversations, texts, all_segments, strict=True):
        seq: list[int] = []
        w: list[float] = []
        names = iter(_copied_names(conversation))
        for piece, is_output in segs:
            piece_ids = encoded["input_ids"][k]
            offsets = encoded["offset_mapping"][k]
            k += 1
            seq.extend(piece_ids)
            if not is_output:
                w.extend([0.0] * len(piece_ids))
                continue
            weight = TOOL_CALL_WEIGHT if piece.startswith("<tool_call>") else 1.0
            piece_w = [FIRST_TOKEN_WEIGHT] + [weight] * (len(piece_ids) - 1)
            mask = _copy_mask(piece, offsets, next(names))
            piece_w = [
                COPY_WEIGHT if m and i > 0 else x
                for i, (x, m) in enumerate(zip(piece_w, mask, strict=True))
            ]
            copied += sum(mask)
            w.extend(piece_w)
        if len(seq) > MAX_LENGTH:
            dropped += 1
            continue
        if len(ids) < 20:  # the pieces must tokenize as the whole chat does
            assert seq == tokenizer(text, add_special_tokens=False)["input_ids"], text
        ids.append(np.array(seq, dtype=np.int32))
        weights.append(np.array(w, dtype=np.float32))
    lengths = np.array([len(s) for s in ids])
    np.savez(
        work / "data.npz",
        ids=np.concatenate(ids),
        weights=np.concatenate(weights),
        offsets=np.concatenate([[0], np.cumsum(lengths)]),
    )
    print(
        f"data: {len(ids)} chats ({dropped} over {MAX_LENGTH} tokens dropped), "
        f"{lengths.sum()} tokens, mean {lengths.mean():.0f}, max {lengths.max()}, "
        f"{copied} copied-name tokens x{COPY_WEIGHT:g}; "
        f"{time.perf_counter() - started:.0f} s",
        flush=True,
    )


class Batches:
    """Batches of chats that share their first block, in a fixed order per epoch.

    Most chats start with the same system block (the tools), so a batch runs that prefix once
    and only the rest per chat: `step -> (prefix [1, P], inputs, targets, weights [B, S])`.
    Within a prefix group, chats are bucketed by length to limit padding.
    """

    def __init__(
        self,
        work: Path,
        batch_size: int,
        seed: int,
        digit_weight: float = 1.0,
        decision_weight: float = 1.0,
    ) -> None:
        data = np.load(work / "data.npz")
        self.ids, self.weights, self.offsets = data["ids"], data["weights"], data["offsets"]
        if decision_weight != 1.0:  # the first token of an answer: tool call or text
            self.weights = np.where(
                self.weights == FIRST_TOKEN_WEIGHT, self.weights * decision_weight, self.weights
            ).astype(np.float32)
        if digit_weight != 1.0:  # numbers copied from the context: the hard part
            digits = np.array([_token_id(work, str(d)) for d in range(10)])
            self.weights = np.where(
                np.isin(self.ids, digits) & (self.weights > 0),
                self.weights * digit_weight,
                self.weights,
            ).astype(np.float32)
        self.batch_size, self.seed = batch_size, seed
        self.count = len(self.offsets) - 1
        end = tiny_models.SPECIAL_TOKEN_IDS[END]
        system = _token_id(work, "system")
        self.prefix_length = np.ones(self.count, dtype=np.int64)
        keys: dict[bytes, int] = {}
        self.group = np.zeros(self.count, dtype=np.int64)
        for i in range(self.count):
            seq = self.ids[self.offsets[i] : self.offsets[i + 1]]
            # a system block (`<|im_start|>system ... <|im_end|>\n`) is shared; else one token
            length = int(np.argmax(seq == end)) + 2 if int(seq[1]) == system else 1
            self.prefix_length[i] = length
            self.group[i] = keys.setdefault(seq[:length].tobytes(), len(keys))
        self.groups = len(keys)
        self.per_epoch = sum(int((self.group == g).sum()) // batch_size for g in range(self.groups))
        self._epoch = -1
        self._order: list[np.ndarray] = []

    def _plan(self, epoch: int) -> None:
        rng = np.random.default_rng(self.seed + epoch)
        lengths = np.diff(self.offsets) - self.prefix_length
        batches: list[np.ndarray] = []
        for g in range(self.groups):
            members = rng.permutation(np.flatnonzero(self.group == g))
            usable = len(members) // self.batch_size * self.batch_size
            bucket = self.batch_size * 64
            for start in range(0, usable, bucket):
                chunk = members[start : min(start + bucket, usable)]
                chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
                batches.extend(np.split(chunk, len(chunk) // self.batch_size))
        self._order = [batches[i] for i in rng.permutation(len(batches))]
        self._epoch = epoch

    def get(self, step: int) -> tuple[mx.array, mx.array, mx.array, mx.array]:
        epoch, index = divmod(step, self.per_epoch)
        if epoch != self._epoch:
            self._plan(epoch)
        rows = self._order[index]
        first = self.offsets[rows[0]]
        p = int(self.prefix_length[rows[0]])
        prefix = self.ids[first : first + p]
        longest = max(int(self.offsets[i + 1] - self.offsets[i]) - p for i in rows)
        width = -(-longest // 32) * 32 + 1  # few distinct shapes for the compiled step
        tokens = np.zeros((len(rows), width), dtype=np.int32)
        weights = np.zeros((len(rows), width), dtype=np.float32)
        for r, i in enumerate(rows):
            a, b = self.offsets[i] + p, self.offsets[i + 1]
            tokens[r, : b - a] = self.ids[a:b]
            weights[r, : b - a] = self.weights[a:b]
        # The prefix holds no assistant tokens, so nothing is lost by predicting only inside the
        # suffix (the prefix's last position would predict the suffix's first token: a marker).
        return (
            mx.array(prefix[None]),
            mx.array(tokens[:, :-1]),
            mx.array(tokens[:, 1:]),
            mx.array(weights[:, 1:]),
        )


# --------------------------------------------------------------------------- model


def config(vocab_size: int) -> dict[str, Any]:
    return tiny_models.model_config("llama", vocab_size=vocab_size, **MODEL)


def build_model(cfg: dict[str, Any], seed: int) -> nn.Module:
    from mlx_lm.models.llama import Model, ModelArgs

    mx.random.seed(seed)
    model = Model(ModelArgs.from_dict(cfg))
    std = 0.02
    residual_std = std / math.sqrt(2 * cfg["num_hidden_layers"])
    params: list[tuple[str, mx.array]] = []
    for name, value in tree_flatten(model.parameters()):
        if name.endswith("norm.weight"):
            continue
        scale = residual_std if name.endswith(("o_proj.weight", "down_proj.weight")) else std
        params.append((name, scale * mx.random.normal(cast(mx.array, value).shape)))
    model.update(tree_unflatten(params))
    mx.eval(model.parameters())
    return model


def shared_prefix_logits(model: nn.Module, prefix: mx.array, suffix: mx.array) -> mx.array:
    """The logits of `concat(prefix, suffix_b)` at the suffix positions, for every row b.

    Same maths as `model(concat(...))` (a test checks it), but the prefix [1, P] runs once for
    the whole batch instead of once per row.
    """
    inner: Any = model.model  # pyright: ignore[reportAttributeAccessIssue]
    p, (b, s) = prefix.shape[1], suffix.shape
    hp, hs = inner.embed_tokens(prefix), inner.embed_tokens(suffix)
    mask = mx.concatenate([mx.ones((s, p), dtype=mx.bool_), mx.tril(mx.ones((s, s), mx.bool_))], 1)
    for layer in inner.layers:
        attn = layer.self_attn

        def project(x: mx.array, offset: int, attn: Any = attn) -> tuple[mx.array, ...]:
            rows, length, _ = x.shape
            q = attn.q_proj(x).reshape(rows, length, attn.n_heads, -1).transpose(0, 2, 1, 3)
            k = attn.k_proj(x).reshape(rows, length, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
            v = attn.v_proj(x).reshape(rows, length, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
            return attn.rope(q, offset=offset), attn.rope(k, offset=offset), v

        qp, kp, vp = project(layer.input_layernorm(hp), 0)
        qs, ks, vs = project(layer.input_layernorm(hs), p)
        op = mx.fast.scaled_dot_product_attention(qp, kp, vp, scale=attn.scale, mask="causal")
        keys = mx.concatenate([mx.broadcast_to(kp, (b, *kp.shape[1:])), ks], axis=2)
        values = mx.concatenate([mx.broadcast_to(vp, (b, *vp.shape[1:])), vs], axis=2)
        os_ = mx.fast.scaled_dot_product_attention(qs, keys, values, scale=attn.scale, mask=mask)
        hp = hp + attn.o_proj(op.transpose(0, 2, 1, 3).reshape(1, p, -1))
        hs = hs + attn.o_proj(os_.transpose(0, 2, 1, 3).reshape(b, s, -1))
        hp = hp + layer.mlp(layer.post_attention_layernorm(hp))
        hs = hs + layer.mlp(layer.post_attention_layernorm(hs))
    return inner.embed_tokens.as_linear(inner.norm(hs))


def loss_fn(
    model: nn.Module, prefix: mx.array, inputs: mx.array, targets: mx.array, weights: mx.array
) -> mx.array:
    logits = shared_prefix_logits(model, prefix, inputs)
    ce = nn.losses.cross_entropy(logits, targets, reduction="none")
    return (ce * weights).sum() / mx.maximum(weights.sum(), 1.0)


def learning_rate(progress: float, step: int, peak: float, warmup_steps: int) -> float:
    warm = min(1.0, (step + 1) / warmup_steps)
    cosine = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
    return peak * warm * cosine


# --------------------------------------------------------------------------- checkpoints


def save_checkpoint(work: Path, model: nn.Module, optimizer: optim.Optimizer, state: dict) -> None:
    ckpt = work / "checkpoint"
    tmp = work / "checkpoint.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    mx.save_safetensors(str(tmp / "model.safetensors"), dict(tree_flatten(model.parameters())))
    mx.save_safetensors(str(tmp / "optimizer.safetensors"), dict(tree_flatten(optimizer.state)))
    (tmp / "state.json").write_text(json.dumps(state))
    shutil.rmtree(ckpt, ignore_errors=True)
    tmp.rename(ckpt)


def load_checkpoint(work: Path, model: nn.Module, optimizer: optim.Optimizer) -> dict | None:
    ckpt = work / "checkpoint"
    if not (ckpt / "state.json").exists():
        return None
    model.load_weights(str(ckpt / "model.safetensors"))
    saved = cast(dict[str, mx.array], mx.load(str(ckpt / "optimizer.safetensors")))
    optimizer.state = tree_unflatten(list(saved.items()))
    return json.loads((ckpt / "state.json").read_text())


# --------------------------------------------------------------------------- export and plot


def export(work: Path, out: Path = EXPORT) -> None:
    """Write the shipped model folder: config, fp32 weights, tokenizer, generation config."""
    cfg = config(_vocab_size(work))
    model = build_model(cfg, 0)
    model.load_weights(str(work / "checkpoint" / "model.safetensors"))
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.safetensors*"):
        old.unlink()
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    generation = {
        "bos_token_id": tiny_models.SPECIAL_TOKEN_IDS[tiny_models.BOS_TOKEN],
        "eos_token_id": list(tiny_models.EOS_TOKEN_IDS),
        "pad_token_id": tiny_models.SPECIAL_TOKEN_IDS[tiny_models.PAD_TOKEN],
        "do_sample": False,
    }
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(work / "tokenizer" / name, out / name)
    total = sum(w.size for w in weights.values())
    print(f"exported {total} parameters to {out}", flush=True)


def _token_id(work: Path, token: str) -> int:
    from tokenizers import Tokenizer

    found = Tokenizer.from_file(str(work / "tokenizer" / "tokenizer.json")).token_to_id(token)
    assert found is not None, token
    return int(found)


def _vocab_size(work: Path) -> int:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(work / "tokenizer" / "tokenizer.json")).get_vocab_size()


def plot(losses: list[list[float]], path: Path) -> None:
    try:
        import matplotlib  # pyright: ignore[reportMissingImports]  (the train extra)

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # pyright: ignore[reportMissingImports]
    except ImportError:
        print("matplotlib is missing (pip install -e '.[train]'): no loss plot", file=sys.stderr)
        return
    if not losses:
        return
    steps = np.array([s for s, _, _ in losses])
    values = np.array([v for _, _, v in losses])
    window = max(1, len(values) // 50)
    smooth = np.convolve(values, np.ones(window) / window, mode="valid")
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    ax.plot(steps, values, alpha=0.3, label="batch")
    ax.plot(steps[window - 1 :], smooth, label=f"mean of {window}")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (assistant tokens)")
    minutes = losses[-1][1] / 60
    ax.set_title(f"exo-tui demo model: {len(losses)} steps, {minutes:.1f} min")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# --------------------------------------------------------------------------- training


def train(args: argparse.Namespace) -> None:
    work: Path = args.work
    prepare(work)
    cfg = config(_vocab_size(work))
    model = build_model(cfg, args.seed)
    count = sum(cast(mx.array, v).size for _, v in tree_flatten(model.parameters()))
    optimizer = optim.AdamW(learning_rate=0.0, betas=[0.9, 0.95], weight_decay=0.05)
    state = load_checkpoint(work, model, optimizer)
    if state is None:
        state = {"step": 0, "elapsed": 0.0, "losses": [], "minutes": args.minutes}
        print(f"model: {count} parameters; training for {args.minutes} min", flush=True)
    else:
        print(f"resuming at step {state['step']}, {state['elapsed'] / 60:.1f} min", flush=True)
    if args.extend:
        # A new phase: warm up again to --lr, cosine down over the extra minutes.
        state.setdefault("phases", [[0.0, 0, float(state["minutes"]) * 60, args.lr]])
        state["phases"].append([state["elapsed"], state["step"], args.extend * 60, args.lr])
        state["minutes"] = float(state["minutes"]) + args.extend
        print(f"extending by {args.extend} min at lr {args.lr}", flush=True)
    phases = state.get("phases", [[0.0, 0, float(state["minutes"]) * 60, args.lr]])
    budget = float(state["minutes"]) * 60
    digit_weight = float(state.setdefault("digit_weight", args.digit_weight))
    decision_weight = float(state.setdefault("decision_weight", args.decision_weight))
    batches = Batches(work, args.batch_size, args.seed, digit_weight, decision_weight)

    loss_and_grad = nn.value_and_grad(model, loss_fn)
    compiled_state = [model.state, optimizer.state]

    def step_fn(prefix: mx.array, inputs: mx.array, targets: mx.array, w: mx.array) -> mx.array:
        loss, grads = loss_and_grad(model, prefix, inputs, targets, w)
        grads, _ = optim.clip_grad_norm(grads, 1.0)
        optimizer.update(model, grads)
        return loss  # only the loss: returning more crashed mx.compile here (see DESIGN)

    step_fn = mx.compile(step_fn, inputs=compiled_state, outputs=compiled_state)

    from tqdm import tqdm

    bar = tqdm(total=round(budget), initial=round(state["elapsed"]), unit="s", mininterval=5)
    last_save = time.perf_counter()
    step, elapsed = int(state["step"]), float(state["elapsed"])
    while elapsed < budget:
        tick = time.perf_counter()
        start, first_step, length, peak = phases[-1]
        lr = learning_rate((elapsed - start) / length, step - first_step, peak, args.warmup)
        optimizer.learning_rate = mx.array(lr)
        loss = step_fn(*batches.get(step))
        mx.eval(loss, compiled_state)
        took = time.perf_counter() - tick
        elapsed += took
        step += 1
        value = cast(float, loss.item())
        state["losses"].append([step, round(elapsed, 2), round(value, 5)])
        bar.update(round(elapsed) - bar.n)
        bar.set_postfix(step=step, loss=f"{value:.3f}", lr=f"{lr:.2e}", s_step=f"{took:.2f}")
        if step % 50 == 0:
            recent = [v for _, _, v in state["losses"][-50:]]
            print(
                f"step {step} {elapsed / 60:.1f} min loss {sum(recent) / len(recent):.4f} "
                f"lr {lr:.2e} {took:.2f} s/step",
                flush=True,
            )
        if time.perf_counter() - last_save > args.checkpoint_minutes * 60 or elapsed >= budget:
            state.update(step=step, elapsed=elapsed)
            save_checkpoint(work, model, optimizer, state)
            plot(state["losses"], LOSS_PNG)
            last_save = time.perf_counter()
    bar.close()
    state.update(step=step, elapsed=elapsed)
    save_checkpoint(work, model, optimizer, state)
    plot(state["losses"], LOSS_PNG)
    print(f"done: {step} steps in {elapsed / 60:.1f} min", flush=True)
    export(work)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=25.0, help="training time budget")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    parser.add_argument("--warmup", type=int, default=100, help="warmup steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint-minutes", type=float, default=2.0)
    parser.add_argument(
        "--extend", type=float, default=0.0, help="train this many more minutes (a new phase)"
    )
    parser.add_argument(
        "--decision-weight", type=float, default=1.0, help="extra weight on answers' first token"
    )
    parser.add_argument(
        "--digit-weight", type=float, default=1.0, help="extra loss weight on output digits"
    )
    parser.add_argument("--work", type=Path, default=WORK)
    parser.add_argument("--prepare-only", action="store_true")
    parser.add_argument("--export-only", action="store_true")
    args = parser.parse_args(argv)
    if args.export_only:
        export(args.work)
    elif args.prepare_only:
        prepare(args.work)
    else:
        train(args)


if __name__ == "__main__":
    main()
