"""mDNS discovery: parsing adverts, two nodes on loopback, and real node processes in namespaces."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from zeroconf.asyncio import AsyncZeroconf

from exo_tui.cluster.discovery import (
    Advert,
    Discovery,
    DiscoveryEvent,
    PeerFound,
    PeerRemoved,
    advert_from_info,
    advertised_addresses,
)
from tests.cluster.conftest import NetnsCluster
from tests.cluster.json_lines import JsonLines, Line
from tests.cluster.netns import NetnsNode
from tests.cluster.raw_adverts import GOOD, MALFORMED, raw_info, register

ROOT = Path(__file__).resolve().parents[2]
VERSION = 1  # what tests/cluster/discovery_node.py speaks
LOOPBACK = "127.0.0.1"


def make_advert(label: str, port: int = 7000) -> Advert:
    # Random ids: other runs on this host may be advertising on loopback at the same time.
    node_id = f"{label}-{uuid.uuid4().hex[:8]}"
    return Advert(node_id=node_id, name=label, version=VERSION, port=port, fingerprint="f" + label)


# --- Adverts, without a network ---


def test_a_well_formed_txt_gives_the_advert_with_its_addresses() -> None:
    info = raw_info("peer", GOOD, "10.0.0.7")
    advert = advert_from_info(info, VERSION)
    assert advert == Advert(
        node_id="raw", name="raw", version=1, port=7000, fingerprint="ab", addresses=("10.0.0.7",)
    )


@pytest.mark.parametrize("label", MALFORMED)
def test_a_malformed_or_foreign_txt_is_refused_with_a_reason(label: str) -> None:
    with pytest.raises(ValueError, match=r"\w"):
        advert_from_info(raw_info(label, MALFORMED[label], "10.0.0.7"), VERSION)


def test_loopback_is_advertised_only_when_nothing_else_is_bound() -> None:
    assert advertised_addresses(["127.0.0.1", "10.1.2.3"]) == ["10.1.2.3"]
    assert advertised_addresses(["127.0.0.1"]) == ["127.0.0.1"]
    assert "127.0.0.1" not in advertised_addresses(None)


# --- Discovery on loopback, in this process (no root needed) ---


async def wait_for(
    events: AsyncIterator[DiscoveryEvent],
    wanted: Callable[[DiscoveryEvent], bool],
    timeout: float = 3.0,
) -> DiscoveryEvent:
    async with asyncio.timeout(timeout):
        async for event in events:
            if wanted(event):
                return event
    raise AssertionError("the events ended")


def found(node_id: str) -> Callable[[DiscoveryEvent], bool]:
    return lambda event: isinstance(event, PeerFound) and event.advert.node_id == node_id


def removed(node_id: str) -> Callable[[DiscoveryEvent], bool]:
    return lambda event: isinstance(event, PeerRemoved) and event.node_id == node_id


@pytest.mark.anyio
async def test_two_nodes_on_loopback_find_each_other_and_hear_a_goodbye() -> None:
    a = Discovery(make_advert("a", 7001), interfaces=[LOOPBACK])
    b = Discovery(make_advert("b", 7002), interfaces=[LOOPBACK])
    a_events, b_events = a.events(), b.events()
    try:
        await asyncio.gather(a.__aenter__(), b.__aenter__())  # together: probing takes ~1 s
        seen_by_a = await wait_for(a_events, found(b.advert.node_id))
        seen_by_b = await wait_for(b_events, found(a.advert.node_id))
        assert seen_by_a == PeerFound(advert=b.advert.model_copy(update={"addresses": (LOOPBACK,)}))
        assert seen_by_b == PeerFound(advert=a.advert.model_copy(update={"addresses": (LOOPBACK,)}))
        await b.__aexit__(None, None, None)
        await wait_for(a_events, removed(b.advert.node_id), timeout=2.0)
    finally:
        await asyncio.gather(a.__aexit__(None, None, None), b.__aexit__(None, None, None))
    assert [event async for event in a_events] == []  # closing ends the stream


@pytest.mark.anyio
async def test_an_updated_advert_is_found_again_and_one_turned_foreign_is_removed() -> None:
    async with (
        AsyncZeroconf(interfaces=[LOOPBACK]) as raw,
        Discovery(make_advert("watcher"), interfaces=[LOOPBACK]) as watcher,
    ):
        node_id = f"raw-{uuid.uuid4().hex[:8]}"
        txt = {**GOOD, "id": node_id}
        await register(raw, raw_info(node_id, txt, LOOPBACK))
        events = watcher.events()
        first = await wait_for(events, found(node_id))
        await raw.async_update_service(raw_info(node_id, {**txt, "name": "renamed"}, LOOPBACK))
        second = await wait_for(events, found(node_id))
        assert isinstance(first, PeerFound) and isinstance(second, PeerFound)
        assert (first.advert.name, second.advert.name) == ("raw", "renamed")
        await raw.async_update_service(raw_info(node_id, {**txt, "v": "99"}, LOOPBACK))
        await wait_for(events, removed(node_id))


@pytest.mark.anyio
async def test_malformed_adverts_are_logged_and_skipped(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="exo_tui.cluster.discovery")
    run = uuid.uuid4().hex[:8]  # in every name and id, to tell ours from other runs' adverts
    good_id = f"good-{run}"
    seen: list[DiscoveryEvent] = []

    def good_found(event: DiscoveryEvent) -> bool:
        seen.append(event)
        return found(good_id)(event)

    async with (
        AsyncZeroconf(interfaces=[LOOPBACK]) as raw,
        Discovery(make_advert("watcher"), interfaces=[LOOPBACK]) as watcher,
    ):
        for label, txt in MALFORMED.items():
            txt = {**txt, "id": f"{txt['id']}-{run}"} if txt.get("id") else txt
            await register(raw, raw_info(f"{label}-{run}", txt, LOOPBACK))
        await register(raw, raw_info(good_id, {**GOOD, "id": good_id}, LOOPBACK))
        events = watcher.events()
        await wait_for(events, good_found)
        async with asyncio.timeout(3):
            while not all(f"{label}-{run}." in caplog.text for label in MALFORMED):
                await asyncio.sleep(0.05)
    seen += [event async for event in events]  # what it still held when it closed
    ours = [e.advert.node_id for e in seen if isinstance(e, PeerFound) and run in e.advert.node_id]
    assert ours == [good_id]


# --- Node processes in network namespaces (root only) ---


@dataclass
class Node:
    """A discovery_node process running in a namespace."""

    advert: Advert
    namespace: NetnsNode
    process: subprocess.Popen[str]
    output: JsonLines

    def found(self) -> dict[str, Line]:
        return {line["advert"]["node_id"]: line for line in self.output.events("found")}

    def leave(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()


def start_node(namespace: NetnsNode, label: str, port: int) -> Node:
    advert = make_advert(label, port)
    argv = [sys.executable, "-m", "tests.cluster.discovery_node"]
    argv += [advert.node_id, str(port), advert.fingerprint, "--name", advert.name]
    process = namespace.run(
        argv, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    advert = advert.model_copy(update={"addresses": (namespace.address,)})
    return Node(
        advert=advert, namespace=namespace, process=process, output=JsonLines(process.stdout)
    )


def sees(count: int) -> Callable[[list[Line]], bool]:
    return lambda lines: (
        len({line["advert"]["node_id"] for line in lines if line["event"] == "found"}) >= count
    )


def test_three_nodes_in_namespaces_find_each_other_within_3_s(netns_cluster: NetnsCluster) -> None:
    nodes = [start_node(ns, f"n{i}", 7100 + i) for i, ns in enumerate(netns_cluster(3))]
    for node in nodes:
        node.output.wait_for(sees(2), timeout=10)  # generous: a loaded machine starts Python slowly
    last_start = max(node.output.events("starting")[0]["t"] for node in nodes)
    for node in nodes:
        others = {other.advert.node_id: other.advert for other in nodes if other is not node}
        seen = node.found()
        assert set(seen) == set(others)  # never itself
        assert len(node.output.events("found")) == len(others)  # and each peer once
        for node_id, line in seen.items():
            assert Advert.model_validate(line["advert"]) == others[node_id]
        latency = max(line["t"] for line in seen.values()) - last_start
        assert latency < 3.0, f"{node.advert.name} took {latency:.2f} s to see its peers"


def test_malformed_adverts_do_not_disturb_a_real_node(netns_cluster: NetnsCluster) -> None:
    watcher_ns, peer_ns, raw_ns = netns_cluster(3)
    raw = raw_ns.run(
        [sys.executable, "-m", "tests.cluster.raw_adverts", raw_ns.address],
        cwd=ROOT,
        stdin=subprocess.PIPE,
    )
    watcher = start_node(watcher_ns, "watcher", 7200)
    peer = start_node(peer_ns, "peer", 7201)

    def warned_about_all(lines: list[Line]) -> bool:
        warnings = " ".join(line["message"] for line in lines if line["event"] == "log")
        return all(f"{label}." in warnings for label in MALFORMED)

    watcher.output.wait_for(lambda lines: sees(1)(lines) and warned_about_all(lines), timeout=10)
    assert set(watcher.found()) == {peer.advert.node_id}
    assert raw.poll() is None and watcher.process.poll() is None
    watcher.leave()
    assert watcher.process.wait(timeout=5) == 0


def test_a_node_that_leaves_cleanly_is_removed_at_the_others(netns_cluster: NetnsCluster) -> None:
    nodes = [start_node(ns, f"n{i}", 7300 + i) for i, ns in enumerate(netns_cluster(3))]
    for node in nodes:
        node.output.wait_for(sees(2), timeout=10)
    leaving, *staying = nodes
    asked_at = time.time()
    leaving.leave()
    assert leaving.process.wait(timeout=5) == 0
    for node in staying:
        node.output.wait_for(lambda lines: bool(removals(lines)), timeout=3)
        [removal] = removals(node.output.lines)
        assert removal["node_id"] == leaving.advert.node_id
        assert removal["t"] - asked_at < 1.0


def removals(lines: list[Line]) -> list[Line]:
    return [line for line in lines if line["event"] == "removed"]
