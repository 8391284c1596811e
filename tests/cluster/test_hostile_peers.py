"""`exo-tui node` against hostile peers on loopback: connection floods, oversized openings and
names made to forge log lines. Real processes, real sockets; the node must keep serving.

Flooders connect from other loopback addresses (127.0.0.2 and up: all of 127/8 is loopback on
Linux), so the real peer, dialing from 127.0.0.1, is a different address, as on a real network.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import resource
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anyio
import psutil
import pytest

from exo_tui.cluster.wire.frames import PROTOCOL_VERSION
from exo_tui.cluster.wire.framing import HEADER
from tests.cluster.node_process import KEY, ROOT, StartNode, _is

FLOOD = 2100
MiB = 1024 * 1024


def flood(port: int, count: int, hosts: list[str]) -> list[socket.socket]:
    """`count` idle connections to the node, spread over `hosts` as source addresses."""
    held: list[socket.socket] = []
    try:
        for i in range(count):
            raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(raw)
            raw.bind((hosts[i % len(hosts)], 0))
            raw.settimeout(5)
            raw.connect(("127.0.0.1", port))
    except BaseException:
        for raw in held:
            raw.close()
        raise
    return held


@contextlib.contextmanager
def files_limit(soft: int) -> Iterator[None]:
    """This process's soft file limit lowered for a while (children inherit it)."""
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, before[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)


def hello(name: str, version: int = PROTOCOL_VERSION) -> bytes:
    payload = json.dumps({
        "type": "hello", "version": version, "node_id": "n-" + secrets.token_hex(4),
        "name": name, "fingerprint": "0" * 16, "nonce": secrets.token_hex(32),
    }).encode()  # fmt: skip
    return HEADER.pack(len(payload)) + payload


def frame_of(said: object) -> bytes:
    payload = json.dumps(said).encode()
    return HEADER.pack(len(payload)) + payload


def say(port: int, data: bytes, source: str = "127.0.0.1") -> None:
    """Send `data` to the node and read until it hangs up (it answers, then closes)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as raw:
        raw.bind((source, 0))
        raw.settimeout(10)
        raw.connect(("127.0.0.1", port))
        with contextlib.suppress(OSError):
            raw.sendall(data)
            while raw.recv(65536):
                pass


# ------------------------------------------------------------------ case 1: connection floods


@pytest.mark.usefixtures("room_for_a_flood")
def test_a_real_peer_joins_while_thousands_of_idle_connections_are_held(start: StartNode) -> None:
    a = start("a")
    # The node may hold no more descriptors than a small machine gives a process.
    resource.prlimit(a.process.pid, resource.RLIMIT_NOFILE, (256, 256))
    hosts = ["127.0.0.2"] + [f"127.0.1.{i}" for i in range(1, 101)]  # one heavy, many light
    held = flood(a.port, FLOOD, hosts)
    try:
        b = start("b", "--peer", a.address)
        a.sees(b, timeout=20)
        b.sees(a, timeout=20)
        assert a.process.poll() is None, "the flood ended the node"
        # The node closed what it could not hold: most of the flood sees its end.
        time.sleep(1)
        closed = sum(1 for raw in held if _closed_by_peer(raw))
        assert closed >= FLOOD - 300
    finally:
        for raw in held:
            raw.close()
    c = start("c", "--peer", a.address)  # still serving after the flood
    a.sees(c, timeout=20)
    assert a.process.poll() is None


def _closed_by_peer(raw: socket.socket) -> bool:
    raw.setblocking(False)
    try:
        return raw.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def test_the_node_raises_its_soft_file_limit_to_the_hard_one(start: StartNode) -> None:
    # mlx-lm sets (2048, 4096) when it is imported; the node raises the soft limit after that.
    with files_limit(1024):
        a = start("a")
    soft, hard = resource.prlimit(a.process.pid, resource.RLIMIT_NOFILE)
    assert soft == hard or soft >= 65536, (soft, hard)


# ------------------------------------------------------------------ case 2: big openings


def test_oversized_hellos_take_no_memory_and_leave_none_held(start: StartNode) -> None:
    a = start("a")
    node = psutil.Process(a.process.pid)
    time.sleep(1)
    before = node.memory_info().rss
    opening = hello("x" * (4 * MiB - 200))
    held: list[socket.socket] = []
    try:
        for i in range(200):
            raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            raw.bind((f"127.0.2.{1 + i % 200}", 0))
            raw.settimeout(5)
            raw.connect(("127.0.0.1", a.port))
            held.append(raw)
            with contextlib.suppress(OSError):
                raw.sendall(opening[:-1])  # all but its last byte: the node would wait for it
        during = node.memory_info().rss
    finally:
        for raw in held:
            raw.close()
    time.sleep(2)
    after = node.memory_info().rss
    assert during - before < 64 * MiB, f"{(during - before) / MiB:.0f} MiB taken by the flood"
    assert after - before < 32 * MiB, f"{(after - before) / MiB:.0f} MiB still held after it"
    b = start("b", "--peer", a.address)
    a.sees(b)


# ------------------------------------------------------------------ case 6: forged log lines

FORGED = "\x1b[2K\r\x1b[1Arefused 10.0.0.9: forged\nrefused 10.0.0.9: forged"


@pytest.fixture
def text_node(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int, list[str]]]:
    """`exo-tui node` in text mode (its log on stderr), with the lines it logs as they come."""
    env = {k: v for k, v in os.environ.items() if k != "EXO_TUI_KEY"}
    env["EXO_TUI_HOME"] = str(tmp_path)
    argv = [sys.executable, "-m", "exo_tui.cli", "node", "--no-mdns", "--port", "0", "--key", KEY]
    process = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        errors="replace",
    )  # fmt: skip
    assert process.stderr is not None
    first = process.stderr.readline()
    port = int(first.split("listening on port ")[1].split(";")[0])
    lines: list[str] = [first]
    reader = threading.Thread(target=lambda: lines.extend(process.stderr or ()), daemon=True)
    reader.start()
    yield process, port, lines
    process.kill()
    process.wait(timeout=10)


def test_peer_names_cannot_forge_or_flood_the_text_log(
    text_node: tuple[subprocess.Popen[str], int, list[str]],
) -> None:
    process, port, lines = text_node
    say(port, hello(FORGED, version=PROTOCOL_VERSION + 7))
    say(port, hello("n" * 6000 + "\x1b]0;owned\x07", version=PROTOCOL_VERSION + 8))
    deadline = time.monotonic() + 10
    while sum("refused" in line for line in lines) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    refusals = [line for line in lines if "version mismatch" in line]
    assert len(refusals) == 2, lines
    log = "".join(lines)
    assert "\x1b" not in log and "\x07" not in log
    assert not any(line.startswith("refused 10.0.0.9") for line in lines), lines
    assert "\\x1b[2K" in refusals[0]  # shown escaped, so the operator sees what was sent
    assert all(len(line) < 1000 for line in lines)
    assert process.poll() is None


def test_peer_names_are_escaped_and_capped_in_json_events(start: StartNode) -> None:
    a = start("a")
    say(a.port, hello(FORGED, version=PROTOCOL_VERSION + 7))
    say(a.port, hello("n" * 6000, version=PROTOCOL_VERSION + 8))
    seen = a.lines.wait_for(lambda lines: sum(_is(x, "foreign") for x in lines) == 2, 10)
    for event in (x for x in seen if _is(x, "foreign")):
        texts = [event["reason"], event["address"], *event["peer"].values()]
        assert all(isinstance(t, str) and t.isprintable() for t in texts), event
        assert len(json.dumps(event)) < 2000
    assert a.process.poll() is None


@pytest.mark.anyio
async def test_an_advert_named_to_forge_log_lines_is_logged_escaped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from zeroconf.asyncio import AsyncZeroconf

    from exo_tui.cluster.discovery import Advert, Discovery
    from tests.cluster.raw_adverts import GOOD, raw_info, register

    caplog.set_level(logging.WARNING, logger="exo_tui.cluster.discovery")
    run = secrets.token_hex(4)
    label = f"evil-{run}\u202e\u2028refused 10.0.0.9"  # zeroconf itself refuses ASCII controls
    watcher = Advert(node_id=f"w-{run}", name="w", version=1, port=7000, fingerprint="fw")
    async with (
        AsyncZeroconf(interfaces=["127.0.0.1"]) as raw,
        Discovery(watcher, interfaces=["127.0.0.1"]) as discovery,
    ):
        await register(raw, raw_info(label, {**GOOD, "id": run, "v": "\x1b[31m\n9"}, "127.0.0.1"))
        events = discovery.events()
        with anyio.move_on_after(5):
            while f"evil-{run}" not in caplog.text:
                await anyio.sleep(0.05)
        del events
    ours = [r.getMessage() for r in caplog.records if f"evil-{run}" in r.getMessage()]
    assert ours, caplog.text
    assert all(line.isprintable() for line in ours), ours


def test_a_flood_of_bad_openings_from_one_address_is_a_few_log_lines(
    text_node: tuple[subprocess.Popen[str], int, list[str]],
) -> None:
    process, port, lines = text_node
    for number in range(50):
        say(port, frame_of({"x": number}), source="127.0.5.1")
    say(port, frame_of({"x": 50}), source="127.0.5.2")  # another address is said
    deadline = time.monotonic() + 10
    while not any("127.0.5.2" in line for line in lines) and time.monotonic() < deadline:
        time.sleep(0.05)
    failed = [line for line in lines if "handshake with 127.0.5.1" in line]
    assert 1 <= len(failed) <= 2, failed
    assert any("127.0.5.2" in line for line in lines)
    assert process.poll() is None


# ------------------------------------------------------------------ all of it, mixed

ODD = ["\x1b[2J", "\n", "\r", "\u202e", "\u2028", "\x07", "\x00", "a", "é", "[b]"]


def odd_text(rng: random.Random, size: int) -> str:
    return "".join(rng.choice(ODD) for _ in range(size))


def hostile_openings(rng: random.Random, fingerprint: str) -> dict[str, bytes]:
    """One opening of each kind a hostile peer might send, for this draw of `rng`."""
    name = odd_text(rng, rng.randint(1, 2000))
    wrong_proof = frame_of({
        "type": "hello", "version": PROTOCOL_VERSION, "node_id": "n-x", "name": odd_text(rng, 30),
        "fingerprint": fingerprint, "nonce": secrets.token_hex(32),
    }) + frame_of({"type": "proof", "proof": "0" * 64})  # fmt: skip
    return {
        "random bytes": rng.randbytes(rng.randint(1, 65536)),
        "a header over the limit": HEADER.pack(rng.randint(8193, 2**32 - 1)) + b"x" * 100,
        "a hello with an odd name": hello(name),
        "a hello of another version": hello(name, version=rng.randint(3, 10**6)),
        "a hello with an odd field": frame_of({"type": "hello", odd_text(rng, 30): 1}),
        "an unknown frame type": frame_of({"type": odd_text(rng, 50)}),
        "a session frame first": frame_of({"type": "stats", "stats": {}}),
        "deeply nested JSON": HEADER.pack(8000) + b"[" * 8000,
        "a wrong proof": wrong_proof,
    }


def test_a_mix_of_hostile_openings_leaves_the_node_serving_and_its_events_clean(
    start: StartNode,
) -> None:
    a = start("a")
    rng = random.Random(16)
    attempts = [
        (f"127.0.{6 + i % 4}.{1 + i % 200}", opening)
        for i in range(40)
        for opening in hostile_openings(rng, a.fingerprint).values()
    ]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda attempt: say(a.port, attempt[1], source=attempt[0]), attempts))
    assert a.process.poll() is None
    b = start("b", "--peer", a.address)
    a.sees(b)
    for event in (x for x in a.lines.lines if _is(x, "foreign")):
        texts = [event["reason"], event["address"], *(event["peer"] or {}).values()]
        assert all(isinstance(t, str) and t.isprintable() for t in texts), event
        assert len(json.dumps(event)) < 2000
