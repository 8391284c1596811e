"""The control port's accept loop and the places of connections still in their handshake, over
real loopback sockets: running out of descriptors pauses accepting, never ends it; a flood of
connections displaces only itself."""

from __future__ import annotations

import logging
import os
import resource
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import anyio
import anyio.abc
import pytest

from exo_tui.cluster.listening import accept_loop
from exo_tui.cluster.listening.admission import Admission

pytestmark = pytest.mark.anyio


@contextmanager
def descriptors_left(count: int) -> Iterator[None]:
    """This process may open only `count` more descriptors for a while."""
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    open_now = len(os.listdir("/proc/self/fd")) - 1  # less the one listdir itself used
    resource.setrlimit(resource.RLIMIT_NOFILE, (open_now + count, before[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)


async def wait_for(predicate: object, timeout: float = 10.0) -> None:
    assert callable(predicate)
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.02)


async def test_running_out_of_descriptors_pauses_accepting_but_never_ends_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger=accept_loop.__name__)
    accepted: list[anyio.abc.SocketStream] = []

    async def hold(stream: anyio.abc.SocketStream) -> None:
        accepted.append(stream)
        await anyio.sleep_forever()

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    clients = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(8)]
    try:
        async with listener, anyio.create_task_group() as tasks:
            tasks.start_soon(accept_loop.serve, listener, hold)
            with descriptors_left(2):
                for client in clients:  # the kernel queues them; accepting each needs a descriptor
                    client.connect(("127.0.0.1", port))
                await wait_for(lambda: "cannot accept" in caplog.text)
                assert len(accepted) < len(clients)
            await wait_for(lambda: len(accepted) == len(clients))
            assert "Too many open files" in caplog.text and "ulimit -n" in caplog.text
            assert "accepting connections again" in caplog.text
            tasks.cancel_scope.cancel()
    finally:
        for client in clients:
            client.close()


async def test_a_connection_whose_handler_fails_is_closed_and_the_next_one_served(
    caplog: pytest.LogCaptureFixture,
) -> None:
    served: list[int] = []

    async def handle(stream: anyio.abc.SocketStream) -> None:
        served.append(len(served))
        if len(served) == 1:
            raise RuntimeError("a bug reached by one connection")
        await stream.send(b"ok")
        await stream.aclose()

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tasks:
        tasks.start_soon(accept_loop.serve, listener, handle)
        async with await anyio.connect_tcp("127.0.0.1", port) as first:
            with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
                await first.receive()  # closed by the node
        async with await anyio.connect_tcp("127.0.0.1", port) as second:
            assert await second.receive() == b"ok"
        tasks.cancel_scope.cancel()
    assert "a bug reached by one connection" in caplog.text


async def test_a_flood_displaces_its_own_oldest_connections_never_a_newer_peer() -> None:
    admission = Admission(per_address=4, total=10)
    ended: dict[str, list[int]] = {}

    async def connection(address: str, number: int, started: anyio.Event) -> None:
        with admission.place(address):
            started.set()
            await anyio.sleep_forever()
        ended.setdefault(address, []).append(number)

    async with anyio.create_task_group() as tasks:
        for number in range(12):  # one address floods
            started = anyio.Event()
            tasks.start_soon(connection, "10.0.0.66", number, started)
            await started.wait()
        assert admission.count == 4
        assert sorted(ended["10.0.0.66"]) == list(range(8))  # its oldest went first
        for number in range(8):  # then many addresses, one connection each
            started = anyio.Event()
            tasks.start_soon(connection, f"10.0.1.{number}", number, started)
            await started.wait()
        peer = anyio.Event()
        tasks.start_soon(connection, "192.168.1.20", 0, peer)
        await peer.wait()
        await anyio.sleep(0)
        assert admission.count == 10
        assert "192.168.1.20" not in ended  # the newest is never the one displaced
        assert len(ended["10.0.0.66"]) == 12 - 1  # the flooder gave way first, down to one
        tasks.cancel_scope.cancel()
    assert admission.count == 0
