"""Turns the chat store has not taken yet: kept in memory, in order, and written whole later.

A full disk or another program's lock must cost the user nothing: the app keeps each finished
turn here, writes it with ``ChatStore.append_turn`` (one transaction, so never half a turn)
and, when the database refuses, keeps it and says why until a later try succeeds.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from engine.types import Frozen, Message
from exo_tui.store.chat_errors import ChatStoreError, ChatWriteError
from exo_tui.store.chats import ChatStore
from exo_tui.store.records import ChatSummary

Stats = dict[str, Any] | None


class WaitingTurn(Frozen):
    """A finished turn to write: each message with its stats; ``replace_from`` drops the chat's
    messages from there first."""

    chat: ChatSummary
    messages: tuple[Message, ...]
    stats: tuple[Stats, ...] = ()
    replace_from: int | None = None


class UnsavedTurns:
    """Safe to share between threads: saves run one at a time, oldest turn first."""

    def __init__(self, store: ChatStore) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._turns: list[WaitingTurn] = []
        self.problem: str | None = None  # why the last save failed, until one succeeds

    def add(
        self,
        chat: ChatSummary,
        messages: Sequence[Message],
        replace_from: int | None = None,
        stats: Sequence[Stats] = (),
    ) -> None:
        """Keep a finished turn for saving (a store opened read-only keeps nothing new).
        ``replace_from``: it replaces the chat's messages from that position on."""
        if self._store.read_only or (not messages and replace_from is None):
            return
        turn = WaitingTurn(
            chat=chat, messages=tuple(messages), stats=tuple(stats), replace_from=replace_from
        )
        with self._lock:
            self._turns.append(turn)

    def save(self) -> str | None:
        """Write every waiting turn; None when all are in, else why not (they stay here)."""
        with self._lock:
            while self._turns:
                turn = self._turns[0]
                try:
                    self._store.append_turn(
                        turn.chat, turn.messages, stats=turn.stats, replace_from=turn.replace_from
                    )
                except ChatWriteError as error:
                    self.problem = f"{error.reason}. {error.fix}"
                    return self.problem
                except ChatStoreError as error:
                    self.problem = str(error)
                    return self.problem
                del self._turns[0]
            self.problem = None
            return None

    def update_chat(self, chat: ChatSummary) -> None:
        """The chat changed (its settings) before the store took it: its waiting turns create
        it as it is now."""
        with self._lock:
            self._turns = [
                turn.model_copy(update={"chat": chat}) if turn.chat.id == chat.id else turn
                for turn in self._turns
            ]

    def forget(self, chat_id: str) -> None:
        """Drop the waiting turns of a chat the user deleted."""
        with self._lock:
            self._turns = [turn for turn in self._turns if turn.chat.id != chat_id]

    @property
    def waiting(self) -> int:
        """How many messages wait to be saved."""
        with self._lock:
            return sum(len(turn.messages) for turn in self._turns)

    def stats(self, chat_id: str) -> list[Stats]:
        """The stats of each message of a chat, as the store will hold them once its waiting
        turns are in (none for a chat the store cannot read now)."""
        try:
            stored = [(entry.message, entry.stats) for entry in self._store.entries(chat_id)]
        except ChatStoreError:  # not written yet (its turns wait here), or unreadable now
            stored = []
        return [record for _, record in self.apply(chat_id, stored)]

    def apply(
        self, chat_id: str, stored: Sequence[tuple[Message, Stats]]
    ) -> list[tuple[Message, Stats]]:
        """A chat's messages and their stats as they will be once its waiting turns are written
        over `stored`."""
        messages = list(stored)
        with self._lock:
            for turn in self._turns:
                if turn.chat.id == chat_id:
                    if turn.replace_from is not None:
                        del messages[turn.replace_from :]
                    stats = [*turn.stats, *[None] * (len(turn.messages) - len(turn.stats))]
                    messages.extend(zip(turn.messages, stats, strict=True))
        return messages
