"""The app's own messages: what its workers and threads send back to the screen's thread."""

from __future__ import annotations

from textual.message import Message as TextualMessage

from engine.loading import LoadedModel
from engine.types import Message
from exo_tui.cluster.control.state import ClusterEvent


class ClusterChanged(TextualMessage):
    """An event for the reducer, posted from a worker thread."""

    def __init__(self, event: ClusterEvent) -> None:
        super().__init__()
        self.event = event


class ModelLoaded(TextualMessage):
    def __init__(self, loaded: LoadedModel) -> None:
        super().__init__()
        self.loaded = loaded


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
