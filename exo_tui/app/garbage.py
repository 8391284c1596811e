"""Keep Python's full garbage collections out of the stream.

The app holds ~160,000 objects that live as long as it does (Textual's screen, styles and caches,
the loaded model's modules, imported code). A full collection walks them all: 60-80 ms here, on
the main thread or mid-token in the engine's, every few seconds of streaming (whatever allocates
triggers it), which showed as dips of 10-30 % in tok/s through the app and as late keys.
`freeze()` leaves what exists now out of later collections (`gc.freeze`), so they walk only
what was made since: at startup and after a model loads. It does not collect first: a full
collection right after the screen came up (~80 ms) left the footer without its keys in one
start in three (Textual's first recompose of it got lost). Frozen garbage is never collected,
so `settle()` where much goes away (a model unloaded): it unfreezes, collects and freezes.
"""

from __future__ import annotations

import gc


def freeze() -> None:
    """Leave every object that exists now out of later collections."""
    gc.freeze()


def settle() -> None:
    """Collect everything, then leave what survived out of later collections."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
