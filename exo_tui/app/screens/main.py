"""The main screen: the nodes, download and launch panels beside the chat."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Header

from exo_tui.app.widgets.chat import ChatPane, PromptInput
from exo_tui.app.widgets.download import DownloadPanel
from exo_tui.app.widgets.launch import LaunchPanel
from exo_tui.app.widgets.nodes import NodesPanel


class MainScreen(Screen[None]):
    class Ready(Message):
        """The panels are mounted: the app can fill them."""

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
        self.query_one("#chat", Vertical).border_title = "Chat"
        self.post_message(self.Ready())
