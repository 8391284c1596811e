"""KV caches kept between chat turns, so a new turn prefills only what changed since the last one.

Built on mlx-lm's `LRUPromptCache` (the server's prefix trie): a request takes the cache of the
longest stored prefix of its prompt, trimmed to the common prefix when an earlier turn was edited
or regenerated. Entries are bounded in count and bytes; the least recently used go first.
"""

from __future__ import annotations

from typing import Any

import psutil
from mlx_lm.models.cache import (
    LRUPromptCache,
    can_trim_prompt_cache,
    make_prompt_cache,
    trim_prompt_cache,
)

# A quarter of this machine's memory at most, and never more than 4 GiB, for kept caches.
_DEFAULT_MAX_BYTES = min(4 << 30, psutil.virtual_memory().total // 4)
_MODEL_KEY = "model"


class ConversationCache:
    """The stored KV caches of one loaded model, keyed by the tokens they hold."""

    def __init__(self, max_entries: int = 8, max_bytes: int = _DEFAULT_MAX_BYTES) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._lru: Any = LRUPromptCache(max_size=max_entries, max_bytes=max_bytes)  # untyped

    def take(self, model: Any, prompt: list[int]) -> tuple[list[Any], list[int]]:
        """A KV cache to continue from and the prompt tokens it does not hold yet (never empty)."""
        found: tuple[list[Any] | None, list[int]] = self._lru.fetch_nearest_cache(
            _MODEL_KEY, prompt
        )
        cache, rest = found
        if cache is not None and not rest:
            # The whole prompt is cached; generation needs one token to feed, so give one back.
            if can_trim_prompt_cache(cache):
                trim_prompt_cache(cache, 1)
                rest = prompt[-1:]
            else:
                cache = None
        if cache is None:
            return make_prompt_cache(model), list(prompt)
        return cache, list(rest)

    def keep(self, tokens: list[int], cache: list[Any]) -> None:
        """Store a cache that holds exactly `tokens` for a later turn."""
        self._lru.insert_cache(_MODEL_KEY, tokens, cache)

    @property
    def nbytes(self) -> int:
        return int(self._lru.nbytes)

    def __len__(self) -> int:
        return len(self._lru)

    def clear(self) -> None:
        self._lru = LRUPromptCache(max_size=self.max_entries, max_bytes=self.max_bytes)
