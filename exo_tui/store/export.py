"""A chat as a Markdown document: pure, so it is tested without a database."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from engine.types import Message
from exo_tui.store.records import ChatSummary


def _fenced(text: str, info: str = "") -> str:
    """A code block whose fence is longer than any run of backticks inside it."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{info}\n{text}\n{fence}"


def render_markdown(chat: ChatSummary, messages: Sequence[Message]) -> str:
    """User, assistant and tool messages as Markdown; reasoning folds away in <details>.

    System messages are left out: they are settings, not conversation.
    """
    blocks = [
        f"# {chat.title}",
        f"Model: `{chat.model}` · started {chat.created_at:%Y-%m-%d %H:%M} UTC",
    ]
    for message in messages:
        match message.role:
            case "system":
                continue
            case "user":
                blocks.append("## User")
            case "assistant":
                blocks.append("## Assistant")
            case "tool":
                name = f" `{message.name}`" if message.name else ""
                blocks.append(f"## Tool result{name}")
                blocks.append(_fenced(message.content))
                continue
        if message.reasoning:
            # A literal closing tag in the reasoning would end the block early.
            reasoning = message.reasoning.strip().replace("</details", "&lt;/details")
            blocks.append(f"<details>\n<summary>Reasoning</summary>\n\n{reasoning}\n\n</details>")
        if message.content.strip():
            blocks.append(message.content.strip())
        for call in message.tool_calls:
            arguments = json.dumps(call.arguments, indent=2, ensure_ascii=False)
            blocks.append(f"**Tool call** `{call.name}`\n\n{_fenced(arguments, 'json')}")
    return "\n\n".join(blocks) + "\n"
