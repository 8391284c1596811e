"""A node that only discovers, for tests: prints what it sees as JSON lines until stdin closes.

    python -m tests.cluster.discovery_node NODE_ID PORT FINGERPRINT [--name N] [--interface IP]

Lines: {"event": "ready", "t": ...} once advertised, then {"event": "found", "advert": {...},
"t": ...}, {"event": "removed", "node_id": ..., "t": ...} and {"event": "log", "message": ...,
"t": ...} for every warning; "t" is time.time(), comparable across namespaces. Closing stdin
(or SIGTERM) leaves through Discovery.__aexit__.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
import time

from exo_tui.cluster.discovery import Advert, Discovery, PeerFound, PeerRemoved

VERSION = 1


def emit(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, "t": time.time(), **fields}), flush=True)


class EmitWarnings(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        emit("log", level=record.levelname, message=record.getMessage())


async def report(discovery: Discovery) -> None:
    async for event in discovery.events():
        match event:
            case PeerFound(advert=advert):
                emit("found", advert=advert.model_dump(mode="json"))
            case PeerRemoved(node_id=node_id):
                emit("removed", node_id=node_id)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("node_id")
    parser.add_argument("port", type=int)
    parser.add_argument("fingerprint")
    parser.add_argument("--name", default="")
    parser.add_argument("--interface", action="append")
    args = parser.parse_args()
    advert = Advert(
        node_id=args.node_id,
        name=args.name or args.node_id,
        version=VERSION,
        port=args.port,
        fingerprint=args.fingerprint,
    )
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_reader(sys.stdin.fileno(), lambda: sys.stdin.readline() or stop.set())
    emit("starting")
    async with Discovery(advert, interfaces=args.interface) as discovery:
        emit("ready")
        reporting = asyncio.create_task(report(discovery))
        await stop.wait()
    await reporting  # ends once the Discovery has closed
    emit("exited")


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, handlers=[EmitWarnings()])
    asyncio.run(main())
