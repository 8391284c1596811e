"""A relay between two real nodes can neither read a session nor inject, drop, replay, reorder or
change its frames: the node that gets such a frame ends that session, names why, and keeps
serving; the next, untouched connection works again."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest

from exo_tui.cluster.wire.frames import Goodbye
from exo_tui.cluster.wire.framing import encode
from tests.cluster.node_process import NodeProcess, StartNode, _is
from tests.cluster.relay import Attack, Relay

HANDSHAKE = ("hello", "challenge", "proof", "welcome")
# Each direction's first two frames are the handshake's (Hello, Proof / Challenge, Welcome).
SESSION = 2
INJECTED = encode(Goodbye(reason="the relay says goodbye"))


def inject(index: int, frame: bytes) -> bytes:
    return frame + INJECTED if index == SESSION else frame


def drop(index: int, frame: bytes) -> bytes:
    return b"" if index == SESSION else frame


def change(index: int, frame: bytes) -> bytes:
    if index != SESSION:
        return frame
    return frame[:-1] + bytes([frame[-1] ^ 0x01])


def replay() -> Attack:
    kept: list[bytes] = []

    def attack(index: int, frame: bytes) -> bytes:
        if index == SESSION:
            kept.append(frame)
        return frame + kept[0] if index == SESSION + 1 else frame

    return attack


def reorder() -> Attack:
    held: list[bytes] = []

    def attack(index: int, frame: bytes) -> bytes:
        if index == SESSION:
            held.append(frame)
            return b""
        return frame + held.pop() if index == SESSION + 1 else frame

    return attack


# Each makes a fresh attack for one test: replay and reorder keep the frames they hold back.
ATTACKS: dict[str, Callable[[], Attack]] = {
    "inject": lambda: inject,
    "drop": lambda: drop,
    "change": lambda: change,
    "replay": replay,
    "reorder": reorder,
}


@pytest.fixture
def relays() -> Iterator[list[Relay]]:
    made: list[Relay] = []
    yield made
    for relay in made:
        relay.close()


def seen_again(node: NodeProcess, other: NodeProcess) -> bool:
    """Whether `node` had stats from `other` after it lost `other`."""
    lines = node.lines.lines
    lost = [i for i, x in enumerate(lines) if _is(x, "peer_lost") and x["node_id"] == other.node_id]
    return bool(lost) and any(
        _is(x, "peer_stats") and x["node_id"] == other.node_id for x in lines[lost[0] :]
    )


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_tampered_session_frame_ends_the_session_and_the_node_goes_on(
    start: StartNode, relays: list[Relay], attack: str
) -> None:
    a = start("a")
    relay = Relay(("127.0.0.1", a.port), to_server=ATTACKS[attack]())
    relays.append(relay)
    b = start("b", "--peer", relay.address)
    lost = a.lost(b, timeout=15)
    assert "failed its authentication tag" in lost["reason"], lost
    assert "left" not in lost["reason"]  # the injected goodbye was never believed
    # b redials through the relay, which now forwards untouched: the session comes back.
    a.lines.wait_for(lambda _: seen_again(a, b), timeout=15)
    assert relay.connections >= 2
    assert a.process.poll() is None and b.process.poll() is None


def test_a_frame_injected_toward_the_dialer_is_refused_too(
    start: StartNode, relays: list[Relay]
) -> None:
    a = start("a")
    relay = Relay(("127.0.0.1", a.port), to_client=inject)
    relays.append(relay)
    b = start("b", "--peer", relay.address)
    lost = b.lost(a, timeout=15)
    assert "failed its authentication tag" in lost["reason"], lost
    assert "left" not in lost["reason"]


def test_a_relay_reads_no_session_frame(start: StartNode, relays: list[Relay]) -> None:
    a = start("a")
    relay = Relay(("127.0.0.1", a.port))
    relays.append(relay)
    b = start("b", "--peer", relay.address)
    a.sees(b)
    b.sees(a)
    # Only the handshake's four frames are readable JSON; every session frame is sealed.
    readable = [frame for frame in relay.seen if b'"type":' in frame]
    types = sorted(json.loads(frame[4:])["type"] for frame in readable)
    assert types == sorted(HANDSHAKE)
    sealed = [frame for frame in relay.seen if frame not in readable]
    assert len(sealed) >= 2
    wire = b"".join(sealed)
    for said in (b"memory_total_bytes", b"stats", b.node_id.encode(), a.node_id.encode()):
        assert said not in wire
