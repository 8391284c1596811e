"""Which code block of the last answer the copy key takes: the last one, then, pressed again,
each one before it in turn (and round to the last again)."""

from __future__ import annotations


class CodeCopy:
    """Remembers the block copied last, so that the key pressed again takes the one before."""

    def __init__(self) -> None:
        self._last: tuple[tuple[str, ...], int] | None = None  # the blocks, and which was copied

    def pick(self, blocks: list[str]) -> tuple[str, int] | None:
        """The block to copy of `blocks` (an answer's, in order) and its place (1 is the first);
        None when there is none."""
        if not blocks:
            self._last = None
            return None
        same = tuple(blocks)
        index = len(blocks) - 1
        if self._last is not None and self._last[0] == same:
            index = (self._last[1] - 1) % len(blocks)
        self._last = (same, index)
        return blocks[index], index + 1
