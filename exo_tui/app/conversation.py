"""The chat in the app: prompt, turn, stream, store; and the draft prefill while the user types.

The app hands it the prompt's messages and the backend that answers, whatever its kind. Turns
run in thread workers on the MLX thread; each finished turn goes to the store whole, and stays
in memory until the store takes it."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from engine.loading import run_loading
from engine.types import (
    ChatRequest,
    DoneChunk,
    Message,
    PrefillProgress,
    ReasoningChunk,
    TextChunk,
)
from exo_tui.app.engine_thread import ENGINE_THREAD
from exo_tui.app.failed_turn import failed_at_once, failure, give_back, unsent
from exo_tui.app.inflight import WorkInFlight
from exo_tui.app.keys import shown
from exo_tui.app.messages import HistorySaved, TurnEnded
from exo_tui.app.pacing import RedrawPacer
from exo_tui.app.save_notice import save_notice
from exo_tui.app.turn_stats import cut_off, stats_of, turn_stats
from exo_tui.app.unsaved import Stats, UnsavedTurns
from exo_tui.app.widgets.chat import AnswerView, ChatPane
from exo_tui.app.widgets.prompt import PromptInput
from exo_tui.chat.backend import Backend
from exo_tui.chat.tools import ToolRegistry
from exo_tui.chat.turn import TurnEvent, chat_turn, joined
from exo_tui.store.chat_errors import ChatNotFoundError, ChatStoreError
from exo_tui.store.chats import ChatStore
from exo_tui.store.opening import open_chat_store
from exo_tui.store.records import (
    ChatSettings,
    ChatSummary,
    StoredMessage,
    auto_title,
    new_chat,
)

if TYPE_CHECKING:
    from textual.app import App
    from textual.timer import Timer
    from textual.widget import AwaitMount

SYSTEM_PROMPT = "You are exo-tui's assistant. Use the tools when they help; answer briefly."
# Seconds without a key press before the typed message is prefilled: between bursts of typing.
DRAFT_PREFILL_DELAY = 0.3
ATTACH_POLL_S = 0.005  # how often a finished answer looks whether it is on screen yet


# A turn being answered: its chat, its opening messages, where it replaces from, its answer.
OpenTurn = tuple[ChatSummary, tuple[tuple[Message, ...], tuple[Stats, ...]], int | None, AnswerView]


class Conversation:
    """The open chat, its messages, the backend that answers and the store that keeps them."""

    def __init__(
        self,
        app: App[None],
        tools: ToolRegistry,
        in_flight: WorkInFlight,
        screen_cpu: Callable[[], Callable[[], float] | None],
        generation_changed: Callable[[bool], None] = lambda generating: None,
    ) -> None:
        """`screen_cpu`: the screen thread's CPU clock (known once the app is mounted);
        `generation_changed`: told when an answer starts and when it ends."""
        self._app = app
        self.tools = tools
        self._in_flight = in_flight
        self._screen_cpu = screen_cpu
        self._generation_changed = generation_changed
        self.backend: Backend | None = None
        self.store: ChatStore | None = None
        self.unsaved: UnsavedTurns | None = None
        self.summary: ChatSummary | None = None
        self.messages: list[Message] = []
        self.generating = False
        self.settings = ChatSettings()  # the open chat's (a new chat's: the defaults)
        self._cancel = threading.Event()
        self._draft_timer: Timer | None = None
        self._save_problem: str | None = None  # the one the user was last told of
        self._answer: AnswerView | None = None  # the answer streaming, or the last one
        self._sent: Message | None = None  # the user message it answers (a regenerate: None)
        self._deleted: set[str] = set()  # chats deleted while open: a late turn is not saved
        # The turn being answered (its chat, opening and answer), for a quit that cannot wait.
        self._open_turn: OpenTurn | None = None
        self._saving = threading.Lock()  # one of the turn and a quit that gave up on it saves
        self._abandoned = False
        self.editing: int | None = None  # the user message the prompt holds to send again
        self.forking = False  # sending the message edited starts a branch: a new chat

    def open_store(self, chat_db: Path | None) -> str | None:
        """Open the history; a notice for the user, if the store has one."""
        opened = open_chat_store(chat_db)
        self.store = opened.store
        self.unsaved = UnsavedTurns(opened.store)
        return opened.notice

    # A turn

    async def submit(self, text: str, can_answer: bool) -> AwaitMount | None:
        """Answer `text`: the turn going on screen; None (and a word to the user) when nothing
        can answer it now. `can_answer`: whether the backend's instance still runs."""
        backend = self._backend_for_turn(can_answer)
        if backend is None:
            return None
        if self.generating:
            self._app.notify(f"Still answering; {shown('app.stop')} stops it.")
            return None
        user = Message(role="user", content=text)
        pane = self._app.query_one(ChatPane)
        editing, forking = self.editing, self.forking
        self._stop_editing()
        if editing is not None and forking:
            return await self._fork(backend, user, editing)
        if editing is not None:  # it replaces the message edited, and what came after it
            del self.messages[editing:]
            answer = self._start(backend, (*self.messages, user), (user,), replace_from=editing)
            await asyncio.sleep(0)
            await pane.drop_from_last_user(keep_user=False)
            self.messages.append(user)
            return pane.add_turn(text, answer)
        earlier = self.history_before_prompt()
        opening: tuple[Message, ...] = (user,)
        if self.summary is None:  # in memory: the store gets it with its first turn
            self.summary = new_chat(backend.card.name, settings=self.settings)
            self.messages = []
            opening = (*earlier, user)  # the system prompt that opens a chat
        answer = self._start(backend, (*earlier, user), opening, replace_from=None)
        await asyncio.sleep(0)  # the worker's task starts its thread now, not after all this
        self.messages.extend(opening)
        return pane.add_turn(text, answer)

    async def _fork(self, backend: Backend, user: Message, position: int) -> AwaitMount:
        """Start a branch: a new chat holding the messages before `position` (their stats
        lines too) and `user`, answered. The chat it forks from stays as it is."""
        assert self.summary is not None
        parent = self.summary
        before = self.messages[:position]
        stats = self.unsaved.stats(parent.id)[:position] if self.unsaved is not None else []
        stats += [None] * (len(before) - len(stats))
        # Named after the message edited: the chats list shows it under its parent, so what
        # the branch asked instead is what tells it from the parent and its other branches.
        self.summary = new_chat(
            backend.card.name,
            auto_title(user.content),
            settings=self.settings,
            fork_of=(parent.id, position),
        )
        opening = (*before, user)
        answer = self._start(backend, opening, opening, replace_from=None, stats=stats)
        self.messages = list(opening)
        await asyncio.sleep(0)
        pane = self._app.query_one(ChatPane)
        await pane.show_messages(before, [stats_of(record) for record in stats])
        self._app.notify(f"A new branch of “{parent.title}”; {shown('app.chats')} shows both.")
        return pane.add_turn(user.content, answer)

    async def regenerate(self, can_answer: bool) -> AwaitMount | None:
        """Answer the last user message again: its answer (tool rounds and all) goes, on
        screen and in the store, for the new one. None when it cannot be done now."""
        if self.refuse_while_answering():
            return None
        last = self._last_user()
        if last is None:
            self._app.notify("Nothing to answer again yet: ask something first.")
            return None
        backend = self._backend_for_turn(can_answer)
        if backend is None:
            return None
        del self.messages[last + 1 :]
        if self.settings.temperature == 0:
            self._app.notify(
                f"At temperature 0 the answer comes out the same; {shown('chat.settings')} "
                "sets a higher one."
            )
        answer = self._start(backend, tuple(self.messages), (), replace_from=last + 1)
        await asyncio.sleep(0)
        pane = self._app.query_one(ChatPane)
        await pane.drop_from_last_user(keep_user=True)
        return pane.add_answer(answer)

    def edit_last(self) -> None:
        """Put the last user message back in the prompt; sending it replaces that message and
        its answer. Asked again (or on another chat), the prompt is a plain one again."""
        if self.editing is not None:
            self._stop_editing()
            self._app.query_one(PromptInput).clear()
            return
        if self.refuse_while_answering():
            return
        last = self._last_user()
        if last is None:
            self._app.notify("No message to edit yet: ask something first.")
            return
        self.editing = last
        prompt = self._app.query_one(PromptInput)
        send = shown("prompt.send", PromptInput.BINDINGS)
        # Short enough for the prompt's border at 80 columns.
        note = f"{send} replaces your last message · {shown('chat.edit_last')} cancels"
        prompt.hold_for_edit(self.messages[last].content, note)
        prompt.focus()

    def fork_from(self, position: int | None) -> None:
        """Put the user message at `position` in the prompt (None: the user cancelled);
        sending it starts a new chat from there, and this one is kept. The history before it
        is prefilled at once, so the branch's answer starts from the cache whatever this chat
        left in it."""
        if position is None or self.refuse_while_answering():
            return
        if not 0 < position < len(self.messages) or self.messages[position].role != "user":
            return  # the chat changed under the list
        self.editing, self.forking = position, True
        prompt = self._app.query_one(PromptInput)
        send = shown("prompt.send", PromptInput.BINDINGS)
        # Short enough for the prompt's border at 80 columns.
        note = f"{send} forks a new chat · {shown('chat.fork')} cancels"
        text = self.messages[position].content
        prompt.hold_for_edit(text, note)
        prompt.focus()
        self.prefill_draft(text)

    def can_fork(self) -> bool:
        """Whether the open chat has a message to fork from (and a word to the user if not);
        asked while a message is held for editing, that edit is given up instead."""
        if self.editing is not None:
            self._stop_editing()
            self._app.query_one(PromptInput).clear()
            return False
        if self.refuse_while_answering():
            return False
        if self._last_user() is None:
            self._app.notify("No message to fork from yet: ask something first.")
            return False
        return True

    def _stop_editing(self) -> None:
        self.forking = False
        if self.editing is not None:
            self.editing = None
            for prompt in self._app.query(PromptInput):
                prompt.hold_for_edit("", None)

    def _last_user(self) -> int | None:
        """Where the last user message is in the open chat's messages."""
        users = [i for i, message in enumerate(self.messages) if message.role == "user"]
        return users[-1] if users and self.summary is not None else None

    def _backend_for_turn(self, can_answer: bool) -> Backend | None:
        if self.backend is None or not can_answer:
            self._app.notify(f"Launch a model first ({shown('app.launch')}).", severity="warning")
            return None
        return self.backend

    def _start(
        self,
        backend: Backend,
        history: tuple[Message, ...],
        opening: tuple[Message, ...],
        replace_from: int | None,
        stats: Sequence[Stats] = (),
    ) -> AnswerView:
        """Start answering the last message of `history` in a worker: the engine starts first,
        so storing the turn and putting it on screen overlap its prefill. The store gets
        `opening` (with `stats`, one per message, as far as they go) and what the answer adds,
        from `replace_from` on when it is given."""
        request = ChatRequest(
            messages=history,
            tools=self.tools.specs,
            max_tokens=self.settings.max_tokens,
            temperature=self.settings.temperature,
        )
        answer = self._answer = AnswerView()
        self._sent = opening[-1] if opening and opening[-1].role == "user" else None
        self.set_generating(True)
        cancel = self._cancel = threading.Event()
        backend.stop_prefill()  # stop prefilling for this turn: it is here
        assert self.summary is not None
        summary = self.summary
        first = (*stats, *[None] * (len(opening) - len(stats)))[: len(opening)]
        self._app.run_worker(
            lambda: self._generate(
                backend, request, answer, cancel, summary, (opening, first), replace_from
            ),
            name="_generate",
            group="chat",
            thread=True,
        )
        return answer

    @property
    def system_prompt(self) -> str:
        return self.settings.system_prompt or SYSTEM_PROMPT

    @property
    def max_tokens(self) -> int:
        return self.settings.max_tokens

    @max_tokens.setter
    def max_tokens(self, tokens: int) -> None:
        self.settings = self.settings.model_copy(update={"max_tokens": tokens})

    def change_settings(self, settings: ChatSettings | None) -> None:
        """The user saved the chat's settings (None: they cancelled): the next turn follows
        them, and the store keeps them with the chat."""
        if settings is None:
            return
        self.settings = settings
        saved = (
            f"Settings saved: temperature {settings.temperature:g}, "
            f"answers up to {settings.max_tokens:,} tokens."
        )
        if self.summary is None:  # a new chat: its first turn writes them
            self._app.notify(saved)
            return
        self.summary = self.summary.model_copy(update={"settings": settings})
        opening = None
        if self.messages and self.messages[0].role == "system":
            opening = self.system_prompt
            self.messages[0] = self.messages[0].model_copy(update={"content": opening})
        try:
            if self.store is not None:
                self.store.set_settings(self.summary.id, settings, opening)
        except ChatNotFoundError:  # not written yet: its first turn writes them
            if self.unsaved is not None:
                self.unsaved.update_chat(self.summary)
        except ChatStoreError as error:
            self._app.notify(
                f"The settings apply here but were not saved: {error}", severity="warning"
            )
            return
        self._app.notify(saved)

    def history_before_prompt(self) -> tuple[Message, ...]:
        """The messages the next prompt follows: a new chat starts with the system prompt; an
        edited message follows what came before the one it replaces."""
        if self.summary is None:
            return (Message(role="system", content=self.system_prompt),)
        return tuple(self.messages[: self.editing])

    def _generate(
        self,
        backend: Backend,
        request: ChatRequest,
        answer: AnswerView,
        cancel: threading.Event,
        chat: ChatSummary,
        opening: tuple[tuple[Message, ...], tuple[Stats, ...]],
        replace_from: int | None,
    ) -> None:
        """Answer, save the turn (`opening` and what the answer added, from `replace_from` on),
        then prefill the next."""
        with self._in_flight.running() as allowed:
            if not allowed:
                return
            dones: list[DoneChunk] = []
            self._open_turn = (chat, opening, replace_from, answer)
            added = ENGINE_THREAD.run(
                lambda: self.stream_turn(backend, request, answer, cancel, dones)
            )
            # Saved here, not from TurnEnded: a quit mid-answer still saves what was answered;
            # and off the MLX thread, so a store waiting out a lock does not hold up the model.
            with self._saving:
                self._open_turn = None
                if self._abandoned:  # a quit saved it already, as it stood
                    return
                if self.unsaved is not None and chat.id not in self._deleted:
                    messages, first = opening if added is not None else unsent(opening)
                    stats = [*first, *turn_stats(added or [], dones)]
                    self.unsaved.add(chat, (*messages, *(added or [])), replace_from, stats)
                    self._app.post_message(HistorySaved(self.unsaved.save()))
            if added is not None:
                # While the user reads and types, prefill the history as the next turn will
                # see it; sending the next message stops this within one step.
                history = request.model_copy(update={"messages": (*request.messages, *added)})
                ENGINE_THREAD.run(lambda: backend.prefill_next(history))

    def stream_turn(
        self,
        backend: Backend,
        request: ChatRequest,
        answer: AnswerView,
        cancel: threading.Event,
        dones: list[DoneChunk],
    ) -> list[Message] | None:
        """Stream one turn into `answer`; the messages it added, None when it failed. Each
        round's DoneChunk goes into `dones` (the stats lines, stored with the turn)."""
        pending: list[TurnEvent] = []
        pacer = RedrawPacer(self._screen_cpu())

        def show(event: TurnEvent) -> None:
            # Tokens arrive faster than a screen redraws: text goes in paced batches (the
            # first at once); anything else at once. The engine starts before the answer is
            # mounted, and a widget outside the DOM cannot take a message from a thread (it
            # finds no app): until it is mounted, everything waits here.
            nonlocal pending
            if isinstance(event, DoneChunk):
                dones.append(event)
            pending.append(event)
            now = time.monotonic()
            due = not isinstance(event, TextChunk | ReasoningChunk) or pacer.due(now)
            if due and answer.is_attached:
                answer.post_message(AnswerView.Feed(joined(pending)))
                pending = []
                # A progress report repaints one line: the first words still go at once.
                if not isinstance(event, PrefillProgress):
                    pacer.sent(now)

        try:
            added = run_loading(chat_turn(backend, request, self.tools, cancel), show)
        except Exception as error:  # the app keeps running, the chat keeps its history
            failed = failure(error)
            if self._wait_until_attached(answer):  # the answer says it, where it would be
                answer.post_message(AnswerView.Feed([*joined(pending), failed]))
            self._app.post_message(TurnEnded([], error=failed.message))
            return None
        if self._wait_until_attached(answer):
            answer.post_message(AnswerView.Feed(joined(pending)))
        failed = failed_at_once(added, dones)  # its error chunk is on screen: nothing to add
        self._app.post_message(TurnEnded([] if failed else added, error="" if failed else None))
        return None if failed else added

    def _wait_until_attached(self, answer: AnswerView) -> bool:
        """In a worker: wait for `answer` to be mounted; False when the app exits first."""
        while not answer.is_attached:
            if not self._app.is_running:
                return False
            time.sleep(ATTACH_POLL_S)
        return True

    def turn_ended(self, message: TurnEnded) -> None:
        self.set_generating(False)
        self.messages.extend(message.added)
        if message.error is not None:  # the answer shows why; the message waits to be changed
            give_back(self.messages, self._sent, self._app.query_one(PromptInput))

    def refuse_while_answering(self) -> bool:
        """True (and a word to the user) when an answer streams: what changes the chat or the
        model waits for it."""
        if self.generating:
            self._app.notify(f"Stop the answer first ({shown('app.stop')}).")
        return self.generating

    def set_generating(self, generating: bool) -> None:
        changed, self.generating = generating != self.generating, generating
        if changed:
            self._generation_changed(generating)
        # A steady cursor while an answer streams: every blink redraws the prompt, and on a
        # small machine the engine pays for each redraw (the same cores, the same GIL).
        for prompt in self._app.query(PromptInput):  # none while the app shuts down
            prompt.cursor_blink = not generating

    def stop(self) -> None:
        """Stop the answer at its next step, and say so at once."""
        self._cancel.set()
        if self._answer is not None and self._answer.is_attached:
            self._answer.stopping()

    def stop_all(self) -> None:
        """Quitting: the answer and any prefill stop at their next step."""
        self._cancel.set()
        if self.backend is not None:
            self.backend.stop_prefill()

    # The draft

    def draft_changed(self, draft: str) -> None:
        if self._draft_timer is not None:
            self._draft_timer.stop()
        self._draft_timer = self._app.set_timer(
            DRAFT_PREFILL_DELAY, lambda: self.prefill_draft(draft)
        )

    def prefill_draft(self, draft: str) -> None:
        """While the user types, prefill their message as far as it is typed, at each pause, as
        if it were sent then: sending it leaves one token to prefill, or what came after the
        pause."""
        backend = self.backend
        if backend is None or self.generating or not draft.strip():
            return
        request = ChatRequest(messages=self.history_before_prompt(), tools=self.tools.specs)
        self._app.run_worker(
            lambda: self._prefill(backend, request, draft),
            name="_prefill",
            group="prefill",
            thread=True,
        )

    def _prefill(self, backend: Backend, request: ChatRequest, draft: str) -> None:
        with self._in_flight.running() as allowed:
            if allowed:
                ENGINE_THREAD.run(lambda: backend.prefill_next(request, draft))

    # The history

    def new_chat(self) -> None:
        self._stop_editing()
        self.settings = ChatSettings()
        self.summary = None
        self.messages = []
        self._app.query_one(ChatPane).remove_children()
        if self.backend is not None:
            self.backend.forget_history()

    def chat_deleted(self, chat_id: str) -> None:
        """A chat was deleted from the store: its waiting turns go, and if it was the open one,
        the next message starts a new chat (an answer still streaming finishes on screen)."""
        self._deleted.add(chat_id)
        if self.unsaved is not None:
            self.unsaved.forget(chat_id)
        if self.summary is not None and self.summary.id == chat_id:
            if self.generating:  # the answer finishes on screen, into no chat
                self._stop_editing()
                self.summary, self.messages = None, []
            else:
                self.new_chat()
            self._app.notify("The open chat was deleted: the next message starts a new one.")

    def reopen_last(self) -> None:
        """On start: the chat used last opens again, as the user left it."""
        if self.store is None:
            return
        try:
            chats = self.store.list_chats()
            if chats:
                entries = self.store.entries(chats[0].id)
                # After the screen's first layout: an answer shown before it kept the height it
                # had before its Markdown was parsed, and what followed its text went undrawn.
                self._app.call_after_refresh(self.reopen, chats[0], entries)
        except ChatStoreError as error:
            self._app.notify(f"Could not reopen the last chat: {error}", severity="warning")

    def reopen(self, chat: ChatSummary, stored: list[StoredMessage]) -> None:
        """Show `chat`: what the store holds of it, then its turns still waiting to be saved,
        each answer with the stats lines it had."""
        self._stop_editing()
        self.summary = chat
        self.settings = chat.settings
        entries = [(entry.message, entry.stats) for entry in stored]
        if self.unsaved is not None:
            entries = self.unsaved.apply(chat.id, entries)
        self.messages = [message for message, _ in entries]
        stats = [stats_of(record) for _, record in entries]
        self._app.query_one(ChatPane).show_messages(self.messages, stats)

    def save_waiting(self) -> None:
        """Try the turns the store refused again."""
        if self.unsaved is not None and self.unsaved.waiting:
            self._app.run_worker(
                self._save, name="_save", group="save", exclusive=True, thread=True
            )

    def history_saved(self, problem: str | None) -> None:
        """Say once that history is not being saved, and why; and say when it is again."""
        notice = save_notice(problem, self._save_problem)
        if notice is not None:
            text, severity, seconds = notice
            self._app.notify(text, severity=severity, timeout=seconds)
        self._save_problem = problem

    def _save(self) -> None:
        with self._in_flight.running() as allowed:
            if allowed and self.unsaved is not None:
                self._app.post_message(HistorySaved(self.unsaved.save()))

    def abandon(self) -> None:
        """Quitting with the model inside one long step: the turn is saved as it stands, with a
        "cancelled" stats line, and what the step still gives is never saved."""
        with self._saving:
            self._abandoned = True
            turn = self._open_turn
            if turn is None or self.unsaved is None:
                return
            chat, opening, replace_from, answer = turn
            if chat.id in self._deleted:
                return
            messages, first = opening
            reply = Message(role="assistant", content=answer.text.strip())
            stats = [*first, cut_off()]
            self.unsaved.add(chat, (*messages, reply), replace_from, stats)
            self.unsaved.save()

    def finish(self) -> None:
        """Quitting, once the work has stopped: save what waits and checkpoint the store."""
        if self.unsaved is not None:
            self.unsaved.save()
        if self.store is not None:
            self.store.close()
