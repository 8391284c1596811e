"""Which failures of a ring rank only echo another's: MLX's words for a lost ring peer.

When one rank of a ring dies, its neighbours fail too, saying only that their peer went away.
A report of the failure names the rank that went first as the cause and these echoes after it.
"""

from __future__ import annotations

# What MLX's ring backend says when the rank at the other end of a socket goes away.
_LOST_PEER_WORDS = ("peer was lost", "connection to a peer", "Socket")


def lost_a_peer(reason: str) -> bool:
    """Whether `reason` only says that a ring peer went away, so the cause is another rank's."""
    return any(words in reason for words in _LOST_PEER_WORDS)
