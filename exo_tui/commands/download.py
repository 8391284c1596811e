"""`exo-tui models download REPO`: a hub download with a bar per file and overall, or JSON Lines."""

from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from engine.errors import EngineError
from engine.loading import run_loading
from exo_tui.hub.catalogue import find_entry
from exo_tui.hub.downloads import Downloading, download
from exo_tui.hub.progress import DownloadProgress

if TYPE_CHECKING:
    from rich.progress import TaskID


def parse_layers(text: str) -> tuple[int, int]:
    """`START:END` (END excluded), as a placement's layer range."""
    start, sep, end = text.partition(":")
    try:
        layers = (int(start), int(end))
    except ValueError:
        layers = (-1, -1)
    if not sep or not 0 <= layers[0] < layers[1]:
        raise EngineError(
            f"--layers {text} is not a layer range",
            "Give START:END with 0 <= START < END, e.g. --layers 0:16",
        )
    return layers


class JsonDownload:
    """One JSON object per progress event on stdout, then a `downloaded` line with the path."""

    def progress(self, event: DownloadProgress) -> None:
        self._write(event.model_dump_json())

    def finished(self, repo_id: str, snapshot: Path) -> None:
        self._write(json.dumps({"type": "downloaded", "repo_id": repo_id, "path": str(snapshot)}))

    def stop(self) -> None:
        return None

    @staticmethod
    def _write(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class RichDownload:
    """A Rich bar for the whole download and one per file while it lands, on stderr."""

    def __init__(self, repo_id: str) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self._console = Console(stderr=True)
        self._bar = Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=self._console,
        )
        self._overall = self._bar.add_task(f"{repo_id}", total=None)
        self._files: dict[str, TaskID] = {}
        self._bar.start()

    def progress(self, event: DownloadProgress) -> None:
        self._bar.update(self._overall, completed=event.bytes_done, total=event.bytes_total)
        if event.file not in self._files:
            label = f"  {event.file}"
            self._files[event.file] = self._bar.add_task(label, total=event.file_total)
        done = event.file_bytes >= event.file_total
        # A finished file leaves the screen; the overall bar keeps its bytes.
        self._bar.update(self._files[event.file], completed=event.file_bytes, visible=not done)

    def finished(self, repo_id: str, snapshot: Path) -> None:
        self.stop()
        self._console.print(f"[dim]{repo_id} is in {snapshot}[/dim]", highlight=False)

    def stop(self) -> None:
        self._bar.stop()


def run_download(args: argparse.Namespace) -> int:
    """Download `args.repo` (optionally only `--layers`); Ctrl+C keeps what landed."""
    layers = parse_layers(args.layers) if args.layers else None
    entry = find_entry(args.repo)
    repo_id = entry.repo if entry is not None else args.repo
    try:
        download_with_progress(
            repo_id,
            as_json=args.json,
            revision=args.revision,
            layers=layers,
            total_layers=entry.layers if entry is not None and layers else None,
        )
    except KeyboardInterrupt:
        print(f"exo-tui: stopped; run the same command to resume {repo_id}", file=sys.stderr)
        return 130
    return 0


def download_with_progress(
    repo_id: str,
    *,
    as_json: bool,
    revision: str = "main",
    layers: tuple[int, int] | None = None,
    total_layers: int | None = None,
) -> Path:
    """Download with bars on stderr (or JSON Lines on stdout) and return the snapshot folder.

    Ctrl+C (KeyboardInterrupt) stops the download threads and keeps the partial files."""
    cancel = threading.Event()
    downloading: Downloading = download(
        repo_id, revision=revision, layers=layers, total_layers=total_layers, cancel=cancel
    )
    out = JsonDownload() if as_json else RichDownload(repo_id)
    try:
        snapshot = run_loading(downloading, out.progress)
    except KeyboardInterrupt:
        cancel.set()
        downloading.close()  # the download threads stop; partial files stay for next time
        raise
    finally:
        out.stop()
    out.finished(repo_id, snapshot)
    return snapshot
