"""How a headless chat prints: JSON Lines, or a progress bar and plain text (the local chat and
the cluster's chat print alike)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

from engine.types import (
    Chunk,
    DoneChunk,
    ErrorChunk,
    LoadProgress,
    ModelCard,
    ModelReady,
    PrefillProgress,
    ReasoningChunk,
    TextChunk,
    ToolCallChunk,
    ToolResult,
)

if TYPE_CHECKING:
    from rich.progress import TaskID

    from exo_tui.cluster.control.state import DownloadProgressed


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
            case PrefillProgress():
                pass  # the answer text alone goes to stdout; JSON Lines carry the progress
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
