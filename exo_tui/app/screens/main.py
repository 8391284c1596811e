"""The main screen: the panels, and the work they start (models, picker, downloads, launch).

The app keeps the node, the cluster state and the chat; the screen reads them through `Host`
and changes the state only through the host's reducer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar, Protocol

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Footer, Header
from textual.worker import Worker, WorkerState, get_current_worker

from engine.errors import EngineError
from engine.loading import LoadedModel, run_loading
from engine.models.weights import require_weight_files
from engine.types import LoadProgress, ModelCard, Strategy
from exo_tui.app import garbage
from exo_tui.app.api_service import ApiService
from exo_tui.app.bindings import CHAT_BINDINGS
from exo_tui.app.chat_status import chat_title, empty_hint
from exo_tui.app.conversation import SYSTEM_PROMPT, Conversation
from exo_tui.app.engine_thread import ENGINE_THREAD
from exo_tui.app.inflight import WorkInFlight
from exo_tui.app.keys import shown
from exo_tui.app.messages import ClusterChanged, ModelLoaded
from exo_tui.app.screens.chat_settings import ChatSettingsScreen
from exo_tui.app.screens.download_confirm import Choice, DownloadConfirm
from exo_tui.app.screens.fork_from import ForkFromScreen
from exo_tui.app.screens.model_picker import ModelPicker, PickerEntry
from exo_tui.app.selection import Selection
from exo_tui.app.widgets.chat import AnswerView, ChatPane
from exo_tui.app.widgets.download import DownloadPanel
from exo_tui.app.widgets.launch import LaunchPanel
from exo_tui.app.widgets.nodes import NodesPanel
from exo_tui.app.widgets.prompt import PromptInput
from exo_tui.app.widgets.requests import RequestsPanel
from exo_tui.chat.backend import ClusterBackend, LocalBackend
from exo_tui.cluster.control.coordinator import Fetches, plan_fetches
from exo_tui.cluster.control.placement import Placement
from exo_tui.cluster.control.state import (
    ClusterEvent,
    ClusterState,
    InstanceCleared,
    InstancePlaced,
    LoadFailed,
    LoadFinished,
    LoadProgressed,
    LoadStarted,
    Unloaded,
)
from exo_tui.cluster.errors import ClusterError
from exo_tui.cluster.node import Node
from exo_tui.hub.catalogue import CatalogueEntry, entry_card


class Host(Protocol):
    """What the screen needs of the app."""

    state: ClusterState
    selection: Selection
    conversation: Conversation

    @property
    def local_id(self) -> str: ...

    @property
    def node(self) -> Node | None:
        """This app as a node of the cluster; None without one."""
        ...

    @property
    def in_flight(self) -> WorkInFlight: ...

    def dispatch(self, event: ClusterEvent) -> None: ...

    def show_state(self) -> None: ...

    def refresh_local_stats(self) -> None: ...


class _LoadCancelled(Exception):
    """The user stopped a load between two layers."""


class MainScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [*CHAT_BINDINGS]

    class Ready(Message):
        """The panels are mounted: the app can fill them."""

    def __init__(
        self,
        host: Host,
        models_dirs: list[Path] | None,
        bundled: bool,
        catalogue: Sequence[CatalogueEntry],
        preselect: str | None,
        load_at_start: bool,
        load_demo: bool = False,
        api: ApiService | None = None,
    ) -> None:
        """`load_demo`: with no model asked for, load the bundled demo once it is found, so a
        newcomer's first key is a question."""
        super().__init__(id="_default")
        self._host = host
        self._models_dirs = models_dirs
        self._bundled = bundled
        self._catalogue = catalogue
        self._preselect = preselect
        self._load_at_start = load_at_start
        self._load_demo = load_demo
        self._api = api
        self.cards: list[ModelCard] = []
        self._load_started: float | None = None
        self._load_clock: Timer | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="main"):
            with Vertical(id="side"):
                yield NodesPanel(id="nodes")
                yield DownloadPanel(id="download")
                yield LaunchPanel(id="launch")
                if self._api is not None:
                    yield RequestsPanel(self._api.board, self._api.url)
            with Vertical(id="chat"):
                yield ChatPane(id="chat-pane")
                yield PromptInput(id="prompt")
        yield Footer()

    def on_mount(self) -> None:
        self.post_message(self.Ready())

    # Drawing

    def show(self, state: ClusterState) -> None:
        """Draw `state` and the selection's placement (raises NoMatches once unmounted)."""
        self.query_one(NodesPanel).show(state)
        names = {n.node_id: n.name for n in state.nodes}
        panel = self.query_one(LaunchPanel)
        selection = self._host.selection
        panel.show(selection.card, selection.strategy, selection.placement, names)
        panel.set_status(self._status_text())
        model = selection.card.name if selection.card is not None else None
        conversation = self._host.conversation
        answers = self.query(AnswerView)  # the one streaming is the last
        # Whether the answer streaming reports its prefill's progress (no words yet).
        prefilling = conversation.generating and bool(answers) and answers.last().prefilling
        title = chat_title(model, state, conversation.generating, prefilling)
        self.query_one("#chat", Vertical).border_title = title
        self.query_one(ChatPane).set_hint(empty_hint(model, state))

    def _status_text(self) -> Text:
        state = self._host.state
        status = state.instance_status
        if status is None:
            placed = isinstance(self._host.selection.placement, Placement)
            return Text(f"{shown('app.launch')} launches" if placed else "", style="dim")
        if status == "loading":
            started = self._load_started
            elapsed = "" if started is None else f" {time.monotonic() - started:.1f} s"
            fetching = any(n.runner.state == "downloading" for n in state.nodes)
            doing = "downloading" if fetching else "loading"
            return Text(f"{doing}…{elapsed} ({shown('app.stop')} cancels)")
        if status == "failed" and state.instance is not None:
            reason = state.instance.failed_reason or "a node failed"
            again = f"{shown('app.launch')} places and launches again"
            return Text(f"failed: {reason}. {again}.", style="red")
        if status in ("ready", "generating"):
            return Text(f"{status} · {shown('app.unload')} unloads", style="green")
        return Text(status)

    # The chat's keys

    async def action_regenerate(self) -> None:
        can_answer = self._host.state.instance_status != "failed"
        turn = await self._host.conversation.regenerate(can_answer)
        if turn is not None:
            await turn

    def action_edit_last(self) -> None:
        self._host.conversation.edit_last()

    def action_fork(self) -> None:
        conversation = self._host.conversation
        if conversation.can_fork():
            self.app.push_screen(ForkFromScreen(conversation.messages), conversation.fork_from)

    def action_chat_settings(self) -> None:
        conversation = self._host.conversation
        dialog = ChatSettingsScreen(conversation.settings, SYSTEM_PROMPT)
        self.app.push_screen(dialog, conversation.change_settings)

    # Models

    @work(thread=True, exclusive=True, group="models")
    def find_models(self) -> None:
        from engine.models.finding import find_models

        cards = find_models(self._models_dirs, include_bundled=self._bundled)
        self.app.call_from_thread(self._models_found, cards)

    def rescan_models(self) -> None:
        """In a worker thread: a peer had this node download its share of a model."""
        from engine.models.finding import find_models

        cards = find_models(self._models_dirs, include_bundled=self._bundled)
        self.app.call_from_thread(self._set_cards, cards)

    def _set_cards(self, cards: list[ModelCard]) -> None:
        self.cards = cards
        self._host.refresh_local_stats()

    def _models_found(self, cards: list[ModelCard]) -> None:
        self._set_cards(cards)
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
        card = self._host.selection.card
        demo = self._load_demo and not wanted and card is not None and card.source == "bundled"
        if self._load_at_start or demo:
            # Once: models are found again after each download.
            self._load_at_start = self._load_demo = False
            self.launch()

    def _choose_path(self, spec: str) -> None:
        from engine.models.finding import resolve_model

        try:
            self.choose_model(resolve_model(spec, self._models_dirs))
        except EngineError as error:
            self.notify(str(error), severity="error", timeout=10)

    def choose_model(self, card: ModelCard) -> None:
        self._host.selection.choose_model(card)
        self._host.show_state()

    def _fit(self, card: ModelCard) -> tuple[bool, str]:
        return self._host.selection.fit(self._host.state, card)

    def pick_model(self) -> None:
        """Models on disk, then the catalogue's models that are not."""
        entries = [PickerEntry(card, *self._fit(card)) for card in self.cards]
        on_disk = {card.name.lower() for card in self.cards}
        for entry in self._catalogue:
            if entry.repo.lower() not in on_disk:
                card = entry_card(entry)
                entries.append(PickerEntry(card, *self._fit(card), catalogue=entry))

        def chosen(entry: PickerEntry | None) -> None:
            if entry is None:
                return
            if entry.catalogue is None:
                self.choose_model(entry.card)
            else:
                self._offer_download(entry.catalogue, entry.fits, entry.fit_note)

        card = self._host.selection.card
        self.app.push_screen(ModelPicker(entries, card.name if card else None), chosen)

    # Downloads

    def _offer_download(self, entry: CatalogueEntry, fits: bool, fit_note: str) -> None:
        panel = self.query_one(DownloadPanel)
        if panel.active:
            self.notify(
                f"{panel.repo_id} is downloading; {shown('app.stop')} cancels it.",
                severity="warning",
            )
            return

        def confirmed(choice: Choice) -> None:
            if choice == "here":
                panel.start(entry.repo)
            elif choice == "shares":
                self.choose_model(entry_card(entry))
                self.notify(
                    f"{entry.repo} chosen: {shown('app.launch')} downloads each node's share "
                    "and loads."
                )

        nodes = len(self._host.selection.candidates(self._host.state))
        self.app.push_screen(DownloadConfirm(entry, fits, fit_note, nodes), confirmed)

    @on(DownloadPanel.Finished)
    def _downloaded(self, message: DownloadPanel.Finished) -> None:
        self.notify(f"{message.repo_id} is downloaded; loading it.")
        self._preselect = message.repo_id  # chosen once the models are found again
        self._load_at_start = True  # and launched: the user asked for this model
        self.find_models()

    @on(DownloadPanel.Failed)
    def _download_failed(self, message: DownloadPanel.Failed) -> None:
        severity = "warning" if message.cancelled else "error"
        self.notify(message.error, severity=severity, timeout=10)

    def cancel_download(self) -> None:
        self.query_one(DownloadPanel).cancel()

    # Strategy

    @on(LaunchPanel.StrategyChosen)
    def _strategy_chosen(self, event: LaunchPanel.StrategyChosen) -> None:
        self.set_strategy(event.strategy)

    def set_strategy(self, strategy: Strategy) -> None:
        card = self._host.selection.card
        if strategy == "tensor" and card is not None and not card.supports_tensor:
            self.notify(f"Tensor sharding is unavailable: {card.tensor_unsupported_reason}")
            strategy = "pipeline"
        self._host.selection.strategy = strategy
        self._host.show_state()

    # Launch and load

    def launch(self) -> None:
        host = self._host
        card = host.selection.card
        if card is None:
            self.notify(f"Pick a model first ({shown('app.pick_model')}).", severity="warning")
            return
        if host.state.instance_status in ("loading", "ready", "generating"):
            self.notify(f"A model is loaded or loading; {shown('app.unload')} unloads it first.")
            return
        if host.state.instance is not None:  # failed: place again on the nodes that are left
            host.dispatch(InstanceCleared())
        placement = host.selection.placement
        if not isinstance(placement, Placement):
            message = placement.message if placement else "nothing to place"
            self.notify(f"Cannot launch: {message}", severity="error", timeout=8)
            return
        across = placement.world_size > 1 or placement.node_ids != (host.local_id,)
        if across and host.node is None:
            self.notify("Placing on other nodes needs the cluster: start without --no-cluster.")
            return
        fetches: Fetches = {}
        if across:
            try:
                nodes = [n.stats for n in host.state.nodes]
                fetches = plan_fetches(placement, card, nodes)
            except ClusterError as error:
                self.notify(f"Cannot launch: {error}", severity="error", timeout=10)
                return
        elif not on_disk(card):
            entry = next((e for e in self._catalogue if e.repo.lower() == card.name.lower()), None)
            if entry is None:
                self.notify(cannot_load_alone(card), severity="error", timeout=10)
            else:
                self._offer_download(entry, *self._fit(card))
            return
        host.dispatch(InstancePlaced(placement=placement))
        self._load_started = time.monotonic()
        if self._load_clock is not None:
            self._load_clock.stop()
        self._load_clock = self.set_interval(0.2, self._tick_loading, name="load-clock")
        if across:
            self._launch_on_cluster(placement, card, fetches)
        else:
            self._load(card)

    @work(exclusive=True, group="load")
    async def _launch_on_cluster(
        self, placement: Placement, card: ModelCard, fetches: Fetches
    ) -> None:
        """Every node of the placement fetches its share of the files if it lacks them, then
        loads its ranks; their bars fill from their progress."""
        assert self._host.node is not None
        coordinator = self._host.node.coordinator
        try:
            await coordinator.launch(placement, card, fetches=fetches)
        except ClusterError as error:
            self.notify(f"Launch failed: {error}", severity="error", timeout=10)
            return
        loop = asyncio.get_running_loop()
        self._host.conversation.backend = ClusterBackend(coordinator, card, loop)
        self.notify(f"{card.name} is ready on {placement.world_size} nodes. Ask away.")

    def _tick_loading(self) -> None:
        """The elapsed time while loading; the clock stops with the load."""
        if self._host.state.instance_status == "loading":
            self.query_one(LaunchPanel).set_status(self._status_text())
        elif self._load_clock is not None:
            self._load_clock.stop()
            self._load_clock = None

    @work(thread=True, exclusive=True, group="load")
    def _load(self, card: ModelCard) -> None:
        worker = get_current_worker()
        with self._host.in_flight.running() as allowed:
            if allowed:
                ENGINE_THREAD.run(lambda: self._load_layers(card, worker))

    def _load_layers(self, card: ModelCard, worker: Worker[None]) -> None:
        from engine.loading import load_model

        node = self._host.local_id
        post = self.post_message

        def progressed(progress: LoadProgress) -> None:
            if worker.is_cancelled:
                raise _LoadCancelled
            layers = progress.layers_loaded
            post(ClusterChanged(LoadProgressed(node_id=node, layers_loaded=layers,
                                               total=progress.total)))  # fmt: skip

        try:
            loading = load_model(Path(card.path))
            post(ClusterChanged(LoadStarted(node_id=node, model=card.name, total=card.num_layers)))
            loaded: LoadedModel = run_loading(loading, progressed)
            # Read by path, a model in the hub cache is named after its snapshot folder (a
            # commit id); the chosen card has the name the user picked.
            loaded.card = card
        except _LoadCancelled:
            post(ClusterChanged(Unloaded(node_id=node)))
            post(ClusterChanged(InstanceCleared()))
            return
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

    @on(AnswerView.Prefilling)
    def _prefilling(self, _: AnswerView.Prefilling) -> None:
        self.show(self._host.state)

    @on(ModelLoaded)
    def _model_loaded(self, message: ModelLoaded) -> None:
        self._host.conversation.backend = LocalBackend(message.loaded)
        garbage.freeze()
        self.notify(f"{message.loaded.card.name} is ready. Ask away.")

    def cancel_load(self) -> None:
        self.workers.cancel_group(self, "load")

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state == WorkerState.ERROR and event.worker.group == "load":
            self._host.conversation.set_generating(False)
            self.notify(f"{event.worker.name} failed: {event.worker.error}", severity="error")


def on_disk(card: ModelCard) -> bool:
    """Whether this machine holds all of `card`'s files (a catalogue card's path is where its
    download would go)."""
    return card.layers_on_disk is None and (Path(card.path) / "config.json").is_file()


def cannot_load_alone(card: ModelCard) -> str:
    """Why `card` cannot load on this node alone: by name, the files its folder lacks."""
    alone = f"Cannot load {card.name} on this node alone ({card.partial_note or 'nothing on disk'})"
    try:
        require_weight_files(Path(card.path), name=card.name)
    except EngineError as error:
        nodes = shown("app.choose_nodes")
        return f"{alone}: {error}. {nodes} places it across the nodes that hold the rest."
    return (
        f"{alone}. Place it across the nodes that hold the rest ({shown('app.choose_nodes')}), "
        "or download it: "
        "exo-tui models download"
    )
