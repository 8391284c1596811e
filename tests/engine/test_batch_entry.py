"""The batch caches' own join and growth (engine/batch_entry.py) against mlx-lm's: the same
tokens in the same places, with less copied."""

from __future__ import annotations

import copy
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.models.cache import BatchKVCache

from engine.batch_entry import join_caches, make_room

HEADS, DIM = 2, 8


def filled(left_padding: list[int], length: int, trim: int = 0, *, seed: int) -> BatchKVCache:
    """A batch cache that was fed `length` positions (its room grown as mlx-lm grows it), the
    last `trim` of them then trimmed away (their values stay in the arrays, unread)."""
    mx.random.seed(seed)
    cache = BatchKVCache(left_padding)
    shape = (len(left_padding), HEADS, length, DIM)
    cache.update_and_fetch(mx.random.normal(shape), mx.random.normal(shape))
    cache.trim(trim)
    mx.eval(cache.keys, cache.values, cache.offset, cache.left_padding)
    return cache


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (([0, 2], 19, 0), ([0, 0, 1], 19, 0)),  # as long: nothing shifts
        (([0, 3], 40, 0), ([1, 0, 0], 12, 0)),  # the joining rows are shorter
        (([2], 7, 0), ([0, 4], 300, 0)),  # the joining rows are longer, with more room
        (([0, 1], 30, 9), ([0], 25, 3)),  # trimmed: stale values past what each holds
    ],
)
def test_joined_rows_hold_what_mlx_lms_extend_gives(
    ours: tuple[list[int], int, int], theirs: tuple[list[int], int, int]
) -> None:
    ours_cache, theirs_cache = filled(*ours, seed=1), filled(*theirs, seed=2)
    expected = copy.deepcopy(ours_cache)
    expected.extend(copy.deepcopy(theirs_cache))
    join_caches([ours_cache], [theirs_cache])
    assert ours_cache._idx == expected._idx
    assert ours_cache.keys is not None and expected.keys is not None
    assert ours_cache.keys.shape == expected.keys.shape  # the same room
    assert ours_cache.offset.tolist() == expected.offset.tolist()
    assert ours_cache.left_padding.tolist() == expected.left_padding.tolist()
    # Everything before the end, the padding the join adds included (zeros, as mlx-lm pads:
    # attention masks it, and it must be a number). Past the end only mlx-lm's can hold stale
    # values, which nothing reads.
    for got, want in zip(ours_cache.keys_and_values(), expected.keys_and_values(), strict=True):
        assert got.tolist() == want.tolist()


def test_rows_joined_then_fed_give_the_same_attention_inputs_as_mlx_lms() -> None:
    ours, theirs = filled([0, 1], 21, seed=3), filled([0, 0, 2], 17, seed=4)
    expected = copy.deepcopy(ours)
    expected.extend(copy.deepcopy(theirs))
    join_caches([ours], [theirs])
    mx.random.seed(5)
    step = mx.random.normal((5, HEADS, 1, DIM))
    got = ours.update_and_fetch(step, step)
    want = expected.update_and_fetch(step, step)
    assert ours.make_mask(1).tolist() == expected.make_mask(1).tolist()
    for array, reference in zip(got, want, strict=True):
        assert array.tolist() == reference.tolist()


def test_an_empty_layer_joins_through_mlx_lms_own_extend() -> None:
    ours, theirs = filled([0], 9, seed=6), BatchKVCache([0, 0])
    expected = copy.deepcopy(ours)
    expected.extend(copy.deepcopy(theirs))
    join_caches([ours], [theirs])
    assert ours.keys is not None and expected.keys is not None
    assert ours.keys.shape == expected.keys.shape
    assert ours.offset.tolist() == expected.offset.tolist()


def test_a_cache_that_is_mostly_held_joins_through_mlx_lms_own_extend() -> None:
    """Where the caches are mostly what they hold (a long chat), copying what they hold twice
    costs more than mlx-lm's copies of the room: its `extend` joins them, stale values past
    the end and all."""
    ours, theirs = filled([0], 310, 10, seed=10), filled([0, 1], 300, seed=11)
    expected = copy.deepcopy(ours)
    expected.extend(copy.deepcopy(theirs))
    join_caches([ours], [theirs])
    assert ours.keys is not None and expected.keys is not None
    assert ours.keys.tolist() == expected.keys.tolist()


def test_room_made_ahead_holds_what_growing_would() -> None:
    grown, made = filled([0, 2], 18, seed=7), filled([0, 2], 18, seed=7)
    # Fed to the end of its room, as a merged cache is: the next tokens need more.
    keys: Any = made.keys
    values: Any = made.values
    exact = keys[..., : made._idx, :], values[..., : made._idx, :]
    made.keys, made.values = exact
    grown.keys, grown.values = exact
    make_room(made, 5)
    assert made.keys is not None and made.keys.shape[2] == 18 + 256
    mx.random.seed(8)
    rest = mx.random.normal((2, HEADS, 5, DIM))
    got = made.update_and_fetch(rest, rest)
    want = grown.update_and_fetch(rest, rest)  # mlx-lm's growth
    assert made.keys.shape == grown.keys.shape
    assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()


def test_room_already_there_is_left_as_it_is() -> None:
    cache = filled([0], 10, seed=9)
    keys = cache.keys
    make_room(cache, 3)  # 246 positions of room left
    assert cache.keys is keys
