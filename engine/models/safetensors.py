"""safetensors headers: each tensor's dtype and shape, read without the weights, and the file's
size checked against them."""

from __future__ import annotations

import json
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from engine.errors import ModelFormatError

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


@dataclass(frozen=True)
class TensorInfo:
    dtype: str
    shape: tuple[int, ...]
    nbytes: int = 0  # its data's bytes in the file


def as_int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _truncated(file: Path, detail: str) -> ModelFormatError:
    return ModelFormatError(
        f"{file} is truncated ({detail})",
        "The download did not finish; delete the file and re-download the model",
    )


def read_safetensors_header(file: Path) -> dict[str, TensorInfo]:
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

    tensors: dict[str, TensorInfo] = {}
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


def _tensor_info(entry: object) -> tuple[TensorInfo, int] | None:
    if not isinstance(entry, dict):
        return None
    e = cast(dict[str, object], entry)
    dtype, shape, offsets = e.get("dtype"), e.get("shape"), e.get("data_offsets")
    if not isinstance(dtype, str) or not isinstance(shape, list):
        return None
    if not isinstance(offsets, list) or len(cast(list[object], offsets)) != 2:
        return None
    dims = [as_int(d) for d in cast(list[object], shape)]
    ends = [as_int(o) for o in cast(list[object], offsets)]
    if any(d is None for d in dims) or any(o is None for o in ends):
        return None
    start, end = (o for o in ends if o is not None)
    if not 0 <= start <= end:
        return None
    return TensorInfo(dtype, tuple(d for d in dims if d is not None), end - start), end


def numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def common_dtype(tensors: dict[str, TensorInfo]) -> str | None:
    """The dtype holding the most values, ignoring packed quantized weights."""
    counts: Counter[str] = Counter()
    for t in tensors.values():
        if t.dtype not in ("U32", "U8"):
            counts[t.dtype] += numel(t.shape)
    if not counts:
        return None
    dtype = counts.most_common(1)[0][0]
    return _SAFETENSORS_DTYPES.get(dtype, dtype.lower())
