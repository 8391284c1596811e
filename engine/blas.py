"""Load a fast system BLAS before MLX, and say which BLAS MLX ends up using.

The `mlx[cpu]` wheel bundles netlib's reference BLAS, which is unvectorised and single-threaded.
Loading Debian's OpenBLAS with RTLD_GLOBAL before `mlx.core` makes MLX's BLAS symbols resolve
to it, far faster on matmuls; greedy tokens stay identical. `EXO_TUI_BLAS=off` keeps the bundled
one; `EXO_TUI_BLAS=/path/to/libopenblas.so` names a library.

OpenBLAS's threads busy-wait for more work after each call, 2^28 cycles by default, burning CPU
long after a matmul. In a forward pass they took the core that the attention's second share
(and the TUI) runs on, so they wait 2^12 cycles now: a prefill gets faster, decoding is
unchanged.
`OPENBLAS_THREAD_TIMEOUT` set by the user wins.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import sys
from pathlib import Path

_CANDIDATES = (
    "/usr/lib/{arch}-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/{arch}-linux-gnu/openblas-openmp/libopenblas.so.0",
    "/usr/lib/{arch}-linux-gnu/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
)

_state: dict[str, str] = {}
# log2 of the cycles an idle OpenBLAS thread spins before it sleeps (OpenBLAS allows 4-30).
THREAD_TIMEOUT = "12"


def find_openblas() -> str | None:
    arch = platform.machine()
    for pattern in _CANDIDATES:
        path = pattern.format(arch=arch)
        if Path(path).exists():
            return path
    return ctypes.util.find_library("openblas")


def preload() -> str:
    """Load a system OpenBLAS if there is one and MLX is not imported yet; return `describe()`."""
    if "blas" in _state:
        return _state["blas"]
    setting = os.environ.get("EXO_TUI_BLAS", "auto").strip()
    if sys.platform == "darwin":
        _state["blas"] = "accelerate"
    elif setting.lower() in ("off", "0", "no", "reference"):
        _state["blas"] = "reference (EXO_TUI_BLAS=off)"
    elif "mlx.core" in sys.modules:
        # Too late: MLX already bound its BLAS symbols to the bundled library.
        _state["blas"] = "reference (mlx was imported before the engine)"
    else:
        path = setting if setting.lower() not in ("auto", "", "on") else find_openblas()
        if path is None:
            _state["blas"] = "reference (no system OpenBLAS; apt install libopenblas0-pthread)"
        else:
            try:
                os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", THREAD_TIMEOUT)  # read at load
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                _state["blas"] = f"openblas ({path})"
            except OSError as error:
                _state["blas"] = f"reference (could not load {path}: {error})"
    return _state["blas"]


def describe() -> str:
    """Which BLAS MLX uses in this process, e.g. `openblas (/usr/lib/...)` or `reference (...)`."""
    return _state.get("blas") or preload()


def kind() -> str:
    """The short name: `openblas`, `reference` or `accelerate`."""
    return describe().split(" ", 1)[0]


def machine_cores() -> int:
    """The cores this process can run on (its CPU affinity; every core where that is unknown)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS
        return max(1, os.cpu_count() or 1)
