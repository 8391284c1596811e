"""What the user is told of the history's saving: once when it stops (and why), and when it is
saved again."""

from __future__ import annotations

from typing import Literal

Notice = tuple[str, Literal["information", "error"], float]  # text, severity, seconds shown


def save_notice(problem: str | None, told: str | None) -> Notice | None:
    """The notice for a save that ended with `problem` (None: saved), when the user was last
    told of `told`; None when there is nothing new to say."""
    if problem is not None and problem != told:
        text = (
            f"History could not be saved: {problem} This chat is kept here and saved as soon "
            "as the database takes it."
        )
        return text, "error", 15
    if problem is None and told is not None:
        return "History is saved again.", "information", 5
    return None
