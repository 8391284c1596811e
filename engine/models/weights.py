"""The weight index (model.safetensors.index.json): which files hold which layers, and which of
them a folder lacks."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from engine.errors import ModelFormatError
from engine.models.locations import hub_repo_of

INDEX_FILE = "model.safetensors.index.json"


_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


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


def weight_index(path: Path) -> dict[str, Any] | None:
    """The folder's model.safetensors.index.json (None without one); ModelFormatError when it
    is not a JSON object with a weight_map."""
    index_path = path / INDEX_FILE
    if not index_path.is_file():
        return None
    index = read_json_object(index_path)
    if not isinstance(index.get("weight_map"), dict):
        raise ModelFormatError(f"{index_path} has no weight_map", "Re-download the model")
    return index


def read_json_object(path: Path) -> dict[str, Any]:
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


def _weight_map(index_json: Mapping[str, Any]) -> dict[str, str]:
    weight_map = cast(dict[str, object], index_json.get("weight_map") or {})
    return {weight: file for weight, file in weight_map.items() if isinstance(file, str)}


def index_total_size(index_json: Mapping[str, Any]) -> int | None:
    metadata: object = index_json.get("metadata")
    if isinstance(metadata, dict):
        total: object = cast(dict[str, object], metadata).get("total_size")
        if isinstance(total, int) and total > 0:
            return total
    return None


def layers_present(
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


def safetensors_files(path: Path) -> list[Path]:
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
