"""The control connection on the wire: frames, framing, the handshake and the session's seal."""
