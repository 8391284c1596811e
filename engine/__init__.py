"""The in-process MLX engine: model store, loading, generation. No Textual, no sockets."""

from engine import blas

# Before anything imports mlx.core, so MLX binds its BLAS calls to a fast system library.
blas.preload()
