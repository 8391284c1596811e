"""The `exo-tui` command: the TUI by default, `chat` for headless one-shot chats, `models`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path


def _add_models_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--models-dir",
        action="append",
        type=Path,
        default=None,
        metavar="DIR",
        help="a folder of models (repeatable; default: the exo-tui data folder)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="exo-tui",
        description="Run large language models across the machines you own.",
    )
    parser.add_argument("--model", help="model to preselect (name or path)")
    parser.add_argument("--load", action="store_true", help="launch the model at start")
    _add_models_dir(parser)
    commands = parser.add_subparsers(dest="command")

    chat = commands.add_parser("chat", help="one chat turn, headless (for scripts and benchmarks)")
    chat.add_argument("--model", help="model name or path (default: the bundled demo)")
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
        type=int,
        default=1,
        metavar="N",
        help="run the model on N local processes joined in an MLX ring (default 1: in-process)",
    )
    chat.add_argument(
        "--strategy",
        choices=["pipeline", "tensor"],
        default="pipeline",
        help="with --ranks: split the layers (pipeline) or every layer (tensor)",
    )
    _add_models_dir(chat)

    models = commands.add_parser("models", help="list the models found, with their cards")
    models.add_argument("--json", action="store_true", help="one JSON card per line")
    _add_models_dir(models)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from engine.errors import EngineError

    try:
        if args.command == "chat":
            from exo_tui.headless import run_chat

            return run_chat(args)
        if args.command == "models":
            from exo_tui.headless import list_models

            return list_models(args)
        from exo_tui.app.main import run_app

        return run_app(model=args.model, models_dirs=args.models_dir, load=args.load)
    except EngineError as error:
        print(f"exo-tui: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
