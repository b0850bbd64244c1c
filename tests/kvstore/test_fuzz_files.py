"""Random damage to the cold tier's files (hypothesis): bytes overwritten anywhere in a
segment, in the index or in the namespace table, or a file cut short. Reopening never
raises, and every get returns the exact bytes that were put under that key, or a miss
(with a logged reason): never a block whose CRC or key does not match."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from kvstore.store import KVStore
from tests.fuzz_seed import FUZZ_SEED
from tests.kvstore.helpers import key, payload

NUM_BLOCKS = 24
SEGMENT = 32 << 10  # several segments, so damage lands in sealed ones and the open tail alike


def _store(root: Path) -> KVStore:
    return KVStore(root, max_disk_bytes=8 << 20, segment_bytes=SEGMENT)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A closed store holding NUM_BLOCKS blocks in two namespaces."""
    root = tmp_path_factory.mktemp("pristine") / "store"
    with _store(root) as store:
        for i in range(NUM_BLOCKS):
            assert store.put("a" if i % 2 else "b", key(i), payload(i, 4096))
    return root


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.name.endswith(".lock"))


damage = st.tuples(
    st.integers(min_value=0, max_value=10_000),  # which file (modulo their number)
    st.lists(st.tuples(st.floats(min_value=0, max_value=1, exclude_max=True), st.binary(min_size=1, max_size=8)),
             min_size=1, max_size=6),  # where (as a fraction of the file) and what to write
    st.one_of(st.none(), st.floats(min_value=0, max_value=1)),  # cut the file to this fraction, or not
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@seed(FUZZ_SEED)
@given(case=damage)
def test_damaged_files_give_exact_blocks_or_misses(pristine: Path, tmp_path: Path, case,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    which, writes, cut = case
    root = tmp_path / f"store-{which}-{len(writes)}"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(pristine, root)
    target = _files(root)[which % len(_files(root))]
    data = bytearray(target.read_bytes())
    for where, value in writes:
        at = int(where * len(data))
        data[at:at + len(value)] = value
    if cut is not None:
        del data[int(cut * len(data)):]
    target.write_bytes(bytes(data))
    caplog.clear()
    with caplog.at_level(logging.INFO), _store(root) as store:
        misses = 0
        for i in range(NUM_BLOCKS):
            (got,) = store.get("a" if i % 2 else "b", [key(i)])
            assert got is None or bytes(got) == payload(i, 4096), f"block {i} served wrong bytes ({target.name})"
            misses += got is None
            (other,) = store.get("b" if i % 2 else "a", [key(i)])  # never across namespaces
            assert other is None
        # the store keeps working: a new block round-trips
        assert store.put("a", key(1000), payload(1000, 4096))
        assert bytes(store.get("a", [key(1000)])[0]) == payload(1000, 4096)
    if misses:
        said = [r for r in caplog.records if r.levelno >= logging.WARNING or "rebuilt" in r.getMessage()]
        assert said, f"{misses} blocks lost without a word ({target.name})"
    shutil.rmtree(root)
