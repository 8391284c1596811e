"""Helpers for app tests: fixed node stats, and waiting on a condition instead of sleeping."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from time import monotonic

from textual.pilot import Pilot

from exo_tui.cluster.control.state import NodeStats

GB = 10**9


def fixed_stats(
    available: int = 12 * GB, total: int = 16 * GB
) -> Callable[[Sequence[str]], NodeStats]:
    """Node stats that do not change, so screens are the same on every run."""

    def stats(models: Sequence[str]) -> NodeStats:
        return NodeStats(
            node_id="node-a",
            name="studio",
            backend="cpu",
            blas="openblas",
            kernels="avx512 (2 threads)",
            memory_total_bytes=total,
            memory_available_bytes=available,
            models=tuple(models),
        )

    return stats


async def wait_until(
    pilot: Pilot[None], predicate: Callable[[], bool], timeout: float = 30.0
) -> None:
    deadline = monotonic() + timeout
    while not predicate():
        if monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await pilot.pause(0.02)
