"""Downloads from the TUI, against a local stand-in for the hub (tests/hub_server.py).

The picker lists catalogue models that are not on disk; choosing one asks first, Enter downloads
it with its bars, and the model is then chosen and launches. Esc cancels and a retry resumes;
a missing, gated or offline repo is reported and the app keeps running.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from huggingface_hub import constants as hf_constants
from rich.text import Text
from textual.pilot import Pilot
from textual.widgets import OptionList, ProgressBar, Static

from engine.kv_memory import format_bytes
from engine.models.cards import read_card
from exo_tui.app.main import ExoTuiApp
from exo_tui.app.screens.download_confirm import DownloadConfirm
from exo_tui.app.screens.model_picker import ModelPicker
from exo_tui.app.widgets.download import DownloadPanel
from exo_tui.cluster.control.state import RunnerReady
from exo_tui.hub import fetch
from exo_tui.hub.cache import repo_folder
from exo_tui.hub.catalogue import CatalogueEntry
from exo_tui.hub.progress import DownloadProgress
from tests.app.helpers import fixed_stats, wait_until
from tests.hub_server import HubServer, use_hub

SIZE = (120, 40)
REPO = "mlx-community/tiny-llama-test"
pytestmark = pytest.mark.anyio


def catalogue_entry(model: Path, repo: str = REPO) -> CatalogueEntry:
    """A catalogue entry for a tiny model folder, as the hub will serve it under `repo`."""
    card = read_card(model)
    config = json.loads((model / "config.json").read_text())
    return CatalogueEntry(
        repo=repo,
        family="llama",
        model_type=card.model_type,
        parameters=card.num_parameters,
        layers=card.num_layers,
        hidden_size=card.hidden_size,
        intermediate_size=config["intermediate_size"],
        heads=card.num_attention_heads,
        kv_heads=card.num_kv_heads,
        vocab_size=card.vocab_size,
        bytes=card.bytes_on_disk,
        bits=16,
        group_size=64,
        context_length=card.context_length or 2048,
        reasoning=False,
        tool_format="json_tools",
        tensor=card.supports_tensor,
    )


@pytest.fixture
def hub(tiny_llama: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubServer]:
    with HubServer() as server:
        server.add_repo(REPO, tiny_llama)
        use_hub(monkeypatch, server, tmp_path / "hf-home")  # HF_HUB_CACHE: per test (conftest)
        yield server


def total_bytes(model: Path) -> int:
    return sum(p.stat().st_size for p in model.iterdir() if p.is_file())


def make_app(models_dir: Path, catalogue: list[CatalogueEntry]) -> ExoTuiApp:
    return ExoTuiApp(
        model="tiny-llama",
        models_dirs=[models_dir],
        node_stats=fixed_stats(),
        bundled=False,
        catalogue=catalogue,
    )


def picker_lines(app: ExoTuiApp) -> list[str]:
    options = app.screen.query_one("#picker-list", OptionList)
    lines: list[str] = []
    for index in range(options.option_count):
        prompt = options.get_option_at_index(index).prompt
        lines.append(prompt.plain if isinstance(prompt, Text) else str(prompt))
    return lines


async def open_picker(app: ExoTuiApp, pilot: Pilot[None]) -> None:
    await wait_until(pilot, lambda: app.selection.card is not None)
    await pilot.press("ctrl+o")
    await wait_until(pilot, lambda: isinstance(app.screen, ModelPicker))


async def ask_to_download(app: ExoTuiApp, pilot: Pilot[None], words: str) -> None:
    await open_picker(app, pilot)
    await pilot.press(*words, "enter")
    await wait_until(pilot, lambda: isinstance(app.screen, DownloadConfirm))


def notices(app: ExoTuiApp) -> list[str]:
    return [n.message for n in app._notifications]


def partial_bytes(blobs: Path) -> int:
    """Bytes in the cache's partial files (a file may be renamed away while we look)."""
    size = 0
    for partial in blobs.glob("*.incomplete"):
        with contextlib.suppress(OSError):
            size += partial.stat().st_size
    return size


def record_progress(monkeypatch: pytest.MonkeyPatch) -> list[DownloadProgress]:
    shown: list[DownloadProgress] = []
    show = DownloadPanel.show_progress

    def spy(panel: DownloadPanel, progress: DownloadProgress) -> None:
        shown.append(progress)
        show(panel, progress)

    monkeypatch.setattr(DownloadPanel, "show_progress", spy)
    return shown


async def test_the_picker_marks_catalogue_models_with_their_size_and_fit(models_dir: Path) -> None:
    app = ExoTuiApp(
        model="tiny-llama", models_dirs=[models_dir], node_stats=fixed_stats(), bundled=False
    )
    async with app.run_test(size=SIZE) as pilot:
        await open_picker(app, pilot)
        lines = picker_lines(app)
        assert lines[0].startswith("tiny-llama") and "not downloaded" not in lines[0]
        small = next(line for line in lines if "Llama-3.2-1B-Instruct-4bit" in line)
        assert "catalogue · not downloaded" in small
        assert "700.0 MB" in small and "fits (pipeline)" in small
        huge = next(line for line in lines if "Llama-3.3-70B-Instruct-4bit" in line)
        assert "does not fit" in huge  # 12 GB free on the one node


async def test_a_catalogue_model_downloads_with_its_bars_then_is_chosen_and_launches(
    models_dir: Path, tiny_llama: Path, hub: HubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    shown = record_progress(monkeypatch)
    entry = catalogue_entry(tiny_llama)
    app = make_app(models_dir, [entry])
    total = total_bytes(tiny_llama)
    async with app.run_test(size=SIZE) as pilot:
        await open_picker(app, pilot)
        listed = next(line for line in picker_lines(app) if REPO in line)
        assert "not downloaded" in listed and "fits (pipeline)" in listed
        await pilot.press(*"test", "enter")
        await wait_until(pilot, lambda: isinstance(app.screen, DownloadConfirm))
        summary = str(app.screen.query_one("#download-summary", Static).render())
        assert format_bytes(entry.bytes) in summary  # the weights, as the catalogue says
        assert "models--mlx-community--tiny-llama-test" in summary

        await pilot.press("enter")
        await wait_until(
            pilot, lambda: app.selection.card is not None and app.selection.card.name == REPO
        )
        last = shown[-1]
        assert (last.bytes_done, last.files_done) == (total, last.files_total)
        assert {p.file for p in shown} == {p.name for p in tiny_llama.iterdir() if p.is_file()}
        assert app.query_one("#download-overall", ProgressBar).percentage == 1.0
        panel = app.query_one(DownloadPanel)
        assert not panel.active and not panel.display
        assert app.selection.card is not None
        assert app.selection.card.source == "hf_cache"
        assert Path(app.selection.card.path).is_relative_to(repo_folder(REPO))
        assert any(f"{REPO} is downloaded" in n for n in notices(app))
        # Then it loads, without another key.
        await wait_until(
            pilot,
            lambda: (
                app.conversation.backend is not None
                and isinstance(app.state.nodes[0].runner, RunnerReady)
            ),
        )
        assert app.conversation.backend is not None and app.conversation.backend.card.name == REPO

        # On disk now: the picker lists it once, as a model found in the cache.
        await open_picker(app, pilot)
        listed = [line for line in picker_lines(app) if REPO in line]
        assert len(listed) == 1 and "not downloaded" not in listed[0]


async def test_escape_cancels_a_download_and_a_retry_resumes(
    models_dir: Path, tiny_llama: Path, hub: HubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Slow the bytes down so there is a download in flight to cancel.
    slow = threading.Event()
    slow.set()
    update = fetch.ProgressHook.update

    def slow_update(hook: fetch.ProgressHook, n: float | None = 1) -> None:
        if slow.is_set():
            time.sleep(0.01)
        update(hook, n)

    monkeypatch.setattr(fetch.ProgressHook, "update", slow_update)
    monkeypatch.setattr(hf_constants, "DOWNLOAD_CHUNK_SIZE", 1024)
    app = make_app(models_dir, [catalogue_entry(tiny_llama)])
    total = total_bytes(tiny_llama)
    async with app.run_test(size=SIZE) as pilot:
        await ask_to_download(app, pilot, "test")
        await pilot.press("enter")
        panel = app.query_one(DownloadPanel)
        blobs = repo_folder(REPO) / "blobs"
        await wait_until(pilot, lambda: partial_bytes(blobs) > 0 and panel.last is not None)
        assert panel.display and "Esc cancels" in str(
            panel.query_one("#download-hint", Static).render()
        )
        await pilot.press("escape")
        await wait_until(pilot, lambda: not panel.active)
        assert any("cancelled" in n and "resume" in n for n in notices(app))
        assert app.selection.card is not None and app.selection.card.name == "tiny-llama"
        assert partial_bytes(blobs) > 0  # partial files are kept

        # The app keeps running; choosing it again fetches only the rest.
        slow.clear()
        hub.reset_counts()
        await ask_to_download(app, pilot, "test")
        await pilot.press("enter")
        await wait_until(
            pilot, lambda: app.selection.card is not None and app.selection.card.name == REPO
        )
        assert 0 < hub.bytes_served() < total
        assert not list(blobs.glob("*.incomplete"))


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("missing", "No model repo mlx-community/not-there"),
        ("gated", "is gated"),
        ("offline", "HF_HUB_OFFLINE is set"),
    ],
)
async def test_a_download_error_is_shown_and_the_app_keeps_running(
    models_dir: Path,
    tiny_llama: Path,
    hub: HubServer,
    monkeypatch: pytest.MonkeyPatch,
    case: str,
    expected: str,
) -> None:
    repo = {"missing": "mlx-community/not-there", "gated": "mlx-community/gated"}.get(case, REPO)
    if case == "gated":
        hub.add_repo(repo, tiny_llama, status="gated")
    if case == "offline":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    app = make_app(models_dir, [catalogue_entry(tiny_llama, repo)])
    async with app.run_test(size=SIZE) as pilot:
        await ask_to_download(app, pilot, repo.split("/")[1])
        await pilot.press("enter")
        await wait_until(pilot, lambda: any(expected in n for n in notices(app)))
        panel = app.query_one(DownloadPanel)
        await wait_until(pilot, lambda: not panel.active and not panel.display)
        assert app.selection.card is not None and app.selection.card.name == "tiny-llama"
        await open_picker(app, pilot)  # still answering keys


async def test_escape_in_the_question_downloads_nothing(
    models_dir: Path, tiny_llama: Path, hub: HubServer
) -> None:
    app = make_app(models_dir, [catalogue_entry(tiny_llama)])
    async with app.run_test(size=SIZE) as pilot:
        await ask_to_download(app, pilot, "test")
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, DownloadConfirm))
        await pilot.pause(0.2)
        assert not app.query_one(DownloadPanel).active
        assert hub.api_calls == 0 and hub.bytes_served() == 0
