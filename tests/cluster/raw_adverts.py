"""Adverts that no real node would send, registered with plain zeroconf, for tests.

    python -m tests.cluster.raw_adverts ADDRESS

registers every advert in MALFORMED on ADDRESS, prints "ready", and keeps them up until stdin
closes.
"""

from __future__ import annotations

import asyncio
import sys

from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf

from exo_tui.cluster.discovery import SERVICE_TYPE

GOOD = {"id": "raw", "name": "raw", "v": "1", "port": "7000", "fp": "ab"}
# Instance label -> TXT: each is wrong in one way (or all).
MALFORMED: dict[str, dict[str, str]] = {
    "bad-port": {**GOOD, "id": "bad-port", "port": "not-a-port"},
    "port-out-of-range": {**GOOD, "id": "port-out-of-range", "port": "70000"},
    "no-fingerprint": {key: value for key, value in GOOD.items() if key != "fp"} | {"id": "no-fp"},
    "future-version": {**GOOD, "id": "future-version", "v": "99"},
    "version-not-a-number": {**GOOD, "id": "version-nan", "v": "one"},
    "empty-id": {**GOOD, "id": ""},
    "no-txt": {},
}


def raw_info(label: str, txt: dict[str, str], address: str, port: int = 7000) -> AsyncServiceInfo:
    return AsyncServiceInfo(
        SERVICE_TYPE,
        f"{label}.{SERVICE_TYPE}",
        parsed_addresses=[address],
        port=port,
        properties=txt,
        server=f"{label}.local.",
    )


async def register(zeroconf: AsyncZeroconf, info: AsyncServiceInfo) -> None:
    # No probing: these names are unique by construction, and the tests want them out fast.
    await zeroconf.async_register_service(info, cooperating_responders=True)


async def main(address: str) -> None:
    async with AsyncZeroconf(interfaces=[address]) as zeroconf:
        for label, txt in MALFORMED.items():
            await register(zeroconf, raw_info(label, txt, address))
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.read)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
