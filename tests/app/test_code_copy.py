"""The copy key takes the last code block, then each one before it, round to the last again."""

from __future__ import annotations

from exo_tui.app.code_copy import CodeCopy


def test_the_key_again_takes_the_block_before_and_a_new_answer_starts_at_its_last() -> None:
    copy = CodeCopy()
    blocks = ["ls", "pwd", "cd"]
    assert [copy.pick(blocks) for _ in range(4)] == [("cd", 3), ("pwd", 2), ("ls", 1), ("cd", 3)]
    assert copy.pick(["a", "b"]) == ("b", 2)  # another answer's blocks: its last first
    assert copy.pick([]) is None
    assert copy.pick(["a", "b"]) == ("b", 2)
