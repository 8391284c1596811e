"""A turn's stats lines as the store keeps them: one JSON record beside each assistant message."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from engine.types import DoneChunk, Message, Stats, Usage

StatsRecord = dict[str, Any]


def stats_record(done: DoneChunk) -> StatsRecord:
    """What the stats line of `done` needs, as JSON (the token ids stay out: they are long)."""
    return done.model_dump(mode="json", exclude={"token_ids"})


def cut_off() -> StatsRecord:
    """The stats line of an answer cut off by quitting: cancelled, nothing counted."""
    return stats_record(
        DoneChunk(
            finish_reason="cancelled",
            usage=Usage(prompt_tokens=0, completion_tokens=0),
            stats=Stats(ttft_s=0, prefill_tps=0, decode_tps=0, peak_memory_bytes=0),
            token_ids=(),
        )
    )


def stats_of(record: StatsRecord | None) -> DoneChunk | None:
    """The stats line a stored record shows; None for none, or one this version cannot read."""
    if record is None:
        return None
    try:
        return DoneChunk.model_validate({**record, "token_ids": ()})
    except ValidationError:
        return None


def turn_stats(added: Sequence[Message], dones: Sequence[DoneChunk]) -> list[StatsRecord | None]:
    """The stats of each message a turn added: a round's DoneChunk goes with the assistant
    message that round made, in order; tool results have none."""
    rounds = iter(dones)
    records: list[StatsRecord | None] = []
    for message in added:
        done = next(rounds, None) if message.role == "assistant" else None
        records.append(None if done is None else stats_record(done))
    return records
