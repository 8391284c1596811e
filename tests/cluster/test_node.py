"""`exo-tui node` processes on 127.0.0.1 dialing each other by hand (`--peer`, no mDNS).

Real processes, real sockets, the real handshake: sessions, refusals of a foreign key, liveness
after SIGKILL / SIGSTOP / SIGTERM, garbage on the control port, and two nodes dialing each other.
"""

from __future__ import annotations

import signal
import socket
import time

from tests.cluster.node_process import FOREIGN_KEY, _is, _lost


def test_peers_named_by_hand_see_each_other(start) -> None:  # type: ignore[no-untyped-def]
    a = start("a")
    b = start("b", "--peer", a.address)
    c = start("c", "--peer", a.address, "--peer", b.address)
    for node in (a, b, c):
        for other in (a, b, c):
            if other is not node:
                node.sees(other)
    stats = next(x for x in a.lines.lines if _is(x, "peer_stats") and x["node_id"] == b.node_id)
    assert stats["name"] == "b"
    assert stats["memory_total_bytes"] >= stats["memory_available_bytes"] > 0
    assert not any(_is(x, "peer_lost") for n in (a, b, c) for x in n.lines.lines)


def test_a_foreign_key_is_refused_on_both_sides(start) -> None:  # type: ignore[no-untyped-def]
    a = start("a")
    stranger = start("stranger", "--peer", a.address, key=FOREIGN_KEY)
    assert stranger.fingerprint != a.fingerprint
    mine = stranger.lines.wait_for(lambda seen: any(_is(x, "foreign") for x in seen), 10)
    refusal = next(x for x in mine if _is(x, "foreign"))
    assert refusal["peer"]["fingerprint"] == a.fingerprint
    assert "key" in refusal["reason"]
    theirs = a.lines.wait_for(lambda seen: any(_is(x, "foreign") for x in seen), 10)
    assert "key" in next(x for x in theirs if _is(x, "foreign"))["reason"]
    time.sleep(1.5)
    assert not any(_is(x, "peer_stats") for n in (a, stranger) for x in n.lines.lines)


def test_a_sigkilled_peer_is_lost_within_5_s(start) -> None:  # type: ignore[no-untyped-def]
    a = start("a")
    b = start("b", "--peer", a.address)
    a.sees(b)
    killed = time.monotonic()
    b.process.kill()
    a.lost(b, timeout=5)
    assert time.monotonic() - killed < 5


def test_a_stopped_peer_is_lost_when_it_goes_silent(start) -> None:  # type: ignore[no-untyped-def]
    a = start("a")
    b = start("b", "--peer", a.address)
    a.sees(b)
    stopped = time.monotonic()
    b.process.send_signal(signal.SIGSTOP)
    lost = a.lost(b, timeout=6)
    assert "nothing" in lost["reason"]
    assert time.monotonic() - stopped < 6


def test_sigterm_says_goodbye_and_a_restarted_node_is_seen_again(start) -> None:  # type: ignore[no-untyped-def]
    a = start("a")
    b = start("b", "--peer", a.address)
    a.sees(b)
    b.process.terminate()
    assert b.process.wait(timeout=10) == 0
    assert "shutting down" in a.lost(b, timeout=3)["reason"]
    again = start("b", "--peer", a.address)
    assert again.node_id == b.node_id  # the id persists on this machine
    a.lines.wait_for(
        lambda seen: sum(_is(x, "peer_stats") and x["joined"] for x in seen) == 2, timeout=10
    )


def test_garbage_on_the_control_port_closes_only_that_connection(start) -> None:  # type: ignore[no-untyped-def]
    a = start("a")
    b = start("b", "--peer", a.address)
    a.sees(b)
    for garbage in (
        b"\xff\xff\xff\xff" + b"x" * 64,
        b"\x00\x00\x00\x05hello",
        b"GET / HTTP/1.1\r\n\r\n",
    ):
        with socket.create_connection(("127.0.0.1", a.port), timeout=5) as raw:
            raw.sendall(garbage)
            raw.settimeout(5)
            while raw.recv(4096):  # a closes the connection
                pass
    c = start("c", "--peer", a.address)
    a.sees(c)
    assert a.process.poll() is None
    assert _lost(a.lines.lines, b.node_id) is None


def test_two_nodes_dialing_each_other_keep_one_session(start) -> None:  # type: ignore[no-untyped-def]
    a = start("a")
    b = start("b", "--peer", a.address)
    a.sees(b)
    # Now a dials b too: both ends keep the session the smaller id dialed, without a flap.
    c = start("c", "--peer", a.address, "--peer", b.address)
    a2 = start("a2", "--peer", b.address, "--peer", c.address)
    for node in (b, c):
        node.sees(a2)
    time.sleep(3)
    for node in (a, b, c, a2):
        assert not any(_is(x, "peer_lost") for x in node.lines.lines), node.lines.lines
