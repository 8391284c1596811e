"""Telling a rank that only lost its ring peer from the rank that failed first, by MLX's words."""

from __future__ import annotations

import pytest

from exo_tui.cluster.worker.failures import lost_a_peer

ECHOES = [
    "[ring] connection to a peer was lost",
    "rank 1 failed: RuntimeError: [ring] connection to a peer was lost",
    "node studio: rank 0 failed: the peer was lost mid-step",
    "rank 2 failed: RuntimeError: [ring] Socket closed by the peer",
    "rank 0 failed: the connection to a peer dropped",
]
CAUSES = [
    "rank 1 was killed by SIGKILL",
    "rank 0 exited with status 1 (MemoryError)",
    "rank 1 failed: model.safetensors is truncated",
    "rank 0 sent nothing for 30 s (hung or stopped), so it was killed",
    "rank 1 could not join the ring within 60 s",
    "[ring] Couldn't create socket to connect",
]


@pytest.mark.parametrize("reason", ECHOES)
def test_a_lost_peer_is_an_echo(reason: str) -> None:
    assert lost_a_peer(reason)


@pytest.mark.parametrize("reason", CAUSES)
def test_a_rank_that_failed_on_its_own_is_a_cause(reason: str) -> None:
    assert not lost_a_peer(reason)
