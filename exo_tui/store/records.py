"""A chat and a stored message as the rest of the app sees them, and a new chat's title."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from typing import Any

from pydantic import Field, ValidationError

from engine.types import Frozen, Message

DEFAULT_TITLE = "New chat"
MAX_TEMPERATURE = 2.0
MAX_ANSWER_TOKENS = 32768


class ChatSettings(Frozen):
    """How a chat's answers are made. ``system_prompt`` None: the app's own."""

    system_prompt: str | None = None
    temperature: float = Field(default=0.0, ge=0.0, le=MAX_TEMPERATURE)
    max_tokens: int = Field(default=1024, ge=1, le=MAX_ANSWER_TOKENS)


def settings_of(stored: str | None) -> ChatSettings:
    """A chat's settings from their stored JSON; the defaults for none, or for ones this
    version cannot read."""
    if stored is None:
        return ChatSettings()
    try:
        return ChatSettings.model_validate_json(stored)
    except ValidationError:
        return ChatSettings()


TITLE_LENGTH = 40


class ChatSummary(Frozen):
    """A chat as the chat list shows it. ``updated_at`` is when its last message was written.
    A branch (forked from an earlier message of another chat) names its ``parent_id`` and the
    position it forked at: it holds the parent's messages before it, then its own."""

    id: str
    title: str
    model: str
    created_at: datetime
    updated_at: datetime
    message_count: int
    settings: ChatSettings = ChatSettings()
    parent_id: str | None = None
    fork_position: int | None = None


class StoredMessage(Frozen):
    """A message with what the store keeps beside it: its place, its stats and when it came."""

    position: int
    message: Message
    stats: dict[str, Any] | None
    created_at: datetime


class ChatMatch(Frozen):
    """A chat whose messages hold the searched text: the first message that does, and the text
    around the match."""

    chat_id: str
    position: int
    snippet: str


SNIPPET_BEFORE = 16  # characters of context: enough to read, short enough for a list's column
SNIPPET_AFTER = 28


def snippet(text: str, wanted: str) -> str:
    """The words around the first `wanted` in `text` (ignoring case), whitespace folded."""
    flat = " ".join(text.split())
    at = flat.lower().find(" ".join(wanted.split()).lower())
    if at < 0:
        return flat[: SNIPPET_BEFORE + SNIPPET_AFTER]
    start, end = max(0, at - SNIPPET_BEFORE), at + len(wanted) + SNIPPET_AFTER
    return ("…" if start else "") + flat[start:end] + ("…" if end < len(flat) else "")


def auto_title(text: str, limit: int = TITLE_LENGTH) -> str | None:
    """A chat title from its first user message: whitespace folded, cut at a word near ``limit``."""
    flat = " ".join(text.split())
    if not flat:
        return None
    if len(flat) <= limit:
        return flat
    cut = flat[:limit]
    space = cut.rfind(" ")
    if space >= limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,.;:-") + "…"


def as_time(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)


def new_chat(
    model: str,
    title: str | None = None,
    settings: ChatSettings | None = None,
    fork_of: tuple[str, int] | None = None,
) -> ChatSummary:
    """A chat that exists only in memory until ``append_turn`` writes its first turn.
    ``fork_of``: the chat it branches from and the position it forks at."""
    now = as_time(time.time())
    clean = " ".join(title.split()) if title is not None else ""
    return ChatSummary(
        id=uuid.uuid4().hex,
        title=clean or DEFAULT_TITLE,
        model=model,
        created_at=now,
        updated_at=now,
        message_count=0,
        settings=settings or ChatSettings(),
        parent_id=fork_of[0] if fork_of else None,
        fork_position=fork_of[1] if fork_of else None,
    )
