"""The system OpenBLAS the engine loads: its idle threads go to sleep instead of spinning."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from engine.blas import find_openblas

# A fresh interpreter: the BLAS is chosen before MLX is first imported.
IDLE_CPU_AFTER_MATMULS = textwrap.dedent(
    """
    import json, os, time
    from engine import blas
    described = blas.preload()
    import mlx.core as mx
    a = mx.random.normal((1024, 1024))
    for _ in range(3):
        mx.eval(a @ a)
    before = os.times()
    time.sleep(0.5)
    after = os.times()
    idle_cpu = (after.user + after.system) - (before.user + before.system)
    print(json.dumps({"blas": described, "idle_cpu_s": idle_cpu}))
    """
)


def test_openblas_threads_sleep_soon_after_their_work() -> None:
    if find_openblas() is None:
        pytest.skip("no system OpenBLAS on this machine (apt install libopenblas0-pthread)")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    out = subprocess.run(
        [sys.executable, "-c", IDLE_CPU_AFTER_MATMULS],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["blas"].startswith("openblas")
    # With OpenBLAS's default (2^28 cycles of busy-waiting) its threads burnt ~130 ms of CPU in
    # this half second of sleep, taking the cores from the attention and the TUI.
    assert result["idle_cpu_s"] < 0.04
