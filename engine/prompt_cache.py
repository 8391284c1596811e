"""KV caches kept between chat turns, so a new turn prefills only what changed since the last one.

Built on mlx-lm's `LRUPromptCache` (the server's prefix trie): a request takes the cache of the
longest stored prefix of its prompt, trimmed to the common prefix when an earlier turn was edited
or regenerated. Entries are bounded in count and bytes; the least recently used go first.

A request takes the stored cache itself, not a copy: mlx-lm copies it (so that its server can
serve one prefix to many requests), and the copy is made lazily, inside the first forward pass,
where it adds a large share of the time to the first token. The entry a turn continues is
replaced by the longer one the turn keeps anyway; an entry that holds a few tokens more than a
request shares with it (a draft prefilled as if sent, then typed on) is trimmed in place. One
that holds more (another chat, an answer being regenerated), or more than the request shares
with it (a short chat that a new one shares only the template's first tokens with, answered
at the same time), is another branch: it is copied, as mlx-lm does, and stays.
"""
# pyright: reportUnknownMemberType=false, reportUnknownVariableType=false, reportUnknownArgumentType=false
# (mlx-lm ships no type information.)

from __future__ import annotations

import copy
import threading
from typing import Any

import psutil
from mlx_lm.models.cache import (
    KVCache,
    LRUPromptCache,
    QuantizedKVCache,
    can_trim_prompt_cache,
    make_prompt_cache,
    trim_prompt_cache,
)

# A quarter of this machine's memory at most, and never more than 4 GiB, for kept caches.
_DEFAULT_MAX_BYTES = min(4 << 30, psutil.virtual_memory().total // 4)
_MODEL_KEY = "model"
# Past what a request shares with an entry, at most this many tokens (and no more than it
# shares) are trimmed away in place.
TRIM_IN_PLACE_TOKENS = 64


def trims_at_any_length(model: Any) -> bool:
    """Whether every layer's cache can be cut back to any length. A sliding window's
    (mlx-lm's RotatingKVCache, gpt-oss's every other layer) cannot once it has rotated: a
    cache past it serves only prompts that continue all of it."""
    return all(isinstance(c, KVCache | QuantizedKVCache) for c in make_prompt_cache(model))


class _TakingPromptCache(LRUPromptCache):
    """mlx-lm's LRU prompt cache that hands out the stored cache itself instead of a copy."""

    def nearest(self, model: Any, tokens: list[int]) -> tuple[list[int] | None, int]:
        """The entry `fetch_nearest_cache` would serve `tokens` from (None: none) and how many
        of `tokens` it holds."""
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
            return longer, min(len(tokens) - 1, found.common_prefix)
        return (found.shorter, shorter) if found.shorter is not None else (None, 0)

    def take_nearest(self, model: Any, tokens: list[int]) -> tuple[list[Any] | None, list[int]]:
        """As `fetch_nearest_cache`, but the entry leaves the store and comes back itself,
        trimmed to what `tokens` share with it. A longer branch, or a cache that cannot be
        trimmed, is copied, as mlx-lm does: it stays for the turn it belongs to."""
        key, held = self.nearest(model, tokens)
        if (
            key is None
            or len(key) - held > min(TRIM_IN_PLACE_TOKENS, held)
            or not can_trim_prompt_cache(self._trie.get(model, key).prompt_cache)
        ):
            return self.fetch_nearest_cache(model, tokens)
        entry = self._trie.pop(model, key)
        self._lru.remove(model, key)
        self._n_bytes -= entry.nbytes
        self._n_bytes_by_type[entry.cache_type] -= entry.nbytes
        if len(key) > held:
            trim_prompt_cache(entry.prompt_cache, len(key) - held)
        return entry.prompt_cache, tokens[held:]


class ConversationCache:
    """The stored KV caches of one loaded model, keyed by the tokens they hold.

    Safe to use from several threads: the app looks at it while a worker prefills into it.
    """

    def __init__(self, max_entries: int = 8, max_bytes: int = _DEFAULT_MAX_BYTES) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._lru: Any = _TakingPromptCache(max_size=max_entries, max_bytes=max_bytes)  # untyped
        # mlx-lm's trie is plain dicts: a search during a pop can meet a branch half removed.
        self._lock = threading.Lock()

    def take(self, model: Any, prompt: list[int]) -> tuple[list[Any], list[int]]:
        """A KV cache to continue from and the prompt tokens it does not hold yet (never empty).

        The cache is taken out of the store: `keep` what it holds afterwards."""
        with self._lock:
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
        with self._lock:
            _, reused = self._lru.nearest(_MODEL_KEY, prompt)
        return min(int(reused), len(prompt) - 1)

    def keep(self, tokens: list[int], cache: list[Any]) -> None:
        """Store a cache that holds exactly `tokens` for a later turn."""
        with self._lock:
            self._lru.insert_cache(_MODEL_KEY, tokens, cache)

    def keep_copy(self, tokens: list[int], cache: list[Any]) -> None:
        """Store a copy of a cache that holds exactly `tokens`, which goes on being used."""
        self.keep(tokens, copy.deepcopy(cache))

    @property
    def nbytes(self) -> int:
        return int(self._lru.nbytes)

    def __len__(self) -> int:
        return len(self._lru)

    def clear(self) -> None:
        with self._lock:
            self._lru = _TakingPromptCache(max_size=self.max_entries, max_bytes=self.max_bytes)
