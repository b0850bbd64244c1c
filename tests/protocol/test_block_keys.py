"""Chained block keys: equal prefixes share keys, anything else never does."""

from __future__ import annotations

import pytest

from protocol.block_keys import KEY_BYTES, chain_keys

FP = b"model-a"


@pytest.mark.parametrize(
    "num_tokens, block, expected",
    [(0, 4, 0), (3, 4, 0), (4, 4, 1), (7, 4, 1), (8, 4, 2), (1000, 256, 3)],
)
def test_only_full_blocks_get_keys(num_tokens, block, expected) -> None:
    keys = chain_keys(FP, list(range(num_tokens)), block)
    assert len(keys) == expected
    assert all(len(k) == KEY_BYTES for k in keys)


def test_shared_prefix_shares_keys_until_divergence() -> None:
    a = list(range(16))
    b = a[:9] + [999] + a[10:]  # diverges inside block 2 (tokens 8..11)
    ka, kb = chain_keys(FP, a, 4), chain_keys(FP, b, 4)
    assert ka[:2] == kb[:2]
    assert ka[2] != kb[2] and ka[3] != kb[3]  # chaining: later blocks differ too


@pytest.mark.parametrize(
    "other",
    [
        dict(fingerprint=b"model-b"),
        dict(salt="tenant-1"),
    ],
)
def test_model_and_salt_separate_caches(other) -> None:
    tokens = list(range(8))
    base = chain_keys(FP, tokens, 4)
    changed = chain_keys(other.get("fingerprint", FP), tokens, 4, salt=other.get("salt"))
    assert not set(base) & set(changed)


def test_different_salts_differ() -> None:
    tokens = list(range(8))
    assert chain_keys(FP, tokens, 4, "a") != chain_keys(FP, tokens, 4, "b")
    assert chain_keys(FP, tokens, 4, "a") == chain_keys(FP, tokens, 4, "a")


def test_bad_block_size() -> None:
    with pytest.raises(ValueError):
        chain_keys(FP, [1, 2], 0)
