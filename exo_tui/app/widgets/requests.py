"""The API panel: the requests other clients send, live, and Esc to cancel the one selected."""

from __future__ import annotations

import time
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from exo_tui.api.board import FINISHED, RequestBoard, ServedRequest
from exo_tui.untrusted import shown

REDRAW_EVERY_S = 0.25  # a flood of requests redraws the table at most this often
STATE_STYLES = {
    "queued": "yellow",
    "prefilling": "cyan",
    "answering": "bold green",
    "done": "dim",
    "cancelled": "dim red",
    "error": "red",
}
CLIENT_WIDTH = 24  # the client's address and User-Agent, cut to this many cells


def cell(text: str) -> Text:
    """A client's text in a cell: escaped, cut, and never read as markup (a DataTable reads a
    plain string's markup)."""
    return Text(shown(text)[:CLIENT_WIDTH], no_wrap=True)


def state_text(request: ServedRequest) -> Text:
    """ "queued #2", "answering", "error" ... in the state's colour."""
    label: str = request.state
    if request.state == "queued" and request.queue_position is not None:
        label = f"queued #{request.queue_position}"
    return Text(label, style=STATE_STYLES[request.state])


def summary(requests: tuple[ServedRequest, ...]) -> str:
    """The panel's title: how many requests run and wait."""
    running = sum(r.state in ("prefilling", "answering") for r in requests)
    waiting = sum(r.state == "queued" for r in requests)
    return f"API · {running} running · {waiting} queued"


class RequestsTable(DataTable[Text | str]):
    """The rows; Esc cancels the request under the cursor (the app's Esc stops the chat's
    answer everywhere else)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding(
            "escape",
            "cancel_request",
            "Cancel request",
            id="requests.cancel",
            tooltip="Cancel the API request under the cursor",
        ),
    ]

    def __init__(self, board: RequestBoard) -> None:
        super().__init__(id="requests-table", cursor_type="row", zebra_stripes=True)
        self.board = board

    def action_cancel_request(self) -> None:
        if self.row_count == 0:
            return
        request_id = str(self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value)
        request = next((r for r in self.board.snapshot() if r.id == request_id), None)
        if request is None or request.state in FINISHED or not self.board.cancel(request_id):
            self.notify("That request has finished already.")
            return
        self.notify(f"Cancelling {request_id} ({cell(request.client)}).")


class RequestsPanel(Vertical):
    """Shown while the app serves the API; hidden otherwise."""

    def __init__(self, board: RequestBoard, url: str) -> None:
        super().__init__(id="requests")
        self.board = board
        self.url = url
        self._dirty = True  # set from the server's threads; read by the redraw timer

    def compose(self) -> ComposeResult:
        yield Static(id="requests-url")
        yield RequestsTable(self.board)

    def on_mount(self) -> None:
        table = self.query_one(RequestsTable)
        # The narrow side panel shows the first columns: what the request is doing first.
        table.add_column("state", key="state")
        table.add_column("tokens", key="tokens")
        table.add_column("tok/s", key="rate")
        table.add_column("client", key="client")
        table.add_column("model", key="model")
        table.add_column("age", key="age")
        self.board.subscribe(self._changed)
        self.set_interval(REDRAW_EVERY_S, self._redraw_if_changed)
        self._redraw()

    def _changed(self) -> None:
        self._dirty = True

    def _redraw_if_changed(self) -> None:
        if self._dirty:
            self._redraw()

    def _redraw(self) -> None:
        self._dirty = False
        requests = self.board.snapshot()
        self.border_title = summary(requests)
        table = self.query_one(RequestsTable)
        cursor = table.cursor_row
        table.clear()
        now = time.time()
        for request in reversed(requests):  # the newest on top
            tokens = f"{request.prompt_tokens}+{request.completion_tokens}"
            rate = f"{request.tokens_per_second:.1f}" if request.completion_tokens > 1 else ""
            table.add_row(
                state_text(request),
                tokens,
                rate,
                cell(request.client),
                cell(request.model),
                f"{now - request.started_at:.0f} s",
                key=request.id,
            )
        if requests:
            table.move_cursor(row=min(cursor, len(requests) - 1))
        waiting = "" if requests else " · no requests yet"
        self.query_one("#requests-url", Static).update(Text(f"{self.url}{waiting}"))
