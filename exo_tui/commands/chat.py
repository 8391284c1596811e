"""Headless commands: `exo-tui chat` (one turn, text or JSON Lines) and `exo-tui models`."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from engine.errors import EngineError, ModelNotFoundError
from engine.types import ChatRequest, Message, ModelCard, ModelReady
from exo_tui.commands.printing import JsonLines, TextOutput, print_turn

if TYPE_CHECKING:
    from exo_tui.chat.tools import ToolRegistry
    from exo_tui.cluster.node import ClusterSetup


def default_model_spec(models_dirs: list[Path] | None) -> str:
    """The model to use when none is named: the bundled demo, else the only installed one."""
    from engine.models.finding import find_models
    from engine.models.locations import bundled_demo_dir

    if (bundled_demo_dir() / "config.json").exists():
        return "demo"
    found = find_models(models_dirs, include_bundled=False)
    if len(found) == 1:
        return found[0].path
    raise ModelNotFoundError(
        "No model named and no bundled demo model"
        + (f" ({len(found)} models installed)" if found else ""),
        "Pass --model NAME_OR_PATH; `exo-tui models` lists the models found",
    )


def read_prompt(args: argparse.Namespace) -> str:
    if args.prompt is not None:
        return utf8_text(str(args.prompt), "--prompt")
    if sys.stdin.isatty():
        raise EngineError("No prompt given", "Pass --prompt TEXT or pipe the message on stdin")
    data = sys.stdin.buffer.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise EngineError(
            f"Standard input is not UTF-8 text: byte 0x{data[error.start]:02x} at offset "
            f"{error.start} is not valid UTF-8",
            "Pipe the message as UTF-8 (e.g. through `iconv -t UTF-8`), or pass --prompt TEXT",
        ) from None


def utf8_text(text: str, option: str) -> str:
    """`text` from the command line, which Python decodes with surrogates for bytes that are
    not UTF-8 (the tokenizer and the wire refuse them later, with a traceback)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise EngineError(
            f"{option} is not UTF-8 text: character {error.start} is a byte that is not UTF-8",
            "Pass the text in UTF-8",
        ) from None
    return text


def build_request(args: argparse.Namespace, prompt: str) -> ChatRequest:
    messages: list[Message] = []
    if args.system:
        messages.append(Message(role="system", content=utf8_text(args.system, "--system")))
    messages.append(Message(role="user", content=prompt))
    return ChatRequest(
        messages=tuple(messages),
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
    )


def run_chat(args: argparse.Namespace, cluster: ClusterSetup | None = None) -> int:
    from engine.generate import validate
    from engine.loading import load_model, run_loading
    from engine.models.weights import require_weight_files
    from exo_tui.chat.backend import LocalBackend
    from exo_tui.chat.tools import builtin_registry, local_cluster_status
    from exo_tui.chat.turn import chat_turn

    prompt = read_prompt(args)
    request = build_request(args, prompt)
    validate(request)  # a bad request fails before minutes of loading
    card = chat_card(args.model or default_model_spec(args.models_dir), args.models_dir)
    if cluster is None and card.source == "hf_cache":
        card = downloaded(card, args.json)  # nothing, or the rest, of a hub model
    elif cluster is None and card.layers_on_disk is not None:
        # A folder outside the hub cache is no hub repo: name the files it lacks, ask no hub.
        require_weight_files(Path(card.path), name=card.name)
    registry = builtin_registry(lambda: local_cluster_status(card.name))
    if not args.no_tools:
        request = request.model_copy(update={"tools": registry.specs})
    out = JsonLines() if args.json else TextOutput(card)
    if cluster is not None:
        from exo_tui.commands.cluster_chat import run_chat_on_cluster

        return run_chat_on_cluster(args, cluster, card, request, registry, out)
    if args.ranks > 1:
        return run_chat_on_ranks(args, card, request, registry, out)
    started = time.perf_counter()
    loaded = run_loading(load_model(Path(card.path)), out.progress)
    out.loaded(
        ModelReady(
            model=card.name,
            load_seconds=time.perf_counter() - started,
            blas=loaded.blas,
            kernels=loaded.kernels,
        )
    )
    return print_turn(chat_turn(LocalBackend(loaded), request, registry), out)


def chat_card(spec: str, models_dirs: list[Path] | None) -> ModelCard:
    """The model to chat with: on disk (a path or a name), else a catalogue model by repo id,
    which `exo-tui chat` downloads (whole, or on a cluster each node its share)."""
    from engine.models.finding import resolve_model
    from exo_tui.hub.catalogue import entry_card, find_entry

    try:
        return resolve_model(spec, models_dirs)
    except ModelNotFoundError:
        entry = find_entry(spec)
        if entry is None:
            raise
        return entry_card(entry)


def downloaded(card: ModelCard, as_json: bool) -> ModelCard:
    """`card` once all its files are in the Hugging Face cache (fetching what is missing)."""
    from engine.models.cards import read_card
    from engine.models.weights import missing_weight_files
    from exo_tui.commands.download import download_with_progress

    folder = Path(card.path)
    if (folder / "config.json").is_file() and not missing_weight_files(folder):
        return card
    snapshot = download_with_progress(card.name, as_json=as_json)
    return read_card(snapshot, "hf_cache", name=card.name)


def run_chat_on_ranks(
    args: argparse.Namespace,
    card: ModelCard,
    request: ChatRequest,
    registry: ToolRegistry,
    out: JsonLines | TextOutput,
) -> int:
    """The same turn on `--ranks` local runner processes (an MLX ring on 127.0.0.1)."""
    from engine.loading import run_loading
    from exo_tui.chat.backend import RingBackend
    from exo_tui.chat.turn import chat_turn
    from exo_tui.cluster.worker.local_ring import start_local_ranks

    started = time.perf_counter()
    ring = run_loading(start_local_ranks(card, args.strategy, args.ranks), out.progress)
    with ring:
        out.loaded(
            ModelReady(
                model=card.name,
                load_seconds=time.perf_counter() - started,
                blas=ring.ready[0].blas,
                kernels=ring.ready[0].kernels,
            )
        )
        backend = RingBackend(card, ring.chat, ring.close)
        return print_turn(chat_turn(backend, request, registry), out)
