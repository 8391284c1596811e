"""The download panel: a hub download in a thread worker, with an overall bar and a file bar.

The worker drives `exo_tui.hub.downloads.download` (a generator of progress events) and posts what
it yields as messages; `Finished` and `Failed` bubble up to the app, which picks the new model or
says what went wrong. Cancelling sets the download's Event: partial files stay in the cache, so
choosing the model again resumes them.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import ProgressBar, Static
from textual.worker import get_current_worker

from engine.errors import EngineError
from engine.kv_memory import format_bytes
from engine.loading import run_loading
from exo_tui.app.keys import shown
from exo_tui.app.widgets import quiet
from exo_tui.hub.downloads import download
from exo_tui.hub.errors import DownloadCancelled, HubError
from exo_tui.hub.progress import DownloadProgress

# Bytes land in chunks far faster than a screen redraws: post at most this often (seconds),
# plus every file's last chunk.
PROGRESS_INTERVAL = 0.1


def overall_text(progress: DownloadProgress) -> str:
    return (
        f"{format_bytes(progress.bytes_done)} / {format_bytes(progress.bytes_total)} · "
        f"{progress.files_done} of {progress.files_total} files"
    )


def file_text(progress: DownloadProgress) -> Text:
    return Text.assemble(
        progress.file,
        (f"  {format_bytes(progress.file_bytes)} / {format_bytes(progress.file_total)}", "dim"),
    )


class DownloadPanel(Vertical):
    """One download at a time; hidden while none runs."""

    class Progressed(Message):
        def __init__(self, progress: DownloadProgress) -> None:
            super().__init__()
            self.progress = progress

    class Finished(Message):
        """The repo is in the Hugging Face cache, at `snapshot`."""

        def __init__(self, repo_id: str, snapshot: Path) -> None:
            super().__init__()
            self.repo_id = repo_id
            self.snapshot = snapshot

    class Failed(Message):
        """The download stopped: `error` says why and what to do; `cancelled` by the user."""

        def __init__(self, repo_id: str, error: str, *, cancelled: bool = False) -> None:
            super().__init__()
            self.repo_id = repo_id
            self.error = error
            self.cancelled = cancelled

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.repo_id: str | None = None
        self.last: DownloadProgress | None = None
        self._cancel = threading.Event()

    def compose(self) -> ComposeResult:
        yield Static(id="download-repo")
        # A known total from the start: an unknown one animates 15 times a second.
        yield ProgressBar(total=1, show_eta=False, id="download-overall")
        yield Static(id="download-bytes")
        yield Static(id="download-file")
        yield ProgressBar(total=1, show_eta=False, id="download-file-bar")
        yield Static(id="download-hint")

    def on_mount(self) -> None:
        self.border_title = "Download"
        self.display = False

    @property
    def active(self) -> bool:
        return self.repo_id is not None

    def start(self, repo_id: str) -> None:
        """Show the panel and download `repo_id` in a thread worker."""
        self.begin(repo_id)
        self._cancel = threading.Event()
        self._fetch(repo_id, self._cancel)

    def begin(self, repo_id: str) -> None:
        """Show the panel for `repo_id` with empty bars (the worker fills them)."""
        self.repo_id = repo_id
        self.last = None
        quiet.show(self.query_one("#download-repo", Static), Text(repo_id, style="bold"))
        quiet.show(self.query_one("#download-bytes", Static), "asking the hub…")
        quiet.show(self.query_one("#download-file", Static), "")
        quiet.show(
            self.query_one("#download-hint", Static),
            Text(f"{shown('app.stop')} cancels; a retry resumes", style="dim"),
        )
        for bar in self.query(ProgressBar):
            bar.update(total=1, progress=0)
        self.display = True

    def show_progress(self, progress: DownloadProgress) -> None:
        self.last = progress
        self.query_one("#download-overall", ProgressBar).update(
            total=max(progress.bytes_total, 1), progress=progress.bytes_done
        )
        self.query_one("#download-file-bar", ProgressBar).update(
            total=max(progress.file_total, 1), progress=progress.file_bytes
        )
        quiet.show(self.query_one("#download-bytes", Static), overall_text(progress))
        quiet.show(self.query_one("#download-file", Static), file_text(progress))

    def cancel(self) -> bool:
        """Stop the running download (partial files stay); False when none runs."""
        if not self.active or self._cancel.is_set():
            return False
        self._cancel.set()
        quiet.show(self.query_one("#download-hint", Static), Text("cancelling…", style="yellow"))
        return True

    def on_unmount(self) -> None:
        # The app is closing: let the download threads stop instead of holding the exit.
        self._cancel.set()

    @on(Progressed)
    def _progressed(self, message: Progressed) -> None:
        if message.progress.repo_id == self.repo_id:
            self.show_progress(message.progress)

    @on(Finished)
    @on(Failed)
    def _ended(self) -> None:
        # The message bubbles on to the app, which picks the model or reports the error.
        self.repo_id = None
        self.display = False

    @work(thread=True, exclusive=True, group="download")
    def _fetch(self, repo_id: str, cancel: threading.Event) -> None:
        worker = get_current_worker()
        posted = 0.0
        unsent: DownloadProgress | None = None

        def progressed(progress: DownloadProgress) -> None:
            nonlocal posted, unsent
            if worker.is_cancelled:
                cancel.set()
            now = time.monotonic()
            if now - posted >= PROGRESS_INTERVAL or progress.file_bytes >= progress.file_total:
                self.post_message(self.Progressed(progress))
                posted, unsent = now, None
            else:
                unsent = progress

        try:
            snapshot: Path = run_loading(download(repo_id, cancel=cancel), progressed)
        except DownloadCancelled as error:
            self.post_message(self.Failed(repo_id, str(error), cancelled=True))
            return
        except (HubError, EngineError) as error:  # offline, gated, missing, disk, integrity
            self.post_message(self.Failed(repo_id, str(error)))
            return
        except Exception as error:  # an unexpected failure must not take the app down
            self.post_message(self.Failed(repo_id, f"{type(error).__name__}: {error}"))
            return
        if unsent is not None:
            self.post_message(self.Progressed(unsent))
        self.post_message(self.Finished(repo_id, snapshot))
