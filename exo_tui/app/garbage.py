"""Keep Python's full garbage collections out of the stream.

The app holds ~160,000 objects that live as long as it does (Textual's screen, styles and caches,
the loaded model's modules, imported code). A full collection walks them all: 60-80 ms here, on
the main thread or mid-token in the engine's, every few seconds of streaming (whatever allocates
triggers it), which showed as dips of 10-30 % in tok/s through the app and as late keys.
`settle()` collects once and freezes what is left (`gc.freeze`), so later collections walk only
what was made since. Frozen garbage is never collected, so settle again where much goes away
(a model unloaded, a chat closed): it unfreezes everything first.
"""

from __future__ import annotations

import gc


def settle() -> None:
    """Collect everything, then leave what survived out of later collections."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
