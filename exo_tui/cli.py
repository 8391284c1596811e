"""The `exo-tui` command: the TUI by default; `node`, `chat`, `serve`, `models` and `key` for the
shell."""

from __future__ import annotations

import argparse
import ipaddress
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path


def _number(text: str, kind: type[int] | type[float], wanted: str) -> int | float:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {wanted}") from None


def _port(text: str) -> int:
    """A TCP port, or 0 for any free one (argparse exits 2 with the message)."""
    wanted = "a TCP port: use 1 to 65535 (0: any free port)"
    port = int(_number(text, int, wanted))
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not {wanted}")
    return port


def _address(text: str) -> str:
    """An IP address of this machine to bind to (zeroconf and the listener take addresses)."""
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an IP address: give one of this machine's addresses, e.g. 192.168.1.5"
        ) from None


def _count_of(things: str) -> Callable[[str], int]:
    """A parser of how many `things`, 1 or more."""
    wanted = f"a number of {things}: use a whole number of 1 or more"

    def count(text: str) -> int:
        value = int(_number(text, int, wanted))
        if value < 1:
            raise argparse.ArgumentTypeError(f"{value} is not {wanted}")
        return value

    return count


def _seconds(text: str) -> float:
    wanted = "a number of seconds: use 0 or more"
    seconds = float(_number(text, float, wanted))
    if not math.isfinite(seconds) or seconds < 0:
        raise argparse.ArgumentTypeError(f"{text} is not {wanted}")
    return seconds


def _model_spec(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "the model name is empty: give a model name or path (`exo-tui models` lists them)"
        )
    return text


def _add_models_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--models-dir",
        action="append",
        type=Path,
        default=None,
        metavar="DIR",
        help="a folder of models (repeatable; default: the exo-tui data folder)",
    )


def _add_node_options(parser: argparse.ArgumentParser, port_option: str = "--port") -> None:
    parser.add_argument(
        port_option, dest="port", type=_port, default=None, help="control port (default 52525)"
    )
    parser.add_argument(
        "--peer",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="a peer to dial, for networks without multicast (repeatable)",
    )
    parser.add_argument(
        "--interface",
        action="append",
        type=_address,
        default=None,
        metavar="ADDRESS",
        help="bind the control port and mDNS to this address only (repeatable for mDNS)",
    )
    parser.add_argument("--key", help="the cluster key (default: EXO_TUI_KEY, then the stored key)")


def _add_no_mdns(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-mdns", action="store_true", help="only dial the --peer addresses")


def _add_discovery(
    parser: argparse.ArgumentParser, discover_help: str, port_option: str = "--port"
) -> None:
    """What a command that joins the cluster for a moment (with --cluster) takes."""
    parser.add_argument(
        "--discover",
        type=_seconds,
        default=3.0,
        metavar="S",
        help=f"with --cluster: {discover_help} (default 3)",
    )
    _add_node_options(parser, port_option)
    _add_no_mdns(parser)


def _host(text: str) -> str:
    return "127.0.0.1" if text == "localhost" else _address(text)


def _add_serve(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = commands.add_parser(
        "serve", help="serve a model over the OpenAI and Ollama APIs (headless)"
    )
    serve.add_argument(
        "--model", type=_model_spec, help="model name or path (default: the bundled demo)"
    )
    serve.add_argument(
        "--host", type=_host, default="127.0.0.1", help="address to listen on (default 127.0.0.1)"
    )
    serve.add_argument(
        "--port",
        dest="api_port",
        type=_port,
        default=8080,
        metavar="PORT",
        help="the API's port (default 8080)",
    )
    serve.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help="require this key (`Authorization: Bearer KEY`); needed off loopback",
    )
    serve.add_argument(
        "--max-queue",
        type=_count_of("requests"),
        default=16,
        metavar="N",
        help="requests that may wait for the model; more get 429 (default 16)",
    )
    serve.add_argument(
        "--max-batch",
        type=_count_of("requests"),
        default=None,
        metavar="N",
        help="requests this machine's model decodes together; more wait in the queue "
        "(default 16; each holds its own KV cache)",
    )
    serve.add_argument(
        "--cluster",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="place the model across the cluster's nodes, as `chat --cluster` does "
        "(default --no-cluster: this machine)",
    )
    serve.add_argument(
        "--nodes",
        default=None,
        metavar="ID,...",
        help="with --cluster: the nodes to use, by id or name, in ring order (default: all)",
    )
    serve.add_argument(
        "--strategy",
        choices=["pipeline", "tensor"],
        default="pipeline",
        help="with --cluster: split the layers (pipeline) or every layer (tensor)",
    )
    _add_discovery(serve, "seconds to look for nodes before placing", "--node-port")
    _add_models_dir(serve)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="exo-tui",
        description="Run large language models across the machines you own.",
    )
    parser.add_argument("--model", type=_model_spec, help="model to preselect (name or path)")
    parser.add_argument("--load", action="store_true", help="launch the model at start")
    parser.add_argument(
        "--cluster",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="be a node of the cluster: peers found by mDNS or named with --peer show up live "
        "(default; --no-cluster: this machine alone)",
    )
    _add_node_options(parser)
    _add_no_mdns(parser)
    _add_models_dir(parser)
    parser.add_argument(
        "--api-port",
        type=_port,
        default=None,
        metavar="PORT",
        help="also serve the OpenAI and Ollama APIs on this port, on the model loaded "
        "(default: off; `exo-tui serve` is the same without the screen)",
    )
    parser.add_argument(
        "--api-host",
        type=_host,
        default="127.0.0.1",
        help="with --api-port: the address to listen on (default 127.0.0.1)",
    )
    parser.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help="with --api-port: require this key (`Authorization: Bearer KEY`); needed off loopback",
    )
    commands = parser.add_subparsers(dest="command")

    chat = commands.add_parser("chat", help="one chat turn, headless (for scripts and benchmarks)")
    chat.add_argument(
        "--model", type=_model_spec, help="model name or path (default: the bundled demo)"
    )
    chat.add_argument("--prompt", help="the user message (default: read standard input)")
    chat.add_argument("--system", help="a system message")
    chat.add_argument("--max-tokens", type=int, default=512)
    chat.add_argument("--temperature", type=float, default=0.7, help="0 means greedy")
    chat.add_argument("--top-p", type=float, default=1.0)
    chat.add_argument("--seed", type=int, default=None)
    chat.add_argument("--json", action="store_true", help="JSON Lines on stdout, one per event")
    chat.add_argument(
        "--no-tools", action="store_true", help="offer no tools (default: the built-in ones)"
    )
    chat.add_argument(
        "--ranks",
        type=_count_of("processes"),
        default=1,
        metavar="N",
        help="run the model on N local processes joined in an MLX ring (default 1: in-process)",
    )
    chat.add_argument(
        "--strategy",
        choices=["pipeline", "tensor"],
        default="pipeline",
        help="with --ranks or --cluster: split the layers (pipeline) or every layer (tensor)",
    )
    chat.add_argument(
        "--cluster",
        action="store_true",
        help="run on the cluster: find the nodes, place the model across them, chat",
    )
    chat.add_argument(
        "--nodes",
        default=None,
        metavar="ID,...",
        help="with --cluster: the nodes to use, by id or name, in ring order (default: all)",
    )
    _add_discovery(chat, "seconds to look for nodes before placing")
    _add_models_dir(chat)

    models = commands.add_parser(
        "models", help="list the models found and the catalogue; `models download REPO`"
    )
    models.add_argument("--json", action="store_true", help="one JSON card per line")
    models.add_argument(
        "--cluster",
        action="store_true",
        help="say whether each model fits the cluster's nodes (default: this machine alone)",
    )
    _add_discovery(models, "seconds to look for nodes")
    _add_models_dir(models)
    models_commands = models.add_subparsers(dest="models_command")
    fetch = models_commands.add_parser(
        "download", help="download a model from Hugging Face into its cache (resumable)"
    )
    fetch.add_argument("repo", metavar="REPO", help="a repo id, e.g. mlx-community/Qwen3-4B-4bit")
    fetch.add_argument(
        "--layers",
        metavar="START:END",
        help="only the weight files holding these layers (END excluded), plus the shared files",
    )
    fetch.add_argument("--revision", default="main", help="branch, tag or commit (default main)")
    fetch.add_argument("--json", action="store_true", help="JSON Lines on stdout, one per event")

    node = commands.add_parser("node", help="run this machine as a headless peer of the cluster")
    _add_node_options(node)
    _add_no_mdns(node)
    node.add_argument("--name", help="the name other nodes show (default: the host name)")
    node.add_argument("--json", action="store_true", help="JSON Lines on stdout, one per event")
    _add_models_dir(node)

    _add_serve(commands)

    key = commands.add_parser("key", help="print the cluster key, to give to your other machines")
    key.add_argument(
        "--show-fingerprint",
        action="store_true",
        help="print only the key's fingerprint (safe to share; peers advertise it)",
    )
    key.add_argument(
        "--new",
        action="store_true",
        help="replace the stored key; nodes on the old one are refused",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from engine.errors import EngineError
    from exo_tui.cluster.errors import ClusterError
    from exo_tui.commands.node import cluster_setup
    from exo_tui.hub.errors import HubError

    try:
        if args.command == "chat":
            from exo_tui.commands.chat import run_chat

            return run_chat(args, cluster_setup(args) if args.cluster else None)
        if args.command == "serve":
            from exo_tui.commands.serve import run_serve

            return run_serve(args, cluster_setup(args) if args.cluster else None)
        if args.command == "models" and args.models_command == "download":
            from exo_tui.commands.download import run_download

            return run_download(args)
        if args.command == "models":
            from exo_tui.commands.models import list_models

            return list_models(args, cluster_setup(args) if args.cluster else None)
        if args.command == "key":
            from exo_tui.commands.key import show_key

            return show_key(args)
        if args.command == "node":
            from exo_tui.commands.node import start_node

            return start_node(args)
        from exo_tui.app.main import run_app

        cluster = cluster_setup(args) if args.cluster else None
        return run_app(
            model=args.model,
            models_dirs=args.models_dir,
            load=args.load,
            cluster=cluster,
            load_demo=args.model is None,  # the bundled demo, when it is what was found first
            api=(args.api_host, args.api_port, args.api_key) if args.api_port is not None else None,
        )
    except (EngineError, ClusterError, HubError) as error:
        print(f"exo-tui: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
