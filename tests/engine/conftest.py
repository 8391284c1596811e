"""Fixtures of the engine's tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.engine.kernel_checks import ISAS, ext


@pytest.fixture
def empty_hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Never scan the real Hugging Face cache: point it at an empty folder."""
    hub = tmp_path / "hf-hub"
    hub.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    return hub


@pytest.fixture(params=ISAS)
def isa(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each instruction set the CPU runs, in turn; the best one again afterwards."""
    best, int8_tiles, bf16_tiles, int8_rows = (
        ext().isa(),
        ext().amx_int8_min_rows(),
        ext().amx_small_min_rows(),
        ext().int8_min_rows(),
    )
    name, _, tiles = request.param.partition("+")
    if not ext().isa_supported(name):
        pytest.skip(f"this CPU does not run {name}")
    if tiles in ("int8", "int16"):  # one row of x as 8-bit or as 16-bit integers, no tiles
        ext().set_int8_min_rows(1 if tiles == "int8" else 2)
        tiles = ""
    ext().set_amx(bool(tiles))
    if tiles and not ext().amx():
        ext().set_amx(True)
        pytest.skip("this CPU has no AMX tiles")
    if tiles == "amx-bf16":
        ext().set_amx_int8_min_rows(1 << 30)
        ext().set_amx_small_min_rows(3)
    assert ext().use_isa(name)
    yield request.param
    ext().use_isa(best)
    ext().set_amx(True)
    ext().set_amx_int8_min_rows(int8_tiles)
    ext().set_amx_small_min_rows(bf16_tiles)
    ext().set_int8_min_rows(int8_rows)
