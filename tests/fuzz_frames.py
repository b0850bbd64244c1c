"""The multipart frames the socket fuzzers send: raw bytes, a message body (well-formed or
not) with payload frames, or a packed body with a few bytes overwritten. Shared by the
worker's and the kvstore's fuzzers, which differ only in the bodies they generate."""

from __future__ import annotations

import msgpack
from hypothesis import strategies as st


def packed(body: dict) -> bytes:
    """The body as msgpack; a body msgpack refuses (an int too large) becomes its bare type."""
    try:
        return msgpack.packb(body, use_bin_type=True)
    except (OverflowError, ValueError, TypeError):
        return msgpack.packb({"type": body["type"]}, use_bin_type=True)


def _flipped(raw: bytes, at: int, patch: bytes) -> list[bytes]:
    return [raw[:at] + patch + raw[at + len(patch):]]


def frame_strategy(bodies: st.SearchStrategy[dict], payload_bytes: int,
                   payload_frames: int) -> st.SearchStrategy[list[bytes]]:
    """Frames built from `bodies`, with up to `payload_frames` payloads of up to `payload_bytes`."""
    return st.one_of(
        st.lists(st.binary(max_size=64), min_size=1, max_size=3),  # raw bytes
        st.tuples(bodies, st.lists(st.binary(max_size=payload_bytes), max_size=payload_frames)).map(
            lambda b: [packed(b[0]), *b[1]]),
        st.tuples(bodies, st.integers(min_value=0, max_value=200), st.binary(min_size=1, max_size=4)).map(
            lambda b: _flipped(packed(b[0]), b[1], b[2])),  # bytes overwritten
    )
