"""The node daemon's listening side: its accept loop, who may wait in the handshake, file limits."""
