"""The control connection's frames: each round-trips, and a bad payload fails at the edge."""

from __future__ import annotations

import json
from contextlib import suppress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.types import ChatRequest, PrefillProgress, ShardSpec
from exo_tui.cluster.wire.frames import (
    ChatFrame,
    ChunkFrame,
    Frame,
    Goodbye,
    LaunchRanks,
    RanksProgress,
    Refused,
)
from exo_tui.cluster.wire.framing import (
    HEADER,
    ProtocolError,
    decode,
    encode,
)
from tests.cluster.wire_ends import (
    EVERY_FRAME,
    FUZZ,
    LAPTOP,
    STATS,
    hello_from,
)

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("frame", EVERY_FRAME, ids=lambda frame: frame.type)
def test_every_frame_round_trips(frame: Frame) -> None:
    data = encode(frame)
    (length,) = HEADER.unpack(data[: HEADER.size])
    assert length == len(data) - HEADER.size
    assert decode(data[HEADER.size :]) == frame


@FUZZ
@given(
    st.one_of(
        st.builds(Goodbye, reason=st.text()),
        st.builds(Refused, reason=st.text()),
        st.builds(
            RanksProgress,
            instance_id=st.text(),
            layers_loaded=st.integers(min_value=0),
            total=st.integers(min_value=0),
        ),
        st.builds(
            ChatFrame,
            instance_id=st.text(),
            request_id=st.integers(min_value=0),
            request=st.builds(
                ChatRequest,
                messages=st.just(()),
                temperature=st.floats(allow_nan=False, allow_infinity=False),
            ),
        ),
    )
)
def test_text_and_numbers_round_trip(frame: Frame) -> None:
    assert decode(encode(frame)[HEADER.size :]) == frame


@pytest.mark.parametrize(
    "repo_id",
    [
        "/etc/passwd",
        "../x",
        "org/..",
        "org/name/../../x",
        "../models/x",
        "C:\\models\\x",
        "name",
        "",
    ],
)
def test_a_fetch_names_a_hub_repo_never_a_path(repo_id: str) -> None:
    frame = {"type": "fetch_shard", "instance_id": "i1", "repo_id": repo_id, "total_layers": 4}
    with pytest.raises(ProtocolError, match="repo_id"):
        decode(json.dumps(frame).encode())


LAUNCH = LaunchRanks(
    instance_id="i1",
    model="qwen3-0.6b",
    specs=(ShardSpec(strategy="pipeline", start_layer=0, end_layer=28),),
    hosts=("127.0.0.1:5000",),
)
MALFORMED = {
    "empty": (b"", "EOF while parsing"),
    "not json": (b"hello there", "Invalid JSON"),
    "not utf-8": (b'{"type": "goodbye", "reason": "\xff"}', "Invalid JSON"),
    "trailing bytes": (b'{"type": "welcome"}{}', "trailing characters"),
    "not an object": (b'["welcome"]', "Input should be an object"),
    "no type": (b'{"reason": "x"}', "Unable to extract tag using discriminator 'type'"),
    "unknown type": (b'{"type": "launch"}', "Input tag 'launch' found using 'type'"),
    "missing field": (b'{"type": "refused"}', "refused.reason: Field required"),
    "extra field": (b'{"type": "welcome", "admin": true}', "welcome.admin: Extra inputs"),
    "string for a number": (
        b'{"type": "reserve_ports", "instance_id": "i1", "count": "2"}',
        "reserve_ports.count: Input should be a valid integer",
    ),
    "bool for an int": (
        json.dumps({**hello_from(LAPTOP).model_dump(), "version": True}).encode(),
        "hello.version: Input should be a valid integer",
    ),
    "non-finite float": (
        LAUNCH.model_dump_json().replace('"join_timeout_s":60.0', '"join_timeout_s":NaN').encode(),
        "launch_ranks.join_timeout_s: Input should be less than or equal to 3600",
    ),
    "nonce not hex": (
        json.dumps({**hello_from(LAPTOP).model_dump(), "nonce": "zz" * 32}).encode(),
        "hello.nonce: String should match pattern",
    ),
    "wrong type inside stats": (
        json.dumps(
            {"type": "stats", "stats": {**STATS.model_dump(), "memory_total_bytes": "lots"}}
        ).encode(),
        "stats.stats.memory_total_bytes: Input should be a valid integer",
    ),
    "deep nesting": (b"[" * 10_000, "recursion limit"),
}


@pytest.mark.parametrize(("payload", "says"), MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_payloads_are_protocol_errors_that_say_why(payload: bytes, says: str) -> None:
    with pytest.raises(ProtocolError, match="malformed frame") as raised:
        decode(payload)
    assert says in str(raised.value)


@FUZZ
@given(st.binary(max_size=512))
def test_random_bytes_only_ever_decode_or_raise_protocol_error(payload: bytes) -> None:
    with suppress(ProtocolError):
        decode(payload)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)


TAGS = st.sampled_from(
    ["hello", "challenge", "proof", "welcome", "refused", "stop_instance", "stats"]
)


@FUZZ
@given(TAGS, st.dictionaries(st.sampled_from(["version", "nonce", "stats", "x"]), JSON_VALUES))
def test_random_json_objects_only_ever_decode_or_raise_protocol_error(
    tag: str, fields: dict[str, object]
) -> None:
    try:
        frame = decode(json.dumps({"type": tag, **fields}).encode())
    except ProtocolError:
        return
    assert frame.type == tag


def test_a_chunk_frame_carries_the_prefills_progress() -> None:
    frame = ChunkFrame(instance_id="i", request_id=1, chunk=PrefillProgress(done=12, total=51))
    assert decode(encode(frame)[HEADER.size :]) == frame
