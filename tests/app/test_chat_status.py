"""The chat's border names the model and its state; an empty chat says what to do next."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from textual.containers import Vertical
from textual.pilot import Pilot
from textual.widgets import Static

from engine.generate import CancelToken
from engine.prefill import PrefillPace
from engine.types import ChatRequest, Chunk, DoneChunk, Stats, ToolCallChunk, Usage
from exo_tui.app.chat_status import EXAMPLES, model_state
from exo_tui.app.main import ExoTuiApp
from exo_tui.app.widgets.chat import AnswerView, ChatPane, StatsLine
from exo_tui.app.widgets.prompt import PromptInput
from exo_tui.app.widgets.tool_card import ToolCallView
from exo_tui.chat.backend import Deliver, LocalBackend, answer_on_a_thread
from exo_tui.cluster.control.placement import Placement, place
from exo_tui.cluster.control.state import (
    ClusterState,
    InstancePlaced,
    LoadProgressed,
    LoadStarted,
    NodeSeen,
    apply,
)
from tests.app.helpers import fixed_stats, wait_until
from tests.app.test_app import SIZE, launch, make_app
from tests.cards import tiny_card

pytestmark = pytest.mark.anyio


def hint_of(pane: ChatPane) -> str:
    hint = pane.query_one(".chat-hint")
    return str(hint.render()) if hint.display else ""


async def test_the_border_and_the_hint_follow_the_model(models_dir: Path) -> None:
    app = make_app(models_dir)
    async with app.run_test(size=SIZE) as pilot:
        chat = app.screen.query_one("#chat", Vertical)
        pane = app.query_one(ChatPane)
        await wait_until(pilot, lambda: chat.border_title == "Chat · tiny-llama · not loaded")
        assert hint_of(pane) == "tiny-llama is not loaded: Ctrl+L loads it."

        await launch(app, pilot)
        await wait_until(pilot, lambda: chat.border_title == "Chat · tiny-llama · ready")
        assert all(question in hint_of(pane) for question in EXAMPLES)

        await pilot.click(PromptInput)
        await pilot.press(*"Hi", "enter")
        await wait_until(pilot, lambda: bool(app.query(StatsLine)))
        assert hint_of(pane) == ""
        await pilot.press("ctrl+n")
        await wait_until(pilot, lambda: "try one that uses its tools" in hint_of(pane))


async def test_a_chat_before_any_model_says_how_to_pick_one(tmp_path: Path) -> None:
    from exo_tui.app.main import ExoTuiApp

    empty = tmp_path / "models"
    empty.mkdir()
    app = ExoTuiApp(models_dirs=[empty], node_stats=fixed_stats(), bundled=False)
    async with app.run_test(size=SIZE) as pilot:
        pane = app.query_one(ChatPane)
        await wait_until(pilot, lambda: hint_of(pane) == "No model chosen: Ctrl+O picks one.")


def test_loading_counts_the_layers_of_every_node() -> None:
    card = tiny_card(name="m", num_layers=16)
    state = ClusterState()
    for node in ("a", "b"):
        stats = fixed_stats()(()).model_copy(update={"node_id": node, "name": node})
        state = apply(state, NodeSeen(stats=stats, at=0.0))
    placement = place(tuple(n.stats for n in state.online_nodes), card, "pipeline")
    assert isinstance(placement, Placement)
    state = apply(state, InstancePlaced(placement=placement))
    assert model_state(state, answering=False) == "not loaded"
    for node in ("a", "b"):
        state = apply(state, LoadStarted(node_id=node, model="m", total=8))
    state = apply(state, LoadProgressed(node_id="a", layers_loaded=5, total=8))
    assert model_state(state, answering=False) == "loading 5/16"


async def test_with_no_model_asked_for_the_demo_loads_by_itself(tmp_path: Path) -> None:
    from exo_tui.app.main import ExoTuiApp

    empty = tmp_path / "models"
    empty.mkdir()
    app = ExoTuiApp(models_dirs=[empty], node_stats=fixed_stats(), load_demo=True)
    async with app.run_test(size=SIZE) as pilot:
        chat = app.screen.query_one("#chat", Vertical)
        await wait_until(pilot, lambda: chat.border_title == "Chat · demo · ready", timeout=60)
        assert app.conversation.backend is not None


async def test_a_model_asked_for_by_name_waits_for_ctrl_l(models_dir: Path) -> None:
    from exo_tui.app.main import ExoTuiApp

    app = ExoTuiApp(
        model="tiny-llama", models_dirs=[models_dir], node_stats=fixed_stats(), load_demo=True
    )
    async with app.run_test(size=SIZE) as pilot:
        chat = app.screen.query_one("#chat", Vertical)
        await wait_until(pilot, lambda: chat.border_title == "Chat · tiny-llama · not loaded")
        await pilot.pause(0.5)
        assert app.conversation.backend is None


async def test_a_slow_prefill_shows_its_progress_and_esc_stops_it_between_steps(
    models_dir: Path,
) -> None:
    app = make_app(models_dir)
    async with app.run_test(size=SIZE) as pilot:
        chat = app.screen.query_one("#chat", Vertical)
        await launch(app, pilot)
        backend = app.conversation.backend
        assert isinstance(backend, LocalBackend)
        # A model too slow for its prompt to go in one step: one token a step (engine.prefill).
        backend.loaded.prefill_pace = PrefillPace(step_s=1e-6)
        app.query_one(PromptInput).text = "Tell me about the sea and the ships. " * 50
        await pilot.press("enter")
        answer = await wait_until_answer(app, pilot)
        await wait_until(pilot, lambda: chat.border_title == "Chat · tiny-llama · prefilling")
        line = str(answer.render())
        assert line.startswith("prefilling ") and line.endswith(" s · Esc stops"), line
        done, total = (int(n.replace(",", "")) for n in line.split()[1:4:2])
        assert 0 < done < total
        await pilot.press("escape")
        await wait_until(pilot, lambda: bool(answer.query(StatsLine)), timeout=30)
        stats = answer.query_one(StatsLine)
        assert stats.done.finish_reason == "cancelled"
        assert stats.done.usage.completion_tokens == 0  # stopped inside the prefill
        await wait_until(pilot, lambda: chat.border_title == "Chat · tiny-llama · ready")


async def wait_until_answer(app: ExoTuiApp, pilot: Pilot[None]) -> AnswerView:
    await wait_until(pilot, lambda: bool(app.query(AnswerView)))
    return app.query(AnswerView).last()


class ToolFirst:
    """The loaded model, but its first round is a tool call (a tiny random model makes none):
    the round after the tool's result is the real model's, prefilled by the engine."""

    def __init__(self, backend: LocalBackend) -> None:
        self._backend = backend
        self.rounds = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self._backend, name)

    def answer(self, request: ChatRequest, cancel: CancelToken, deliver: Deliver) -> bool:
        return answer_on_a_thread(self.generate, request, cancel, deliver)

    def generate(self, request: ChatRequest, cancel: CancelToken | None) -> Iterator[Chunk]:
        self.rounds += 1
        if self.rounds > 1:
            return self._backend.generate(request, cancel)
        usage = Usage(prompt_tokens=1, completion_tokens=1)
        stats = Stats(ttft_s=0.1, prefill_tps=1.0, decode_tps=1.0, peak_memory_bytes=0)
        return iter(
            [
                ToolCallChunk(id="c1", name="calculator", arguments={"expression": "12*34"}),
                DoneChunk(finish_reason="tool_calls", usage=usage, stats=stats, token_ids=(1,)),
            ]
        )


async def test_the_round_after_a_tool_call_shows_its_prefill_too(models_dir: Path) -> None:
    app = make_app(models_dir)
    async with app.run_test(size=SIZE) as pilot:
        chat = app.screen.query_one("#chat", Vertical)
        await launch(app, pilot)
        backend = app.conversation.backend
        assert isinstance(backend, LocalBackend)
        backend.loaded.prefill_pace = PrefillPace(step_s=1e-6)  # one token a step
        app.conversation.backend = ToolFirst(backend)  # type: ignore[assignment]
        app.query_one(PromptInput).text = "What is 12 times 34? Tell me about the sea. " * 30
        await pilot.press("enter")
        answer = await wait_until_answer(app, pilot)
        await wait_until(pilot, lambda: bool(answer.query(ToolCallView)), timeout=30)
        await wait_until(pilot, lambda: bool(answer.query(".answer-wait")), timeout=30)
        line = str(answer.query_one(".answer-wait", Static).render())
        assert line.startswith("prefilling ") and line.endswith(" s · Esc stops"), line
        done, total = (int(n.replace(",", "")) for n in line.split()[1:4:2])
        assert 0 < done < total
        await wait_until(pilot, lambda: chat.border_title == "Chat · tiny-llama · prefilling")
        await pilot.press("escape")
        await wait_until(pilot, lambda: len(answer.query(StatsLine)) == 2, timeout=30)
        assert answer.query(StatsLine).last().done.finish_reason == "cancelled"
        assert not answer.query(".answer-wait")
        await wait_until(pilot, lambda: chat.border_title == "Chat · tiny-llama · ready")
