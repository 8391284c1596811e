"""A model folder's card, read from config.json and its safetensors headers alone (a few
kilobytes per file), without loading any weights."""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, cast, get_args

from engine.errors import ModelFormatError, ModelNotFoundError
from engine.models import locations
from engine.models.locations import DEMO_SPEC
from engine.models.safetensors import (
    TensorInfo,
    as_int,
    common_dtype,
    numel,
    read_safetensors_header,
)
from engine.models.weights import (
    index_total_size,
    layer_of,
    layers_present,
    read_json_object,
    safetensors_files,
    weight_index,
)
from engine.types import ModelCard, ModelSource, Quantization, QuantizationMode

_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")


_HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model", "dim")


_HEAD_KEYS = ("num_attention_heads", "n_head", "n_heads", "num_heads")


_KV_HEAD_KEYS = ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num")


_VOCAB_KEYS = ("vocab_size", "padded_vocab_size", "n_vocab")


_CONTEXT_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "max_sequence_length",
    "seq_length",
    "n_ctx",
    "model_max_length",
)


_QUANTIZATION_MODES = get_args(QuantizationMode)


# Any one of these makes a folder's tokenizer loadable by transformers / mlx-lm.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "tiktoken.model")


def read_card(path: Path, source: ModelSource = "path", *, name: str | None = None) -> ModelCard:
    """Read a model folder's card from config.json and its safetensors headers.

    `name` defaults to the folder name ("demo" for the bundled model, whatever the caller
    passed as `source`). Raises ModelNotFoundError or ModelFormatError.
    """
    path = Path(path).expanduser()
    if name is None and path.resolve() == locations.bundled_demo_dir().resolve():
        name, source = DEMO_SPEC, "bundled"
    if not path.exists():
        raise ModelNotFoundError(
            f"No model at {path}",
            "Check the path, or run `exo-tui models` to list the models found",
        )
    if not path.is_dir():
        raise ModelFormatError(
            f"{path} is a file, not a model folder",
            "Pass the folder that holds config.json and the *.safetensors files",
        )
    config_path = path / "config.json"
    if not config_path.is_file():
        raise ModelFormatError(
            f"{path} is not an mlx-lm model folder: it has no config.json",
            "A model folder needs config.json, *.safetensors weights and a tokenizer; "
            "re-download the model or point at the right folder",
        )
    config = read_json_object(config_path)
    text = _text_config(config)

    model_type = _model_type(config, config_path)
    module_name, module = _mlx_lm_module(config, model_type)

    num_layers = _require_int(text, _LAYER_KEYS, config_path)
    hidden_size = _require_int(text, _HIDDEN_KEYS, config_path)
    vocab_size = _require_int(text, _VOCAB_KEYS, config_path)
    heads = _first_int(text, _HEAD_KEYS) or 0
    kv_heads = _first_int(text, _KV_HEAD_KEYS) or heads
    head_dim = _first_int(text, ("head_dim",)) or (hidden_size // heads if heads else 0)
    context_length = _first_int(text, _CONTEXT_KEYS)
    quantization = _quantization(config)

    weight_files = safetensors_files(path)
    tensors: dict[str, TensorInfo] = {}
    bytes_on_disk = 0
    for weight_file in weight_files:
        tensors.update(read_safetensors_header(weight_file))
        bytes_on_disk += weight_file.stat().st_size
    num_parameters = _count_parameters(tensors, config, quantization)
    index = weight_index(path)
    layers_on_disk = layers_present(path, index, num_layers) if index is not None else None
    bytes_in_layers = _bytes_in_layers(tensors, num_layers, layers_on_disk)
    if index is not None and layers_on_disk is not None:
        # A pipeline share of a download: the card describes the whole model.
        total = index_total_size(index)
        if total is not None and bytes_on_disk:
            num_parameters = num_parameters * total // bytes_on_disk
            bytes_on_disk = total
    if bytes_in_layers is not None:
        bytes_in_layers = min(bytes_in_layers, bytes_on_disk)

    _check_tokenizer(path)

    supports_tensor = hasattr(module.Model, "shard")
    reason = None if supports_tensor else f"mlx-lm's {module_name} model has no shard()"
    return ModelCard(
        name=name or path.resolve().name,
        path=str(path.resolve()),
        source=source,
        model_type=model_type,
        num_layers=num_layers,
        hidden_size=hidden_size,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=vocab_size,
        context_length=context_length,
        quantization=quantization,
        dtype=_config_dtype(config, text) or common_dtype(tensors),
        bytes_on_disk=bytes_on_disk,
        num_parameters=num_parameters,
        supports_tensor=supports_tensor,
        tensor_unsupported_reason=reason,
        layers_on_disk=layers_on_disk,
        bytes_in_layers=bytes_in_layers,
    )


def _bytes_in_layers(
    tensors: dict[str, TensorInfo], num_layers: int, layers_on_disk: tuple[int, ...] | None
) -> int | None:
    """The bytes of every transformer layer's weights, from the headers read. Of a pipeline
    share, the layers on disk stand for all (a model's layers are alike); None when none is."""
    sizes: dict[int, int] = {}
    for name, tensor in tensors.items():
        layer = layer_of(name)
        if layer is not None and (layers_on_disk is None or layer in layers_on_disk):
            sizes[layer] = sizes.get(layer, 0) + tensor.nbytes
    if layers_on_disk is None:
        return sum(sizes.values())
    if not sizes:
        return None
    return sum(sizes.values()) * num_layers // len(sizes)


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    """Multimodal configs nest the language model's fields under `text_config`."""
    text: object = config.get("text_config")
    if isinstance(text, dict):
        return {**config, **cast(dict[str, Any], text)}
    return config


def _model_type(config: dict[str, Any], config_path: Path) -> str:
    value: object = config.get("model_type")
    if not isinstance(value, str) or not value:
        raise ModelFormatError(
            f"{config_path} has no model_type",
            "mlx-lm needs model_type to pick the architecture; re-download the model "
            "or add the right model_type",
        )
    return value


def _mlx_lm_version() -> str:
    try:
        return importlib.metadata.version("mlx-lm")
    except importlib.metadata.PackageNotFoundError:
        return "(unknown version)"


def _mlx_lm_module(config: dict[str, Any], model_type: str) -> tuple[str, ModuleType]:
    """The mlx-lm module for a config, remapped the way mlx_lm.utils._get_classes does it."""
    import mlx_lm.utils as mlx_utils  # heavy import: only when a card is read

    remap = cast(dict[str, str], getattr(mlx_utils, "MODEL_REMAPPING", {}))
    arch_remap = cast(
        dict[tuple[str, str], str], getattr(mlx_utils, "MODEL_ARCHITECTURE_REMAPPING", {})
    )
    module_name = remap.get(model_type, model_type)
    architectures: object = config.get("architectures") or ()
    if isinstance(architectures, str):
        architectures = (architectures,)
    if isinstance(architectures, list | tuple):
        for arch in cast(Sequence[object], architectures):
            if isinstance(arch, str) and (model_type, arch) in arch_remap:
                module_name = arch_remap[(model_type, arch)]
                break
    full_name = f"mlx_lm.models.{module_name}"
    try:
        module = importlib.import_module(full_name)
    except ModuleNotFoundError as e:
        if e.name != full_name and not full_name.startswith(f"{e.name}."):
            raise ModelFormatError(
                f"mlx-lm's {module_name} model (model_type '{model_type}') needs the missing "
                f"Python package '{e.name}'",
                f"Install it (pip install {e.name}) or pick another model",
            ) from e
        raise ModelFormatError(
            f"model_type '{model_type}' is not supported by mlx-lm {_mlx_lm_version()}",
            "Upgrade mlx-lm (pip install -U mlx-lm) or pick another model",
        ) from e
    except Exception as e:  # a broken model module must not crash listing
        raise ModelFormatError(
            f"mlx-lm's {module_name} model (model_type '{model_type}') failed to import: {e}",
            "Upgrade or reinstall mlx-lm, or pick another model",
        ) from e
    if not hasattr(module, "Model"):
        raise ModelFormatError(
            f"model_type '{model_type}' is not supported by mlx-lm {_mlx_lm_version()}",
            "Upgrade mlx-lm (pip install -U mlx-lm) or pick another model",
        )
    return module_name, module


def _first_int(config: dict[str, Any], keys: Sequence[str]) -> int | None:
    for key in keys:
        value = as_int(config.get(key))
        if value is not None and value > 0:
            return value
    return None


def _require_int(config: dict[str, Any], keys: Sequence[str], config_path: Path) -> int:
    value = _first_int(config, keys)
    if value is None:
        raise ModelFormatError(
            f"{config_path} has no {keys[0]} (nor {', '.join(keys[1:])})",
            "Re-download the model; this config does not describe a transformer mlx-lm can run",
        )
    return value


def _quantization(config: dict[str, Any]) -> Quantization | None:
    """mlx-lm's own `quantization`, else Hugging Face's `quantization_config` (top or text)."""
    candidates: list[tuple[object, int]] = [(config.get("quantization"), 64)]
    candidates.append((config.get("quantization_config"), 128))
    text: object = config.get("text_config")
    if isinstance(text, dict):
        text_dict = cast(dict[str, Any], text)
        candidates.append((text_dict.get("quantization"), 64))
        candidates.append((text_dict.get("quantization_config"), 128))
    for raw, default_group in candidates:
        if not isinstance(raw, dict):
            continue
        q = cast(dict[str, Any], raw)
        bits = as_int(q.get("bits"))
        method: object = q.get("quant_method") or q.get("format") or ""
        if bits is None and method == "mxfp4":  # gpt-oss as OpenAI publishes it
            return Quantization(bits=4, group_size=32, mode="mxfp4")
        if bits is None and isinstance(method, str) and "fp8" in method.lower():
            bits = 8
        if bits is None or bits <= 0:
            continue
        group = as_int(q.get("group_size"))
        if group is None:
            block: object = q.get("weight_block_size")
            if isinstance(block, list) and block:
                group = as_int(cast(list[object], block)[-1])
        mode: object = q.get("mode")
        if mode not in _QUANTIZATION_MODES:
            mode = "affine"
        return Quantization(
            bits=bits,
            group_size=group if group and group > 0 else default_group,
            mode=cast(QuantizationMode, mode),
        )
    return None


def _config_dtype(config: dict[str, Any], text: dict[str, Any]) -> str | None:
    for source in (text, config):
        for key in ("torch_dtype", "dtype"):
            value: object = source.get(key)
            if isinstance(value, str) and value:
                return value.removeprefix("torch.")
    return None


def _layer_bits(config: dict[str, Any], prefix: str, default: int) -> int:
    """Per-layer bits from mlx-lm's mixed quantization (`quantization[<module path>]`)."""
    for key in ("quantization", "quantization_config"):
        q: object = config.get(key)
        if isinstance(q, dict):
            layer: object = cast(dict[str, object], q).get(prefix)
            if isinstance(layer, dict):
                bits = as_int(cast(dict[str, object], layer).get("bits"))
                if bits:
                    return bits
    return default


def _count_parameters(
    tensors: dict[str, TensorInfo], config: dict[str, Any], quantization: Quantization | None
) -> int:
    """Count parameters like mlx-lm: a packed uint32 weight holds 32/bits values; the
    quantization scales and biases are not parameters."""
    quantized_prefixes = {
        name.removesuffix(".weight")
        for name, t in tensors.items()
        if name.endswith(".weight")
        and t.dtype == "U32"
        and name.removesuffix(".weight") + ".scales" in tensors
    }
    default_bits = quantization.bits if quantization else 4
    total = 0
    for name, t in tensors.items():
        prefix, _, leaf = name.rpartition(".")
        if prefix in quantized_prefixes:
            if leaf in ("scales", "biases"):
                continue
            if leaf == "weight":
                bits = _layer_bits(config, prefix, default_bits)
                total += numel(t.shape) * 32 // bits
                continue
        total += numel(t.shape)
    return total


def _check_tokenizer(path: Path) -> None:
    if any((path / f).is_file() for f in _TOKENIZER_FILES):
        return
    if any(path.glob("*.tiktoken")):
        return
    raise ModelFormatError(
        f"{path} has no tokenizer: tokenizer.json (or tokenizer.model / tokenizer_config.json) "
        "is missing",
        "Copy the tokenizer files from the original model repository into the folder, "
        "or re-download the model",
    )
