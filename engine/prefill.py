"""A prompt prefilled in steps of about a second, sized from the model's measured speed, with a
progress report after each step and a cancel between steps.

A fast model's prompt goes through in the one pass that also gives its first token, as before:
only a model whose prefill would take longer than a step is stepped. Its speed is not known
before its first pass, so the first prompt of a model starts with a small step and sizes the
next from how long that one took.
"""
# pyright: reportUnknownMemberType=false, reportMissingTypeStubs=false
# (mlx ships no complete type information.)

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from typing import Any, Protocol

import mlx.core as mx

from engine.types import PrefillProgress

STEP_S = 1.0  # what a step aims to take: the progress line moves, and a cancel waits no longer
FIRST_STEP = 8  # tokens of a model's first step, before its speed is known
MAX_STEP = 2048  # tokens a step at most (mlx-lm's prefill step)


class Cancel(Protocol):
    def is_set(self) -> bool: ...


# Every rank of a ring must take the same steps (the collectives inside a pass must match): it
# takes rank 0's size for each (`agree(size)` gives rank 0's on every rank). None: alone.
Agree = Callable[[int], int]


class PrefillPace:
    """How fast a loaded model prefills (the best rate measured: a short pass's fixed cost makes
    it read slower than the model is), and so how large a step of about `step_s` is."""

    def __init__(self, step_s: float = STEP_S) -> None:
        self.step_s = step_s
        self.tokens_per_s: float | None = None

    def record(self, tokens: int, seconds: float) -> None:
        """A pass put `tokens` into the cache in `seconds`."""
        if tokens > 0 and seconds > 0:
            rate = tokens / seconds
            self.tokens_per_s = max(rate, self.tokens_per_s or 0.0)

    def step(self, remaining: int, prompts: int = 1) -> int:
        """Tokens for the next step of each of `prompts` prompts prefilled together, with
        `remaining` tokens left of the longest; 0 when the rest fits in one step."""
        if self.tokens_per_s is None:
            return FIRST_STEP if remaining > FIRST_STEP else 0
        budget = int(self.tokens_per_s * self.step_s / max(prompts, 1))
        if remaining <= budget:
            return 0
        return max(1, min(budget, MAX_STEP))

    def at_most(self, size: int) -> int:
        """A step of at most `size` tokens that takes about a step's time (`size` itself while
        the speed is not known)."""
        if self.tokens_per_s is None:
            return size
        return max(1, min(size, int(self.tokens_per_s * self.step_s)))


def feed(model: Any, tokens: list[int], cache: list[Any]) -> None:
    """Put `tokens` into `cache` (their logits are never computed: only the cache is evaluated)."""
    model(mx.array(tokens)[None], cache=cache)
    mx.eval([c.state for c in cache])


def timed_feed(
    model: Any, tokens: list[int], cache: list[Any], pace: PrefillPace, stream: Any = None
) -> None:
    """`feed` (on `stream`, if given), its speed recorded in `pace`."""
    started = time.perf_counter()
    if stream is None:
        feed(model, tokens, cache)
    else:
        with mx.stream(stream):
            feed(model, tokens, cache)
    pace.record(len(tokens), time.perf_counter() - started)


def prefill_steps(
    model: Any,
    rest: list[int],
    cache: list[Any],
    pace: PrefillPace,
    cancel: Cancel,
    agree: Agree | None = None,
    stream: Any = None,
) -> Generator[PrefillProgress]:
    """Put the head of `rest` into `cache` a step at a time (on `stream`) while the rest would
    take more than a step, yielding the progress after each (at least the last token is left,
    for the pass that gives the first token). Stops after a step when `cancel` is set."""
    done = 0
    total = len(rest)
    while True:
        size = pace.step(total - done)
        if agree is not None:
            size = agree(size)
        size = min(size, total - done - 1)
        if size <= 0:
            return
        timed_feed(model, rest[done : done + size], cache, pace, stream)
        done += size
        yield PrefillProgress(done=done, total=total)
        if cancel.is_set():
            return
