"""Segment records: round trip, damage detection, and recovery scans."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvstore.segments import (
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    HEADER_BYTES,
    CorruptRecord,
    SegmentWriter,
    decode_payload,
    encode_record,
    list_segments,
    parse_header,
    read_header,
    read_record,
    scan_segment,
    segment_path,
)
from tests.kvstore.helpers import key, payload

KEY = bytes(range(16))


def _decode(record: bytes | bytearray) -> bytes:
    header = parse_header(record)
    return decode_payload(header, memoryview(record)[header.payload_offset :])


@pytest.mark.parametrize(
    "data, compress, compression",
    [
        (b"", True, COMPRESSION_NONE),
        (b"a" * 10_000, True, COMPRESSION_LZ4),
        (os.urandom(5000), True, COMPRESSION_NONE),  # lz4 would not save space: stored raw
        (b"a" * 10_000, False, COMPRESSION_NONE),
        (memoryview(b"abc" * 1000), True, COMPRESSION_LZ4),
        (payload(3, 65_536), True, COMPRESSION_LZ4),
    ],
    ids=["empty", "compressible", "random", "compression-off", "memoryview", "half-random"],
)
def test_record_round_trip(data, compress, compression) -> None:
    record = encode_record(KEY, "model-ß", data, compress)
    header = parse_header(record)
    assert (header.key, header.namespace, header.compression) == (KEY, "model-ß", compression)
    assert header.record_bytes == len(record)
    assert header.raw_bytes == len(data)
    assert _decode(record) == bytes(data)


@pytest.mark.parametrize(
    "position",
    [0, 5, 8, 23, 24, 36, HEADER_BYTES, HEADER_BYTES + 2, HEADER_BYTES + 100, -1],
    ids=["magic", "compression", "key", "key-end", "stored-length", "header-crc", "namespace",
         "payload-first", "payload-middle", "payload-last"],
)
def test_a_flipped_byte_is_detected(position) -> None:
    record = bytearray(encode_record(KEY, "ns", payload(1, 2000), compress=True))
    record[position] ^= 0x01
    with pytest.raises(CorruptRecord):
        _decode(record)


def test_bad_key_length_is_refused() -> None:
    with pytest.raises(ValueError, match="16 bytes"):
        encode_record(b"short", "ns", b"x", compress=True)


def _write_segment(path: Path, records: list[bytes]) -> list[int]:
    writer = SegmentWriter(path, 1)
    offsets = [writer.append(record) for record in records]
    writer.close()
    return offsets


def test_read_record_checks_it_is_the_record_asked_for(tmp_path: Path) -> None:
    records = [encode_record(key(i), "ns", payload(i), compress=True) for i in range(2)]
    path = segment_path(tmp_path, 1)
    offsets = _write_segment(path, records)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert read_record(fd, offsets[1], len(records[1]), key(1), "ns") == payload(1)
        assert read_header(fd, offsets[1]).key == key(1)
        for args in [(key(0), "ns"), (key(1), "other")]:
            with pytest.raises(CorruptRecord):
                read_record(fd, offsets[1], len(records[1]), *args)
        with pytest.raises(CorruptRecord):  # past the end of the file
            read_record(fd, offsets[1], len(records[1]) + 10, key(1), "ns")
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    "tail",
    ["cut-in-header", "cut-after-header", "cut-in-payload", "garbage", "zeros"],
)
def test_a_torn_tail_is_ignored_and_cut_off(tmp_path: Path, tail: str) -> None:
    records = [encode_record(key(i), "ns", payload(i), compress=True) for i in range(3)]
    path = segment_path(tmp_path, 1)
    _write_segment(path, records)
    intact = len(records[0]) + len(records[1])
    if tail.startswith("cut"):
        keep = {"cut-in-header": 10, "cut-after-header": HEADER_BYTES + 2, "cut-in-payload": len(records[2]) - 7}[tail]
        os.truncate(path, intact + keep)
    else:
        os.truncate(path, intact)
        with open(path, "ab") as file:
            file.write(os.urandom(3000) if tail == "garbage" else bytes(3000))
    result = scan_segment(path, verify_payload=True, truncate=True)
    assert [header.key for _, header in result.records] == [key(0), key(1)]
    assert path.stat().st_size == result.good_end == intact


@pytest.mark.parametrize("damage", ["header", "payload"])
def test_scan_skips_a_damaged_record_and_keeps_the_rest(tmp_path: Path, damage: str) -> None:
    records = [encode_record(key(i), "ns", payload(i), compress=True) for i in range(3)]
    path = segment_path(tmp_path, 1)
    offsets = _write_segment(path, records)
    with open(path, "r+b") as file:
        file.seek(offsets[1] + (10 if damage == "header" else len(records[1]) - 1))
        byte = file.read(1)
        file.seek(-1, os.SEEK_CUR)
        file.write(bytes([byte[0] ^ 0x40]))
    result = scan_segment(path, verify_payload=True, truncate=True)
    assert [header.key for _, header in result.records] == [key(0), key(2)]
    assert result.num_skipped >= 1
    assert path.stat().st_size == sum(map(len, records))  # nothing after a good record is cut


def test_list_segments_orders_by_number_and_ignores_other_files(tmp_path: Path) -> None:
    for number in (12, 3, 1000001):
        segment_path(tmp_path, number).touch()
    (tmp_path / "seg-x.log").touch()
    (tmp_path / "notes.txt").touch()
    assert list(list_segments(tmp_path)) == [3, 12, 1000001]
