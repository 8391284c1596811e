"""Model cards read from real files (engine.models.cards, .safetensors, .weights), and every
bad-input error."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import numpy as np
import pytest

from engine.errors import ModelFormatError, ModelNotFoundError
from engine.models.cards import read_card
from engine.models.weights import missing_weight_files
from engine.types import Quantization
from tests.engine.model_folders import LLAMA_CONFIG, llama_tensors, numel, write_model

# Never the real Hugging Face cache: an empty folder per test.
pytestmark = pytest.mark.usefixtures("empty_hf_cache")


# ------------------------------------------------------------------------------ cards


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
