"""While the user types, the app prefills the next turn: its prompt is then all cached but the
new message, and sending stops a prefill that is still running."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from textual.pilot import Pilot

from engine.generate import next_turn_prefix, render_prompt
from engine.loading import LoadedModel
from engine.types import ChatRequest, Message
from exo_tui.app.main import ExoTuiApp
from exo_tui.app.widgets.chat import StatsLine
from exo_tui.app.widgets.prompt import PromptInput
from exo_tui.chat.backend import LocalBackend
from exo_tui.cluster.control.state import RunnerReady
from tests.app.helpers import fixed_stats, wait_until

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def launched(
    tiny_llama: Path, tmp_path: Path, max_tokens: int
) -> AsyncIterator[tuple[ExoTuiApp, Pilot[None], LoadedModel]]:
    """The app with the tiny model launched and the prompt focused."""
    models = tmp_path / "models"
    shutil.copytree(tiny_llama, models / "tiny-llama")
    app = ExoTuiApp(
        model="tiny-llama", models_dirs=[models], node_stats=fixed_stats(), bundled=False
    )
    app.conversation.max_tokens = max_tokens
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: app.selection.card is not None)
        await pilot.press("ctrl+l")
        await wait_until(pilot, lambda: isinstance(app.state.nodes[0].runner, RunnerReady))
        backend = app.conversation.backend
        assert isinstance(backend, LocalBackend)
        await pilot.click(PromptInput)
        yield app, pilot, backend.loaded


async def test_the_next_turn_is_prefilled_after_an_answer(tiny_llama: Path, tmp_path: Path) -> None:
    async with launched(tiny_llama, tmp_path, max_tokens=16) as (app, pilot, loaded):
        await pilot.press(*"hello there", "enter")
        await wait_until(
            pilot, lambda: bool(app.query(StatsLine)) and not app.conversation.generating
        )
        history = ChatRequest(
            messages=tuple(app.conversation.messages), tools=app.conversation.tools.specs
        )
        prefix = next_turn_prefix(loaded, history)
        # The prefill runs in the answer's worker after the turn: wait for it to be stored.
        await wait_until(pilot, lambda: not app.workers or all(w.is_finished for w in app.workers))
        assert loaded.prompt_cache.reusable(prefix) == len(prefix) - 1  # all of it (a take
        # gives one token back to feed)
        await pilot.press(*"and again", "enter")
        await wait_until(
            pilot, lambda: len(app.query(StatsLine)) == 2 and not app.conversation.generating
        )
        done = app.query(StatsLine).last().done
        assert done.usage.cached_tokens >= len(prefix) - 1
        second = ChatRequest(
            messages=(*history.messages, Message(role="user", content="and again")),
            tools=app.conversation.tools.specs,
        )
        # Only the new message (and its template markers) was prefilled on the critical path.
        new = done.usage.prompt_tokens - done.usage.cached_tokens
        assert new <= len(render_prompt(loaded, second)) - len(prefix) + 1


async def test_a_message_being_typed_is_prefilled_at_each_pause(
    tiny_llama: Path, tmp_path: Path
) -> None:
    async with launched(tiny_llama, tmp_path, max_tokens=8) as (app, pilot, loaded):
        message = "how many layers does each of my nodes hold"
        draft = message[: -len(" hold")]
        await pilot.press(*draft)
        # A pause in the typing: the message so far is prefilled behind the app's back.
        history = ChatRequest(
            messages=app.conversation.history_before_prompt(), tools=app.conversation.tools.specs
        )
        prefix = next_turn_prefix(loaded, history, draft)
        await wait_until(pilot, lambda: loaded.prompt_cache.reusable(prefix) == len(prefix) - 1)
        await pilot.press(*message[len(draft) :], "enter")
        await wait_until(
            pilot, lambda: bool(app.query(StatsLine)) and not app.conversation.generating
        )
        done = app.query(StatsLine).last().done
        prompt = render_prompt(
            loaded,
            history.model_copy(
                update={"messages": (*history.messages, Message(role="user", content=message))}
            ),
        )
        assert done.usage.prompt_tokens == len(prompt)
        # The draft was prefilled as if sent: what it shares with the message was cached, and
        # only the last word and the template's end were left for the critical path.
        shared = next(i for i, (a, b) in enumerate(zip(prefix, prompt, strict=False)) if a != b)
        assert done.usage.cached_tokens >= shared
        assert done.usage.prompt_tokens - done.usage.cached_tokens <= len(prompt) - shared
