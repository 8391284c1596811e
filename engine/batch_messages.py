"""What crosses between a batching model's thread and its callers: frozen messages each way."""

from __future__ import annotations

from typing import Literal

from engine.types import ChatRequest, Frozen


# What callers send the model's thread.
class Admission(Frozen):
    """A request, checked and rendered in its caller's thread, waits for a slot."""

    id: int
    request: ChatRequest
    prompt: tuple[int, ...]
    max_tokens: int
    started: float  # time.perf_counter() when its caller asked (for the TTFT)


class Withdrawal(Frozen):
    """The caller stopped reading: its request leaves the batch."""

    id: int


class PrefillAsked(Frozen):
    """Prefill the next turn of `request` (with the typed `draft`) when the model is idle."""

    id: int
    request: ChatRequest
    draft: str


class Closing(Frozen):
    """The model is being let go of: end every request and stop the thread."""


Message = Admission | Withdrawal | PrefillAsked | Closing


class Refused(Frozen):
    """The model's thread to a caller: its request cannot be served (raised in its thread, as
    `engine.generate` raises it, before any chunk)."""

    cause: str
    fix: str
    # What cannot be served: the model (its weights), or this request (its size).
    about: Literal["model", "request"] = "model"


class PrefillDone(Frozen):
    """The model's thread to a prefill's caller: how many tokens it prefilled, or why not."""

    tokens: int = 0
    cause: str | None = None
    fix: str = ""
