"""`exo-tui node`: this machine as a headless peer of the cluster, until Ctrl+C or SIGTERM.

`cluster_setup` reads the identity, key and options that every cluster command shares.

Logs peers joining, leaving and being refused on stderr; with `--json`, writes one JSON object
per event on stdout instead (what scripts and the tests read).
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import signal
import sys
from pathlib import Path

import anyio

from engine.errors import EngineError
from exo_tui.cluster.control.state import ClusterEvent, NodeLost, StatsUpdated
from exo_tui.cluster.identity import ClusterKey, NodeIdentity, load_cluster_key, load_node_identity
from exo_tui.cluster.node import (
    DEFAULT_PORT,
    ClusterSetup,
    Foreign,
    NodeOptions,
    machine_node,
    parse_peer,
)
from exo_tui.untrusted import NAME_LIMIT, shown

# Refusals said per address: a peer may vary its name (and so the reason) with every attempt.
REFUSALS_PER_HOST = 3
HOSTS_REMEMBERED = 1024


class EventPrinter:
    """Turns the node's events into lines: every change as JSON, or joins and losses as text."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.online: set[str] = set()
        # Each refusal once, not at every redial; a few per address, for a bounded number of them.
        self.refused: dict[str, set[str]] = {}

    def event(self, event: ClusterEvent) -> None:
        match event:
            case StatsUpdated(stats=stats):
                joined = stats.node_id not in self.online
                self.online.add(stats.node_id)
                if self.as_json:
                    self._json({"type": "peer_stats", "joined": joined, **stats.model_dump()})
                elif joined:
                    name, node_id = shown(stats.name, NAME_LIMIT), shown(stats.node_id, NAME_LIMIT)
                    self._text(f"peer {name} ({node_id}) joined")
            case NodeLost(node_id=node_id, reason=reason):
                self.online.discard(node_id)
                if self.as_json:
                    self._json({"type": "peer_lost", "node_id": node_id, "reason": reason})
                else:
                    self._text(f"peer {node_id} lost: {reason}")
            case _:
                pass

    def foreign(self, foreign: Foreign) -> None:
        """Say a refusal (its texts are escaped and capped already: see Foreign.of)."""
        host = foreign.address.rsplit(":", 1)[0]
        if host not in self.refused and len(self.refused) >= HOSTS_REMEMBERED:
            return
        said = self.refused.setdefault(host, set())
        if foreign.reason in said or len(said) > REFUSALS_PER_HOST:
            return
        said.add(foreign.reason)
        if len(said) > REFUSALS_PER_HOST:
            self._text(f"more refusals of {host} are not logged")
            return
        peer = foreign.peer.model_dump() if foreign.peer else None
        if self.as_json:
            self._json({"type": "foreign", "address": foreign.address, "reason": foreign.reason,
                        "peer": peer})  # fmt: skip
        else:
            self._text(f"refused {foreign.address}: {foreign.reason}")

    def listening(self, identity: NodeIdentity, key: ClusterKey, port: int) -> None:
        if self.as_json:
            self._json({"type": "listening", "node_id": identity.node_id, "name": identity.name,
                        "port": port, "fingerprint": key.fingerprint})  # fmt: skip
        else:
            self._text(
                f"node {identity.name} ({identity.node_id}) listening on port {port}; "
                f"cluster key fingerprint {key.fingerprint}"
            )

    def _json(self, payload: dict[str, object]) -> None:
        print(json.dumps(payload), flush=True)

    def _text(self, line: str) -> None:
        print(line, file=sys.stderr, flush=True)


async def serve(
    identity: NodeIdentity,
    key: ClusterKey,
    options: NodeOptions,
    models_dirs: list[Path] | None,
    as_json: bool,
) -> None:
    printer = EventPrinter(as_json)
    setup = ClusterSetup(identity=identity, key=key, options=options)
    node = machine_node(setup, models_dirs, printer.event, printer.foreign)
    async with anyio.create_task_group() as tasks:
        port = await tasks.start(node.run)
        printer.listening(identity, key, port)
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                tasks.cancel_scope.cancel()
                break


def cluster_setup(args: argparse.Namespace) -> ClusterSetup:
    """Identity, key and options of this node from the command line; EngineError when bad."""
    for peer in args.peer:
        try:
            parse_peer(peer)
        except ValueError as error:
            raise EngineError(str(error), "Give peers as --peer HOST:PORT") from error
    interfaces: list[str] | None = args.interface
    options = NodeOptions(
        port=DEFAULT_PORT if args.port is None else args.port,
        bind=interfaces[0] if interfaces else "0.0.0.0",
        peers=tuple(args.peer),
        mdns=not args.no_mdns,
        interfaces=interfaces,
    )
    key = load_cluster_key(args.key)
    me = load_node_identity(getattr(args, "name", None))
    return ClusterSetup(identity=me, key=key, options=options)


def start_node(args: argparse.Namespace) -> int:
    """`exo-tui node`: check the options, then serve until Ctrl+C or SIGTERM."""
    setup = cluster_setup(args)
    return run_node(setup.identity, setup.key, setup.options, args.models_dir, args.json)


def run_node(
    identity: NodeIdentity,
    key: ClusterKey,
    options: NodeOptions,
    models_dirs: list[Path] | None,
    as_json: bool,
) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        anyio.run(serve, identity, key, options, models_dirs, as_json)
    except BaseExceptionGroup as group:  # the task group wraps what went wrong
        raise listen_error(group, options) or group from None
    return 0


def listen_error(
    group: BaseExceptionGroup[BaseException], options: NodeOptions
) -> EngineError | None:
    """What the user can do about a control port that could not be opened, when that is what
    went wrong (the error is in `group`, from the listener that Node.run opens first)."""
    where = f"{options.bind}:{options.port}"
    for error in _leaves(group):
        if not isinstance(error, OSError):
            continue
        if error.errno == errno.EADDRINUSE:
            return EngineError(
                f"Cannot listen on {where}: port {options.port} is in use (another exo-tui node?)",
                "Stop the other process, or pass --port N (0: any free port)",
            )
        if error.errno == errno.EADDRNOTAVAIL:
            return EngineError(
                f"Cannot listen on {where}: {options.bind} is not an address of this machine",
                "Pass one of its addresses with --interface (`ip -brief address` lists them), "
                "or leave --interface out",
            )
        if error.errno == errno.EACCES:
            return EngineError(
                f"Cannot listen on {where}: port {options.port} needs privileges",
                "Pass --port N with N above 1023",
            )
    return None


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    found: list[BaseException] = []
    for error in group.exceptions:
        if isinstance(error, BaseExceptionGroup):
            found += _leaves(error)  # pyright: ignore[reportUnknownArgumentType]
        else:
            found.append(error)
    return found
