"""Loaded weights move onto transparent huge pages (Linux 6.1+), with their values unchanged."""
# pyright: reportUnknownMemberType=false, reportUnknownVariableType=false, reportUnknownArgumentType=false

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from engine import kernels, loading
from engine.loading import load_model_sync

HUGE_PAGE_SIZE = Path("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size")


def _collapse_supported() -> bool:
    if platform.system() != "Linux" or not HUGE_PAGE_SIZE.exists():
        return False
    major, minor = (int(part) for part in platform.release().split(".")[:2])
    return (major, minor) >= (6, 1)  # MADV_COLLAPSE


pytestmark = [
    pytest.mark.skipif(not kernels.available(), reason=kernels.describe()),
    pytest.mark.skipif(not _collapse_supported(), reason="needs Linux 6.1+ with THP"),
]


def _huge_bytes_around(address: int, size: int) -> int:
    """AnonHugePages of the mappings that hold some of [address, address + size), from
    /proc/self/smaps. The bytes may span more than one mapping (an allocator's heap grown in
    steps), so each one that overlaps counts."""
    total = 0
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            start, end = (int(part, 16) for part in head.split("-"))
            inside = start < address + size and address < end
        elif inside and head == "AnonHugePages:":
            total += int(line.split()[1]) * 1024
    return total


def test_an_array_moved_onto_huge_pages_keeps_its_values() -> None:
    array = mx.random.uniform(shape=(4 << 20,), key=mx.random.key(0))  # 16 MiB of float32
    mx.eval(array)
    before = np.array(array)
    address = int(np.asarray(array).ctypes.data)  # the array's own memory, not a copy
    page = int(HUGE_PAGE_SIZE.read_text())

    moved = kernels.back_with_huge_pages([array])

    # Every whole huge page inside its 16 MiB at least (the ends may share a page with memory
    # that is not mapped, which stays as it is).
    assert moved >= (16 << 20) - 2 * page
    huge = _huge_bytes_around(address, 16 << 20)
    assert huge >= (16 << 20) - 2 * page, f"{moved} bytes collapsed, {huge} on huge pages after"
    np.testing.assert_array_equal(np.array(array), before)
    assert mx.array_equal(array * 2, mx.array(before) * 2)  # MLX reads it as before


def test_unevaluated_and_empty_arrays_are_passed_over() -> None:
    lazy = mx.ones((1 << 20,)) * 3
    empty = mx.zeros((0,))
    mx.eval(empty)
    assert kernels.back_with_huge_pages([lazy, empty]) == 0
    assert mx.all(lazy == 3).item()


def test_loading_moves_every_weight(
    tiny_model_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loader hands each layer's weights and the rest (embeddings, head) over as they load,
    and a model of a few MiB ends up mostly on huge pages."""
    folder = tiny_model_factory("llama", hidden_size=512, vocab_size=4096, num_layers=2)
    handed: list[mx.array] = []
    moved: list[int] = []
    real = kernels.back_with_huge_pages

    def recording(arrays: list[mx.array]) -> int:
        handed.extend(arrays)
        moved.append(real(arrays))
        return moved[-1]

    monkeypatch.setattr(loading.kernels, "back_with_huge_pages", recording)
    loaded = load_model_sync(folder)

    weights = cast(list[tuple[str, mx.array]], tree_flatten(loaded.model.parameters()))
    assert {id(array) for _, array in weights} <= {id(array) for array in handed}
    assert sum(moved) >= sum(array.nbytes for _, array in weights) // 2


def test_off_leaves_the_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXO_TUI_HUGE_PAGES", "off")
    array = mx.random.uniform(shape=(4 << 20,), key=mx.random.key(1))
    mx.eval(array)
    assert kernels.back_with_huge_pages([array]) == 0
