"""What a turn that failed before any answer leaves: the chat as it was before the message was
sent, and the message back in the prompt to change (a prompt too long for the model, say)."""

from __future__ import annotations

from engine.errors import EngineError
from engine.types import DoneChunk, ErrorChunk, Message
from exo_tui.app.unsaved import Stats
from exo_tui.app.widgets.prompt import PromptInput

Opening = tuple[tuple[Message, ...], tuple[Stats, ...]]


def unsent(opening: Opening) -> Opening:
    """The turn's opening (messages and their stats) without the message it sent, if it sent
    one (a regenerate sends none): the store keeps what came before, not the failed message."""
    messages, stats = opening
    if messages and messages[-1].role == "user":
        return messages[:-1], stats[: len(messages) - 1]
    return opening


def give_back(messages: list[Message], sent: Message | None, prompt: PromptInput) -> None:
    """Take the failed turn's message `sent` off the end of the open chat's `messages` (the next
    turn does not carry it), and put its text back in `prompt`."""
    if sent is None or not messages or messages[-1] is not sent:
        return
    messages.pop()
    prompt.give_back(sent.content)


def failure(error: Exception) -> ErrorChunk:
    """What the answer says of a turn that raised: an engine error names its cause and fix."""
    if isinstance(error, EngineError):
        return ErrorChunk(message=str(error))
    return ErrorChunk(message=f"{type(error).__name__}: {error}")


def failed_at_once(added: list[Message], dones: list[DoneChunk]) -> bool:
    """Whether a turn that ran ended in an error before any answer (a ring that failed before
    its first token says so in chunks, not raised): the same as one that raised."""
    empty = len(added) == 1 and not (added[0].content or added[0].reasoning or added[0].tool_calls)
    return empty and len(dones) == 1 and dones[0].finish_reason == "error"
