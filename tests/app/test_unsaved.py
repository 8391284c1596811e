"""Turns waiting for the store: written in order, over what they replace, as their chat is now."""

from __future__ import annotations

from pathlib import Path

from engine.types import Message
from exo_tui.app.unsaved import UnsavedTurns
from exo_tui.store.chats import ChatStore
from exo_tui.store.records import ChatSettings, new_chat


def test_waiting_turns_apply_in_order_and_create_the_chat_as_it_is_now(tmp_path: Path) -> None:
    with ChatStore(tmp_path / "chats.db") as store:
        unsaved = UnsavedTurns(store)
        chat = new_chat("demo")
        question = Message(role="user", content="q")
        unsaved.add(chat, [question, Message(role="assistant", content="a")], stats=[None, {}])
        unsaved.add(chat, [Message(role="assistant", content="again")], replace_from=1)
        assert unsaved.apply(chat.id, []) == [
            (question, None),
            (Message(role="assistant", content="again"), None),
        ]
        warmer = ChatSettings(temperature=0.7)
        unsaved.update_chat(chat.model_copy(update={"settings": warmer}))
        assert unsaved.save() is None
        assert [m.content for m in store.messages(chat.id)] == ["q", "again"]
        assert store.get_chat(chat.id).settings == warmer


def test_a_chats_stats_are_the_stored_ones_then_those_still_waiting(tmp_path: Path) -> None:
    with ChatStore(tmp_path / "chats.db") as store:
        unsaved = UnsavedTurns(store)
        chat = new_chat("demo")
        assert unsaved.stats(chat.id) == []  # neither stored nor waiting
        first = [Message(role="user", content="q"), Message(role="assistant", content="a")]
        unsaved.add(chat, first, stats=[None, {"ttft": 1}])
        assert unsaved.save() is None
        unsaved.add(chat, [Message(role="assistant", content="b")], stats=[{"ttft": 2}])
        assert unsaved.stats(chat.id) == [None, {"ttft": 1}, {"ttft": 2}]
