"""The Textual app: the node's lifecycle, model finding, the picker, downloads, launch and load.

The app renders state and turns keys into commands. Cluster state changes only through the pure
reducer (`exo_tui.cluster.control.state.apply`); the user's choices are in `Selection`, the chat
in `Conversation`. Loading runs in thread workers and comes back as messages. Quitting stops the
MLX work and waits for it, then checkpoints the store.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import ClassVar

from rich.text import Text
from textual import on, work
from textual.app import App, SystemCommand
from textual.binding import BindingType
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.timer import Timer
from textual.worker import Worker, WorkerState, get_current_worker

from engine.errors import EngineError
from engine.generate import wait_for_streams
from engine.loading import LoadedModel, run_loading
from engine.models import require_weight_files
from engine.types import LoadProgress, ModelCard
from exo_tui.app import garbage
from exo_tui.app.bindings import APP_BINDINGS
from exo_tui.app.conversation import Conversation
from exo_tui.app.engine_thread import ENGINE_THREAD
from exo_tui.app.failures import cluster_failure
from exo_tui.app.inflight import WorkInFlight
from exo_tui.app.keymap import KeymapError, load_keymap
from exo_tui.app.messages import ClusterChanged, HistorySaved, ModelLoaded, TurnEnded
from exo_tui.app.pacing import thread_cpu_clock
from exo_tui.app.screens.chats import ChatsScreen, write_export
from exo_tui.app.screens.download_confirm import Choice, DownloadConfirm
from exo_tui.app.screens.help import HelpScreen
from exo_tui.app.screens.main import MainScreen
from exo_tui.app.screens.model_picker import ModelPicker, PickerEntry
from exo_tui.app.screens.nodes import Cancelled as NODES_CANCELLED
from exo_tui.app.screens.nodes import NodesScreen
from exo_tui.app.selection import Selection
from exo_tui.app.widgets.chat import AnswerView, PromptInput
from exo_tui.app.widgets.download import DownloadPanel
from exo_tui.app.widgets.launch import LaunchPanel
from exo_tui.app.widgets.nodes import NodesPanel
from exo_tui.chat.backend import ClusterBackend, LocalBackend
from exo_tui.chat.tools import builtin_registry
from exo_tui.cluster.control.coordinator import ClusterError, Fetches, plan_fetches
from exo_tui.cluster.control.placement import Placement, Strategy
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
    NodeSeen,
    NodeStats,
    StatsUpdated,
    Unloaded,
    apply,
)
from exo_tui.cluster.local import cluster_summary, local_node_id, local_node_stats
from exo_tui.cluster.node import ClusterSetup, Foreign, Node
from exo_tui.hub.catalogue import CatalogueEntry, entry_card, load_catalogue
from exo_tui.rate import NoticeRate
from exo_tui.store.chats import ChatStoreError, ChatSummary, render_markdown
from exo_tui.store.paths import config_dir, data_dir

# How long a thread may hold the GIL while another waits for it (Python's default: 5 ms). The
# engine's thread needs it for a moment each token, between computations that run without it;
# at the default it waited out whole screen redraws, and streaming through the app fell behind
# the headless CLI (bench/tui_stream.py measures it).
GIL_SWITCH_INTERVAL_S = 0.001
REFUSAL_NOTICE_EVERY_S = 10.0  # refused peers are all listed; pop-ups about them, no oftener
REFUSED_REMEMBERED = 1024  # addresses already said in a notice
SAVE_RETRY_S = 5.0  # how often turns the store refused are tried again
# How long quitting waits for MLX work to stop (it stops within one step) and a history write.
QUIT_WAIT_S = 60.0


class _LoadCancelled(Exception):
    """The user stopped a load between two layers."""


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
        self._bundled = bundled
        self._node_stats = node_stats
        self._preselect = model
        self._load_at_start = load
        self._models_dirs = models_dirs
        self._chat_db = chat_db
        self.state = ClusterState()
        self.selection = Selection()
        self.cards: list[ModelCard] = []
        self._in_flight = WorkInFlight()
        self._switch_interval = sys.getswitchinterval()  # put back when the app ends
        self._screen_cpu: Callable[[], float] | None = None  # paces streamed text (on mount)
        self._load_started: float | None = None
        self._load_clock: Timer | None = None
        tools = builtin_registry(lambda: cluster_summary(self.state, self._model_name()))
        self.conversation = Conversation(self, tools, self._in_flight, lambda: self._screen_cpu)

    # Layout

    def get_default_screen(self) -> Screen[None]:
        return MainScreen(id="_default")

    def on_mount(self) -> None:
        sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
        self._screen_cpu = thread_cpu_clock(threading.current_thread())
        self._apply_keymap()

    @on(MainScreen.Ready)
    def _start(self) -> None:
        """The panels are there: this node shows itself, finds its models, joins the cluster."""
        self.dispatch(NodeSeen(stats=self._node_stats(()), at=time.time()))
        self.set_interval(1.0, self._refresh_local_stats)
        notice = self.conversation.open_store(self._chat_db)
        if notice:
            self.notify(notice, severity="warning", timeout=15)
        self.set_interval(SAVE_RETRY_S, self.conversation.save_waiting)
        self._find_models()
        if self._cluster is not None:
            # A small model is best on this node alone; F2 chooses others to place across.
            self.choose_nodes((self.local_id,))
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
                self.choose_nodes(node_ids)

        self.push_screen(NodesScreen(self.state.nodes, self.selection.chosen_nodes), chosen)

    def choose_nodes(self, node_ids: tuple[str, ...] | None) -> None:
        """Place on `node_ids` (in ring order), or on every online node (None)."""
        self.selection.chosen_nodes = node_ids
        self.show_state()

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
        self.show_state()

    def show_state(self) -> None:
        """Place the selection again and redraw the panels."""
        self.selection.refresh(self.state)
        try:
            self.query_one(NodesPanel).show(self.state)
            self._show_launch()
        except NoMatches:  # shutting down: a timer's event after the widgets went
            return

    def _show_launch(self) -> None:
        names = {n.node_id: n.name for n in self.state.nodes}
        panel = self.query_one(LaunchPanel)
        selection = self.selection
        panel.show(selection.card, selection.strategy, selection.placement, names)
        panel.set_status(self._status_text())

    def _status_text(self) -> Text:
        status = self.state.instance_status
        if status is None:
            hint = "Ctrl+L launches" if isinstance(self.selection.placement, Placement) else ""
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
        backend = self.conversation.backend
        return backend.card.name if backend is not None else None

    # Models

    @work(thread=True, exclusive=True, group="models")
    def _find_models(self) -> None:
        from engine.models import find_models

        cards = find_models(self._models_dirs, include_bundled=self._bundled)
        self.call_from_thread(self._models_found, cards)

    def _store_changed(self) -> None:
        """A peer had this node download its share of a model (runs in a worker thread)."""
        from engine.models import find_models

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
        from engine.models import resolve_model

        try:
            self.choose_model(resolve_model(spec, self._models_dirs))
        except EngineError as error:
            self.notify(str(error), severity="error", timeout=10)

    def choose_model(self, card: ModelCard) -> None:
        self.selection.choose_model(card)
        self.show_state()

    def _fit(self, card: ModelCard) -> tuple[bool, str]:
        return self.selection.fit(self.state, card)

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

        card = self.selection.card
        current = card.name if card else None
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

        nodes = len(self.selection.candidates(self.state))
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
        self._set_strategy("tensor" if self.selection.strategy == "pipeline" else "pipeline")

    @on(LaunchPanel.StrategyChosen)
    def _strategy_chosen(self, event: LaunchPanel.StrategyChosen) -> None:
        self._set_strategy(event.strategy)

    def _set_strategy(self, strategy: Strategy) -> None:
        card = self.selection.card
        if strategy == "tensor" and card is not None and not card.supports_tensor:
            self.notify(f"Tensor sharding is unavailable: {card.tensor_unsupported_reason}")
            strategy = "pipeline"
        self.selection.strategy = strategy
        self.show_state()

    # Launch and unload

    def action_launch(self) -> None:
        card = self.selection.card
        if card is None:
            self.notify("Pick a model first (Ctrl+O).", severity="warning")
            return
        if self.state.instance_status in ("loading", "ready", "generating"):
            self.notify("A model is loaded or loading; Ctrl+U unloads it first.")
            return
        if self.state.instance is not None:  # failed: place again on the nodes that are left
            self.dispatch(InstanceCleared())
        placement = self.selection.placement
        if not isinstance(placement, Placement):
            message = placement.message if placement else "nothing to place"
            self.notify(f"Cannot launch: {message}", severity="error", timeout=8)
            return
        across = placement.world_size > 1 or placement.node_ids != (self.local_id,)
        if across and self._node is None:
            self.notify("Placing on other nodes needs the cluster: start without --no-cluster.")
            return
        fetches: Fetches = {}
        if across:
            try:
                nodes = [n.stats for n in self.state.nodes]
                fetches = plan_fetches(placement, card, nodes)
            except ClusterError as error:
                self.notify(f"Cannot launch: {error}", severity="error", timeout=10)
                return
        elif not self._on_disk(card):
            entry = self._catalogue_entry(card.name)
            if entry is None:
                self.notify(cannot_load_alone(card), severity="error", timeout=10)
            else:
                self._offer_download(entry, *self._fit(card))
            return
        self.dispatch(InstancePlaced(placement=placement))
        self._load_started = time.monotonic()
        if self._load_clock is not None:
            self._load_clock.stop()
        self._load_clock = self.set_interval(0.2, self._tick_loading, name="load-clock")
        if across:
            self._launch_on_cluster(placement, card, fetches)
        else:
            self._load(card)

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
        coordinator = self._node.coordinator
        try:
            await coordinator.launch(placement, card, fetches=fetches)
        except ClusterError as error:
            self.notify(f"Launch failed: {error}", severity="error", timeout=10)
            return
        self.conversation.backend = ClusterBackend(coordinator, card, asyncio.get_running_loop())
        self.notify(f"{card.name} is ready on {placement.world_size} nodes. Ask away.")

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

    @on(ClusterChanged)
    def _cluster_changed(self, message: ClusterChanged) -> None:
        self.dispatch(message.event)

    @on(ModelLoaded)
    def _model_loaded(self, message: ModelLoaded) -> None:
        self.conversation.backend = LocalBackend(message.loaded)
        garbage.freeze()
        self.notify(f"{message.loaded.card.name} is ready. Ask away.")

    def action_unload(self) -> None:
        if self.conversation.generating:
            self.notify("Stop the answer first (Esc).")
            return
        self.workers.cancel_group(self, "load")
        across = self._node is not None and self._node.coordinator.instance is not None
        backend, self.conversation.backend = self.conversation.backend, None
        if backend is not None:
            backend.unload()  # a cluster's instance stops on every node
        if across:
            if backend is None and self._node is not None:  # still launching
                self.run_worker(self._node.coordinator.stop(), group="unload")
            self.dispatch(InstanceCleared())
            return
        if backend is not None:
            garbage.settle()
        self.dispatch(Unloaded(node_id=self.local_id))
        self.dispatch(InstanceCleared())

    def action_stop(self) -> None:
        if self.conversation.generating:
            self.conversation.stop()
        elif self.state.instance_status == "loading":
            self.workers.cancel_group(self, "load")
        else:
            self.query_one(DownloadPanel).cancel()

    # Chat

    @on(PromptInput.Submitted)
    async def _prompt(self, event: PromptInput.Submitted) -> None:
        can_answer = self.state.instance_status != "failed"  # failed: launch again
        shown = await self.conversation.submit(event.text, can_answer)
        if shown is None:
            return
        for node_id in self._serving_nodes():
            self.dispatch(GenerationStarted(node_id=node_id))
        await shown

    @on(PromptInput.Changed)
    def _draft_changed(self, event: PromptInput.Changed) -> None:
        self.conversation.draft_changed(self.query_one(PromptInput).message)

    def _serving_nodes(self) -> tuple[str, ...]:
        """The nodes that run the model: those of the instance, or this one."""
        instance = self.state.instance
        return instance.placement.node_ids if instance is not None else (self.local_id,)

    @on(TurnEnded)
    def _turn_ended(self, message: TurnEnded) -> None:
        self.conversation.turn_ended(message)
        for node_id in self._serving_nodes():
            self.dispatch(GenerationFinished(node_id=node_id))

    @on(HistorySaved)
    def _history_saved(self, message: HistorySaved) -> None:
        self.conversation.history_saved(message.problem)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state == WorkerState.ERROR and event.worker.group in ("chat", "load"):
            self.conversation.set_generating(False)
            self.notify(f"{event.worker.name} failed: {event.worker.error}", severity="error")

    def action_new_chat(self) -> None:
        if self.conversation.generating:
            self.notify("Stop the answer first (Esc).")
            return
        self.conversation.new_chat()

    def action_chats(self) -> None:
        store = self.conversation.store
        if store is None:
            return

        def reopen(chat: ChatSummary | None) -> None:
            if chat is None:
                return
            try:
                stored = store.messages(chat.id)
            except ChatStoreError as error:
                self.notify(f"Could not open the chat: {error}", severity="error", timeout=10)
                return
            self.conversation.reopen(chat, stored)

        self.push_screen(ChatsScreen(store, export_dir=data_dir() / "exports"), reopen)

    def action_export_chat(self) -> None:
        chat, messages = self.conversation.summary, self.conversation.messages
        if chat is None or not messages:
            self.notify("Nothing to export yet.")
            return
        # From memory: it holds the turns the store has not taken yet too.
        markdown = render_markdown(chat, messages)
        try:
            path = write_export(data_dir() / "exports", chat, markdown)
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
        self.conversation.stop_all()
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
        self.conversation.finish()

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
    unsaved, store = app.conversation.unsaved, app.conversation.store
    if unsaved is not None and unsaved.waiting and store is not None:
        # The screen is gone: the last word on turns the store never took goes to the terminal.
        print(
            f"exo-tui: {unsaved.waiting} messages could not be saved to {store.path}: "
            f"{unsaved.problem}",
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
