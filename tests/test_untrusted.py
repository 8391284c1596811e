"""Untrusted text made safe to log or show: nothing unprintable survives, and no text is long."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from exo_tui.untrusted import shown


def test_plain_text_is_left_alone() -> None:
    assert shown("studio.local (n-1234)") == "studio.local (n-1234)"
    assert shown("Mac Studio de Zoé – 東京") == "Mac Studio de Zoé – 東京"


def test_escapes_and_newlines_are_written_out_not_obeyed() -> None:
    forged = "a\x1b[2K\r\nrefused 10.0.0.9\u202egnp.exe\x07\u2028x"
    safe = shown(forged)
    assert safe == "a\\x1b[2K\\r\\nrefused 10.0.0.9\\u202egnp.exe\\x07\\u2028x"
    assert safe.isprintable()


def test_a_long_text_keeps_its_start_and_end_and_says_how_long_it_was() -> None:
    reason = "x" * 3_000_000 + " speaks version 9: run the same exo-tui version on every machine"
    safe = shown(reason, 120)
    assert len(safe) < 170
    assert safe.startswith("xxx") and safe.endswith("every machine")
    assert f"{len(reason):,} characters" in safe


@given(st.text(max_size=2000), st.integers(min_value=1, max_value=500))
def test_anything_comes_out_printable_and_bounded(text: str, limit: int) -> None:
    safe = shown(text, limit)
    assert safe.isprintable()
    assert len(safe) <= limit + 40
