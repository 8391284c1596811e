"""The API panel over a real request board: live rows, queue positions, Esc cancels the selected."""

from __future__ import annotations

import threading

import pytest
from rich.text import Text
from textual.app import App, ComposeResult

from exo_tui.api.board import RequestBoard
from exo_tui.app.widgets.requests import RequestsPanel, RequestsTable
from tests.app.helpers import wait_until

URL = "http://127.0.0.1:8080"


class PanelApp(App[None]):
    CSS_PATH = "../../exo_tui/app/app.tcss"

    def __init__(self, board: RequestBoard) -> None:
        super().__init__()
        self.board = board

    def compose(self) -> ComposeResult:
        yield RequestsPanel(self.board, URL)


def cells(table: RequestsTable, column: str) -> list[str]:
    out: list[str] = []
    for row in table.ordered_rows:
        value = table.get_cell(row.key, column)
        out.append(value.plain if isinstance(value, Text) else str(value))
    return out


@pytest.mark.anyio
async def test_rows_follow_the_board_from_another_thread_and_esc_cancels_the_selected() -> None:
    board = RequestBoard()
    app = PanelApp(board)
    async with app.run_test(size=(100, 20)) as pilot:
        panel = app.query_one(RequestsPanel)
        table = app.query_one(RequestsTable)
        assert "no requests yet" in str(app.query_one("#requests-url").render())
        first_cancel, second_cancel = threading.Event(), threading.Event()

        def serve() -> None:  # as the server's threads write it
            first = board.open("openai", "demo", "127.0.0.1 · openai/python", first_cancel)
            board.update(
                first.id,
                state="answering",
                prompt_tokens=12,
                completion_tokens=30,
                tokens_per_second=41.5,
            )
            second = board.open("ollama", "demo", "127.0.0.1 · ollama-python", second_cancel)
            board.update(second.id, queue_position=1)

        thread = threading.Thread(target=serve)
        thread.start()
        thread.join()
        await wait_until(pilot, lambda: table.row_count == 2)
        assert cells(table, "state") == ["queued #1", "answering"]  # the newest on top
        assert cells(table, "tokens") == ["0+0", "12+30"]
        assert cells(table, "rate") == ["", "41.5"]
        assert panel.border_title == "API · 1 running · 1 queued"
        assert URL in str(app.query_one("#requests-url").render())

        table.focus()
        table.move_cursor(row=1)
        await pilot.press("escape")
        assert first_cancel.is_set() and not second_cancel.is_set()

        board.update("req-1", state="cancelled")
        await wait_until(pilot, lambda: cells(table, "state")[1] == "cancelled")
        await pilot.press("escape")  # a finished request: said, and nothing else is touched
        assert not second_cancel.is_set()
        await wait_until(pilot, lambda: any("finished" in n.message for n in app._notifications))


@pytest.mark.anyio
async def test_a_client_s_markup_and_escapes_are_shown_as_text() -> None:
    board = RequestBoard()
    app = PanelApp(board)
    async with app.run_test(size=(100, 20)) as pilot:
        table = app.query_one(RequestsTable)
        board.open("openai", "demo", "[bold red]evil\x1b[2J", threading.Event())
        await wait_until(pilot, lambda: table.row_count == 1)
        assert cells(table, "client") == ["[bold red]evil\\x1b[2J"]
