"""The app's main screens, set up the same way for snapshot tests and for `make screenshots`.

Each scene starts the real app on a tiny model with fixed node stats, then brings it to one state
through the same reducer events a real run produces (or real chunks, scripted), so pictures do not
depend on timing, the machine's memory or its name.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from textual.pilot import Pilot
from textual.widgets import Static

from engine.types import DoneChunk, Stats, TextChunk, ToolCallChunk, ToolResult, Usage
from exo_tui.app.main import ExoTuiApp
from exo_tui.app.widgets.chat import ChatPane, PromptInput
from exo_tui.app.widgets.nodes import NodeCard
from exo_tui.cluster.state import (
    InstancePlaced,
    LoadFailed,
    LoadFinished,
    LoadProgressed,
    LoadStarted,
)
from tests.app.helpers import fixed_stats, wait_until

SIZE = (120, 36)
Scene = Callable[[ExoTuiApp, Pilot[None]], Awaitable[None]]


def scene_app(models_dir: Path | None) -> ExoTuiApp:
    app = ExoTuiApp(
        model="tiny-llama" if models_dir else None,
        models_dirs=[models_dir] if models_dir else [],
        node_stats=fixed_stats(),
        bundled=False,
    )
    app.animation_level = "none"
    return app


async def settle(app: ExoTuiApp, pilot: Pilot[None]) -> None:
    app.query_one(PromptInput).cursor_blink = False
    app.clear_notifications()
    await pilot.pause(0.2)


async def _model_chosen(app: ExoTuiApp, pilot: Pilot[None]) -> None:
    await wait_until(pilot, lambda: app.card is not None)
    # The node's card counts the models found; wait until it has been redrawn with them.
    text = app.query_one(NodeCard).query_one("#node-text", Static)
    await wait_until(pilot, lambda: f"{len(app.cards)} model" in str(text.render()))


async def empty(app: ExoTuiApp, pilot: Pilot[None]) -> None:
    await pilot.pause(0.3)
    await settle(app, pilot)


async def placement(app: ExoTuiApp, pilot: Pilot[None]) -> None:
    await _model_chosen(app, pilot)
    await settle(app, pilot)


def _placed(app: ExoTuiApp) -> tuple[str, str, int]:
    assert app.card is not None and app.placement is not None
    app.dispatch(InstancePlaced(placement=app.placement))  # type: ignore[arg-type]
    return app.local_id, app.card.name, app.card.num_layers


async def loading(app: ExoTuiApp, pilot: Pilot[None]) -> None:
    await _model_chosen(app, pilot)
    node, model, total = _placed(app)
    app.dispatch(LoadStarted(node_id=node, model=model, total=total))
    app.dispatch(LoadProgressed(node_id=node, layers_loaded=total // 2, total=total))
    await settle(app, pilot)


async def chatting(app: ExoTuiApp, pilot: Pilot[None]) -> None:
    await _model_chosen(app, pilot)
    node, model, total = _placed(app)
    app.dispatch(LoadStarted(node_id=node, model=model, total=total))
    app.dispatch(LoadFinished(node_id=node, model=model, total=total))
    pane = app.query_one(ChatPane)
    await pane.add_user("what is 12 times 34?")
    answer = await pane.start_answer()
    await answer.feed(
        ToolCallChunk(id="call_1", name="calculator", arguments={"expression": "12 * 34"})
    )
    answer.tool_result(ToolResult(id="call_1", name="calculator", content="408", ok=True))
    await answer.feed(TextChunk(text="12 times 34 is **408**."))
    await answer.feed(
        DoneChunk(
            finish_reason="stop",
            usage=Usage(prompt_tokens=212, completion_tokens=11, cached_tokens=180),
            stats=Stats(ttft_s=0.031, prefill_tps=850.0, decode_tps=412.0, peak_memory_bytes=0),
            token_ids=(),
        )
    )
    await settle(app, pilot)


async def error(app: ExoTuiApp, pilot: Pilot[None]) -> None:
    await _model_chosen(app, pilot)
    node, model, total = _placed(app)
    app.dispatch(LoadStarted(node_id=node, model=model, total=total))
    app.dispatch(
        LoadFailed(
            node_id=node,
            reason="mlx-lm cannot build the model: shapes of layers.0.mlp do not match config",
        )
    )
    await settle(app, pilot)


SCENES: dict[str, Scene] = {
    "empty": empty,
    "placement": placement,
    "loading": loading,
    "chatting": chatting,
    "error": error,
}
