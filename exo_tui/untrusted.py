"""Text from outside (a peer's name or reason, an advert, a hub's answer) made safe to log or show.

Every character Python does not call printable (controls, escape sequences, newlines, bidi
overrides, line separators) is written as Python escapes it (`\\x1b`, `\\n`, `\\u202e`), so it can
neither forge a line nor repaint a terminal, and the result is cut in the middle to a bounded
length: its start says what it is, its end often says the fix.
"""

from __future__ import annotations

NAME_LIMIT = 64  # a node name, id or fingerprint
REASON_LIMIT = 400  # a sentence that may quote a peer
LIMIT = 200


def shown(text: str, limit: int = LIMIT) -> str:
    """`text`, escaped and cut to about `limit` characters (plus a note saying how long it was)."""
    if len(text) <= limit and text.isprintable():
        return text
    head_size = max(1, limit * 2 // 3)
    tail_size = max(1, limit - head_size)
    if len(text) <= limit:
        escaped = _escaped(text)
        if len(escaped) <= limit:
            return escaped
        head, tail = escaped[:head_size], escaped[-tail_size:]
    else:  # only the ends are escaped: a huge text costs no more than a short one
        head = _escaped(text[:head_size])[:head_size]
        tail = _escaped(text[-tail_size:])[-tail_size:]
    return f"{head} …({len(text):,} characters, cut)… {tail}"


def _escaped(text: str) -> str:
    # repr() of one unprintable character is its escape between quotes.
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)
