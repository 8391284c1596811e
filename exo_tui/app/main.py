"""The Textual app: the node's lifecycle, the cluster state, the keymap and the runtime tuning.

The app turns keys into commands. Cluster state changes only through the pure reducer
(`exo_tui.cluster.control.state.apply`); the user's choices are in `Selection`, the chat in
`Conversation`, the panels and the work they start (models, downloads, launch, load) in
`MainScreen`. Quitting stops the MLX work and waits for it, then checkpoints the store.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import ClassVar

from textual import on
from textual.app import App, SystemCommand
from textual.binding import BindingType
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.worker import Worker, WorkerState

from engine.errors import EngineError
from engine.generate import wait_for_streams
from engine.mlx_threads import GIL_SWITCH_INTERVAL_S
from exo_tui.app import garbage
from exo_tui.app.api_service import ApiService
from exo_tui.app.bindings import APP_BINDINGS, CHAT_BINDINGS, PALETTE_SKIPS
from exo_tui.app.code_copy import CodeCopy
from exo_tui.app.conversation import Conversation
from exo_tui.app.engine_thread import ENGINE_THREAD
from exo_tui.app.failures import cluster_failure
from exo_tui.app.inflight import WorkInFlight
from exo_tui.app.keymap import KeymapError, binding_scopes, load_keymap
from exo_tui.app.keys import keys_of, pretty, shown, use_keymap
from exo_tui.app.messages import ClusterChanged, HistorySaved, TurnEnded
from exo_tui.app.pacing import thread_cpu_clock
from exo_tui.app.screens.chats import ChatsScreen, write_export
from exo_tui.app.screens.help import HelpScreen
from exo_tui.app.screens.main import MainScreen
from exo_tui.app.screens.nodes import Cancelled as NODES_CANCELLED
from exo_tui.app.screens.nodes import NodesScreen
from exo_tui.app.selection import Selection
from exo_tui.app.widgets.chat import AnswerView, code_blocks
from exo_tui.app.widgets.prompt import PromptInput
from exo_tui.chat.tools import builtin_registry
from exo_tui.cluster.control.state import (
    ClusterEvent,
    ClusterState,
    ForeignNode,
    ForeignSeen,
    GenerationFinished,
    GenerationStarted,
    InstanceCleared,
    NodeSeen,
    NodeStats,
    StatsUpdated,
    Unloaded,
    apply,
)
from exo_tui.cluster.node import ClusterSetup, Foreign, Node
from exo_tui.cluster.this_machine import cluster_summary, local_node_id, local_node_stats
from exo_tui.hub.catalogue import CatalogueEntry, load_catalogue
from exo_tui.rate import NoticeRate
from exo_tui.store.chat_errors import ChatStoreError
from exo_tui.store.export import render_markdown
from exo_tui.store.paths import config_dir, data_dir
from exo_tui.store.records import ChatSummary
from exo_tui.store.settings import load_settings, save_settings

REFUSAL_NOTICE_EVERY_S = 10.0  # refused peers are all listed; pop-ups about them, no oftener
REFUSED_REMEMBERED = 1024  # addresses already said in a notice
SAVE_RETRY_S = 5.0  # how often turns the store refused are tried again
# How long quitting waits for MLX work to stop (it stops within one step) and a history write;
# past it (one step of a slow model can take minutes) the turn is saved as it stands and the
# process ends without waiting (`run_app`).
QUIT_WAIT_S = 1.5


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
        load_demo: bool = False,
        node_stats: Callable[[Sequence[str]], NodeStats] = local_node_stats,
        bundled: bool = True,
        cluster: ClusterSetup | None = None,
        catalogue: Sequence[CatalogueEntry] | None = None,
        api: ApiService | None = None,
    ) -> None:
        """`catalogue`: the models the picker offers to download (default: the packaged one).
        `api`: the API to serve while the app runs (started at mount, stopped at the end)."""
        super().__init__()
        self.api = api
        self.abandoned = False  # quit with the model still inside a step: end the process
        self._cluster = cluster
        self._refused: set[str] = set()  # addresses refused so far
        self._refusal_notices = NoticeRate(REFUSAL_NOTICE_EVERY_S)
        self._node: Node | None = None
        self._bundled = bundled
        self._node_stats = node_stats
        self._models_dirs = models_dirs
        self._chat_db = chat_db
        self.state = ClusterState()
        self.selection = Selection()
        self._theme_remembered = False  # the saved theme is read at mount, then each change kept
        self._in_flight = WorkInFlight()
        self._switch_interval = sys.getswitchinterval()  # put back when the app ends
        self._screen_cpu: Callable[[], float] | None = None  # paces streamed text (on mount)
        self._code_copy = CodeCopy()  # which code block the copy key takes next
        tools = builtin_registry(lambda: cluster_summary(self.state, self._model_name()))
        self.conversation = Conversation(
            self, tools, self._in_flight, lambda: self._screen_cpu, self._generation_changed
        )
        offered = tuple(catalogue) if catalogue is not None else load_catalogue()
        self.main = MainScreen(self, models_dirs, bundled, offered, model, load, load_demo, api)

    # Layout

    def get_default_screen(self) -> Screen[None]:
        return self.main

    def on_mount(self) -> None:
        sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
        self._screen_cpu = thread_cpu_clock(threading.current_thread())
        self._apply_keymap()
        theme = load_settings().theme
        if theme in self.available_themes:
            self.theme = theme
        self._theme_remembered = True

    def watch_theme(self, theme: str) -> None:
        """Remember the theme the user picks (in the palette) for the next run."""
        if not self._theme_remembered:
            return
        try:
            save_settings(load_settings().model_copy(update={"theme": theme}))
        except OSError as error:
            self.notify(f"The theme will not be remembered: {error}", severity="warning")

    @on(MainScreen.Ready)
    def _start(self) -> None:
        """The panels are there: this node shows itself, finds its models, joins the cluster."""
        self.dispatch(NodeSeen(stats=self._node_stats(()), at=time.time()))
        self.set_interval(1.0, self.refresh_local_stats)
        notice = self.conversation.open_store(self._chat_db)
        if notice:
            self.notify(notice, severity="warning", timeout=15)
        self.conversation.reopen_last()
        self.set_interval(SAVE_RETRY_S, self.conversation.save_waiting)
        if self.api is not None:
            self.api.start()
        self.main.find_models()
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
            stats=lambda: self._node_stats(tuple(c.name for c in self.main.cards)).model_copy(
                update={"cards": tuple(self.main.cards)}
            ),
            on_event=self.dispatch,
            options=setup.options,
            on_foreign=self._foreign,
            models_dirs=self._models_dirs,
            include_bundled=self._bundled,
            on_store_changed=self.main.rescan_models,
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
        # The chat's keys are the main screen's: what they do needs the chat on screen.
        for target, bindings in ((self, APP_BINDINGS), (self.main, CHAT_BINDINGS)):
            for binding in bindings:
                if binding.id and binding.id not in PALETTE_SKIPS:
                    yield SystemCommand(
                        f"{binding.description} ({shown(binding.id)})",
                        binding.tooltip or binding.description,
                        getattr(target, f"action_{binding.action}"),
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
            self.main.show(self.state)
        except NoMatches:  # shutting down: a timer's event after the widgets went
            return

    def refresh_local_stats(self) -> None:
        models = tuple(c.name for c in self.main.cards)
        self.dispatch(StatsUpdated(stats=self._node_stats(models), at=time.time()))

    @property
    def node(self) -> Node | None:
        return self._node

    @property
    def in_flight(self) -> WorkInFlight:
        return self._in_flight

    @property
    def local_id(self) -> str:
        return self.state.nodes[0].node_id if self.state.nodes else local_node_id()

    def _model_name(self) -> str | None:
        backend = self.conversation.backend
        return backend.card.name if backend is not None else None

    # Models, strategy, launch: the screen does them, the keys come here

    def action_pick_model(self) -> None:
        self.main.pick_model()

    def action_toggle_strategy(self) -> None:
        self.main.set_strategy("tensor" if self.selection.strategy == "pipeline" else "pipeline")

    def action_launch(self) -> None:
        self.main.launch()

    @on(ClusterChanged)
    def _cluster_changed(self, message: ClusterChanged) -> None:
        self.dispatch(message.event)

    def action_unload(self) -> None:
        if self.conversation.refuse_while_answering():
            return
        self.main.cancel_load()
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
            self.main.cancel_load()
        else:
            self.main.cancel_download()

    # Chat

    @on(PromptInput.Submitted)
    async def _prompt(self, event: PromptInput.Submitted) -> None:
        can_answer = self.state.instance_status != "failed"  # failed: launch again
        turn = await self.conversation.submit(event.text, can_answer)
        if turn is None:  # refused: the text goes back into the prompt, nothing is lost
            event.prompt_input.give_back(event.text)
            return
        await turn

    @on(ChatsScreen.Deleted)
    def _chat_deleted(self, message: ChatsScreen.Deleted) -> None:
        self.conversation.chat_deleted(message.chat_id)

    @on(PromptInput.Changed)
    def _draft_changed(self, event: PromptInput.Changed) -> None:
        self.conversation.draft_changed(self.query_one(PromptInput).message)

    def _generation_changed(self, generating: bool) -> None:
        """An answer started or ended on the nodes that run the model: those of the instance,
        or this one."""
        instance = self.state.instance
        nodes = instance.placement.node_ids if instance is not None else (self.local_id,)
        for node_id in nodes:
            self.dispatch(
                (GenerationStarted if generating else GenerationFinished)(node_id=node_id)
            )

    @on(TurnEnded)
    def _turn_ended(self, message: TurnEnded) -> None:
        self.conversation.turn_ended(message)

    @on(HistorySaved)
    def _history_saved(self, message: HistorySaved) -> None:
        self.conversation.history_saved(message.problem)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state == WorkerState.ERROR and event.worker.group == "chat":
            self.conversation.set_generating(False)
            self.notify(f"{event.worker.name} failed: {event.worker.error}", severity="error")

    def action_new_chat(self) -> None:
        if self.conversation.refuse_while_answering():
            return
        self.conversation.new_chat()

    def action_chats(self) -> None:
        store = self.conversation.store
        if store is None:
            return
        if self.conversation.refuse_while_answering():  # the one rule with a new chat
            return

        def reopen(chat: ChatSummary | None) -> None:
            if chat is None:
                return
            try:
                stored = store.entries(chat.id)
            except ChatStoreError as error:
                self.notify(f"Could not open the chat: {error}", severity="error", timeout=10)
                return
            self.conversation.reopen(chat, stored)

        summary = self.conversation.summary
        open_chat = summary.id if summary is not None else None
        self.push_screen(ChatsScreen(store, data_dir() / "exports", open_chat), reopen)

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

    def action_copy_code(self) -> None:
        answers = list(self.query(AnswerView))
        blocks = code_blocks(answers[-1].text) if answers else []
        picked = self._code_copy.pick(blocks)
        if picked is None:
            self.notify("The last answer has no code block.")
            return
        block, place = picked
        self.copy_to_clipboard(block)
        lines = block.count("\n") + 1
        size = f"({lines} line{'s' if lines > 1 else ''})"
        if len(blocks) == 1:
            self.notify(f"Copied the code block {size}.")
            return
        which = "the last code block" if place == len(blocks) else f"code block {place}"
        again = f"{shown('app.copy_code')} again copies the one before"
        self.notify(f"Copied {which} of {len(blocks)} {size}; {again}.")

    async def on_unmount(self) -> None:
        sys.setswitchinterval(self._switch_interval)
        if self.api is not None:  # its requests are cancelled, its port closed
            await asyncio.to_thread(self.api.stop)
        # Quitting mid-answer, mid-prefill or mid-load: each stops at its next step.
        self.conversation.stop_all()
        self.main.cancel_load()
        # The ranks this node runs for an instance stop with the app (the node's own shutdown
        # runs in a worker that may not get to finish).
        if self._node is not None and self._node.host is not None:
            self._node.host.close_now()
        # Waited for off the event loop: a cluster answer's chunks come through it.
        await asyncio.to_thread(self._finish_work)

    def _finish_work(self) -> None:
        """Join the MLX work and history writes, then save what waits and checkpoint the store."""
        if not self._in_flight.close(QUIT_WAIT_S):
            self.conversation.abandon()
            self.abandoned = True
            return  # the store stays open (its writes are durable) for what still waits
        ENGINE_THREAD.run(wait_for_streams)  # on the thread that ran the work
        self.conversation.finish()

    # Help and keys

    def action_help(self) -> None:
        rows = [
            (
                ", ".join(pretty(key) for key in keys_of(b).split(",")),
                b.description,
                b.id or "",
            )
            for bindings in binding_scopes().values()
            for b in bindings
            if b.id and b.description
        ]
        self.push_screen(HelpScreen(rows))

    def _apply_keymap(self) -> None:
        path = config_dir() / "keys.toml"
        try:
            keymap = load_keymap(path)
        except KeymapError as error:
            self.notify(str(error), severity="error", timeout=15)
            keymap = {}
        use_keymap(keymap)
        self.set_keymap(keymap)


def run_app(
    model: str | None = None,
    models_dirs: list[Path] | None = None,
    load: bool = False,
    cluster: ClusterSetup | None = None,
    load_demo: bool = False,
    api: tuple[str, int, str | None] | None = None,
) -> int:
    """`api`: (host, port, key) to serve the OpenAI and Ollama APIs on, or None."""
    identity = cluster.identity if cluster is not None else None
    app: ExoTuiApp | None = None
    service = None
    if api is not None:
        try:
            service = ApiService(*api, lambda: app.conversation.backend if app else None)
        except OSError as error:
            raise EngineError(
                f"The API cannot listen: {error}",
                "Choose another --api-port, or stop what listens there",
            ) from None

    def node_stats(models: Sequence[str]) -> NodeStats:
        return local_node_stats(models, identity=identity)

    app = ExoTuiApp(
        model=model,
        models_dirs=models_dirs,
        load=load,
        node_stats=node_stats,
        cluster=cluster,
        load_demo=load_demo,
        api=service,
    )
    # A loop of our own: asyncio.run would wait, as it ends, for the worker threads in its
    # executor, one of them the answer a slow model is still inside of.
    loop = asyncio.new_event_loop()
    app.run(loop=loop)
    unsaved, store = app.conversation.unsaved, app.conversation.store
    if unsaved is not None and unsaved.waiting and store is not None:
        # The screen is gone: the last word on turns the store never took goes to the terminal.
        print(
            f"exo-tui: {unsaved.waiting} messages could not be saved to {store.path}: "
            f"{unsaved.problem}",
            file=sys.stderr,
        )
    if app.abandoned:
        # MLX still computing on a thread would abort an interpreter that ends under it
        # ("terminate called without an active exception"): the process ends here instead.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    loop.run_until_complete(loop.shutdown_default_executor())
    loop.close()
    return 0
