"""The TUI serving the API (--api-port): a real client's request answered by the model the app
loaded, shown live in the requests panel."""

from __future__ import annotations

import threading
from pathlib import Path

import openai
import pytest
from rich.text import Text

from exo_tui.app.api_service import ApiService
from exo_tui.app.main import ExoTuiApp
from exo_tui.app.widgets.requests import RequestsTable
from tests.app.helpers import fixed_stats, wait_until


@pytest.mark.anyio
async def test_a_client_is_answered_by_the_loaded_model_and_shown_in_the_panel(
    tmp_path: Path,
) -> None:
    app: ExoTuiApp | None = None
    service = ApiService("127.0.0.1", 0, None, lambda: app.conversation.backend if app else None)
    app = ExoTuiApp(
        model="demo", load=True, chat_db=tmp_path / "chats.db", node_stats=fixed_stats(),
        api=service,
    )  # fmt: skip
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_until(pilot, lambda: app.conversation.backend is not None, timeout=120)
        answers: list[str] = []

        def ask() -> None:
            client = openai.OpenAI(base_url=f"{service.url}/v1", api_key="none", max_retries=0)
            reply = client.chat.completions.create(
                model="demo",
                messages=[{"role": "user", "content": "Say hello."}],
                max_tokens=40,
                temperature=0,
            )
            answers.append(reply.choices[0].message.content or "")

        thread = threading.Thread(target=ask)
        thread.start()
        table = app.query_one(RequestsTable)
        await wait_until(pilot, lambda: not thread.is_alive(), timeout=120)
        assert answers and answers[0].strip()

        def states() -> list[str]:
            cells = [table.get_cell(row.key, "state") for row in table.ordered_rows]
            return [c.plain if isinstance(c, Text) else str(c) for c in cells]

        await wait_until(
            pilot, lambda: bool(states()) and states()[0] in ("done", "cancelled", "error")
        )
        assert states() == ["done"], app.api.board.snapshot() if app.api else None
        assert service.url in str(app.query_one("#requests-url").render())
    # Quitting closed the port.
    with pytest.raises(openai.APIConnectionError):
        openai.OpenAI(base_url=f"{service.url}/v1", api_key="none", max_retries=0).models.list()


def test_the_tui_refuses_to_serve_off_loopback_without_a_key() -> None:
    from engine.errors import EngineError

    with pytest.raises(EngineError, match="--api-key"):
        ApiService("0.0.0.0", 0, None, lambda: None)
