"""The in-process MLX engine: model store, loading generators, generation. No Textual, no sockets."""
