"""Block keys: the one rule the worker and the kvstore must agree on.

`key_i = blake2b_128(key_{i-1} || fingerprint || token ids of block i)`, with key_{-1}
derived from an optional per-request salt. Equal keys mean equal prefixes under the same
model, so blocks are shared across requests; a different model (fingerprint) or tenant
(salt) never produces the same key.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from typing import NewType

BlockKey = NewType("BlockKey", bytes)

KEY_BYTES = 16


def root_key(fingerprint: bytes, salt: str | None = None) -> BlockKey:
    """The chain's seed: the model fingerprint, mixed with the tenant's salt if any."""
    h = hashlib.blake2b(digest_size=KEY_BYTES)
    h.update(b"mlxd-root\x00")
    h.update(fingerprint)
    if salt:
        h.update(b"\x00salt\x00")
        h.update(salt.encode("utf-8"))
    return BlockKey(h.digest())


def chain_keys(
    fingerprint: bytes,
    token_ids: Sequence[int],
    block_tokens: int,
    salt: str | None = None,
) -> list[BlockKey]:
    """Keys of every *full* block of `token_ids`; a trailing partial block has none."""
    if block_tokens <= 0:
        raise ValueError(f"block_tokens must be positive, got {block_tokens}")
    keys: list[BlockKey] = []
    previous = root_key(fingerprint, salt)
    for start in range(0, len(token_ids) - block_tokens + 1, block_tokens):
        h = hashlib.blake2b(digest_size=KEY_BYTES)
        h.update(previous)
        h.update(fingerprint)
        h.update(array("I", token_ids[start : start + block_tokens]).tobytes())
        previous = BlockKey(h.digest())
        keys.append(previous)
    return keys
