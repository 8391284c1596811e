"""The whole app driven by Pilot with a real tiny model: preview, launch, chat, chats, keys."""

from __future__ import annotations

import io
import json
import shutil
import time
from pathlib import Path

import pytest
from rich.console import Console
from textual.widgets import DataTable, ProgressBar, Static

from exo_tui.app.main import ExoTuiApp
from exo_tui.app.screens.chats import ChatsScreen
from exo_tui.app.screens.help import HelpScreen
from exo_tui.app.screens.model_picker import ModelPicker
from exo_tui.app.widgets.chat import AnswerView, ChatPane, StatsLine, UserMessage
from exo_tui.app.widgets.launch import LaunchPanel
from exo_tui.app.widgets.nodes import NodeCard
from exo_tui.app.widgets.prompt import PromptInput
from exo_tui.cluster.control.state import ClusterEvent, LoadProgressed, RunnerFailed, RunnerReady
from exo_tui.store.opening import open_chat_store
from tests.app.helpers import GB, HeldBackend, fixed_stats, wait_until

SIZE = (120, 40)
pytestmark = pytest.mark.anyio


def make_app(models_dir: Path, **kwargs: object) -> ExoTuiApp:
    return ExoTuiApp(
        model="tiny-llama",
        models_dirs=[models_dir],
        node_stats=fixed_stats(),
        bundled=False,
        **kwargs,  # type: ignore[arg-type]
    )


def text_of(app: ExoTuiApp, selector: str) -> str:
    """What a Static shows, as plain text (Rich tables included)."""
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(app.query_one(selector, Static).content)
    return console.export_text()


def runner(app: ExoTuiApp) -> object:
    return app.state.nodes[0].runner


async def launch(app: ExoTuiApp, pilot) -> None:  # type: ignore[no-untyped-def]
    await wait_until(pilot, lambda: app.selection.card is not None)
    await pilot.press("ctrl+l")
    await wait_until(
        pilot, lambda: app.conversation.backend is not None and isinstance(runner(app), RunnerReady)
    )


async def test_start_shows_the_node_and_a_placement_preview(models_dir: Path) -> None:
    app = make_app(models_dir)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.selection.card is not None)
        card = app.query_one(NodeCard)

        def node_text() -> str:
            return str(card.query_one("#node-text", Static).render())

        await wait_until(pilot, lambda: f"{len(app.main.cards)} model" in node_text())
        assert "studio" in node_text() and "cpu" in node_text() and "openblas" in node_text()
        assert "4.0 GB / 16.0 GB" in node_text()  # used / total, from the node's stats
        preview = text_of(app, "#placement")
        assert "fits" in preview and "0–3" in preview and "studio" in preview
        assert "tiny-llama" in text_of(app, "#launch-model")


async def test_memory_is_refreshed_every_second(models_dir: Path) -> None:
    readings = iter([12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1] * 5)
    app = ExoTuiApp(
        model="tiny-llama",
        models_dirs=[models_dir],
        node_stats=lambda models: fixed_stats(available=next(readings) * GB)(models),
    )
    async with app.run_test(size=SIZE) as pilot:
        first = app.state.nodes[0].stats.memory_available_bytes
        await wait_until(
            pilot, lambda: app.state.nodes[0].stats.memory_available_bytes != first, timeout=5
        )


async def test_launch_draws_every_layer_then_chat_streams_and_is_stored(models_dir: Path) -> None:
    app = make_app(models_dir)
    progress: list[int] = []
    dispatch = app.dispatch

    def spy(event: ClusterEvent) -> None:
        if isinstance(event, LoadProgressed):
            progress.append(event.layers_loaded)
        dispatch(event)

    app.dispatch = spy  # type: ignore[method-assign]
    async with app.run_test(size=SIZE) as pilot:
        await launch(app, pilot)
        assert progress == [1, 2, 3, 4]
        assert not app.query_one("#node-load", ProgressBar).display  # the bar goes once ready
        assert "ready" in text_of(app, "#launch-status")

        await pilot.click(PromptInput)
        await pilot.press(*"Hello there")
        await pilot.press("enter")
        await wait_until(pilot, lambda: bool(app.query(StatsLine)))
        assert app.query_one(UserMessage)
        answer = app.query_one(AnswerView)
        assert answer.text.strip()
        assert "tok/s" in str(app.query_one(StatsLine).render())

        store, chat = app.conversation.store, app.conversation.summary
        assert store is not None and chat is not None
        chat_id = chat.id
        await wait_until(pilot, lambda: any(c.id == chat_id for c in store.list_chats()))
        stored = store.messages(chat_id)
        assert [m.role for m in stored] == ["system", "user", "assistant"]
        assert stored[1].content == "Hello there"
        assert stored[2].content == answer.text.strip()


async def test_an_answer_done_before_it_is_on_screen_is_shown_whole(
    models_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On a loaded machine the engine can finish before the app's thread mounts the answer: its
    # chunks wait for the mount, they are not lost (nor raise NoActiveAppError in the worker).
    add_turn = ChatPane.add_turn

    def slow_add_turn(pane: ChatPane, text: str, answer: AnswerView) -> object:
        time.sleep(0.5)  # the GIL is free: the worker generates every token meanwhile
        return add_turn(pane, text, answer)

    monkeypatch.setattr(ChatPane, "add_turn", slow_add_turn)
    app = make_app(models_dir)
    app.conversation.max_tokens = 4
    async with app.run_test(size=SIZE) as pilot:
        await launch(app, pilot)
        await pilot.click(PromptInput)
        await pilot.press(*"Hello there", "enter")
        await wait_until(
            pilot, lambda: bool(app.query(StatsLine)) and not app.conversation.generating
        )
        assert not [n.message for n in app._notifications if n.severity == "error"]
        assert app.query_one(AnswerView).text.strip() == app.conversation.messages[-1].content


async def test_escape_stops_the_answer(models_dir: Path) -> None:
    app = make_app(models_dir)
    async with app.run_test(size=SIZE) as pilot:
        await launch(app, pilot)
        assert app.conversation.backend is not None
        # Held after its first words, until Esc: the answer cannot end before the key lands.
        held = HeldBackend(app.conversation.backend, after=1)
        app.conversation.backend = held  # type: ignore[assignment]
        await pilot.press(*"Tell me a long story")
        await pilot.press("enter")
        await wait_until(
            pilot, lambda: bool(app.query(AnswerView)) and bool(app.query_one(AnswerView).text)
        )
        prompt = app.query_one(PromptInput)
        assert not prompt.cursor_blink  # steady while the answer streams: no redraws for it
        await pilot.press("escape")
        await wait_until(pilot, lambda: bool(app.query(StatsLine)))
        assert "cancelled" in str(app.query_one(StatsLine).render())
        assert not app.conversation.generating
        assert prompt.cursor_blink


async def test_unload_frees_the_model(models_dir: Path) -> None:
    app = make_app(models_dir)
    async with app.run_test(size=SIZE) as pilot:
        await launch(app, pilot)
        await pilot.press("ctrl+u")
        await wait_until(
            pilot, lambda: app.conversation.backend is None and app.state.instance is None
        )
        assert runner(app).state == "idle"  # type: ignore[attr-defined]


async def test_picker_filters_and_chooses(models_dir: Path, tiny_model_factory) -> None:  # type: ignore[no-untyped-def]
    shutil.copytree(tiny_model_factory("qwen3"), models_dir / "tiny-qwen3")
    app = make_app(models_dir)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: len(app.main.cards) == 2)
        await pilot.press("ctrl+o")
        await wait_until(pilot, lambda: isinstance(app.screen, ModelPicker))
        await pilot.press(*"qwen")
        await pilot.press("enter")
        await wait_until(
            pilot,
            lambda: app.selection.card is not None and app.selection.card.name == "tiny-qwen3",
        )
        assert "tiny-qwen3" in text_of(app, "#launch-model")


async def test_strategy_toggle_and_unsupported_tensor(models_dir: Path) -> None:
    app = make_app(models_dir)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.selection.card is not None)
        await pilot.press("ctrl+t")
        assert app.selection.strategy == "tensor"
        assert "tensor over 1 node" in text_of(app, "#placement")
        assert app.selection.card is not None
        no_tensor = app.selection.card.model_copy(
            update={"supports_tensor": False, "tensor_unsupported_reason": "no shard() here"}
        )
        app.main.choose_model(no_tensor)
        await pilot.pause()
        assert app.selection.strategy == "pipeline"
        assert app.query_one("#strategy-tensor").disabled
        assert "no shard() here" in text_of(app, "#strategy-note")


async def test_a_model_that_does_not_fit_is_refused(models_dir: Path) -> None:
    app = make_app(models_dir)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.selection.card is not None)
        assert app.selection.card is not None
        huge = app.selection.card.model_copy(update={"bytes_on_disk": 40 * GB})
        app.main.choose_model(huge)
        await pilot.pause()
        preview = text_of(app, "#placement")
        assert "short by" in preview and "studio" in preview
        await pilot.press("ctrl+l")
        await pilot.pause()
        assert app.state.instance is None
        assert app.conversation.backend is None


async def test_a_folder_missing_an_indexed_file_is_refused_by_that_file_s_name(
    models_dir: Path,
) -> None:
    folder = models_dir / "tiny-llama"
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    lost = sorted(set(index["weight_map"].values()))[-1]
    (folder / lost).unlink()
    app = make_app(models_dir)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.selection.card is not None)
        await pilot.press("ctrl+l")
        await wait_until(pilot, lambda: any(lost in n.message for n in app._notifications))
        (message,) = [n.message for n in app._notifications if lost in n.message]
        assert f"Copy {lost} into {folder}" in message and "download" not in message
        assert app.state.instance is None and app.conversation.backend is None


async def test_a_model_failing_to_load_marks_the_node_failed(models_dir: Path) -> None:
    broken = models_dir / "tiny-llama"
    config = json.loads((broken / "config.json").read_text())
    config["hidden_size"] = 96  # the weights no longer match
    (broken / "config.json").write_text(json.dumps(config))
    app = make_app(models_dir)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.selection.card is not None)
        await pilot.press("ctrl+l")
        await wait_until(pilot, lambda: isinstance(runner(app), RunnerFailed))
        assert "failed" in text_of(app, "#launch-status")
        assert app.state.instance_status == "failed"
        # The app keeps running: the picker still opens.
        await pilot.press("ctrl+o")
        await wait_until(pilot, lambda: isinstance(app.screen, ModelPicker))


async def test_a_chat_is_there_after_a_restart(models_dir: Path) -> None:
    app = make_app(models_dir)
    async with app.run_test(size=SIZE) as pilot:
        await launch(app, pilot)
        await pilot.press(*"Remember me")
        await pilot.press("enter")
        await wait_until(pilot, lambda: bool(app.query(StatsLine)))
    again = make_app(models_dir)
    async with again.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: isinstance(again.screen, ChatsScreen))
        table = again.screen.query_one(DataTable)
        assert table.row_count == 1
        await pilot.press("enter")
        await wait_until(pilot, lambda: bool(again.query(UserMessage)))
        assert "Remember me" in str(again.query_one(UserMessage).render())
        assert again.query_one(ChatPane).query(AnswerView)


async def test_an_unreadable_chat_database_is_set_aside(models_dir: Path, exo_home: Path) -> None:
    db = exo_home / "data" / "chats.db"
    db.parent.mkdir(parents=True)
    db.write_bytes(b"this is not a database" * 100)
    app = make_app(models_dir)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        notices = [n.message for n in app._notifications]
        assert any("could not be read" in n and "new one started" in n for n in notices)
        assert list(db.parent.glob("chats.db.broken-*"))
    store, notice = open_chat_store(db)
    assert notice is None
    store.close()


async def test_help_lists_every_binding_and_the_palette_has_them(models_dir: Path) -> None:
    app = make_app(models_dir)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f1")
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen))
        table = app.screen.query_one(DataTable)
        ids = {str(table.get_row_at(i)[2]) for i in range(table.row_count)}
        assert {"app.launch", "app.stop", "app.pick_model", "app.chats", "app.quit"} <= ids
        await pilot.press("escape")
        titles = [command.title for command in app.get_system_commands(app.screen)]
        assert any(title.startswith("Launch") for title in titles)
        assert any(title.startswith("Model") for title in titles)


async def test_keys_can_be_remapped(models_dir: Path, exo_home: Path) -> None:
    (exo_home / "config").mkdir(parents=True)
    (exo_home / "config" / "keys.toml").write_text('[keys]\n"app.launch" = "f5"\n')
    app = make_app(models_dir)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.selection.card is not None)
        await pilot.press("f5")
        await wait_until(pilot, lambda: app.conversation.backend is not None)


async def test_a_bad_keymap_is_reported_and_the_app_runs(models_dir: Path, exo_home: Path) -> None:
    (exo_home / "config").mkdir(parents=True)
    (exo_home / "config" / "keys.toml").write_text('[keys]\n"app.nope" = "f5"\n')
    app = make_app(models_dir)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert any("unknown binding id 'app.nope'" in n.message for n in app._notifications)
        assert isinstance(app.query_one(LaunchPanel), LaunchPanel)


async def test_no_models_says_how_to_get_one(tmp_path: Path) -> None:
    empty = tmp_path / "empty-models"
    empty.mkdir()
    app = ExoTuiApp(models_dirs=[empty], node_stats=fixed_stats(), bundled=False)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(
            pilot, lambda: any("No models found" in n.message for n in app._notifications)
        )
        assert app.selection.card is None
        await pilot.press("ctrl+l")
        await pilot.pause()
        assert any("Pick a model first" in n.message for n in app._notifications)
