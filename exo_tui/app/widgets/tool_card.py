"""A tool call in an answer: its name and status on the border, the call and its result folded
to one line until opened."""

from __future__ import annotations

import json
from typing import Any, Literal

from textual.app import ComposeResult
from textual.content import Content
from textual.markup import escape
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Collapsible, Static

from exo_tui.app.widgets.sized import SizedByTheLayout

ToolStatus = Literal["running", "ok", "error", "done"]


class ToolDetails(SizedByTheLayout, Collapsible):
    """A tool call's arguments and result, folded to one line until opened (Enter or a click),
    sized by the layout (see SizedByTheLayout)."""

    Contents = type("Contents", (SizedByTheLayout, Collapsible.Contents), {})


TOOL_LINE_LENGTH = 72  # the folded card's one line: the call, and what it returned


def tool_line(arguments: dict[str, Any], result: str | None) -> str:
    """The folded card's line: `{"expression": "2+2"} → 4`, cut to one line, as plain text."""
    line = _compact_json(arguments) + ("" if result is None else f" → {result}")
    flat = " ".join(line.split())
    if len(flat) > TOOL_LINE_LENGTH:
        flat = flat[: TOOL_LINE_LENGTH - 1].rstrip() + "…"
    return escape(flat)  # a title is read as markup; what a tool returns is not markup


class ToolCallView(SizedByTheLayout, Widget):
    """One tool call: its name and whether it ran on the border; the call and its result folded
    to one line, the whole of both when opened."""

    DEFAULT_CSS = """
    ToolCallView {
        height: auto;
        margin: 0 1 1 1;
        padding: 0 1;
        border: round $secondary;
        border-title-color: $text;
        border-title-style: bold;
        border-subtitle-color: $warning;
        &.-ok { border-subtitle-color: $success; }
        &.-error { border: round $error; border-subtitle-color: $error; }
        &.-done { border-subtitle-color: $text-muted; }
        & > ToolDetails {
            border-top: none;
            padding: 0;
            background: transparent;
            & > Contents { padding: 0 0 0 2; }
            & CollapsibleTitle { padding: 0; }
        }
        & .tool-arguments { color: $text-muted; }
    }
    """

    status: reactive[ToolStatus] = reactive[ToolStatus]("running")

    def __init__(self, call_id: str, name: str, arguments: dict[str, Any]) -> None:
        super().__init__()
        self.call_id = call_id
        self.tool_name = name
        self.arguments = arguments
        self.result: str | None = None
        self.border_title = Content(name)
        self._details = ToolDetails(
            Static(Content(_compact_json(arguments)), classes="tool-arguments"),
            title=tool_line(arguments, None),
            collapsed=True,
        )
        self._show_status("running")

    def compose(self) -> ComposeResult:
        yield self._details

    def set_result(self, content: str, ok: bool | None) -> None:
        """The call ran: `ok` says how; None when a stored chat does not record it."""
        status: ToolStatus = "done" if ok is None else "ok" if ok else "error"
        first = self.result is None
        self.result = content
        self.status = status
        self._show_status(status)
        self._details.title = tool_line(self.arguments, content)
        line = Static(Content(f"→ {content}"), classes="tool-result")
        if not first:
            for old in self._details.query(".tool-result"):
                old.remove()
        if self._details.is_mounted:
            self._details.query_one(ToolDetails.Contents).mount(line)
        else:
            self._details.compose_add_child(line)

    def _show_status(self, status: ToolStatus) -> None:
        self.border_subtitle = "running…" if status == "running" else status
        for name in ("running", "ok", "error", "done"):
            self.set_class(name == status, f"-{name}")


def _compact_json(arguments: dict[str, Any]) -> str:
    return json.dumps(arguments, ensure_ascii=False, separators=(", ", ": "))
