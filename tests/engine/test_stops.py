"""Stop strings: the text before the first one is shown, the stop string and what follows never."""

from __future__ import annotations

from engine.stops import StopText


def shown(stops: tuple[str, ...], pieces: list[str]) -> tuple[str, bool]:
    stop = StopText(stops)
    text = "".join(stop.feed(piece) for piece in pieces)
    return text + stop.flush(), stop.stopped


def test_the_text_ends_before_the_first_stop_string() -> None:
    assert shown(("END", "x"), ["one two END three"]) == ("one two ", True)
    assert shown(("two", "one"), ["zero one two"]) == ("zero ", True)


def test_a_stop_string_split_across_pieces_is_still_found() -> None:
    assert shown(("STOP",), ["abc S", "T", "OP def"]) == ("abc ", True)


def test_text_held_back_as_a_possible_start_is_shown_when_it_is_not_one() -> None:
    stop = StopText(("STOP",))
    assert stop.feed("abc ST") == "abc "  # "ST" may begin the stop string
    assert stop.feed("AR") == "STAR"
    assert stop.feed("xS") == "x"
    assert stop.flush() == "S"  # the answer ended: what was held is shown
    assert not stop.stopped


def test_nothing_after_the_stop() -> None:
    stop = StopText(("\n\n",))
    assert stop.feed("para\n\nnext") == "para"
    assert stop.feed("more") == "" and stop.flush() == "" and stop.stopped


def test_without_stop_strings_every_piece_passes_as_it_is() -> None:
    assert shown((), ["a", "b"]) == ("ab", False)
    assert shown(("",), ["a", "b"]) == ("ab", False)  # an empty stop string stops nothing
