"""What a model's key/value caches take of this machine's memory, and whether the batch's have
room to grow: rows times positions times a position's bytes, against the memory free."""

from __future__ import annotations

from collections.abc import Callable

import psutil

from engine.types import ModelCard

# A batch's caches grow this many positions at a time (mlx-lm's step).
GROWTH = 256


def kv_bytes_per_value(card: ModelCard) -> int:
    """A cached key or value's bytes: a float32 model's activations are 32-bit, any other's
    (fp16, bf16, and quantized models) 16-bit."""
    return 4 if card.dtype in ("float32", "float64") else 2


def kv_bytes_per_position(card: ModelCard, layers: int, kv_heads: int) -> int:
    """The keys and values one position of one sequence takes in `layers` layers."""
    return 2 * layers * kv_heads * card.head_dim * kv_bytes_per_value(card)


def free_memory_bytes() -> int:
    """Memory a cache could take now: what the system has available, and MLX's buffers kept
    for reuse (counted as used, and handed out again before any new memory)."""
    import mlx.core as mx  # (here: placement reads this module's sizes without MLX)

    return int(psutil.virtual_memory().available) + int(mx.get_cache_memory())


def margin_bytes() -> int:
    """What the caches leave to the system and the rest of this process: 1 GiB, or a
    twentieth of a smaller machine's memory."""
    return min(1 << 30, int(psutil.virtual_memory().total) // 20)


def format_bytes(n: int) -> str:
    """Decimal units with one decimal, as memory is shown elsewhere: ``3.1 GB``."""
    sign = "-" if n < 0 else ""
    value = float(abs(n))
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000:
            return f"{sign}{value:.0f} {unit}" if unit == "B" else f"{sign}{value:.1f} {unit}"
        value /= 1000
    return f"{sign}{value:.1f} TB"


class CacheRoom:
    """Whether the batch's caches can take more memory: what the machine has free, less a
    margin. The batch holds every row as long as its longest (mlx-lm's batched caches), so a
    row that joins takes the longest's length, and a longer one lengthens them all."""

    def __init__(
        self,
        per_position: int,
        free: Callable[[], int] = free_memory_bytes,
    ) -> None:
        self.per_position = per_position
        self._free = free
        self.margin = margin_bytes()

    def spare(self) -> int:
        """The bytes the caches may still take."""
        return self._free() - self.margin

    def batch(self, rows: int, longest: int) -> int:
        """The bytes `rows` rows' caches take as long as `longest`, with a growth's room."""
        return rows * (longest + GROWTH) * self.per_position

    def held(self, rows: int, longest: int) -> int:
        """The bytes `rows` rows' caches hold now, the longest `longest` positions long (they
        grow a step of GROWTH at a time)."""
        return rows * -(-longest // GROWTH) * GROWTH * self.per_position

    def growing(self, rows: int) -> int:
        """The bytes `rows` rows take when they grow once more."""
        return rows * GROWTH * self.per_position
