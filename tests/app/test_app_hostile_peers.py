"""The app as a node under hostile peers: a connection flood leaves its cluster on and a real
peer still joins; fake handshakes are listed once per address with a count, notices are limited
in rate, and what peers claim is shown escaped."""

from __future__ import annotations

import json
import secrets
import socket
from pathlib import Path

import anyio
import anyio.to_thread
import pytest
from textual.widgets import Static

from exo_tui.app.main import ExoTuiApp
from exo_tui.cluster.identity import ClusterKey, load_node_identity
from exo_tui.cluster.node import ClusterSetup, NodeOptions
from exo_tui.cluster.wire.frames import PROTOCOL_VERSION
from exo_tui.cluster.wire.framing import HEADER
from tests.app.helpers import fixed_stats, wait_until
from tests.cluster.node_process import KEY, StartNode

pytestmark = pytest.mark.anyio

FAKES = 300
FLOOD = 2100


def fake_hello(name: str) -> bytes:
    """An opening in a protocol version nobody speaks: refused at once, as a foreign peer."""
    payload = json.dumps({
        "type": "hello", "version": PROTOCOL_VERSION + 5, "node_id": "n-" + secrets.token_hex(4),
        "name": name, "fingerprint": secrets.token_hex(8), "nonce": secrets.token_hex(32),
    }).encode()  # fmt: skip
    return HEADER.pack(len(payload)) + payload


def fake_handshakes(port: int, count: int) -> None:
    for number in range(count):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            raw.sendall(fake_hello(f"[bold red]fake-{number}\x1b[2J\n"))
            while raw.recv(65536):  # the app answers Refused, then closes
                pass


def app_alone(tmp_path: Path) -> ExoTuiApp:
    me = load_node_identity()
    setup = ClusterSetup(
        identity=me, key=ClusterKey(text=KEY), options=NodeOptions(port=0, mdns=False)
    )
    return ExoTuiApp(
        models_dirs=[tmp_path / "models"],
        node_stats=lambda models: fixed_stats()(models).model_copy(update={"node_id": me.node_id}),
        bundled=False,
        cluster=setup,
    )


async def test_fake_handshakes_make_one_entry_per_address_and_few_notices(tmp_path: Path) -> None:
    app = app_alone(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: app.node is not None and app.node.port != 0)
        assert app.node is not None
        port = app.node.port
        await anyio.to_thread.run_sync(fake_handshakes, port, FAKES)
        await wait_until(pilot, lambda: sum(f.count for f in app.state.foreign) == FAKES)
        assert len(app.state.foreign) == 1
        entry = app.state.foreign[0]
        assert entry.count == FAKES and entry.address.startswith("127.0.0.1")
        refusals = [n for n in app._notifications if n.message.startswith("Refused")]
        assert 1 <= len(refusals) <= 2
        for notice in refusals:
            assert "\x1b" not in notice.message and "\n" not in notice.message
            assert notice.markup is False  # "[bold red]" is the peer's text, not a style
        shown = str(app.query_one("#foreign", Static).content)
        assert f"×{FAKES}" in shown and "\x1b" not in shown
        assert "1 foreign" in str(app.query_one("#nodes").border_subtitle)
        assert app.is_running


def flood(port: int, count: int) -> list[socket.socket]:
    held: list[socket.socket] = []
    try:
        for number in range(count):
            raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(raw)
            raw.bind((f"127.0.3.{1 + number % 50}", 0))
            raw.settimeout(5)
            raw.connect(("127.0.0.1", port))
    except BaseException:
        for raw in held:
            raw.close()
        raise
    return held


@pytest.mark.usefixtures("room_for_a_flood")
async def test_a_connection_flood_leaves_the_cluster_on_and_a_real_peer_joins(
    tmp_path: Path, start: StartNode
) -> None:
    app = app_alone(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: app.node is not None and app.node.port != 0)
        assert app.node is not None
        port = app.node.port
        held = await anyio.to_thread.run_sync(flood, port, FLOOD)
        try:
            peer = start("peer", "--peer", f"127.0.0.1:{port}")
            await wait_until(pilot, lambda: len(app.state.online_nodes) == 2, timeout=20)
            assert app.state.online_nodes[1].node_id == peer.node_id
        finally:
            for raw in held:
                raw.close()
        off = [n for n in app._notifications if "cluster is off" in n.message]
        assert not off, off[0].message
        assert app.is_running
