"""The Textual app: nodes, model, strategy, placement preview, per-node load bars and the chat.

The app renders state and turns keys into commands. Cluster state changes only through the pure
reducer (`exo_tui.cluster.control.state.apply`); loading and generation run in thread workers
and come back as messages; each finished turn is written to the store whole, and kept in memory
until the store takes it. Quitting stops the MLX work and waits for it, then checkpoints the store.
"""

from __future__ import annotations

import asyncio
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import ClassVar

from rich.text import Text
from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import BindingType
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.message import Message as TextualMessage
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Footer, Header
from textual.worker import Worker, WorkerState, get_current_worker

from engine.errors import EngineError
from engine.generate import CancelToken, prefill_next_turn, wait_for_streams
from engine.loading import LoadedModel
from engine.models.weights import require_weight_files
from engine.types import ChatRequest, Chunk, Message, ModelCard, ReasoningChunk, TextChunk
from exo_tui.app import garbage
from exo_tui.app.bindings import APP_BINDINGS
from exo_tui.app.engine_thread import ENGINE_THREAD
from exo_tui.app.failures import cluster_failure
from exo_tui.app.inflight import WorkInFlight
from exo_tui.app.keymap import KeymapError, load_keymap
from exo_tui.app.pacing import RedrawPacer, thread_cpu_clock
from exo_tui.app.screens.chats import ChatsScreen, write_export
from exo_tui.app.screens.download_confirm import Choice, DownloadConfirm
from exo_tui.app.screens.help import HelpScreen
from exo_tui.app.screens.model_picker import ModelPicker, PickerEntry
from exo_tui.app.screens.nodes import Cancelled as NODES_CANCELLED
from exo_tui.app.screens.nodes import NodesScreen
from exo_tui.app.unsaved import UnsavedTurns
from exo_tui.app.widgets.chat import AnswerView, ChatPane, PromptInput
from exo_tui.app.widgets.download import DownloadPanel
from exo_tui.app.widgets.launch import LaunchPanel
from exo_tui.app.widgets.nodes import NodesPanel
from exo_tui.chat.tools import builtin_registry
from exo_tui.chat.turn import GenerateFn, TurnEvent, chat_turn
from exo_tui.cluster.control.coordinator import ClusterError, Fetches, plan_fetches
from exo_tui.cluster.control.placement import Placement, PlacementError, Strategy, fit, place
from exo_tui.cluster.control.state import (
    ClusterEvent,
    ClusterState,
    ForeignNode,
    ForeignSeen,
    GenerationFinished,
    GenerationStarted,
    InstanceCleared,
    InstancePlaced,
    LoadFailed,
    LoadFinished,
    LoadProgressed,
    LoadStarted,
    ModelSelected,
    NodesChosen,
    NodeSeen,
    NodeStats,
    StatsUpdated,
    StrategySelected,
    Unloaded,
    apply,
)
from exo_tui.cluster.local import cluster_summary, local_node_id, local_node_stats
from exo_tui.cluster.node import ClusterSetup, Foreign, Node
from exo_tui.hub.catalogue import CatalogueEntry, entry_card, load_catalogue
from exo_tui.rate import NoticeRate
from exo_tui.store.chat_errors import ChatStoreError
from exo_tui.store.chats import ChatStore
from exo_tui.store.export import render_markdown
from exo_tui.store.opening import open_chat_store
from exo_tui.store.paths import config_dir, data_dir
from exo_tui.store.records import ChatSummary, new_chat

CONTEXT_LENGTH = 4096
# Seconds without a key press before the typed message is prefilled: between bursts of typing.
DRAFT_PREFILL_DELAY = 0.3
ATTACH_POLL_S = 0.005  # how often a finished answer looks whether it is on screen yet
# How long a thread may hold the GIL while another waits for it (Python's default: 5 ms). The
# engine's thread needs it for a moment each token, between computations that run without it;
# while the screen redraws it waited up to 5 ms each time: tok/s through the app against
# headless, 8 paired rounds on 2 cores: 0.89x at 5 ms, 0.96x at 1 ms, 0.96x at 0.2 ms.
GIL_SWITCH_INTERVAL_S = 0.001
REFUSAL_NOTICE_EVERY_S = 10.0  # refused peers are all listed; pop-ups about them, no oftener
REFUSED_REMEMBERED = 1024  # addresses already said in a notice
SYSTEM_PROMPT = "You are exo-tui's assistant. Use the tools when they help; answer briefly."
SAVE_RETRY_S = 5.0  # how often turns the store refused are tried again
# How long quitting waits for MLX work to stop (it stops within one step) and a history write.
QUIT_WAIT_S = 60.0


class ClusterChanged(TextualMessage):
    """An event for the reducer, posted from a worker thread."""

    def __init__(self, event: ClusterEvent) -> None:
        super().__init__()
        self.event = event


class ModelLoaded(TextualMessage):
    def __init__(self, loaded: LoadedModel) -> None:
        super().__init__()
        self.loaded = loaded


def coalesce(pending: list[TurnEvent], event: TurnEvent) -> None:
    """Append `event`, joining it to the last one when both are text (or both reasoning)."""
    last = pending[-1] if pending else None
    if isinstance(event, TextChunk) and isinstance(last, TextChunk):
        pending[-1] = TextChunk(text=last.text + event.text)
    elif isinstance(event, ReasoningChunk) and isinstance(last, ReasoningChunk):
        pending[-1] = ReasoningChunk(text=last.text + event.text)
    else:
        pending.append(event)


class TurnEnded(TextualMessage):
    def __init__(self, added: list[Message], error: str | None = None) -> None:
        super().__init__()
        self.added = added
        self.error = error


class HistorySaved(TextualMessage):
    """A save of the waiting turns ended: `problem` says why they are not in yet (None: saved)."""

    def __init__(self, problem: str | None) -> None:
        super().__init__()
        self.problem = problem


class ExoTuiApp(App[None]):
    TITLE = "exo-tui"
    CSS_PATH = "app.tcss"
    BINDINGS: ClassVar[list[BindingType]] = [*APP_BINDINGS]

    def __init__(
        self,
        model: str | None = None,
        models_dirs: list[Path] | None = None,
        load: bool = False,
        chat_db: Path | None = None,
        node_stats: Callable[[Sequence[str]], NodeStats] = local_node_stats,
        bundled: bool = True,
        cluster: ClusterSetup | None = None,
        catalogue: Sequence[CatalogueEntry] | None = None,
    ) -> None:
        """`catalogue`: the models the picker offers to download (default: the packaged one)."""
        super().__init__()
        self._catalogue = tuple(catalogue) if catalogue is not None else load_catalogue()
        self._cluster = cluster
        self._refused: set[str] = set()  # addresses refused so far
        self._refusal_notices = NoticeRate(REFUSAL_NOTICE_EVERY_S)
        self._node: Node | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.cluster_card: ModelCard | None = None  # the model running across nodes, if any
        self._bundled = bundled
        self._node_stats = node_stats
        self._preselect = model
        self._load_at_start = load
        self._models_dirs = models_dirs
        self._chat_db = chat_db
        self.state = ClusterState()
        self.cards: list[ModelCard] = []
        self.card: ModelCard | None = None
        self.placement: Placement | PlacementError | None = None
        self.loaded: LoadedModel | None = None
        self.store: ChatStore | None = None
        self.unsaved: UnsavedTurns | None = None
        self._save_problem: str | None = None  # the one the user was last told of
        self._in_flight = WorkInFlight()
        self.chat: ChatSummary | None = None
        self.messages: list[Message] = []
        self._answer: AnswerView | None = None
        self._cancel = threading.Event()
        self._switch_interval = sys.getswitchinterval()  # put back when the app ends
        self._screen_cpu: Callable[[], float] | None = None  # paces streamed text (on mount)
        # One generation or next-turn prefill at a time on the model.
        self._engine_lock = threading.Lock()
        self._prefill_cancel = threading.Event()
        self._draft_timer: Timer | None = None
        self._load_started: float | None = None
        self._load_clock: Timer | None = None
        self._generating = False
        self.max_tokens = 1024
        self.tools = builtin_registry(lambda: cluster_summary(self.state, self._model_name()))

    # Layout

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="main"):
            with Vertical(id="side"):
                yield NodesPanel(id="nodes")
                yield DownloadPanel(id="download")
                yield LaunchPanel(id="launch")
            with Vertical(id="chat"):
                yield ChatPane(id="chat-pane")
                yield PromptInput(id="prompt")
        yield Footer()

    def on_mount(self) -> None:
        sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
        self._screen_cpu = thread_cpu_clock(threading.current_thread())
        self.query_one("#chat", Vertical).border_title = "Chat"
        self._apply_keymap()
        self.dispatch(NodeSeen(stats=self._node_stats(()), at=time.time()))
        self.set_interval(1.0, self._refresh_local_stats)
        self._open_store()
        self.set_interval(SAVE_RETRY_S, self._retry_save)
        self._find_models()
        if self._cluster is not None:
            # A small model is best on this node alone; F2 chooses others to place across.
            self.dispatch(NodesChosen(node_ids=(self.local_id,)))
            self.run_worker(self._serve_cluster(self._cluster), group="cluster", exclusive=True)
        self.query_one(PromptInput).focus()
        self.call_after_refresh(garbage.freeze)

    async def _serve_cluster(self, setup: ClusterSetup) -> None:
        """This app as a node of the cluster: peers' stats and losses go into the state."""
        node = self._node = Node(
            setup.identity,
            setup.key,
            stats=lambda: self._node_stats(tuple(c.name for c in self.cards)).model_copy(
                update={"cards": tuple(self.cards)}
            ),
            on_event=self.dispatch,
            options=setup.options,
            on_foreign=self._foreign,
            models_dirs=self._models_dirs,
            include_bundled=self._bundled,
            on_store_changed=self._store_changed,
        )
        self._loop = asyncio.get_running_loop()
        try:
            await node.run()
        except OSError as error:
            self.notify(
                f"The cluster is off: cannot listen on port {setup.options.port} ({error}). "
                "Start exo-tui with --port N to use another port.",
                severity="error",
                timeout=15,
            )
        except Exception as error:  # mDNS or the network failing must not take the app down
            self.notify(
                f"The cluster is off: {cluster_failure(error)}. This machine still works alone.",
                severity="error",
                timeout=15,
                markup=False,
            )

    def _foreign(self, foreign: Foreign) -> None:
        """A refused peer is listed as foreign in the nodes panel, once per address with a
        count; a new address is said in a notice, as often as the notices' rate allows (its
        texts are the peer's, escaped and capped by Foreign.of, and never read as markup)."""
        peer = foreign.peer
        host = foreign.address.rsplit(":", 1)[0]
        name = peer.name if peer else host
        if host not in self._refused:
            if len(self._refused) >= REFUSED_REMEMBERED:
                self._refused.clear()  # a flood from many addresses must not grow it forever
            self._refused.add(host)
            held = self._refusal_notices.allow()
            if held is not None:
                more = f" ({held} more refused since the last notice)" if held else ""
                self.notify(
                    f"Refused {name} ({foreign.address}): {foreign.reason}{more}",
                    severity="warning",
                    markup=False,
                )
        shown = ForeignNode(
            name=name,
            address=foreign.address,
            fingerprint=peer.fingerprint if peer else "",
            reason=foreign.reason,
        )
        self.dispatch(ForeignSeen(foreign=shown))

    def action_choose_nodes(self) -> None:
        """Choose the nodes to place on (in ring order), or every online node."""

        def chosen(node_ids: tuple[str, ...] | None) -> None:
            if node_ids != NODES_CANCELLED:
                self.dispatch(NodesChosen(node_ids=node_ids))

        self.push_screen(NodesScreen(self.state.nodes, self.state.chosen_nodes), chosen)

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for binding in APP_BINDINGS:
            if binding.description and binding.show:
                key = self.get_key_display(binding)
                yield SystemCommand(
                    f"{binding.description} ({key})",
                    f"{binding.id}",
                    getattr(self, f"action_{binding.action}"),
                )

    # State

    def dispatch(self, event: ClusterEvent) -> None:
        """Fold one event into the state and redraw what depends on it."""
        self.state = apply(self.state, event)
        self._refresh_placement()
        try:
            self.query_one(NodesPanel).show(self.state)
            self._show_launch()
        except NoMatches:  # shutting down: a timer's event after the widgets went
            return

    def _refresh_placement(self) -> None:
        if self.card is None:
            self.placement = None
        elif self.state.instance is not None:
            self.placement = self.state.instance.placement
        else:
            self.placement = place(
                self.state.candidates, self.card, self.state.strategy, context_length=CONTEXT_LENGTH
            )

    def _show_launch(self) -> None:
        names = {n.node_id: n.name for n in self.state.nodes}
        panel = self.query_one(LaunchPanel)
        panel.show(self.card, self.state.strategy, self.placement, names)
        panel.set_status(self._status_text())

    def _status_text(self) -> Text:
        status = self.state.instance_status
        if status is None:
            hint = "Ctrl+L launches" if isinstance(self.placement, Placement) else ""
            return Text(hint, style="dim")
        if status == "loading":
            started = self._load_started
            elapsed = "" if started is None else f" {time.monotonic() - started:.1f} s"
            fetching = any(n.runner.state == "downloading" for n in self.state.nodes)
            doing = "downloading" if fetching else "loading"
            return Text(f"{doing}…{elapsed} (Esc cancels)")
        if status == "failed" and self.state.instance is not None:
            reason = self.state.instance.failed_reason or "a node failed"
            return Text(f"failed: {reason}. Ctrl+L places and launches again.", style="red")
        if status in ("ready", "generating"):
            return Text(f"{status} · Ctrl+U unloads", style="green")
        return Text(status)

    def _refresh_local_stats(self) -> None:
        models = tuple(c.name for c in self.cards)
        self.dispatch(StatsUpdated(stats=self._node_stats(models), at=time.time()))

    @property
    def local_id(self) -> str:
        return self.state.nodes[0].node_id if self.state.nodes else local_node_id()

    def _model_name(self) -> str | None:
        return self.loaded.card.name if self.loaded else None

    # Models

    @work(thread=True, exclusive=True, group="models")
    def _find_models(self) -> None:
        from engine.models.finding import find_models

        cards = find_models(self._models_dirs, include_bundled=self._bundled)
        self.call_from_thread(self._models_found, cards)

    def _store_changed(self) -> None:
        """A peer had this node download its share of a model (runs in a worker thread)."""
        from engine.models.finding import find_models

        cards = find_models(self._models_dirs, include_bundled=self._bundled)
        self.call_from_thread(self._store_rescanned, cards)

    def _store_rescanned(self, cards: list[ModelCard]) -> None:
        self.cards = cards
        self._refresh_local_stats()

    def _models_found(self, cards: list[ModelCard]) -> None:
        self.cards = cards
        self._refresh_local_stats()
        if not cards:
            self.notify(
                "No models found. Put an mlx-lm model folder in the models folder, pass "
                "--models-dir DIR, or download one from Hugging Face (mlx-community).",
                severity="warning",
                timeout=10,
            )
        wanted = self._preselect
        chosen = next((c for c in cards if wanted in (c.name, c.path)), None) if wanted else None
        if chosen is None and wanted:
            self._choose_path(wanted)
        elif chosen is not None or cards:
            self.choose_model(chosen or cards[0])
        if self._load_at_start:
            self._load_at_start = False  # models are found again after each download
            self.action_launch()

    def _choose_path(self, spec: str) -> None:
        from engine.models.finding import resolve_model

        try:
            self.choose_model(resolve_model(spec, self._models_dirs))
        except EngineError as error:
            self.notify(str(error), severity="error", timeout=10)

    def choose_model(self, card: ModelCard) -> None:
        self.card = card
        if not card.supports_tensor and self.state.strategy == "tensor":
            self.state = apply(self.state, StrategySelected(strategy="pipeline"))
        self.dispatch(ModelSelected(model=card.name))

    def _fit(self, card: ModelCard) -> tuple[bool, str]:
        """Whether `card` fits the chosen nodes (pipeline, else tensor), and a note saying so."""
        return fit(self.state.candidates, card, context_length=CONTEXT_LENGTH)

    def _picker_entries(self) -> list[PickerEntry]:
        """Models on disk, then the catalogue's models that are not."""
        entries = [PickerEntry(card, *self._fit(card)) for card in self.cards]
        on_disk = {card.name.lower() for card in self.cards}
        for entry in self._catalogue:
            if entry.repo.lower() not in on_disk:
                card = entry_card(entry)
                entries.append(PickerEntry(card, *self._fit(card), catalogue=entry))
        return entries

    def action_pick_model(self) -> None:
        def chosen(entry: PickerEntry | None) -> None:
            if entry is None:
                return
            if entry.catalogue is None:
                self.choose_model(entry.card)
            else:
                self._offer_download(entry.catalogue, entry.fits, entry.fit_note)

        current = self.card.name if self.card else None
        self.push_screen(ModelPicker(self._picker_entries(), current), chosen)

    # Downloads

    def _offer_download(self, entry: CatalogueEntry, fits: bool, fit_note: str) -> None:
        panel = self.query_one(DownloadPanel)
        if panel.active:
            self.notify(f"{panel.repo_id} is downloading; Esc cancels it.", severity="warning")
            return

        def confirmed(choice: Choice) -> None:
            if choice == "here":
                panel.start(entry.repo)
            elif choice == "shares":
                self.choose_model(entry_card(entry))
                self.notify(f"{entry.repo} chosen: Ctrl+L downloads each node's share and loads.")

        nodes = len(self.state.candidates)
        self.push_screen(DownloadConfirm(entry, fits, fit_note, nodes), confirmed)

    @on(DownloadPanel.Finished)
    def _downloaded(self, message: DownloadPanel.Finished) -> None:
        self.notify(f"{message.repo_id} is downloaded; loading it.")
        self._preselect = message.repo_id  # chosen once the models are found again
        self._load_at_start = True  # and launched: the user asked for this model
        self._find_models()

    @on(DownloadPanel.Failed)
    def _download_failed(self, message: DownloadPanel.Failed) -> None:
        severity = "warning" if message.cancelled else "error"
        self.notify(message.error, severity=severity, timeout=10)

    def action_toggle_strategy(self) -> None:
        self._set_strategy("tensor" if self.state.strategy == "pipeline" else "pipeline")

    @on(LaunchPanel.StrategyChosen)
    def _strategy_chosen(self, event: LaunchPanel.StrategyChosen) -> None:
        self._set_strategy(event.strategy)

    def _set_strategy(self, strategy: Strategy) -> None:
        if strategy == "tensor" and self.card is not None and not self.card.supports_tensor:
            self.notify(f"Tensor sharding is unavailable: {self.card.tensor_unsupported_reason}")
            strategy = "pipeline"
        self.dispatch(StrategySelected(strategy=strategy))

    # Launch and unload

    def action_launch(self) -> None:
        if self.card is None:
            self.notify("Pick a model first (Ctrl+O).", severity="warning")
            return
        if self.state.instance_status in ("loading", "ready", "generating"):
            self.notify("A model is loaded or loading; Ctrl+U unloads it first.")
            return
        if self.state.instance is not None:  # failed: place again on the nodes that are left
            self.dispatch(InstanceCleared())
        if not isinstance(self.placement, Placement):
            message = self.placement.message if self.placement else "nothing to place"
            self.notify(f"Cannot launch: {message}", severity="error", timeout=8)
            return
        across = self.placement.world_size > 1 or self.placement.node_ids != (self.local_id,)
        if across and self._node is None:
            self.notify("Placing on other nodes needs the cluster: start without --no-cluster.")
            return
        fetches: Fetches = {}
        if across:
            try:
                nodes = [n.stats for n in self.state.nodes]
                fetches = plan_fetches(self.placement, self.card, nodes)
            except ClusterError as error:
                self.notify(f"Cannot launch: {error}", severity="error", timeout=10)
                return
        elif not self._on_disk(self.card):
            entry = self._catalogue_entry(self.card.name)
            if entry is None:
                self.notify(cannot_load_alone(self.card), severity="error", timeout=10)
            else:
                self._offer_download(entry, *self._fit(self.card))
            return
        self.dispatch(InstancePlaced(placement=self.placement))
        self._load_started = time.monotonic()
        if self._load_clock is not None:
            self._load_clock.stop()
        self._load_clock = self.set_interval(0.2, self._tick_loading, name="load-clock")
        if across:
            self._launch_on_cluster(self.placement, self.card, fetches)
        else:
            self._load(self.card)

    def _on_disk(self, card: ModelCard) -> bool:
        """Whether this machine holds all of `card`'s files (a catalogue card's path is where
        its download would go)."""
        return card.layers_on_disk is None and (Path(card.path) / "config.json").is_file()

    def _catalogue_entry(self, repo: str) -> CatalogueEntry | None:
        return next((e for e in self._catalogue if e.repo.lower() == repo.lower()), None)

    @work(exclusive=True, group="load")
    async def _launch_on_cluster(
        self, placement: Placement, card: ModelCard, fetches: Fetches
    ) -> None:
        """Every node of the placement fetches its share of the files if it lacks them, then
        loads its ranks; their bars fill from their progress."""
        assert self._node is not None
        try:
            await self._node.coordinator.launch(placement, card, fetches=fetches)
        except ClusterError as error:
            self.notify(f"Launch failed: {error}", severity="error", timeout=10)
            return
        self.cluster_card = card
        self.notify(f"{card.name} is ready on {placement.world_size} nodes. Ask away.")

    def _cluster_generate(
        self, request: ChatRequest, cancel: CancelToken | None
    ) -> Iterator[Chunk]:
        """Chat with the cluster's instance from a worker thread: the coordinator runs in the
        app's event loop and hands chunks over through a queue."""
        assert self._node is not None and self._loop is not None
        coordinator = self._node.coordinator
        chunks: queue.Queue[Chunk | None] = queue.Queue()

        async def pump() -> None:
            try:
                async for chunk in coordinator.chat(request, cancel):
                    chunks.put(chunk)
            finally:
                chunks.put(None)

        asyncio.run_coroutine_threadsafe(pump(), self._loop)
        while (chunk := chunks.get()) is not None:
            yield chunk

    def _tick_loading(self) -> None:
        """The elapsed time while loading; the clock stops with the load."""
        if self.state.instance_status == "loading":
            self.query_one(LaunchPanel).set_status(self._status_text())
        elif self._load_clock is not None:
            self._load_clock.stop()
            self._load_clock = None

    @work(thread=True, exclusive=True, group="load")
    def _load(self, card: ModelCard) -> None:
        worker = get_current_worker()
        with self._in_flight.running() as allowed:
            if allowed:
                ENGINE_THREAD.run(lambda: self._load_layers(card, worker))

    def _load_layers(self, card: ModelCard, worker: Worker[None]) -> None:
        from engine.loading import load_model

        node = self.local_id
        post = self.post_message
        try:
            loading = load_model(Path(card.path))
            post(ClusterChanged(LoadStarted(node_id=node, model=card.name, total=card.num_layers)))
            while True:
                try:
                    progress = next(loading)
                except StopIteration as done:
                    loaded: LoadedModel = done.value
                    # Read by path, a model in the hub cache is named after its snapshot folder
                    # (a commit id); the chosen card has the name the user picked.
                    loaded.card = card
                    break
                if worker.is_cancelled:
                    post(ClusterChanged(Unloaded(node_id=node)))
                    post(ClusterChanged(InstanceCleared()))
                    return
                post(
                    ClusterChanged(
                        LoadProgressed(
                            node_id=node, layers_loaded=progress.layers_loaded, total=progress.total
                        )
                    )
                )
        except EngineError as error:
            post(ClusterChanged(LoadFailed(node_id=node, reason=str(error))))
            return
        except Exception as error:  # a crash in MLX must not take the app down
            post(
                ClusterChanged(LoadFailed(node_id=node, reason=f"{type(error).__name__}: {error}"))
            )
            return
        post(ModelLoaded(loaded))
        post(ClusterChanged(LoadFinished(node_id=node, model=card.name, total=card.num_layers)))

    @on(ClusterChanged)
    def _cluster_changed(self, message: ClusterChanged) -> None:
        self.dispatch(message.event)

    @on(ModelLoaded)
    def _model_loaded(self, message: ModelLoaded) -> None:
        self.loaded = message.loaded
        garbage.freeze()
        self.notify(f"{message.loaded.card.name} is ready. Ask away.")

    def action_unload(self) -> None:
        if self._generating:
            self.notify("Stop the answer first (Esc).")
            return
        self.workers.cancel_group(self, "load")
        self._prefill_cancel.set()
        if self._node is not None and self._node.coordinator.instance is not None:
            self.cluster_card = None
            self.run_worker(self._node.coordinator.stop(), group="unload")
            self.dispatch(InstanceCleared())
            return
        if self.loaded is not None:
            self.loaded.unload()
            self.loaded = None
            garbage.settle()
        self.dispatch(Unloaded(node_id=self.local_id))
        self.dispatch(InstanceCleared())

    def action_stop(self) -> None:
        if self._generating:
            self._cancel.set()
        elif self.state.instance_status == "loading":
            self.workers.cancel_group(self, "load")
        else:
            self.query_one(DownloadPanel).cancel()

    # Chat

    def _open_store(self) -> None:
        opened = open_chat_store(self._chat_db)
        self.store = opened.store
        self.unsaved = UnsavedTurns(opened.store)
        if opened.notice:
            self.notify(opened.notice, severity="warning", timeout=15)

    @on(PromptInput.Submitted)
    async def _prompt(self, event: PromptInput.Submitted) -> None:
        answerer: LoadedModel | GenerateFn | None = self.loaded
        card = self.loaded.card if self.loaded is not None else self.cluster_card
        if self.loaded is None and self.cluster_card is not None:
            if self.state.instance_status in ("ready", "generating"):
                answerer = self._cluster_generate
            else:
                card = None  # the cluster's instance failed: launch again
        if answerer is None or card is None:
            self.notify("Launch a model first (Ctrl+L).", severity="warning")
            return
        if self._generating:
            self.notify("Still answering; Esc stops it.")
            return
        # The engine starts first: storing the turn and putting it on screen overlap its prefill.
        user = Message(role="user", content=event.text)
        earlier = self._history_before_prompt()
        request = ChatRequest(
            messages=(*earlier, user),
            tools=self.tools.specs,
            max_tokens=self.max_tokens,
            temperature=0.0,
        )
        self._answer = AnswerView()
        self._set_generating(True)
        self._cancel = threading.Event()
        self._prefill_cancel.set()  # stop prefilling for this turn: it is here
        self._prefill_cancel = threading.Event()
        opening: tuple[Message, ...] = (user,)
        if self.chat is None:  # in memory: the store gets it with its first turn
            self.chat = new_chat(card.name)
            self.messages = []
            opening = (*earlier, user)  # the system prompt that opens a chat
        self._generate(answerer, request, self._answer, self._cancel, self.chat, opening)
        await asyncio.sleep(0)  # the worker's task starts its thread now, not after all this
        self.messages.extend(opening)
        shown = self.query_one(ChatPane).add_turn(event.text, self._answer)
        for node_id in self._serving_nodes():
            self.dispatch(GenerationStarted(node_id=node_id))
        await shown

    def _history_before_prompt(self) -> tuple[Message, ...]:
        """The messages the next prompt follows: a new chat starts with the system prompt."""
        if self.chat is None:
            return (Message(role="system", content=SYSTEM_PROMPT),)
        return tuple(self.messages)

    @on(PromptInput.Changed)
    def _draft_changed(self, event: PromptInput.Changed) -> None:
        if self._draft_timer is not None:
            self._draft_timer.stop()
        draft = self.query_one(PromptInput).message
        self._draft_timer = self.set_timer(DRAFT_PREFILL_DELAY, lambda: self._prefill_draft(draft))

    def _prefill_draft(self, draft: str) -> None:
        """While the user types, prefill their message as far as it is typed, at each pause, as
        if it were sent then: sending it leaves one token to prefill, or what came after the
        pause."""
        loaded = self.loaded
        if loaded is None or self._generating or not draft.strip():
            return
        request = ChatRequest(messages=self._history_before_prompt(), tools=self.tools.specs)
        self._prefill(loaded, request, draft, self._prefill_cancel)

    @work(thread=True, group="prefill")
    def _prefill(
        self, loaded: LoadedModel, request: ChatRequest, draft: str, cancel: threading.Event
    ) -> None:
        with self._in_flight.running() as allowed:
            if allowed:
                ENGINE_THREAD.run(lambda: self._prefill_draft_now(loaded, request, draft, cancel))

    def _prefill_draft_now(
        self, loaded: LoadedModel, request: ChatRequest, draft: str, cancel: threading.Event
    ) -> None:
        with self._engine_lock:  # after the answer (and its own prefill) let go of the model
            if not cancel.is_set():
                prefill_next_turn(loaded, request, cancel, draft)

    def _serving_nodes(self) -> tuple[str, ...]:
        """The nodes that run the model: those of the instance, or this one."""
        instance = self.state.instance
        return instance.placement.node_ids if instance is not None else (self.local_id,)

    @work(thread=True, group="chat")
    def _generate(
        self,
        answerer: LoadedModel | GenerateFn,
        request: ChatRequest,
        answer: AnswerView,
        cancel: threading.Event,
        chat: ChatSummary,
        opening: tuple[Message, ...],
    ) -> None:
        """Answer, save the turn (`opening` and what the answer added), then prefill the next."""
        prefill_cancel = self._prefill_cancel  # the next prompt (or an unload) sets it
        with self._in_flight.running() as allowed:
            if not allowed:
                return
            added = ENGINE_THREAD.run(lambda: self._answer_turn(answerer, request, answer, cancel))
            # Saved here, not from TurnEnded: a quit mid-answer still saves what was answered;
            # and off the MLX thread, so a store waiting out a lock does not hold up the model.
            if self.unsaved is not None:
                self.unsaved.add(chat, (*opening, *(added or [])))
                self.post_message(HistorySaved(self.unsaved.save()))
            if added is not None and isinstance(answerer, LoadedModel):
                # While the user reads and types, prefill the history as the next turn will
                # see it; sending the next message stops this within one step.
                history = request.model_copy(update={"messages": (*request.messages, *added)})
                ENGINE_THREAD.run(lambda: self._prefill_history(answerer, history, prefill_cancel))

    def _answer_turn(
        self,
        answerer: LoadedModel | GenerateFn,
        request: ChatRequest,
        answer: AnswerView,
        cancel: threading.Event,
    ) -> list[Message] | None:
        with self._engine_lock:  # after any next-turn prefill has stopped
            return self._run_turn(answerer, request, answer, cancel)

    def _prefill_history(
        self, loaded: LoadedModel, history: ChatRequest, cancel: threading.Event
    ) -> None:
        with self._engine_lock:
            if not cancel.is_set():
                prefill_next_turn(loaded, history, cancel)

    def _run_turn(
        self,
        answerer: LoadedModel | GenerateFn,
        request: ChatRequest,
        answer: AnswerView,
        cancel: threading.Event,
    ) -> list[Message] | None:
        """Stream one turn into `answer`; the messages it added, None when it failed."""
        turn = chat_turn(answerer, request, self.tools, cancel)
        pending: list[TurnEvent] = []
        pacer = RedrawPacer(self._screen_cpu)
        try:
            while True:
                try:
                    event = next(turn)
                except StopIteration as done:
                    if self._wait_until_attached(answer):
                        answer.post_message(AnswerView.Feed(pending))
                    self.post_message(TurnEnded(done.value))
                    return done.value
                # Tokens arrive faster than a screen redraws: text goes in paced batches (the
                # first at once); anything else at once. The engine starts before the answer is
                # mounted, and a widget outside the DOM cannot take a message from a thread (it
                # finds no app): until it is mounted, everything waits here.
                coalesce(pending, event)
                now = time.monotonic()
                due = not isinstance(event, TextChunk | ReasoningChunk) or pacer.due(now)
                if due and answer.is_attached:
                    answer.post_message(AnswerView.Feed(pending))
                    pending = []
                    pacer.sent(now)
        except EngineError as error:
            self.post_message(TurnEnded([], error=str(error)))
        except Exception as error:  # the app keeps running, the chat keeps its history
            self.post_message(TurnEnded([], error=f"{type(error).__name__}: {error}"))
        return None

    def _wait_until_attached(self, answer: AnswerView) -> bool:
        """In a worker: wait for `answer` to be mounted; False when the app exits first."""
        while not answer.is_attached:
            if not self.is_running:
                return False
            time.sleep(ATTACH_POLL_S)
        return True

    @on(TurnEnded)
    def _turn_ended(self, message: TurnEnded) -> None:
        self._set_generating(False)
        self.messages.extend(message.added)
        if message.error:
            self.notify(message.error, severity="error", timeout=10)
        for node_id in self._serving_nodes():
            self.dispatch(GenerationFinished(node_id=node_id))

    def _retry_save(self) -> None:
        if self.unsaved is not None and self.unsaved.waiting:
            self._save_waiting()

    @work(thread=True, exclusive=True, group="save")
    def _save_waiting(self) -> None:
        with self._in_flight.running() as allowed:
            if allowed and self.unsaved is not None:
                self.post_message(HistorySaved(self.unsaved.save()))

    @on(HistorySaved)
    def _history_saved(self, message: HistorySaved) -> None:
        """Say once that history is not being saved, and why; and say when it is again."""
        problem = message.problem
        if problem is not None and problem != self._save_problem:
            self.notify(
                f"History could not be saved: {problem} This chat is kept here and saved as soon "
                "as the database takes it.",
                severity="error",
                timeout=15,
            )
        elif problem is None and self._save_problem is not None:
            self.notify("History is saved again.")
        self._save_problem = problem

    def _set_generating(self, generating: bool) -> None:
        self._generating = generating
        # A steady cursor while an answer streams: every blink redraws the prompt, and on a
        # small machine the engine pays for each redraw (the same cores, the same GIL).
        for prompt in self.query(PromptInput):  # none while the app shuts down
            prompt.cursor_blink = not generating

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state == WorkerState.ERROR and event.worker.group in ("chat", "load"):
            self._set_generating(False)
            self.notify(f"{event.worker.name} failed: {event.worker.error}", severity="error")

    def action_new_chat(self) -> None:
        if self._generating:
            self.notify("Stop the answer first (Esc).")
            return
        self.chat = None
        self.messages = []
        self.query_one(ChatPane).remove_children()
        if self.loaded is not None:
            self.loaded.prompt_cache.clear()

    def action_chats(self) -> None:
        if self.store is None:
            return
        store = self.store

        def reopen(chat: ChatSummary | None) -> None:
            if chat is None:
                return
            try:
                stored = store.messages(chat.id)
            except ChatStoreError as error:
                self.notify(f"Could not open the chat: {error}", severity="error", timeout=10)
                return
            self.chat = chat
            waiting = self.unsaved.of(chat.id) if self.unsaved is not None else []
            self.messages = [*stored, *waiting]
            self.query_one(ChatPane).show_messages(self.messages)

        self.push_screen(ChatsScreen(store, export_dir=data_dir() / "exports"), reopen)

    def action_export_chat(self) -> None:
        if self.chat is None or not self.messages:
            self.notify("Nothing to export yet.")
            return
        # From memory: it holds the turns the store has not taken yet too.
        markdown = render_markdown(self.chat, self.messages)
        try:
            path = write_export(data_dir() / "exports", self.chat, markdown)
        except OSError as error:
            self.notify(f"Could not export the chat: {error}", severity="error", timeout=10)
            return
        self.notify(f"Exported to {path}")

    def action_copy_answer(self) -> None:
        answers = list(self.query(AnswerView))
        if not answers:
            self.notify("No answer to copy yet.")
            return
        self.copy_to_clipboard(answers[-1].text)
        self.notify("Copied the last answer.")

    async def on_unmount(self) -> None:
        sys.setswitchinterval(self._switch_interval)
        # Quitting mid-answer, mid-prefill or mid-load: each stops at its next step.
        self._cancel.set()
        self._prefill_cancel.set()
        self.workers.cancel_group(self, "load")
        # The ranks this node runs for an instance stop with the app (the node's own shutdown
        # runs in a worker that may not get to finish).
        if self._node is not None and self._node.host is not None:
            self._node.host.close_now()
        # Waited for off the event loop: a cluster answer's chunks come through it.
        await asyncio.to_thread(self._finish_work)

    def _finish_work(self) -> None:
        """Join the MLX work and history writes, then save what waits and checkpoint the store."""
        if not self._in_flight.close(QUIT_WAIT_S):
            return  # still busy: the store stays open (its writes are durable), nothing waits
        ENGINE_THREAD.run(wait_for_streams)  # on the thread that ran the work
        if self.unsaved is not None:
            self.unsaved.save()
        if self.store is not None:
            self.store.close()

    # Help and keys

    def action_help(self) -> None:
        rows = [
            (self.get_key_display(b), b.description, b.id or "")
            for b in APP_BINDINGS
            if b.description and b.id != "app.help_key"
        ]
        self.push_screen(HelpScreen(rows))

    def _apply_keymap(self) -> None:
        path = config_dir() / "keys.toml"
        try:
            self.set_keymap(load_keymap(path, APP_BINDINGS))
        except KeymapError as error:
            self.notify(str(error), severity="error", timeout=15)


def run_app(
    model: str | None = None,
    models_dirs: list[Path] | None = None,
    load: bool = False,
    cluster: ClusterSetup | None = None,
) -> int:
    identity = cluster.identity if cluster is not None else None

    def node_stats(models: Sequence[str]) -> NodeStats:
        return local_node_stats(models, identity=identity)

    app = ExoTuiApp(
        model=model, models_dirs=models_dirs, load=load, node_stats=node_stats, cluster=cluster
    )
    app.run()
    if app.unsaved is not None and app.unsaved.waiting and app.store is not None:
        # The screen is gone: the last word on turns the store never took goes to the terminal.
        print(
            f"exo-tui: {app.unsaved.waiting} messages could not be saved to {app.store.path}: "
            f"{app.unsaved.problem}",
            file=sys.stderr,
        )
    return 0


def cannot_load_alone(card: ModelCard) -> str:
    """Why `card` cannot load on this node alone: by name, the files its folder lacks."""
    alone = f"Cannot load {card.name} on this node alone ({card.partial_note or 'nothing on disk'})"
    try:
        require_weight_files(Path(card.path), name=card.name)
    except EngineError as error:
        return f"{alone}: {error}. F2 places it across the nodes that hold the rest."
    return (
        f"{alone}. Place it across the nodes that hold the rest (F2), or download it: "
        "exo-tui models download"
    )
