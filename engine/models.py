"""The model store: find mlx-lm model folders and read their cards without loading any weights.

A card comes from `config.json` and the safetensors headers only (a few kilobytes per file), so
listing a hundred models is fast. Every expected failure is a `ModelNotFoundError` or a
`ModelFormatError` that names the folder, file or value and says what to do.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import re
import struct
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import platformdirs

from engine.errors import EngineError, ModelFormatError, ModelNotFoundError
from engine.types import ModelCard, ModelSource, Quantization

__all__ = [
    "SkippedModel",
    "bundled_demo_dir",
    "default_models_dir",
    "find_models",
    "find_models_with_errors",
    "hf_cache_dir",
    "layer_of",
    "hub_repo_of",
    "missing_weight_files",
    "read_card",
    "require_weight_files",
    "resolve_model",
    "shard_files",
    "weight_index",
]

DEMO_SPEC = "demo"

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
# Any one of these makes a folder's tokenizer loadable by transformers / mlx-lm.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "tiktoken.model")

_SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U64": "uint64",
    "U32": "uint32",
    "U16": "uint16",
    "U8": "uint8",
    "BOOL": "bool",
}
_MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors spec's own limit
INDEX_FILE = "model.safetensors.index.json"
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


@dataclass(frozen=True)
class SkippedModel:
    """A folder that looked like a model but could not be read; `error` says why and what to do."""

    path: Path
    source: ModelSource
    error: EngineError


@dataclass(frozen=True)
class _TensorInfo:
    dtype: str
    shape: tuple[int, ...]


# --------------------------------------------------------------------------------------------
# Locations


def default_models_dir() -> Path:
    """Where `exo-tui models` keeps downloaded models."""
    return platformdirs.user_data_path("exo-tui") / "models"


def bundled_demo_dir() -> Path:
    """The demo model shipped inside the package (it may be absent in a source checkout)."""
    return Path(__file__).resolve().parent / "demo" / "model"


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache, read from the environment now (not at import time)."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        value = os.environ.get(var)
        if value:
            return Path(os.path.expandvars(value)).expanduser()
    home = os.environ.get("HF_HOME")
    if home:
        return Path(os.path.expandvars(home)).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "huggingface" / "hub"


# --------------------------------------------------------------------------------------------
# Reading one card


def read_card(path: Path, source: ModelSource = "path", *, name: str | None = None) -> ModelCard:
    """Read a model folder's card from config.json and its safetensors headers.

    `name` defaults to the folder name ("demo" for the bundled model, whatever the caller
    passed as `source`). Raises ModelNotFoundError or ModelFormatError.
    """
    path = Path(path).expanduser()
    if name is None and path.resolve() == bundled_demo_dir().resolve():
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
    config = _read_json_object(config_path)
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

    weight_files = _weight_files(path)
    tensors: dict[str, _TensorInfo] = {}
    bytes_on_disk = 0
    for weight_file in weight_files:
        tensors.update(_read_safetensors_header(weight_file))
        bytes_on_disk += weight_file.stat().st_size
    num_parameters = _count_parameters(tensors, config, quantization)
    index = weight_index(path)
    layers_on_disk = _layers_on_disk(path, index, num_layers) if index is not None else None
    if index is not None and layers_on_disk is not None:
        # A pipeline share of a download: the card describes the whole model.
        total = _index_total_size(index)
        if total is not None and bytes_on_disk:
            num_parameters = num_parameters * total // bytes_on_disk
            bytes_on_disk = total

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
        dtype=_config_dtype(config, text) or _common_dtype(tensors),
        bytes_on_disk=bytes_on_disk,
        num_parameters=num_parameters,
        supports_tensor=supports_tensor,
        tensor_unsupported_reason=reason,
        layers_on_disk=layers_on_disk,
    )


def _read_json_object(path: Path) -> dict[str, Any]:
    try:
        data: object = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelFormatError(
            f"{path} is not valid JSON ({e})",
            "Fix or re-download the file",
        ) from e
    except OSError as e:
        raise ModelFormatError(
            f"Cannot read {path} ({e.strerror or e})", "Check the file's permissions"
        ) from e
    if not isinstance(data, dict):
        raise ModelFormatError(
            f"{path} does not hold a JSON object",
            "Fix or re-download the file",
        )
    return cast(dict[str, Any], data)


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


def _as_int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _first_int(config: dict[str, Any], keys: Sequence[str]) -> int | None:
    for key in keys:
        value = _as_int(config.get(key))
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
        bits = _as_int(q.get("bits"))
        if bits is None:
            method: object = q.get("quant_method") or q.get("format") or ""
            if isinstance(method, str) and "fp8" in method.lower():
                bits = 8
        if bits is None or bits <= 0:
            continue
        group = _as_int(q.get("group_size"))
        if group is None:
            block: object = q.get("weight_block_size")
            if isinstance(block, list) and block:
                group = _as_int(cast(list[object], block)[-1])
        return Quantization(bits=bits, group_size=group if group and group > 0 else default_group)
    return None


def _config_dtype(config: dict[str, Any], text: dict[str, Any]) -> str | None:
    for source in (text, config):
        for key in ("torch_dtype", "dtype"):
            value: object = source.get(key)
            if isinstance(value, str) and value:
                return value.removeprefix("torch.")
    return None


# --------------------------------------------------------------------------------------------
# Which files hold which layers (a pipeline rank needs only some of them)


def layer_of(weight: str) -> int | None:
    """The transformer layer a weight belongs to (`model.layers.12.mlp...` -> 12), or None."""
    found = _LAYER.search(weight)
    return int(found.group(1)) if found else None


def shard_files(index_json: Mapping[str, Any], layer_range: tuple[int, int]) -> set[str]:
    """The safetensors files holding layers ``[start, end)`` and every weight outside layers.

    Weights outside the layers (embeddings, final norm, head) are always included: the engine
    keeps them on every pipeline rank (each rank embeds and computes the logits).
    """
    start, end = layer_range
    if not 0 <= start < end:
        raise ValueError(f"bad layer range {start}:{end}")
    return {file for weight, file in _weight_map(index_json).items()
            if (layer := layer_of(weight)) is None or start <= layer < end}  # fmt: skip


def missing_weight_files(path: Path, layers: tuple[int, int] | None = None) -> list[str]:
    """The weight files of `path` that its index lists for `layers` (None: all) but that are
    not on disk; empty for a complete folder or one without an index."""
    index = weight_index(path)
    if index is None:
        return []
    wanted = shard_files(index, layers) if layers else set(_weight_map(index).values())
    return sorted(name for name in wanted if not (path / name).is_file())


def require_weight_files(
    path: Path, layers: tuple[int, int] | None = None, *, name: str | None = None
) -> None:
    """Raise ModelFormatError naming the weight files of `layers` (None: all) that the folder's
    index lists but that are not on disk. The fix depends on where the folder is: a snapshot in
    the Hugging Face cache downloads the rest of its repo; any other folder is not a hub repo,
    so the files must be copied in."""
    missing = missing_weight_files(path, layers)
    if not missing:
        return
    which = f"layers {layers[0]}-{layers[1] - 1}" if layers else "the whole model"
    shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
    cause = (
        f"{path} lacks {len(missing)} weight file(s) that {which} of {name or path.name} "
        f"need{'s' if not layers else ''}: {shown} (its {INDEX_FILE} lists "
        f"{'them' if len(missing) > 1 else 'it'})"
    )
    repo = hub_repo_of(path)
    if repo is not None:
        part = f" --layers {layers[0]}:{layers[1]}" if layers else ""
        raise ModelFormatError(cause, f"Download them: exo-tui models download {repo}{part}")
    raise ModelFormatError(
        cause,
        f"Copy {missing[0]}{' and the rest' if len(missing) > 1 else ''} into {path} from "
        "where the model came from, or run it across nodes that hold the other layers",
    )


def hub_repo_of(path: Path) -> str | None:
    """The repo id of a snapshot folder in the Hugging Face cache
    (`models--org--name/snapshots/<commit>` -> "org/name"), None for any other folder."""
    storage = path.resolve().parent.parent
    if path.resolve().parent.name != "snapshots" or not storage.name.startswith("models--"):
        return None
    return storage.name.removeprefix("models--").replace("--", "/")


def weight_index(path: Path) -> dict[str, Any] | None:
    """The folder's model.safetensors.index.json (None without one); ModelFormatError when it
    is not a JSON object with a weight_map."""
    index_path = path / INDEX_FILE
    if not index_path.is_file():
        return None
    index = _read_json_object(index_path)
    if not isinstance(index.get("weight_map"), dict):
        raise ModelFormatError(f"{index_path} has no weight_map", "Re-download the model")
    return index


def _weight_map(index_json: Mapping[str, Any]) -> dict[str, str]:
    weight_map = cast(dict[str, object], index_json.get("weight_map") or {})
    return {weight: file for weight, file in weight_map.items() if isinstance(file, str)}


def _index_total_size(index_json: Mapping[str, Any]) -> int | None:
    metadata: object = index_json.get("metadata")
    if isinstance(metadata, dict):
        total: object = cast(dict[str, object], metadata).get("total_size")
        if isinstance(total, int) and total > 0:
            return total
    return None


def _layers_on_disk(
    path: Path, index_json: Mapping[str, Any], num_layers: int
) -> tuple[int, ...] | None:
    """None when every file the index lists is on disk; else the layers whose weights are
    (none when a weight outside the layers is missing: no layer can run without it)."""
    present: dict[str, bool] = {}
    complete: dict[int | None, bool] = {}
    for weight, file in _weight_map(index_json).items():
        here = present.setdefault(file, (path / file).is_file())
        layer = layer_of(weight)
        complete[layer] = complete.get(layer, True) and here
    if all(complete.values()):
        return None
    if not complete.get(None, True):
        return ()
    return tuple(layer for layer in range(num_layers) if complete.get(layer, True))


def _weight_files(path: Path) -> list[Path]:
    files = sorted(p for p in path.glob("*.safetensors") if not p.name.startswith("."))
    if not files:
        raise ModelFormatError(
            f"{path} has no *.safetensors weights",
            "mlx-lm loads safetensors only: convert the model with `mlx_lm.convert` "
            "or download an MLX version (e.g. from mlx-community)",
        )
    for file in files:
        if not file.is_file():  # e.g. a broken symlink into the Hugging Face cache
            raise ModelFormatError(f"{file} is missing (broken link)", "Re-download the model")
    return files


def _truncated(file: Path, detail: str) -> ModelFormatError:
    return ModelFormatError(
        f"{file} is truncated ({detail})",
        "The download did not finish; delete the file and re-download the model",
    )


def _read_safetensors_header(file: Path) -> dict[str, _TensorInfo]:
    """Parse a safetensors header (8-byte little-endian length + JSON) and check the file size."""
    size = file.stat().st_size
    try:
        with file.open("rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                raise _truncated(file, f"{size} bytes, shorter than a safetensors header")
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len > _MAX_HEADER_BYTES:
                raise ModelFormatError(
                    f"{file} is not a safetensors file (header length {header_len})",
                    "Re-download the file",
                )
            if 8 + header_len > size:
                raise _truncated(file, f"{size} bytes, header needs {8 + header_len}")
            raw = f.read(header_len)
    except OSError as e:
        raise ModelFormatError(
            f"Cannot read {file} ({e.strerror or e})", "Check the file's permissions"
        ) from e
    try:
        header: object = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelFormatError(
            f"{file} has a corrupt safetensors header ({e})", "Re-download the file"
        ) from e
    if not isinstance(header, dict):
        raise ModelFormatError(f"{file} has a corrupt safetensors header", "Re-download the file")

    tensors: dict[str, _TensorInfo] = {}
    data_end = 0
    for key, entry in cast(dict[str, object], header).items():
        if key == "__metadata__":
            continue
        info = _tensor_info(entry)
        if info is None:
            raise ModelFormatError(
                f"{file} has a corrupt safetensors header (bad entry for '{key}')",
                "Re-download the file",
            )
        tensor, end = info
        tensors[key] = tensor
        data_end = max(data_end, end)
    needed = 8 + header_len + data_end
    if size < needed:
        raise _truncated(file, f"{size} of {needed} bytes")
    return tensors


def _tensor_info(entry: object) -> tuple[_TensorInfo, int] | None:
    if not isinstance(entry, dict):
        return None
    e = cast(dict[str, object], entry)
    dtype, shape, offsets = e.get("dtype"), e.get("shape"), e.get("data_offsets")
    if not isinstance(dtype, str) or not isinstance(shape, list):
        return None
    if not isinstance(offsets, list) or len(cast(list[object], offsets)) != 2:
        return None
    dims = [_as_int(d) for d in cast(list[object], shape)]
    ends = [_as_int(o) for o in cast(list[object], offsets)]
    if any(d is None for d in dims) or any(o is None for o in ends):
        return None
    return _TensorInfo(dtype, tuple(d for d in dims if d is not None)), max(
        o for o in ends if o is not None
    )


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _layer_bits(config: dict[str, Any], prefix: str, default: int) -> int:
    """Per-layer bits from mlx-lm's mixed quantization (`quantization[<module path>]`)."""
    for key in ("quantization", "quantization_config"):
        q: object = config.get(key)
        if isinstance(q, dict):
            layer: object = cast(dict[str, object], q).get(prefix)
            if isinstance(layer, dict):
                bits = _as_int(cast(dict[str, object], layer).get("bits"))
                if bits:
                    return bits
    return default


def _count_parameters(
    tensors: dict[str, _TensorInfo], config: dict[str, Any], quantization: Quantization | None
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
                total += _numel(t.shape) * 32 // bits
                continue
        total += _numel(t.shape)
    return total


def _common_dtype(tensors: dict[str, _TensorInfo]) -> str | None:
    """The dtype holding the most values, ignoring packed quantized weights."""
    counts: Counter[str] = Counter()
    for t in tensors.values():
        if t.dtype not in ("U32", "U8"):
            counts[t.dtype] += _numel(t.shape)
    if not counts:
        return None
    dtype = counts.most_common(1)[0][0]
    return _SAFETENSORS_DTYPES.get(dtype, dtype.lower())


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


# --------------------------------------------------------------------------------------------
# Finding models


@dataclass(frozen=True)
class _Candidate:
    name: str
    path: Path
    source: ModelSource


def _is_visible_dir(path: Path) -> bool:
    return not path.name.startswith(".") and path.is_dir()


def _sorted_dirs(path: Path) -> list[Path]:
    try:
        return sorted((p for p in path.iterdir() if _is_visible_dir(p)), key=lambda p: p.name)
    except OSError:
        return []


def _models_dir_candidates(models_dir: Path) -> Iterator[_Candidate]:
    """`<dir>/<name>/config.json` and `<dir>/<org>/<name>/config.json`."""
    for sub in _sorted_dirs(models_dir):
        if (sub / "config.json").exists():
            yield _Candidate(sub.name, sub, "models_dir")
            continue
        for nested in _sorted_dirs(sub):
            if (nested / "config.json").exists():
                yield _Candidate(f"{sub.name}/{nested.name}", nested, "models_dir")


def _hf_cache_candidates() -> Iterator[_Candidate]:
    """The newest snapshot of each model repo in the Hugging Face cache (broken ones skipped)."""
    from huggingface_hub import CacheNotFound, scan_cache_dir

    try:
        info = scan_cache_dir(hf_cache_dir())
    except (CacheNotFound, ValueError, OSError):
        return
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model" or not repo.revisions:
            continue
        revisions = sorted(repo.revisions, key=lambda r: r.last_modified, reverse=True)
        main = [r for r in revisions if "main" in r.refs]
        snapshot = (main or revisions)[0].snapshot_path
        if (snapshot / "config.json").exists():
            yield _Candidate(repo.repo_id, snapshot, "hf_cache")


def _candidates(
    models_dirs: Sequence[Path] | None, *, include_hf_cache: bool, include_bundled: bool
) -> list[_Candidate]:
    found: list[_Candidate] = []
    if include_bundled:
        demo = bundled_demo_dir()
        if (demo / "config.json").exists():
            found.append(_Candidate(DEMO_SPEC, demo, "bundled"))
    dirs = [default_models_dir()] if models_dirs is None else list(models_dirs)
    for models_dir in dirs:
        found.extend(_models_dir_candidates(Path(models_dir).expanduser()))
    if include_hf_cache:
        found.extend(_hf_cache_candidates())
    seen: set[Path] = set()
    unique: list[_Candidate] = []
    for c in found:
        key = c.path.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(c)
    return unique


def find_models_with_errors(
    models_dirs: Sequence[Path] | None = None,
    *,
    include_hf_cache: bool = True,
    include_bundled: bool = True,
) -> tuple[list[ModelCard], list[SkippedModel]]:
    """Every readable model, plus the folders that hold a config.json but failed to read.

    Order: the bundled demo, each models dir (default: `default_models_dir()`), then the
    Hugging Face cache.
    """
    cards: list[ModelCard] = []
    skipped: list[SkippedModel] = []
    for c in _candidates(
        models_dirs, include_hf_cache=include_hf_cache, include_bundled=include_bundled
    ):
        try:
            cards.append(read_card(c.path, c.source, name=c.name))
        except EngineError as e:
            skipped.append(SkippedModel(c.path, c.source, e))
    return cards, skipped


def find_models(
    models_dirs: Sequence[Path] | None = None,
    *,
    include_hf_cache: bool = True,
    include_bundled: bool = True,
) -> list[ModelCard]:
    """Every readable model; folders that fail to read are left out (find_models_with_errors)."""
    cards, _ = find_models_with_errors(
        models_dirs, include_hf_cache=include_hf_cache, include_bundled=include_bundled
    )
    return cards


def resolve_model(spec: str, models_dirs: Sequence[Path] | None = None) -> ModelCard:
    """A model by path, by name (`org/name` in the HF cache, a folder in a models dir) or "demo".

    An exact name wins, then a case-insensitive one, then the last part of a name (`name` for
    `org/name`) when it is unambiguous. A named model that fails to read raises its own error.
    """
    if spec == DEMO_SPEC:
        demo = bundled_demo_dir()
        if not (demo / "config.json").exists():
            raise ModelNotFoundError(
                f"The bundled demo model is missing from {demo}",
                "Reinstall exo-tui, or pass another model",
            )
        return read_card(demo, "bundled", name=DEMO_SPEC)

    as_path = Path(spec).expanduser()
    if as_path.exists():
        return read_card(as_path, "path")

    candidates = _candidates(models_dirs, include_hf_cache=True, include_bundled=False)
    # Exact name, then any case, then the last part of `org/name` (exact, then any case).
    tiers: list[tuple[Callable[[str], str], str]] = [
        (lambda n: n, spec),
        (str.lower, spec.lower()),
        (lambda n: n.rsplit("/", 1)[-1], spec),
        (lambda n: n.rsplit("/", 1)[-1].lower(), spec.lower()),
    ]
    exact: list[_Candidate] = []
    for key, wanted in tiers:
        exact = [c for c in candidates if key(c.name) == wanted]
        if exact:
            break
    if len(exact) > 1 and len({c.name for c in exact}) > 1:
        names = ", ".join(sorted({c.name for c in exact}))
        raise ModelNotFoundError(
            f"'{spec}' matches several models: {names}",
            "Use the full name, or pass the model folder's path",
        )
    if exact:
        c = exact[0]
        return read_card(c.path, c.source, name=c.name)

    dirs = [default_models_dir()] if models_dirs is None else [Path(d) for d in models_dirs]
    searched = ", ".join(str(d) for d in dirs) or "no models dirs"
    raise ModelNotFoundError(
        f"No model named '{spec}' (no such path; searched {searched} and the "
        f"Hugging Face cache {hf_cache_dir()})",
        "Run `exo-tui models` to list the models found, or pass the path of a model folder",
    )
