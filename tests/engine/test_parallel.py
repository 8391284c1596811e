"""Sharding on real local rings: greedy output token for token against one process.

Every fixture architecture, 6 layers, is run through pipeline on 2 ranks (3+3), an uneven
pipeline on 2 ranks (2+4, a third and two thirds), pipeline on 3 ranks and tensor on 2 ranks;
so are llama, qwen3 and the MoE quantized to 4 bits with mlx-lm's own quantize, whose linears
(the experts' too) run on the CPU kernels (engine/kernels) when the extension is built, and a
tiny gpt-oss as mlx-community ships it (tests/tiny_gpt_oss.py: MXFP4 experts, the rest 8-bit,
sinks, sliding windows, yarn) on pipeline-2, pipeline-3 and tensor-2, answering through harmony
as the engine runs it. Each rank reports how many of its experts (mlx-lm's QuantizedSwitchLinear)
ran on the kernels.
One ring of 2 processes and one of 3 run every case in turn (tests/engine/rank_worker.py), so
the processes start once; the single-process reference runs in a third process the same way.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import cast

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten

from engine import kernels
from engine.loading import load_model_sync, open_lazy, run_loading, transformer_layers
from engine.models.cards import read_card
from engine.parallel import (
    ShardError,
    _reindex,
    check_shard_spec,
    check_shard_specs,
    even_layer_counts,
    join_pipeline,
    load_shard,
    pipeline_specs,
    tensor_specs,
)
from engine.types import LoadProgress, ModelCard, ShardSpec
from tests.conftest import TinyModelFactory
from tests.engine.rank_worker import Job, JobResult, collect, converse, start_ranks
from tests.tiny_gpt_oss import build_tiny_gpt_oss
from tests.tiny_models import ARCHITECTURES

# The rings run once for the whole module, in the first test's setup: minutes on a busy machine.
pytestmark = pytest.mark.timeout(600)

LAYERS = 6
TURNS = ("Tell me a story about a dog.", "Now tell me one about a cat.")
MAX_TOKENS = (200, 20)
# A prompt long enough for several prefill chunks of 8 tokens.
LONG_PROMPT = " ".join(["The quick brown fox jumps over the lazy dog near the river bank."] * 6)
PREFILL_STEP = 8

# Case: (layers of the model, one spec per rank). Tensor costs two all_sums per layer and
# token, and a rank waiting on the ring spins on its socket: on a small busy machine that is
# most of the run, so the tensor cases take 2-layer models.
CASES: dict[str, tuple[int, list[ShardSpec]]] = {
    "pipeline-2": (LAYERS, pipeline_specs([3, 3])),
    "pipeline-2-uneven": (LAYERS, pipeline_specs([2, 4])),
    "pipeline-3": (LAYERS, pipeline_specs([2, 2, 2])),
    "tensor-2": (2, tensor_specs(2, 2)),
}
MODEL_LAYERS = sorted({layers for layers, _ in CASES.values()})
RING_SIZES = sorted({specs[0].world_size for _, specs in CASES.values()})
# The middle rank of the 3-ring holds one layer: it receives, computes and sends in one call.
PREFILL_SPECS: dict[int, list[ShardSpec] | None] = {
    0: None,
    2: pipeline_specs([3, 3]),
    3: pipeline_specs([2, 1, 3]),
}
SLIDING_SPECS = pipeline_specs([3, 3])

# Quantized with mlx-lm's convert: 4 bits in groups of 32 (the tiny models are 64 wide).
QUANTIZED = ("llama", "qwen3", "qwen3_moe")
GPT_OSS = "gpt_oss-mxfp4"
ARCHS = (*ARCHITECTURES, *(f"{arch}-q4" for arch in QUANTIZED), GPT_OSS)
# The models whose experts are mlx-lm's QuantizedSwitchLinear, on the kernels when built.
QUANTIZED_MOE = ("qwen3_moe-q4", GPT_OSS)
# gpt-oss's 8 heads of 16 give o_proj 64 inputs a rank under tensor-2: its 8-bit groups are 64
# wide. In float32 like the other tiny models: tensor's all_sum adds partial products in another
# order, and in bfloat16 that flips a greedy pick among o200k's random logits within 64 tokens.
# Loading its o200k tokenizer takes seconds a rank, so it runs fewer cases, all on one 6-layer
# model (every pipeline rank then holds a sliding and a full layer: mlx-lm's gpt_oss indexes
# the cache of the first layer of each kind), and fewer tokens: its window (16) is passed
# within the prompt already.
GPT_OSS_SHAPE = {"num_heads": 8, "num_kv_heads": 2, "head_dim": 16}
GPT_OSS_TOKENS = (64, 16)
GPT_OSS_CASES: dict[str, tuple[int, list[ShardSpec]]] = {
    "pipeline-2": CASES["pipeline-2"],
    "pipeline-3": CASES["pipeline-3"],
    "tensor-2": (LAYERS, tensor_specs(LAYERS, 2)),
}


def cases_of(arch: str) -> dict[str, tuple[int, list[ShardSpec]]]:
    return GPT_OSS_CASES if arch == GPT_OSS else CASES


def case_of(arch: str, case: str) -> tuple[int, list[ShardSpec]]:
    """The case's model layers and its specs, one per rank."""
    return cases_of(arch)[case]


RingResults = dict[tuple[str, str], list[JobResult]]
Models = dict[tuple[str, int], Path]


@pytest.fixture(scope="module")
def models(
    tiny_model_factory: TinyModelFactory,
    tmp_path_factory: pytest.TempPathFactory,
    harmony_vocabulary: Path,
) -> Models:
    """The tiny model of every architecture, with each layer count the cases use, the
    quantized ones and gpt-oss (whose harmony vocabulary the ranks find through the
    environment that `harmony_vocabulary` sets)."""
    from mlx_lm import convert

    built: Models = {
        (arch, layers): tiny_model_factory(arch, num_layers=layers)
        for arch in ARCHITECTURES
        for layers in MODEL_LAYERS
    }
    for arch in QUANTIZED:
        for layers in MODEL_LAYERS:
            folder = tmp_path_factory.mktemp(f"{arch}-q4") / "model"
            convert(str(built[arch, layers]), mlx_path=str(folder), quantize=True, q_group_size=32)
            built[f"{arch}-q4", layers] = folder
    for layers in sorted({layers for layers, _ in GPT_OSS_CASES.values()}):
        folder = tmp_path_factory.mktemp(GPT_OSS) / "model"
        built[GPT_OSS, layers] = build_tiny_gpt_oss(
            folder, num_layers=layers, dtype="float32", **GPT_OSS_SHAPE
        )
    return built


@pytest.fixture(scope="module")
def sliding_llama(models: Models, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 6-layer llama with every other layer on a 16-token sliding window: its forward pass
    picks masks by layer index (fa_idx, swa_idx), which a pipeline cut must re-point."""
    folder = tmp_path_factory.mktemp("sliding") / "llama"
    shutil.copytree(models["llama", LAYERS], folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(
        layer_types=["sliding_attention", "full_attention"] * (LAYERS // 2), sliding_window=16
    )
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def max_tokens(arch: str) -> tuple[int, ...]:
    return GPT_OSS_TOKENS if arch == GPT_OSS else MAX_TOKENS


def chat_job(path: Path, specs: list[ShardSpec] | None = None, arch: str = "") -> Job:
    return Job(path=str(path), specs=tuple(specs or ()), turns=TURNS, max_tokens=max_tokens(arch))


def prefill_job(path: Path, specs: list[ShardSpec] | None = None) -> Job:
    return Job(
        path=str(path),
        specs=tuple(specs or ()),
        turns=(LONG_PROMPT,),
        max_tokens=(20,),
        prefill_step_size=PREFILL_STEP,
    )


@pytest.fixture(scope="module")
def runs(
    models: Models, sliding_llama: Path, tmp_path_factory: pytest.TempPathFactory
) -> RingResults:
    """Every case on its ring and the one-process reference, keyed by (arch, case), plus the
    chunked prefill and sliding-window checks. Each value holds one JobResult per rank."""
    folder = tmp_path_factory.mktemp("rings")
    keys: dict[int, list[tuple[str, str]]] = {0: [], **{size: [] for size in RING_SIZES}}
    jobs: dict[int, list[Job]] = {size: [] for size in keys}
    for (arch, layers), path in models.items():
        keys[0].append((arch, f"reference-{layers}"))
        jobs[0].append(chat_job(path, arch=arch))
    for arch in ARCHS:
        for case, (layers, specs) in cases_of(arch).items():
            keys[specs[0].world_size].append((arch, case))
            jobs[specs[0].world_size].append(chat_job(models[arch, layers], specs, arch))
    for size, specs in PREFILL_SPECS.items():
        keys[size].append(("llama", f"prefill-{size}"))
        jobs[size].append(prefill_job(models["llama", LAYERS], specs))
    for size, specs in ((0, None), (2, SLIDING_SPECS)):
        keys[size].append(("llama-sliding", "reference" if size == 0 else "pipeline-2"))
        jobs[size].append(chat_job(sliding_llama, specs))

    results: RingResults = {}
    # The rings one after another: a waiting rank spins on its socket, and two rings at once
    # would take the CPU from each other on a small machine.
    reference = start_ranks(jobs[0], 0, folder)
    for size in RING_SIZES:
        per_rank = collect(start_ranks(jobs[size], size, folder), timeout=240)
        for index, key in enumerate(keys[size]):
            results[key] = [rank_results[index] for rank_results in per_rank]
    (reference_results,) = collect(reference, timeout=240)
    for index, key in enumerate(keys[0]):
        results[key] = [reference_results[index]]
    return results


ALL_CASES = [
    pytest.param(arch, case, id=f"{arch}-{case}") for arch in ARCHS for case in cases_of(arch)
]


@pytest.mark.parametrize(("arch", "case"), ALL_CASES)
def test_sharded_greedy_output_matches_one_process(runs: RingResults, arch: str, case: str) -> None:
    layers, specs = case_of(arch, case)
    (reference,) = runs[arch, f"reference-{layers}"]
    ranks = runs[arch, case]
    assert len(ranks) == len(specs)
    assert len(reference.turns[0].tokens) == max_tokens(arch)[0]
    for result in ranks:
        for turn, expected in zip(result.turns, reference.turns, strict=True):
            assert turn.tokens == expected.tokens, f"rank {result.rank} differs from one process"
    if (arch.endswith("-q4") or arch == GPT_OSS) and kernels.available():
        # Every rank's quantized linears (and the reference's) ran on the CPU kernels.
        assert reference.kernel_layers > 0
        assert all(result.kernel_layers > 0 for result in ranks)
    if arch in QUANTIZED_MOE and kernels.available():
        # So did every expert: each rank's QuantizedSwitchLinear layers, none left on MLX's.
        for result in (reference, *ranks):
            assert result.expert_kernel_layers > 0, f"rank {result.rank}: no expert on a kernel"
            assert result.expert_mlx_layers == 0, f"rank {result.rank}: experts on MLX's kernels"


@pytest.mark.parametrize(("arch", "case"), ALL_CASES)
def test_second_turn_reuses_the_sharded_prompt_cache(
    runs: RingResults, arch: str, case: str
) -> None:
    (reference,) = runs[arch, f"reference-{case_of(arch, case)[0]}"]
    cached = reference.turns[1].cached_tokens
    # gpt-oss's sliding caches, rotated past the window, cannot be cut back to the second
    # prompt's shared start: the ranks must then agree with one process, which may hold none.
    assert cached > 0 or arch == GPT_OSS
    assert all(result.turns[1].cached_tokens == cached for result in runs[arch, case])


@pytest.mark.parametrize(("arch", "case"), ALL_CASES)
def test_each_rank_reports_progress_up_to_its_own_layers(
    runs: RingResults, arch: str, case: str
) -> None:
    for spec, result in zip(case_of(arch, case)[1], runs[arch, case], strict=True):
        owned = spec.num_layers
        assert result.rank == spec.rank
        assert result.progress == tuple(
            LoadProgress(layers_loaded=i, total=owned, rank=spec.rank) for i in range(1, owned + 1)
        )


def weight_bytes(path: Path) -> tuple[int, list[int]]:
    """Bytes of the weights outside the layers, and of each layer, read from the lazy model."""
    model, _, _, _ = open_lazy(path)
    layers = [nbytes(layer) for layer in transformer_layers(model)]
    return nbytes(model) - sum(layers), layers


def nbytes(module: nn.Module) -> int:
    leaves = cast(list[tuple[str, mx.array]], tree_flatten(module.parameters()))
    return sum(array.nbytes for _, array in leaves)


@pytest.mark.parametrize(("arch", "case"), ALL_CASES)
def test_a_rank_holds_only_its_share_of_the_weights(
    runs: RingResults, models: Models, arch: str, case: str
) -> None:
    layer_count, specs = case_of(arch, case)
    outside, layers = weight_bytes(models[arch, layer_count])
    (reference,) = runs[arch, f"reference-{layer_count}"]
    assert reference.weights_bytes == pytest.approx(outside + sum(layers), rel=0.01)
    for spec, result in zip(specs, runs[arch, case], strict=True):
        if spec.strategy == "pipeline":
            share = outside + sum(layers[spec.start_layer : spec.end_layer])
            assert result.weights_bytes == pytest.approx(share, rel=0.01)
        else:
            # Every weight matrix is halved; norms (and a MoE router) stay whole.
            assert result.weights_bytes <= outside + 0.55 * sum(layers)


def test_a_pipeline_cut_keeps_sliding_window_masks_right(runs: RingResults) -> None:
    (reference,) = runs["llama-sliding", "reference"]
    (plain,) = runs["llama", f"reference-{LAYERS}"]
    assert reference.turns[0].tokens != plain.turns[0].tokens  # the window changes the output
    for result in runs["llama-sliding", "pipeline-2"]:
        assert [t.tokens for t in result.turns] == [t.tokens for t in reference.turns]


@pytest.mark.parametrize("size", RING_SIZES)
def test_chunked_prefill_sends_between_ranks(runs: RingResults, size: int) -> None:
    # Prefill chunks evaluate only the caches: the send must hang off the cache, or the next
    # rank would wait forever (the ring's timeout would fail this test instead).
    (reference,) = runs["llama", "prefill-0"]
    assert len(reference.turns[0].tokens) == 20
    for result in runs["llama", f"prefill-{size}"]:
        assert result.turns[0].tokens == reference.turns[0].tokens


# ------------------------------------------------------------------- one process, no ring


@pytest.mark.parametrize("strategy", ["pipeline", "tensor"])
def test_a_ring_of_one_is_the_whole_model(tiny_llama: Path, strategy: str) -> None:
    group = mx.distributed.init()
    assert group.size() == 1
    card = read_card(tiny_llama)
    spec = ShardSpec(strategy=strategy, start_layer=0, end_layer=card.num_layers)  # type: ignore[arg-type]
    reports: list[LoadProgress] = []
    sharded = run_loading(load_shard(tiny_llama, spec, group), reports.append)
    assert [r.layers_loaded for r in reports] == list(range(1, card.num_layers + 1))
    job = Job(path=str(tiny_llama), turns=TURNS, max_tokens=(20, 5))
    whole = load_model_sync(tiny_llama)
    assert [t.tokens for t in converse(sharded, job)] == [t.tokens for t in converse(whole, job)]


# ------------------------------------------------------------------------------ bad specs


def pipeline(start: int, end: int, rank: int, world_size: int) -> ShardSpec:
    return ShardSpec(
        strategy="pipeline", start_layer=start, end_layer=end, rank=rank, world_size=world_size
    )


@pytest.fixture(scope="module")
def card(models: Models) -> ModelCard:
    return read_card(models["llama", LAYERS])


@pytest.mark.parametrize(
    ("spec", "world_size", "words"),
    [
        (pipeline(3, 3, 1, 2), 2, ["empty layer range [3, 3)"]),
        (pipeline(-1, 3, 0, 2), 2, ["[-1, 3)", "out of bounds", "6 layers", "[0, 6)"]),
        (pipeline(-3, 999, 0, 1), 1, ["[-3, 999)", "out of bounds", "6 layers", "[0, 6)"]),
        (pipeline(6, 9, 1, 2), 2, ["[6, 9)", "out of bounds", "6 layers"]),
        (pipeline(3, 8, 1, 2), 2, ["[3, 8)", "out of bounds", "6 layers"]),
        (pipeline(1, 6, 0, 2), 2, ["Rank 0 must hold the first layer"]),
        (pipeline(0, 3, 1, 2), 2, ["last rank (1) must hold the last layer"]),
        (pipeline(0, 6, 0, 1), 2, ["ring of 1 ranks but this ring has 2"]),
        (pipeline(0, 6, 2, 2), 2, ["rank 2, outside a ring of 2"]),
        (tensor_specs(LAYERS, 3)[0], 3, ["4 attention heads and 2 key/value heads", "3 ranks"]),
        (
            ShardSpec(strategy="tensor", start_layer=0, end_layer=3, rank=0, world_size=2),
            2,
            ["every layer", "[0, 3)"],
        ),
    ],
)
def test_bad_specs_are_refused_with_the_reason(
    card: ModelCard, spec: ShardSpec, world_size: int, words: list[str]
) -> None:
    with pytest.raises(ShardError) as raised:
        check_shard_spec(card, spec, world_size)
    for word in words:
        assert word in str(raised.value)


def test_tensor_on_an_architecture_without_shard_names_it(card: ModelCard) -> None:
    no_shard = card.model_copy(update={"model_type": "mamba", "supports_tensor": False})
    with pytest.raises(ShardError, match="the mamba architecture does not have"):
        check_shard_spec(no_shard, tensor_specs(LAYERS, 2)[0], 2)
    check_shard_spec(no_shard, pipeline_specs([3, 3])[0], 2)


def test_a_ring_of_specs_must_cover_every_layer_once(card: ModelCard) -> None:
    check_shard_specs(card, pipeline_specs([1, 2, 3]))
    check_shard_specs(card, tensor_specs(LAYERS, 2))
    with pytest.raises(ShardError, match="Rank 0 ends at layer 2 but rank 1 starts at layer 3"):
        check_shard_specs(card, [pipeline(0, 2, 0, 2), pipeline(3, 6, 1, 2)])
    with pytest.raises(ShardError, match="in rank order"):
        check_shard_specs(card, list(reversed(pipeline_specs([3, 3]))))


def test_layer_indices_are_re_pointed_or_refused(card: ModelCard) -> None:
    holder = nn.Module()
    holder.layers = [nn.RMSNorm(4) for _ in range(4)]
    holder.layer_types = ["sliding", "full", "sliding", "full"]
    holder.fa_idx, holder.swa_idx = 1, 0
    _reindex(holder, card, 2, 4, 4)
    assert (holder.fa_idx, holder.swa_idx, holder.layer_types) == (1, 0, ["sliding", "full"])
    _reindex(holder, card, 1, 2, 2)  # now ["full"]: no sliding layer on this rank
    assert (holder.fa_idx, holder.swa_idx) == (0, 0)  # the rank's first layer, a mask unused

    holder.layer_types = ["sliding", "full", "sliding", "full"]
    holder.swa_idx, holder.shared_kv_idx = 0, 2  # 2 is not the first layer of its type
    with pytest.raises(ShardError, match=r"\(shared_kv_idx\) that a pipeline cut would break"):
        _reindex(holder, card, 0, 2, 4)
    del holder["layer_types"]
    with pytest.raises(ShardError, match="layer indices"):
        _reindex(holder, card, 0, 2, 4)


def test_load_shard_refuses_a_bad_spec_before_reading_weights(tiny_llama: Path) -> None:
    before = mx.get_active_memory()
    loading = load_shard(tiny_llama, pipeline(0, 9, 0, 1), mx.distributed.init())
    with pytest.raises(ShardError, match="out of bounds"):
        next(loading)
    assert mx.get_active_memory() == before


def test_a_pipeline_rank_loads_before_its_ring_and_a_tensor_rank_cannot(tiny_llama: Path) -> None:
    progress: list[LoadProgress] = []
    loaded = run_loading(load_shard(tiny_llama, pipeline(0, 2, 0, 2), None), progress.append)
    assert [p.layers_loaded for p in progress] == [1, 2]
    # Hooked for a ring of two, it refuses to run until it has joined one.
    with pytest.raises(ShardError, match="has not joined its ring"):
        loaded.model(mx.array([[1, 2, 3]]))
    with pytest.raises(ShardError, match="ring of 2 ranks but this ring has 1"):
        join_pipeline(loaded.model, mx.distributed.init(), pipeline(0, 2, 0, 2))
    tensor = load_shard(tiny_llama, tensor_specs(4, 2)[0], None)
    with pytest.raises(ShardError, match="cannot load before joining"):
        next(tensor)


def test_even_layer_counts_give_the_first_ranks_the_remainder() -> None:
    assert even_layer_counts(7, 3) == [3, 2, 2]
    specs = pipeline_specs(even_layer_counts(7, 3))
    assert [(s.start_layer, s.end_layer, s.rank, s.world_size) for s in specs] == [
        (0, 3, 0, 3),
        (3, 5, 1, 3),
        (5, 7, 2, 3),
    ]
