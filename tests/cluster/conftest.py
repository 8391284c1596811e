"""Cluster fixtures: network namespaces joined by a bridge (root only; skipped elsewhere)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.cluster.netns import (
    NetnsLab,
    NetnsNode,
    NetnsUnavailable,
    netns_unavailable,
    sweep_leftovers,
)

NetnsCluster = Callable[[int], list[NetnsNode]]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def netns_lab() -> Iterator[NetnsLab]:
    """A NetnsLab closed after the test, pass or fail; skips where namespaces cannot be made."""
    reason = netns_unavailable()
    if reason is not None:
        pytest.skip(reason)
    sweep_leftovers()
    with NetnsLab() as lab:
        yield lab


@pytest.fixture
def netns_cluster(netns_lab: NetnsLab) -> NetnsCluster:
    """`netns_cluster(count) -> [NetnsNode]`: node namespaces on one bridge (see netns.py)."""

    def make(count: int) -> list[NetnsNode]:
        try:
            return netns_lab.cluster(count)
        except NetnsUnavailable as error:
            pytest.skip(str(error))

    return make
