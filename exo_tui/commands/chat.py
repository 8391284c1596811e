"""Headless commands: `exo-tui chat` (one turn, text or JSON Lines) and `exo-tui models`."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from engine.errors import EngineError, ModelNotFoundError
from engine.types import (
    ChatRequest,
    Chunk,
    DoneChunk,
    ErrorChunk,
    LoadProgress,
    Message,
    ModelCard,
    ModelReady,
    ReasoningChunk,
    TextChunk,
    ToolCallChunk,
    ToolResult,
)

if TYPE_CHECKING:
    from rich.progress import TaskID

    from exo_tui.chat.tools import ToolRegistry
    from exo_tui.cluster.control.state import DownloadProgressed
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
    return print_turn(chat_turn(loaded, request, registry), out)


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
        return print_turn(chat_turn(ring.chat, request, registry), out)


def print_turn(turn: Iterator[Chunk | ToolResult], out: JsonLines | TextOutput) -> int:
    for event in turn:
        if isinstance(event, ToolResult):
            out.tool_result(event)
        else:
            out.chunk(event)
    return out.exit_code


class JsonLines:
    """One JSON object per event on stdout, flushed as it happens."""

    exit_code = 0

    def progress(self, event: LoadProgress) -> None:
        self._write(event.model_dump_json())

    def node_progress(self, node_id: str, name: str, layers_loaded: int, total: int) -> None:
        line = {"type": "load", "node_id": node_id, "node": name,
                "layers_loaded": layers_loaded, "total": total}  # fmt: skip
        self._write(json.dumps(line))

    def node_download(self, event: DownloadProgressed, name: str) -> None:
        line = {"type": "download", "node": name, "node_id": event.node_id, "model": event.model,
                **event.progress.model_dump(exclude={"type"})}  # fmt: skip
        self._write(json.dumps(line))

    def loaded(self, ready: ModelReady) -> None:
        self._write(ready.model_dump_json())

    def chunk(self, chunk: Chunk) -> None:
        if isinstance(chunk, ErrorChunk):
            self.exit_code = 1
        self._write(chunk.model_dump_json())

    def tool_result(self, result: ToolResult) -> None:
        self._write(result.model_dump_json())

    @staticmethod
    def _write(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class TextOutput:
    """Loading as a Rich progress bar on stderr, the answer streamed as plain text on stdout."""

    exit_code = 0

    def __init__(self, card: ModelCard) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        self._console = Console(stderr=True)
        self._bar = Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self._console,
            transient=True,
        )
        self._name = card.name
        self._tasks: dict[int, TaskID] = {}
        self._node_tasks: dict[str, TaskID] = {}
        self._bar.start()
        self._in_reasoning = False

    def progress(self, event: LoadProgress) -> None:
        if event.rank not in self._tasks:
            label = f"loading {self._name}" + (f" (rank {event.rank})" if event.rank else "")
            self._tasks[event.rank] = self._bar.add_task(label, total=event.total)
        self._bar.update(self._tasks[event.rank], completed=event.layers_loaded, total=event.total)

    def node_progress(self, node_id: str, name: str, layers_loaded: int, total: int) -> None:
        if node_id not in self._node_tasks:
            label = f"loading {self._name} on {name}"
            self._node_tasks[node_id] = self._bar.add_task(label, total=total)
        self._bar.update(self._node_tasks[node_id], completed=layers_loaded, total=total)

    def node_download(self, event: DownloadProgressed, name: str) -> None:
        key, progress = f"download {event.node_id}", event.progress
        if key not in self._node_tasks:
            label = f"downloading {self._name} on {name} (MB)"
            self._node_tasks[key] = self._bar.add_task(label, total=progress.bytes_total / 1e6)
        self._bar.update(
            self._node_tasks[key],
            completed=progress.bytes_done / 1e6,
            total=progress.bytes_total / 1e6,
        )

    def loaded(self, ready: ModelReady) -> None:
        self._bar.stop()
        self._console.print(
            f"[dim]{ready.model} loaded in {ready.load_seconds:.1f} s, BLAS: {ready.blas}, "
            f"cpu kernels: {ready.kernels}[/dim]"
        )

    def chunk(self, chunk: Chunk) -> None:
        match chunk:
            case TextChunk(text=text):
                self._end_reasoning()
                sys.stdout.write(text)
                sys.stdout.flush()
            case ReasoningChunk(text=text):
                if not self._in_reasoning:
                    self._in_reasoning = True
                    self._console.print("[dim]thinking…[/dim]")
                self._console.print(text, end="", style="dim", markup=False, highlight=False)
            case ToolCallChunk(name=name, arguments=arguments):
                self._end_reasoning()
                self._console.print(f"\n[bold]tool call[/bold] {name}({json.dumps(arguments)})")
            case ErrorChunk(message=message):
                self.exit_code = 1
                self._console.print(f"\n[red]error:[/red] {message}", markup=True)
            case DoneChunk(usage=usage, stats=stats, finish_reason=reason):
                sys.stdout.write("\n")
                self._console.print(
                    f"[dim]{usage.prompt_tokens} prompt ({usage.cached_tokens} cached) + "
                    f"{usage.completion_tokens} tokens, TTFT {stats.ttft_s * 1000:.0f} ms, "
                    f"prefill {stats.prefill_tps:.1f} tok/s, decode {stats.decode_tps:.1f} tok/s, "
                    f"{reason}[/dim]"
                )

    def tool_result(self, result: ToolResult) -> None:
        style = "green" if result.ok else "red"
        self._console.print(f"[{style}]→[/{style}] {result.content}", highlight=False)

    def _end_reasoning(self) -> None:
        if self._in_reasoning:
            self._in_reasoning = False
            self._console.print()
