"""The model store: cards read from real files, discovery, resolution and every bad-input error."""

from __future__ import annotations

import importlib.metadata
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from engine.errors import ModelFormatError, ModelNotFoundError
from engine.models import locations
from engine.models.cards import read_card
from engine.models.finding import find_models, find_models_with_errors, resolve_model
from engine.models.locations import bundled_demo_dir, default_models_dir
from engine.models.weights import missing_weight_files
from engine.types import Quantization

LLAMA_CONFIG: dict[str, Any] = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 100,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "bfloat16",
}


def llama_tensors(dtype: type[np.generic] = np.float16) -> dict[str, np.ndarray]:
    t: dict[str, np.ndarray] = {"model.embed_tokens.weight": np.zeros((100, 32), dtype)}
    for i in range(2):
        p = f"model.layers.{i}"
        t[f"{p}.self_attn.q_proj.weight"] = np.zeros((32, 32), dtype)
        t[f"{p}.self_attn.k_proj.weight"] = np.zeros((16, 32), dtype)
        t[f"{p}.self_attn.v_proj.weight"] = np.zeros((16, 32), dtype)
        t[f"{p}.self_attn.o_proj.weight"] = np.zeros((32, 32), dtype)
        t[f"{p}.input_layernorm.weight"] = np.ones((32,), dtype)
    t["model.norm.weight"] = np.ones((32,), dtype)
    return t


def numel(tensors: dict[str, np.ndarray]) -> int:
    return sum(int(a.size) for a in tensors.values())


def write_model(
    folder: Path,
    config: dict[str, Any] | None = None,
    files: dict[str, dict[str, np.ndarray]] | None = None,
    *,
    tokenizer: bool = True,
) -> Path:
    """A model folder: config.json, the given safetensors files, a tokenizer.json stub."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(LLAMA_CONFIG if config is None else config))
    if files is None:
        files = {"model.safetensors": llama_tensors()}
    for name, tensors in files.items():
        save_file(tensors, str(folder / name), metadata={"format": "mlx"})
    if tokenizer:
        (folder / "tokenizer.json").write_text("{}")
    return folder


@pytest.fixture(autouse=True)
def empty_hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Never scan the real Hugging Face cache: point it at an empty folder."""
    hub = tmp_path / "hf-hub"
    hub.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    return hub


# ------------------------------------------------------------------------------ cards


def test_locations(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EXO_TUI_HOME", raising=False)
    assert default_models_dir().parts[-2:] == ("exo-tui", "models")
    engine_dir = Path(locations.__file__).resolve().parent.parent
    assert bundled_demo_dir() == engine_dir / "demo" / "model"
    assert (bundled_demo_dir() / "config.json").is_file()


def test_exo_tui_home_holds_the_default_models_dir(exo_home: Path) -> None:
    # The same folder as exo_tui.store.paths puts the chats in, next to them.
    from exo_tui.store.paths import data_dir

    assert default_models_dir() == exo_home / "data" / "models" == data_dir() / "models"
    write_model(default_models_dir() / "alpha")
    assert [c.name for c in find_models(include_hf_cache=False, include_bundled=False)] == ["alpha"]


def test_llama_card_fields(tmp_path: Path) -> None:
    first = llama_tensors()
    second = {"lm_head.weight": np.zeros((100, 32), np.float16)}
    folder = write_model(
        tmp_path / "my-llama",
        files={
            "model-00001-of-00002.safetensors": first,
            "model-00002-of-00002.safetensors": second,
        },
    )
    card = read_card(folder)
    assert card.name == "my-llama"
    assert card.path == str(folder.resolve())
    assert card.source == "path"
    assert card.model_type == "llama"
    assert card.num_layers == 2
    assert card.hidden_size == 32
    assert card.num_attention_heads == 4
    assert card.num_kv_heads == 2
    assert card.head_dim == 8  # hidden / heads: no head_dim in the config
    assert card.vocab_size == 100
    assert card.context_length == 4096
    assert card.quantization is None
    assert card.dtype == "bfloat16"  # the config's torch_dtype wins over the tensors' dtype
    assert card.bytes_on_disk == sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    assert card.num_parameters == numel(first) + numel(second)
    assert card.supports_tensor is True
    assert card.tensor_unsupported_reason is None


def test_card_defaults_from_tensors(tmp_path: Path) -> None:
    config = {
        k: v
        for k, v in LLAMA_CONFIG.items()
        if k not in ("torch_dtype", "num_key_value_heads", "max_position_embeddings")
    }
    config |= {"head_dim": 16, "n_positions": None}
    folder = write_model(tmp_path / "m", config, {"model.safetensors": llama_tensors(np.float32)})
    card = read_card(folder, "models_dir", name="org/m")
    assert card.name == "org/m"
    assert card.source == "models_dir"
    assert card.num_kv_heads == 4  # defaults to the attention heads
    assert card.head_dim == 16  # the config's head_dim, not hidden / heads
    assert card.context_length is None
    assert card.dtype == "float32"  # the most common tensor dtype


def quantized_linear(out: int, inp: int, bits: int, group: int) -> dict[str, np.ndarray]:
    return {
        "weight": np.zeros((out, inp * bits // 32), np.uint32),
        "scales": np.zeros((out, inp // group), np.float16),
        "biases": np.zeros((out, inp // group), np.float16),
    }


def test_quantized_card(tmp_path: Path) -> None:
    tensors: dict[str, np.ndarray] = {"model.norm.weight": np.ones((64,), np.float16)}
    for name, bits in (("model.layers.0.mlp.up_proj", 4), ("model.layers.0.mlp.down_proj", 8)):
        for leaf, arr in quantized_linear(128, 64, bits, 32).items():
            tensors[f"{name}.{leaf}"] = arr
    tensors["model.layers.0.mlp.up_proj.bias"] = np.zeros((128,), np.float16)  # a real bias
    config = LLAMA_CONFIG | {
        "hidden_size": 64,
        "quantization": {
            "group_size": 32,
            "bits": 4,
            "model.layers.0.mlp.down_proj": {"group_size": 32, "bits": 8},
        },
    }
    card = read_card(write_model(tmp_path / "q", config, {"model.safetensors": tensors}))
    assert card.quantization == Quantization(bits=4, group_size=32)
    # Like mlx-lm: packed values unpacked with each layer's bits, scales/biases not counted.
    assert card.num_parameters == 64 + 128 * 64 + 128 + 128 * 64
    assert card.dtype == "bfloat16"


def test_hf_quantization_config_and_text_config(tmp_path: Path) -> None:
    text = {k: v for k, v in LLAMA_CONFIG.items() if k not in ("model_type", "architectures")}
    config = {
        "model_type": "mistral3",  # nests the language model under text_config
        "text_config": text | {"model_type": "ministral3"},
        "quantization_config": {"quant_method": "awq", "bits": 4},
    }
    card = read_card(write_model(tmp_path / "vl", config))
    assert card.model_type == "mistral3"
    assert (card.num_layers, card.hidden_size, card.num_attention_heads) == (2, 32, 4)
    assert card.vocab_size == 100
    assert card.quantization == Quantization(bits=4, group_size=128)
    assert card.supports_tensor is False
    assert card.tensor_unsupported_reason == "mlx-lm's mistral3 model has no shard()"


def test_model_type_remapping(tmp_path: Path) -> None:
    # mlx-lm runs "mistral" with its llama module, which can shard.
    card = read_card(write_model(tmp_path / "mistral", LLAMA_CONFIG | {"model_type": "mistral"}))
    assert card.model_type == "mistral"
    assert card.supports_tensor is True


def test_tiny_llama_and_qwen3_moe_cards(tmp_path: Path) -> None:
    from tests.tiny_models import build_tiny_model, parameter_count

    for arch in ("llama", "qwen3_moe"):
        folder = build_tiny_model(tmp_path / arch, arch, num_layers=3, shards=2)
        card = read_card(folder)
        assert card.model_type == arch
        assert card.num_layers == 3
        assert (card.hidden_size, card.num_attention_heads, card.num_kv_heads) == (64, 4, 2)
        assert card.head_dim == 16
        assert card.vocab_size == 768
        assert card.context_length == 2048
        assert card.dtype == "float32"
        assert card.num_parameters == parameter_count(folder)
        assert card.bytes_on_disk == sum(f.stat().st_size for f in folder.glob("*.safetensors"))
        assert card.supports_tensor is True


def test_quantized_tiny_model_counts_like_mlx_lm(tmp_path: Path) -> None:
    from mlx_lm import convert, load
    from mlx_lm.utils import get_total_parameters

    from tests.tiny_models import build_tiny_model

    src = build_tiny_model(tmp_path / "src", "qwen3_moe")
    dst = tmp_path / "q"
    convert(
        str(src),
        mlx_path=str(dst),
        quantize=True,
        q_bits=4,
        q_group_size=32,
        quant_predicate="mixed_3_6",
    )
    card = read_card(dst)
    assert card.quantization == Quantization(bits=4, group_size=32)
    model = load(str(dst))[0]
    assert card.num_parameters == get_total_parameters(model)


# ------------------------------------------------------------------------------ errors


def test_missing_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(ModelNotFoundError) as e:
        read_card(missing)
    assert str(missing) in str(e.value)
    assert "exo-tui models" in e.value.fix


def test_file_instead_of_folder(tmp_path: Path) -> None:
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"x")
    with pytest.raises(ModelFormatError, match="not a model folder"):
        read_card(f)


def test_folder_without_config(tmp_path: Path) -> None:
    folder = tmp_path / "empty"
    folder.mkdir()
    with pytest.raises(ModelFormatError) as e:
        read_card(folder)
    assert str(folder) in e.value.cause
    assert "not an mlx-lm model folder" in e.value.cause
    assert "config.json" in str(e.value) and "safetensors" in str(e.value)


def test_bad_json(tmp_path: Path) -> None:
    folder = write_model(tmp_path / "m")
    (folder / "config.json").write_text('{"model_type": "llama",')
    with pytest.raises(ModelFormatError) as e:
        read_card(folder)
    assert str(folder / "config.json") in e.value.cause
    assert "not valid JSON" in e.value.cause


def test_config_not_an_object(tmp_path: Path) -> None:
    folder = write_model(tmp_path / "m", config=[1, 2])  # type: ignore[arg-type]
    with pytest.raises(ModelFormatError, match="JSON object"):
        read_card(folder)


def test_missing_model_type(tmp_path: Path) -> None:
    config = {k: v for k, v in LLAMA_CONFIG.items() if k != "model_type"}
    folder = write_model(tmp_path / "m", config)
    with pytest.raises(ModelFormatError) as e:
        read_card(folder)
    assert str(folder / "config.json") in e.value.cause
    assert "model_type" in e.value.cause


def test_unknown_model_type(tmp_path: Path) -> None:
    folder = write_model(tmp_path / "m", LLAMA_CONFIG | {"model_type": "frobnicator9"})
    with pytest.raises(ModelFormatError) as e:
        read_card(folder)
    assert "'frobnicator9'" in e.value.cause
    assert importlib.metadata.version("mlx-lm") in e.value.cause
    assert "Upgrade mlx-lm" in e.value.fix and "another model" in e.value.fix


def test_missing_config_field(tmp_path: Path) -> None:
    config = {k: v for k, v in LLAMA_CONFIG.items() if k != "num_hidden_layers"}
    folder = write_model(tmp_path / "m", config)
    with pytest.raises(ModelFormatError) as e:
        read_card(folder)
    assert str(folder / "config.json") in e.value.cause
    assert "num_hidden_layers" in e.value.cause


def test_no_safetensors(tmp_path: Path) -> None:
    folder = write_model(tmp_path / "m", files={})
    (folder / "pytorch_model.bin").write_bytes(b"\0" * 16)
    with pytest.raises(ModelFormatError) as e:
        read_card(folder)
    assert str(folder) in e.value.cause
    assert "safetensors" in e.value.cause
    assert "mlx_lm.convert" in e.value.fix


def test_truncated_safetensors(tmp_path: Path) -> None:
    folder = write_model(tmp_path / "m")
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:-10])
    with pytest.raises(ModelFormatError) as e:
        read_card(folder)
    assert str(weights) in e.value.cause
    assert "truncated" in e.value.cause
    assert "re-download" in e.value.fix


@pytest.mark.parametrize("keep", [4, 8, 20])
def test_truncated_safetensors_header(tmp_path: Path, keep: int) -> None:
    folder = write_model(tmp_path / "m")
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:keep])
    with pytest.raises(ModelFormatError) as e:
        read_card(folder)
    assert str(weights) in e.value.cause
    assert "truncated" in e.value.cause


def test_corrupt_safetensors_header(tmp_path: Path) -> None:
    folder = write_model(tmp_path / "m", files={})
    bad = folder / "model.safetensors"
    header = b"not json!"
    bad.write_bytes(len(header).to_bytes(8, "little") + header)
    with pytest.raises(ModelFormatError) as e:
        read_card(folder)
    assert str(bad) in e.value.cause
    assert "corrupt" in e.value.cause


def test_a_missing_shard_makes_a_partial_card_that_will_not_load(tmp_path: Path) -> None:
    folder = write_model(
        tmp_path / "m", files={"model-00001-of-00002.safetensors": llama_tensors()}
    )
    index = {
        "metadata": {},
        "weight_map": {
            "model.norm.weight": "model-00001-of-00002.safetensors",
            "lm_head.weight": "model-00002-of-00002.safetensors",
        },
    }
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    # The head's file is missing: no layer can run here, and loading says which file lacks.
    assert read_card(folder).layers_on_disk == ()
    assert missing_weight_files(folder) == ["model-00002-of-00002.safetensors"]


def test_missing_tokenizer(tmp_path: Path) -> None:
    folder = write_model(tmp_path / "m", tokenizer=False)
    with pytest.raises(ModelFormatError) as e:
        read_card(folder)
    assert str(folder) in e.value.cause
    assert "tokenizer.json" in e.value.cause


@pytest.mark.parametrize("name", ["tokenizer.model", "tokenizer_config.json"])
def test_other_tokenizer_files_are_enough(tmp_path: Path, name: str) -> None:
    folder = write_model(tmp_path / "m", tokenizer=False)
    (folder / name).write_text("{}")
    assert read_card(folder).name == "m"


# ------------------------------------------------------------------------------ discovery


def make_models_dir(root: Path) -> Path:
    write_model(root / "alpha")
    write_model(root / "org" / "beta")
    write_model(root / "broken", files={})  # has config.json but no weights
    (root / "notes").mkdir()  # no config.json anywhere: ignored
    (root / "notes" / "readme.txt").write_text("hi")
    write_model(root / ".hidden")  # dot folders are ignored
    return root


def test_models_dir_discovery(tmp_path: Path) -> None:
    root = make_models_dir(tmp_path / "models")
    cards, skipped = find_models_with_errors([root], include_bundled=False)
    assert [(c.name, c.source) for c in cards] == [
        ("alpha", "models_dir"),
        ("org/beta", "models_dir"),
    ]
    assert cards[1].path == str((root / "org" / "beta").resolve())
    assert [s.path for s in skipped] == [root / "broken"]
    assert skipped[0].source == "models_dir"
    assert isinstance(skipped[0].error, ModelFormatError)
    assert str(root / "broken") in str(skipped[0].error)
    # find_models drops what failed to read; a missing models dir is no error.
    names = [c.name for c in find_models([root, tmp_path / "absent"], include_bundled=False)]
    assert names == ["alpha", "org/beta"]


def make_hf_repo(hub: Path, repo_id: str, sha: str, *, ref: str | None = "main") -> Path:
    """A repo in the real cache layout: blobs, snapshot symlinks into them, refs/<ref>."""
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    staging = repo / "staging"
    write_model(staging)
    snapshot = repo / "snapshots" / sha
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for f in sorted(staging.iterdir()):
        blob = repo / "blobs" / f"{sha[:8]}-{f.name}"
        f.rename(blob)
        (snapshot / f.name).symlink_to(os.path.relpath(blob, snapshot))
    staging.rmdir()
    if ref:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(sha)
    return snapshot


def test_hf_cache_discovery(tmp_path: Path, empty_hf_cache: Path) -> None:
    hub = empty_hf_cache
    main = make_hf_repo(hub, "mlx-community/Tiny-4bit", "a" * 40)
    make_hf_repo(hub, "mlx-community/Tiny-4bit", "b" * 40, ref="old")  # another revision
    make_hf_repo(hub, "someone/other", "c" * 40)
    # Broken repos are skipped silently: a dangling blob link, no snapshots at all.
    broken = make_hf_repo(hub, "someone/broken", "d" * 40)
    (broken / "model.safetensors").resolve().unlink()
    (hub / "models--someone--nosnapshots").mkdir()
    # A dataset and a repo without config.json are not models.
    (hub / "datasets--someone--data" / "snapshots" / ("e" * 40)).mkdir(parents=True)
    tok_only = hub / "models--someone--tokenizer" / "snapshots" / ("f" * 40)
    tok_only.mkdir(parents=True)
    (tok_only / "tokenizer.json").write_text("{}")

    cards = find_models([], include_bundled=False)
    assert [(c.name, c.source) for c in cards] == [
        ("mlx-community/Tiny-4bit", "hf_cache"),
        ("someone/other", "hf_cache"),
    ]
    assert cards[0].path == str(main.resolve())
    assert cards[0].num_layers == 2
    assert cards[0].bytes_on_disk == (main / "model.safetensors").stat().st_size
    assert find_models([], include_bundled=False, include_hf_cache=False) == []


def test_hf_cache_missing_is_no_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "does-not-exist"))
    assert find_models([], include_bundled=False) == []


def test_hf_home_is_honoured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    make_hf_repo(tmp_path / "hf-home" / "hub", "org/name", "a" * 40)
    assert [c.name for c in find_models([], include_bundled=False)] == ["org/name"]


def test_bundled_demo_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    demo = write_model(tmp_path / "demo-model")
    monkeypatch.setattr(locations, "bundled_demo_dir", lambda: demo)
    root = make_models_dir(tmp_path / "models")
    cards = find_models([root, demo.parent])  # the demo folder is not listed twice
    assert [(c.name, c.source) for c in cards][:3] == [
        ("demo", "bundled"),
        ("alpha", "models_dir"),
        ("org/beta", "models_dir"),
    ]
    assert "demo-model" not in [c.name for c in cards]
    assert resolve_model("demo").source == "bundled"


def test_bundled_demo_absent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(locations, "bundled_demo_dir", lambda: tmp_path / "no-demo")
    assert find_models([], include_hf_cache=False) == []
    with pytest.raises(ModelNotFoundError) as e:
        resolve_model("demo", [])
    assert str(tmp_path / "no-demo") in e.value.cause


# ------------------------------------------------------------------------------ resolve


def test_resolve_by_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = write_model(tmp_path / "here")
    card = resolve_model(str(folder), [])
    assert (card.name, card.source, card.path) == ("here", "path", str(folder.resolve()))
    monkeypatch.chdir(tmp_path)
    assert resolve_model("here", []).source == "path"  # a relative path works too


def test_resolve_by_name(
    tmp_path: Path, empty_hf_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no folder here named like the specs
    root = make_models_dir(tmp_path / "models")
    make_hf_repo(empty_hf_cache, "mlx-community/Tiny-4bit", "a" * 40)
    assert resolve_model("alpha", [root]).source == "models_dir"
    assert resolve_model("org/beta", [root]).name == "org/beta"
    assert resolve_model("beta", [root]).name == "org/beta"  # unambiguous last part
    hf = resolve_model("mlx-community/Tiny-4bit", [root])
    assert (hf.name, hf.source) == ("mlx-community/Tiny-4bit", "hf_cache")
    assert resolve_model("tiny-4bit", [root]).name == "mlx-community/Tiny-4bit"  # any case
    # A named model that is broken says why, rather than "not found".
    with pytest.raises(ModelFormatError, match="safetensors"):
        resolve_model("broken", [root])


def test_resolve_ambiguous_short_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "models"
    write_model(root / "a" / "same")
    write_model(root / "b" / "same")
    with pytest.raises(ModelNotFoundError) as e:
        resolve_model("same", [root])
    assert "a/same" in e.value.cause and "b/same" in e.value.cause


def test_resolve_not_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    root = make_models_dir(tmp_path / "models")
    with pytest.raises(ModelNotFoundError) as e:
        resolve_model("no-such-model", [root])
    assert "'no-such-model'" in e.value.cause
    assert str(root) in e.value.cause
    assert "exo-tui models" in e.value.fix
