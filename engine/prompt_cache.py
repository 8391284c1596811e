"""KV caches kept between chat turns, so a new turn prefills only what changed since the last one.

Built on mlx-lm's `LRUPromptCache` (the server's prefix trie): a request takes the cache of the
longest stored prefix of its prompt, trimmed to the common prefix when an earlier turn was edited
or regenerated. Entries are bounded in count and bytes; the least recently used go first.

A turn that continues a stored prefix takes that entry itself, not a copy: mlx-lm copies it (so
the server can serve the same prefix twice), and the copy is made lazily, inside the first
forward pass: 20 ms of TTFT for the 33 MB cache of 1,256 tokens of a 10-layer model here, where
the pass itself took 61 ms. The entry would be replaced by the longer one the turn keeps anyway.
"""
# pyright: reportUnknownMemberType=false, reportUnknownVariableType=false, reportUnknownArgumentType=false
# (mlx-lm ships no type information.)

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


class _TakingPromptCache(LRUPromptCache):
    """mlx-lm's LRU prompt cache that hands out a stored prefix instead of a copy of it."""

    def nearest(self, model: Any, tokens: list[int]) -> tuple[list[int] | None, int]:
        """The stored prefix of `tokens` (or `tokens` itself) that `fetch_nearest_cache` would
        serve them from, and how many of them it reuses; (None, n) when it would trim a longer
        entry to n tokens; (None, 0) when nothing is stored for them."""
        found = self._trie.search(model, tokens)
        if found.exact is not None:
            return found.exact, len(tokens)
        shorter = len(found.shorter) if found.shorter is not None else 0
        longer = found.longer
        if (
            longer is not None
            and found.common_prefix > shorter
            and can_trim_prompt_cache(self._trie.get(model, longer).prompt_cache)
        ):
            return None, min(len(tokens) - 1, found.common_prefix)
        return (found.shorter, shorter) if found.shorter is not None else (None, 0)

    def take_nearest(self, model: Any, tokens: list[int]) -> tuple[list[Any] | None, list[int]]:
        """As `fetch_nearest_cache`, but a stored prefix of `tokens` (or `tokens` itself) leaves
        the store and comes back as it is. A longer entry is still copied and trimmed: it stays
        for the turn it belongs to (a regenerated answer, an edited message)."""
        key, _ = self.nearest(model, tokens)
        if key is None or not can_trim_prompt_cache(self._trie.get(model, key).prompt_cache):
            return self.fetch_nearest_cache(model, tokens)
        entry = self._trie.pop(model, key)
        self._lru.remove(model, key)
        self._n_bytes -= entry.nbytes
        self._n_bytes_by_type[entry.cache_type] -= entry.nbytes
        return entry.prompt_cache, tokens[len(key) :]


class ConversationCache:
    """The stored KV caches of one loaded model, keyed by the tokens they hold."""

    def __init__(self, max_entries: int = 8, max_bytes: int = _DEFAULT_MAX_BYTES) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._lru: Any = _TakingPromptCache(max_size=max_entries, max_bytes=max_bytes)  # untyped

    def take(self, model: Any, prompt: list[int]) -> tuple[list[Any], list[int]]:
        """A KV cache to continue from and the prompt tokens it does not hold yet (never empty).

        A stored prefix of `prompt` is taken out of the store: `keep` what it holds afterwards."""
        cache, rest = self._lru.take_nearest(_MODEL_KEY, prompt)
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

    def reusable(self, prompt: list[int]) -> int:
        """How many tokens of `prompt` a `take` would find cached (looking changes nothing)."""
        _, reused = self._lru.nearest(_MODEL_KEY, prompt)
        return min(int(reused), len(prompt) - 1)

    def keep(self, tokens: list[int], cache: list[Any]) -> None:
        """Store a cache that holds exactly `tokens` for a later turn."""
        self._lru.insert_cache(_MODEL_KEY, tokens, cache)

    @property
    def nbytes(self) -> int:
        return int(self._lru.nbytes)

    def __len__(self) -> int:
        return len(self._lru)

    def clear(self) -> None:
        self._lru = _TakingPromptCache(max_size=self.max_entries, max_bytes=self.max_bytes)
