"""The app's main screens, set up the same way for snapshot tests and for `make screenshots`.

Each scene starts the real app on a tiny model with fixed node stats, then brings it to one state
through the same reducer events a real run produces (or real chunks, scripted), so pictures do not
depend on timing, the machine's memory or its name.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from textual.pilot import Pilot
from textual.widgets import Footer, Input, Static
from textual.widgets._collapsible import CollapsibleTitle

from engine.types import (
    DoneChunk,
    Message,
    PrefillProgress,
    Stats,
    TextChunk,
    ToolCallChunk,
    ToolResult,
    Usage,
)
from exo_tui.app.main import ExoTuiApp
from exo_tui.app.screens.chat_settings import ChatSettingsScreen
from exo_tui.app.screens.fork_from import ForkFromScreen
from exo_tui.app.screens.model_picker import ModelPicker
from exo_tui.app.screens.nodes import NodesScreen
from exo_tui.app.widgets.chat import ChatPane
from exo_tui.app.widgets.download import DownloadPanel
from exo_tui.app.widgets.nodes import NodeCard
from exo_tui.app.widgets.prompt import PromptInput
from exo_tui.cluster.control.placement import Placement
from exo_tui.cluster.control.state import (
    DownloadProgressed,
    ForeignNode,
    ForeignSeen,
    InstancePlaced,
    LoadFailed,
    LoadFinished,
    LoadProgressed,
    LoadStarted,
    NodeLost,
    NodeSeen,
    Unloaded,
)
from exo_tui.hub.progress import DownloadProgress
from exo_tui.store.records import new_chat
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
    # A footer's keys are laid out a moment after the screen comes up: on a busy machine,
    # after the scene was ready (one picture in three had an empty footer).
    footers = [footer for screen in app.screen_stack for footer in screen.query(Footer)]
    await wait_until(pilot, lambda: all(_keys_placed(footer) for footer in footers))


def _keys_placed(footer: Footer) -> bool:
    keys = footer.query("FooterKey")
    return bool(keys) and all(key.region.width > 0 for key in keys)


async def _model_chosen(app: ExoTuiApp, pilot: Pilot[None]) -> None:
    await wait_until(pilot, lambda: app.selection.card is not None)
    # The node's card counts the models found; wait until it has been redrawn with them.
    text = app.query_one(NodeCard).query_one("#node-text", Static)
    await wait_until(pilot, lambda: f"{len(app.main.cards)} model" in str(text.render()))


async def empty(app: ExoTuiApp, pilot: Pilot[None]) -> None:
    await pilot.pause(0.3)
    await settle(app, pilot)


async def placement(app: ExoTuiApp, pilot: Pilot[None]) -> None:
    await _model_chosen(app, pilot)
    await settle(app, pilot)


def _placed(app: ExoTuiApp) -> tuple[str, str, int]:
    assert app.selection.card is not None and app.selection.placement is not None
    app.dispatch(InstancePlaced(placement=app.selection.placement))  # type: ignore[arg-type]
    return app.local_id, app.selection.card.name, app.selection.card.num_layers


async def _loaded_chat(app: ExoTuiApp, pilot: Pilot[None]) -> ChatPane:
    """The model chosen, placed and loaded: its chat pane."""
    await _model_chosen(app, pilot)
    node, model, total = _placed(app)
    app.dispatch(LoadStarted(node_id=node, model=model, total=total))
    app.dispatch(LoadFinished(node_id=node, model=model, total=total))
    return app.query_one(ChatPane)


async def loading(app: ExoTuiApp, pilot: Pilot[None]) -> None:
    await _model_chosen(app, pilot)
    node, model, total = _placed(app)
    app.dispatch(LoadStarted(node_id=node, model=model, total=total))
    app.dispatch(LoadProgressed(node_id=node, layers_loaded=total // 2, total=total))
    await settle(app, pilot)


async def chatting(app: ExoTuiApp, pilot: Pilot[None]) -> None:
    pane = await _loaded_chat(app, pilot)
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
    # The card's line grows by its result after it was laid out: on a busy machine the picture
    # was once taken before the new width (the line without "→ 408").
    title = app.query_one(CollapsibleTitle)
    await wait_until(pilot, lambda: title.region.width >= len(str(title.label)) + 2)
    await settle(app, pilot)


async def prefilling(app: ExoTuiApp, pilot: Pilot[None]) -> None:
    """A slow model's prompt going through in steps (engine.prefill), the first words not yet."""
    pane = await _loaded_chat(app, pilot)
    await pane.add_user("Summarise this chapter: " + "the sea, the ships and the ring. " * 6)
    answer = await pane.start_answer()
    answer.clock = lambda: answer.wait_started + 42  # the seconds shown, whatever the machine
    app.conversation.generating = True  # as a turn under way (the border: prefilling)
    await answer.feed(PrefillProgress(done=12, total=51))
    await wait_until(pilot, lambda: "prefilling" in str(app.screen.query_one("#chat").border_title))
    await settle(app, pilot)


async def tool_prefilling(app: ExoTuiApp, pilot: Pilot[None]) -> None:
    """The round after a tool call: the model prefills the tool's result, a line under it."""
    pane = await _loaded_chat(app, pilot)
    await pane.add_user("how much memory does my cluster have?")
    answer = await pane.start_answer()
    answer.clock = lambda: answer.wait_started + 7  # the seconds shown, whatever the machine
    app.conversation.generating = True  # as a turn under way (the border: prefilling)
    await answer.feed(ToolCallChunk(id="call_1", name="cluster_status", arguments={}))
    await answer.feed(
        DoneChunk(
            finish_reason="tool_calls",
            usage=Usage(prompt_tokens=212, completion_tokens=9, cached_tokens=180),
            stats=Stats(ttft_s=0.031, prefill_tps=850.0, decode_tps=412.0, peak_memory_bytes=0),
            token_ids=(),
        )
    )
    status = '{"nodes": [{"name": "studio", "memory_total_gb": 16.0}], "total_memory_gb": 16.0}'
    answer.tool_result(ToolResult(id="call_1", name="cluster_status", content=status, ok=True))
    await answer.feed(PrefillProgress(done=96, total=310))
    await wait_until(pilot, lambda: bool(answer.query(".answer-wait")))
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


def _peers(app: ExoTuiApp) -> list[str]:
    """Two more nodes, as the cluster's sessions report them (fixed stats)."""
    ids: list[str] = []
    for node_id, name, free in (("node-b", "macbook", 21), ("node-c", "gpu-box", 54)):
        stats = fixed_stats(available=free * 10**9, total=(free + 11) * 10**9)(("tiny-llama",))
        app.dispatch(
            NodeSeen(stats=stats.model_copy(update={"node_id": node_id, "name": name}), at=0.0)
        )
        ids.append(node_id)
    return ids


async def _placed_on_three(app: ExoTuiApp, pilot: Pilot[None]) -> tuple[Placement, str]:
    """The model placed over this node and two peers; the placement and the model's name."""
    await _model_chosen(app, pilot)
    _peers(app)
    app.choose_nodes(None)
    await wait_until(pilot, lambda: len(app.query(NodeCard)) == 3)
    assert isinstance(app.selection.placement, Placement) and app.selection.card is not None
    app.dispatch(InstancePlaced(placement=app.selection.placement))
    return app.selection.placement, app.selection.card.name


async def cluster(app: ExoTuiApp, pilot: Pilot[None]) -> None:
    """Three nodes loading one model across them, each with its own bar."""
    placement, model = await _placed_on_three(app, pilot)
    for shard, done in zip(placement.shards, (1, 1, 0), strict=True):
        app.dispatch(LoadStarted(node_id=shard.node_id, model=model, total=shard.spec.num_layers))
        app.dispatch(
            LoadProgressed(node_id=shard.node_id, layers_loaded=done, total=shard.spec.num_layers)
        )
    app.dispatch(
        ForeignSeen(
            foreign=ForeignNode(
                name="neighbour", address="192.168.1.40:52525", fingerprint="9f1c2e7a00b4d613",
                reason="holds another cluster key (fingerprint 9f1c2e7a00b4d613)",
            )
        )
    )  # fmt: skip
    await settle(app, pilot)


async def nodes(app: ExoTuiApp, pilot: Pilot[None]) -> None:
    """The node chooser (F2)."""
    await _model_chosen(app, pilot)
    _peers(app)
    await wait_until(pilot, lambda: len(app.query(NodeCard)) == 3)
    await pilot.press("f2")
    await wait_until(pilot, lambda: isinstance(app.screen, NodesScreen))
    await settle(app, pilot)


async def lost(app: ExoTuiApp, pilot: Pilot[None]) -> None:
    """A node of the running model went away: the failure and the way on."""
    placement, model = await _placed_on_three(app, pilot)
    for shard in placement.shards:
        app.dispatch(LoadStarted(node_id=shard.node_id, model=model, total=shard.spec.num_layers))
        app.dispatch(LoadFinished(node_id=shard.node_id, model=model, total=shard.spec.num_layers))
    peers = [node_id for node_id in placement.node_ids if node_id != app.local_id]
    app.dispatch(NodeLost(node_id=peers[0], reason="stopped answering (no stats for 3 s)"))
    for node_id in (app.local_id, peers[1]):  # the coordinator stopped the other ranks
        app.dispatch(Unloaded(node_id=node_id))
    await settle(app, pilot)


async def picker(app: ExoTuiApp, pilot: Pilot[None]) -> None:
    """The model picker (Ctrl+O): the model on disk, then catalogue models to download."""
    await _model_chosen(app, pilot)
    await pilot.press("ctrl+o")
    await wait_until(pilot, lambda: isinstance(app.screen, ModelPicker))
    await settle(app, pilot)


async def downloading(app: ExoTuiApp, pilot: Pilot[None]) -> None:
    """A catalogue model halfway down: the overall bar and the current file's (scripted)."""
    await _model_chosen(app, pilot)
    repo = "mlx-community/Llama-3.2-1B-Instruct-4bit"
    panel = app.query_one(DownloadPanel)
    panel.begin(repo)
    panel.show_progress(
        DownloadProgress(
            repo_id=repo, file="model.safetensors", file_bytes=312_400_000,
            file_total=695_300_000, bytes_done=329_900_000, bytes_total=712_800_000, files_done=5,
            files_total=6,
        )
    )  # fmt: skip
    await settle(app, pilot)


async def fetching(app: ExoTuiApp, pilot: Pilot[None]) -> None:
    """A model placed over three nodes: two fetch their share of its files, one has it."""
    placement, model = await _placed_on_three(app, pilot)
    shards = placement.shards
    progress = ((1_210_000_000, 2_050_000_000, 3), (410_000_000, 1_580_000_000, 1))
    for shard, (done, total, files) in zip(shards[1:], progress, strict=True):
        app.dispatch(
            DownloadProgressed(node_id=shard.node_id, model=model, progress=DownloadProgress(
                repo_id=model, bytes_done=done, bytes_total=total, files_done=files,
                files_total=5, file=f"model-0000{files + 1}-of-00005.safetensors"))
        )  # fmt: skip
    await settle(app, pilot)


async def chat_settings(app: ExoTuiApp, pilot: Pilot[None]) -> None:
    """This chat's settings (Ctrl+F): presets, the system prompt, temperature, max tokens."""
    await _model_chosen(app, pilot)
    await pilot.press("ctrl+f")
    await wait_until(pilot, lambda: isinstance(app.screen, ChatSettingsScreen))
    system = app.screen.query_one("#settings-system", Input)
    system.cursor_blink = False
    system.cursor_position = 0  # the prompt's start, not wherever its end falls
    await settle(app, pilot)


FORKED_CHAT = (
    ("what is 12 times 34?", "12 times 34 is **408**."),
    ("and 408 divided by 17?", "408 divided by 17 is **24**."),
    ("how many layers does my node hold?", "Your node holds all **4** layers of tiny-llama."),
)


async def fork(app: ExoTuiApp, pilot: Pilot[None]) -> None:
    """Fork from a message (F9): a chat's questions, newest first, to edit and branch from."""
    await _model_chosen(app, pilot)
    conversation = app.conversation
    messages = [Message(role="system", content=conversation.system_prompt)]
    for question, answer in FORKED_CHAT:
        messages += [
            Message(role="user", content=question),
            Message(role="assistant", content=answer),
        ]
    conversation.summary = new_chat("tiny-llama", FORKED_CHAT[0][0])
    conversation.messages = messages
    pane = app.query_one(ChatPane)
    for question, text in FORKED_CHAT:  # as answered, so the pictures do not differ
        await pane.add_user(question)
        answer = await pane.start_answer()
        await answer.feed(TextChunk(text=text))
        await answer.feed(
            DoneChunk(
                finish_reason="stop",
                usage=Usage(prompt_tokens=212, completion_tokens=11, cached_tokens=180),
                stats=Stats(ttft_s=0.031, prefill_tps=850.0, decode_tps=412.0, peak_memory_bytes=0),
                token_ids=(),
            )
        )
    await pilot.press("f9")
    await wait_until(pilot, lambda: isinstance(app.screen, ForkFromScreen))
    await pilot.press("down")
    await settle(app, pilot)


SCENES: dict[str, Scene] = {
    "empty": empty,
    "placement": placement,
    "loading": loading,
    "chatting": chatting,
    "prefilling": prefilling,
    "tool_prefilling": tool_prefilling,
    "error": error,
    "cluster": cluster,
    "nodes": nodes,
    "lost": lost,
    "picker": picker,
    "downloading": downloading,
    "fetching": fetching,
    "chat_settings": chat_settings,
    "fork": fork,
}
