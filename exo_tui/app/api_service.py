"""The API the TUI serves while it runs (`exo-tui --api-port PORT`), on the model it has loaded.

The port is bound before the screen starts, so a port in use is said on the terminal, not lost
behind the screen; uvicorn logs nowhere, since a line on stderr would tear the screen.
"""

from __future__ import annotations

from exo_tui.api.board import RequestBoard
from exo_tui.api.loaded import BackendGetter
from exo_tui.api.server import ApiServer, build_app, require_key_off_loopback


class ApiService:
    def __init__(
        self, host: str, port: int, api_key: str | None, get_backend: BackendGetter
    ) -> None:
        """Raises EngineError off loopback without a key, OSError when the port is taken."""
        require_key_off_loopback(host, api_key)
        self.board = RequestBoard()
        app = build_app(get_backend, self.board, api_key=api_key)
        self._server = ApiServer(app, host, port, log_to_stderr=False)

    @property
    def url(self) -> str:
        return self._server.url

    def start(self) -> None:
        self._server.start()

    def stop(self) -> None:
        """Cancel what is queued or answering and close the port."""
        self._server.stop()
