"""Finding peers on the local network with mDNS: advertise this node, report the others.

    async with Discovery(Advert(node_id=..., name=..., version=1, port=..., fingerprint=...)) as d:
        async for event in d.events():
            ...  # PeerFound / PeerRemoved

Each node registers `_exo-tui._tcp.local.` under its node id, with TXT keys id, name, v, port, fp.
A PeerRemoved comes only from a peer's goodbye (a clean exit): zeroconf keeps a killed peer's
records for many minutes, so liveness must come from heartbeats, never from here.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Sequence
from types import TracebackType
from typing import Annotated, Any, Literal, Self, cast

import psutil
from pydantic import Field, ValidationError
from zeroconf import IPVersion, ServiceStateChange, Zeroconf
from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf

from engine.types import Frozen
from exo_tui.untrusted import REASON_LIMIT, shown

SERVICE_TYPE = "_exo-tui._tcp.local."
RESOLVE_TIMEOUT_MS = 3000

log = logging.getLogger(__name__)


class Advert(Frozen):
    """What a node tells the network about itself."""

    node_id: Annotated[str, Field(min_length=1)]
    name: str
    version: int
    port: Annotated[int, Field(ge=1, le=65535)]
    fingerprint: str
    # Filled in for peers found by browsing, IPv4 first.
    addresses: tuple[str, ...] = ()


class PeerFound(Frozen):
    """A peer appeared, or changed its advert."""

    type: Literal["found"] = "found"
    advert: Advert


class PeerRemoved(Frozen):
    """A peer said goodbye."""

    type: Literal["removed"] = "removed"
    node_id: str


DiscoveryEvent = PeerFound | PeerRemoved


def txt_record(advert: Advert) -> dict[str, str]:
    return {
        "id": advert.node_id,
        "name": advert.name,
        "v": str(advert.version),
        "port": str(advert.port),
        "fp": advert.fingerprint,
    }


def instance_name(node_id: str) -> str:
    return f"{node_id}.{SERVICE_TYPE}"


def advert_from_info(info: AsyncServiceInfo, version: int) -> Advert:
    """The advert in a resolved service; ValueError if it is malformed or of another version."""
    txt = info.decoded_properties
    try:
        fields = {key: txt[wire] for key, wire in _TXT_FIELDS.items()}
    except KeyError as missing:
        raise ValueError(f"TXT lacks {missing}") from None
    addresses = info.parsed_addresses(IPVersion.V4Only) + info.parsed_scoped_addresses(
        IPVersion.V6Only
    )
    try:
        advert = Advert.model_validate({**fields, "addresses": tuple(addresses)})
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
        raise ValueError(problems) from None
    if advert.version != version:
        raise ValueError(f"protocol version {advert.version}, we speak {version}")
    return advert


_TXT_FIELDS = {"node_id": "id", "name": "name", "version": "v", "port": "port", "fingerprint": "fp"}


def _is_loopback(address: str) -> bool:
    return ipaddress.ip_address(address.split("%")[0]).is_loopback


def local_addresses() -> list[str]:
    """The IPv4 addresses of this machine's interfaces that are up, except loopback."""
    up = {name for name, stats in psutil.net_if_stats().items() if stats.isup}
    return [
        entry.address
        for name, entries in psutil.net_if_addrs().items()
        if name in up
        for entry in entries
        if entry.family == socket.AF_INET and not _is_loopback(entry.address)
    ]


def advertised_addresses(interfaces: Sequence[str] | None) -> list[str]:
    """The addresses to put in our A/AAAA records.

    Loopback is left out unless it is all there is: a node in a network namespace, or on a host
    with a LAN, must not tell peers to dial 127.0.0.1.
    """
    chosen = list(interfaces) if interfaces is not None else local_addresses()
    reachable = [address for address in chosen if not _is_loopback(address)]
    return reachable or chosen or ["127.0.0.1"]


class Discovery:
    """Advertises one node and browses for the others, as an async context manager."""

    def __init__(self, advert: Advert, *, interfaces: Sequence[str] | None = None) -> None:
        """`interfaces`: IP addresses to bind mDNS to (zeroconf's `interfaces=`); None for all."""
        self.advert = advert
        self._interfaces = list(interfaces) if interfaces is not None else None
        self._name = instance_name(advert.node_id)
        self._queue: asyncio.Queue[DiscoveryEvent | None] = asyncio.Queue()
        self._resolving: dict[str, asyncio.Task[None]] = {}
        self._found: dict[str, Advert] = {}  # by service name: what we last reported
        self._zeroconf: AsyncZeroconf | None = None
        self._browser: AsyncServiceBrowser | None = None
        self._announcing: asyncio.Future[None] | None = None
        self._closed = False

    async def __aenter__(self) -> Self:
        self._zeroconf = (
            AsyncZeroconf(interfaces=self._interfaces)
            if self._interfaces is not None
            else AsyncZeroconf()
        )
        try:
            # Browse first: peers' answers then arrive while our own name is being probed.
            self._browser = AsyncServiceBrowser(
                self._zeroconf.zeroconf, SERVICE_TYPE, handlers=[self._on_service_state_change]
            )
            # Returns once our name is probed unique; the announcements go on in the background.
            # (zeroconf types the announcing future as a bare Awaitable, hence the Any.)
            zeroconf: Any = self._zeroconf
            announcing = await zeroconf.async_register_service(self._service_info())
            self._announcing = asyncio.ensure_future(cast("Awaitable[None]", announcing))
        except BaseException:
            await self._close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self._close()

    async def events(self) -> AsyncIterator[DiscoveryEvent]:
        """Peers other than ourselves, resolved; ends when the Discovery closes."""
        while True:
            event = await self._queue.get()
            if event is None:
                self._queue.put_nowait(None)  # so every other reader ends too
                return
            yield event

    def _service_info(self) -> AsyncServiceInfo:
        return AsyncServiceInfo(
            SERVICE_TYPE,
            self._name,
            parsed_addresses=advertised_addresses(self._interfaces),
            port=self.advert.port,
            properties=txt_record(self.advert),
            server=f"{self.advert.node_id}.local.",
        )

    def _on_service_state_change(
        self,
        zeroconf: Zeroconf,
        service_type: str,
        name: str,
        state_change: ServiceStateChange,
    ) -> None:
        if name == self._name or self._closed:
            return
        pending = self._resolving.pop(name, None)
        if pending is not None:
            pending.cancel()  # a newer change supersedes it
        if state_change is ServiceStateChange.Removed:
            self._forget(name)
        else:
            task = asyncio.get_running_loop().create_task(self._resolve(name))
            self._resolving[name] = task
            task.add_done_callback(lambda done: self._resolve_done(name, done))

    def _resolve_done(self, name: str, task: asyncio.Task[None]) -> None:
        if self._resolving.get(name) is task:
            del self._resolving[name]

    async def _resolve(self, name: str) -> None:
        assert self._zeroconf is not None
        info = AsyncServiceInfo(SERVICE_TYPE, name)
        if not await info.async_request(self._zeroconf.zeroconf, RESOLVE_TIMEOUT_MS):
            log.warning("mDNS: %s did not resolve within %d ms", shown(name), RESOLVE_TIMEOUT_MS)
            return
        try:
            advert = advert_from_info(info, self.advert.version)
        except ValueError as error:
            log.warning("mDNS: ignoring %s: %s", shown(name), shown(str(error), REASON_LIMIT))
            self._forget(name)  # it may have been valid before this update
            return
        if advert.node_id == self.advert.node_id:
            log.warning("mDNS: ignoring %s: it claims our own node id", shown(name))
            return
        if self._found.get(name) == advert:
            return  # a record came again, or one that is not in the advert (an IPv6 address)
        self._found[name] = advert
        self._queue.put_nowait(PeerFound(advert=advert))

    def _forget(self, name: str) -> None:
        advert = self._found.pop(name, None)
        if advert is not None:
            self._queue.put_nowait(PeerRemoved(node_id=advert.node_id))

    async def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        tasks = [*self._resolving.values(), *([self._announcing] if self._announcing else [])]
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._browser is not None:
            await self._browser.async_cancel()
        if self._zeroconf is not None:
            await self._zeroconf.async_close()  # sends our goodbye packets
        self._queue.put_nowait(None)
