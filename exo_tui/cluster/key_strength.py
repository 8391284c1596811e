"""How many guesses a cluster key would cost an attacker, in bits, as zxcvbn estimates them.

A node proves the key to anyone who says Hello, so whoever records one proof can test guesses
offline as fast as they can compute HMACs. Only a key that needs about 2**128 guesses is out of
reach; zxcvbn (Dropbox's estimator) counts what such an attacker tries first: dictionary words,
names, keyboard walks, repeats, dates and l33t spellings, else brute force.
"""

# pyright: strict

from __future__ import annotations

import math
from typing import Any, cast

import zxcvbn

MIN_KEY_BITS = 128
# zxcvbn refuses longer input (its matching grows faster than the length). A whole key is never
# easier to guess than its prefix, so estimating the prefix errs on the safe side.
_ESTIMATED_CHARACTERS = 72


def guess_bits(text: str) -> float:
    """log2 of the guesses zxcvbn expects an attacker needs to find `text`."""
    estimate: Any = zxcvbn.zxcvbn  # pyright: ignore[reportUnknownMemberType]
    result = cast(dict[str, Any], estimate(text[:_ESTIMATED_CHARACTERS]))
    return math.log2(max(float(result["guesses"]), 1.0))
