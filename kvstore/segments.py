"""Segment files: append-only logs of block records, and the scan that recovers them.

A record is a fixed header, the namespace bytes, then the payload (lz4 block or raw). The
header carries a CRC of itself plus the namespace and a CRC of the payload, so a torn or
flipped record is detected and becomes a miss, never wrong bytes.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import lz4.block

from protocol.block_keys import KEY_BYTES

MAGIC = b"KVR\x01"
RECORD_VERSION = 1
# magic, version, compression, namespace length, key, stored payload length, raw payload
# length, payload CRC32, header CRC32 (of the preceding fields and the namespace bytes)
HEADER = struct.Struct("<4sBBH16sIIII")
HEADER_BYTES = HEADER.size
MAX_PAYLOAD_BYTES = 0xFFFF_FFFF

COMPRESSION_NONE = 0
COMPRESSION_LZ4 = 1

_SEGMENT_NAME = re.compile(r"^seg-(\d{6,})\.log$")


class CorruptRecord(Exception):
    """A record that fails its checks: truncated, flipped bytes, or not the one expected."""


@dataclass(frozen=True, slots=True)
class RecordHeader:
    key: bytes
    namespace: str
    compression: int
    namespace_bytes: int
    stored_bytes: int
    raw_bytes: int
    payload_crc: int

    @property
    def payload_offset(self) -> int:
        """Where the payload starts, relative to the record's start."""
        return HEADER_BYTES + self.namespace_bytes

    @property
    def record_bytes(self) -> int:
        return HEADER_BYTES + self.namespace_bytes + self.stored_bytes


# lz4 must save at least this share to be kept: float KV barely compresses (~1%), and
# decompressing it would cost more restore time than the disk read it saves
MIN_COMPRESSION_SAVING = 0.10


def encode_record(key: bytes, namespace: str, payload: bytes | memoryview, compress: bool) -> bytes:
    """One record, ready to append. Compressed only when lz4 saves a real share of it."""
    if len(key) != KEY_BYTES:
        raise ValueError(f"block keys are {KEY_BYTES} bytes, got {len(key)}")
    raw = memoryview(payload).cast("B")
    if len(raw) > MAX_PAYLOAD_BYTES:
        raise ValueError(f"block of {len(raw)} bytes is over the {MAX_PAYLOAD_BYTES} byte record limit")
    stored: bytes | memoryview = raw
    compression = COMPRESSION_NONE
    if compress and len(raw):
        packed = lz4.block.compress(raw, store_size=False)
        if len(packed) <= (1 - MIN_COMPRESSION_SAVING) * len(raw):
            stored, compression = packed, COMPRESSION_LZ4
    name = namespace.encode("utf-8")
    if len(name) > 0xFFFF:
        raise ValueError("namespace is over 65535 bytes")
    fields = HEADER.pack(
        MAGIC, RECORD_VERSION, compression, len(name), key, len(stored), len(raw), zlib.crc32(stored), 0
    )[:-4]
    header_crc = zlib.crc32(name, zlib.crc32(fields))
    return b"".join((fields, struct.pack("<I", header_crc), name, stored))


def parse_header(buf: bytes | memoryview | mmap.mmap, offset: int = 0) -> RecordHeader:
    """The header of the record at `offset` in `buf` (which must also hold its namespace)."""
    end = offset + HEADER_BYTES
    if len(buf) < end:
        raise CorruptRecord("truncated header")
    magic, version, compression, ns_len, key, stored, raw, payload_crc, header_crc = HEADER.unpack_from(buf, offset)
    if magic != MAGIC or version != RECORD_VERSION:
        raise CorruptRecord("bad magic or version")
    if len(buf) < end + ns_len:
        raise CorruptRecord("truncated namespace")
    name = bytes(buf[end : end + ns_len])
    if zlib.crc32(name, zlib.crc32(buf[offset : end - 4])) != header_crc:
        raise CorruptRecord("header CRC mismatch")
    if compression not in (COMPRESSION_NONE, COMPRESSION_LZ4):
        raise CorruptRecord(f"unknown compression {compression}")
    try:
        namespace = name.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorruptRecord("namespace is not utf-8") from exc
    return RecordHeader(key, namespace, compression, ns_len, stored, raw, payload_crc)


def check_payload(header: RecordHeader, stored: bytes | memoryview) -> None:
    if len(stored) != header.stored_bytes:
        raise CorruptRecord("truncated payload")
    if zlib.crc32(stored) != header.payload_crc:
        raise CorruptRecord("payload CRC mismatch")


def decode_payload(header: RecordHeader, stored: bytes | memoryview) -> bytes | memoryview:
    """The exact bytes that were put, after checking the payload CRC (uncompressed ones as
    a view of the read buffer: no copy on the restore path)."""
    check_payload(header, stored)
    if header.compression == COMPRESSION_NONE:
        return stored
    try:
        raw = lz4.block.decompress(stored, uncompressed_size=header.raw_bytes)
    except lz4.block.LZ4BlockError as exc:
        raise CorruptRecord(f"lz4: {exc}") from exc
    if len(raw) != header.raw_bytes:
        raise CorruptRecord("decompressed length mismatch")
    return raw


def read_header(fd: int, offset: int) -> RecordHeader:
    """The header (and namespace) of the record at `offset` of an open segment file."""
    buf = os.pread(fd, HEADER_BYTES + 256, offset)
    try:
        return parse_header(buf)
    except CorruptRecord:
        if len(buf) < HEADER_BYTES:
            raise
        ns_len = struct.unpack_from("<H", buf, 6)[0]
        if HEADER_BYTES + ns_len <= len(buf):
            raise
        return parse_header(os.pread(fd, HEADER_BYTES + ns_len, offset))


def read_record(fd: int, offset: int, length: int, key: bytes, namespace: str) -> bytes | memoryview:
    """Payload of the record the index says is at `offset`; `CorruptRecord` unless the
    bytes there are exactly that record, intact."""
    data = os.pread(fd, length, offset)
    if len(data) != length:
        raise CorruptRecord("record runs past the end of its segment")
    header = parse_header(data)
    if header.key != key or header.namespace != namespace or header.record_bytes != length:
        raise CorruptRecord("record does not match its index entry")
    return decode_payload(header, memoryview(data)[header.payload_offset :])


def read_raw_record(fd: int, offset: int, length: int) -> tuple[RecordHeader, bytes]:
    """An intact record's header and its bytes as stored (for compaction: copied as is)."""
    data = os.pread(fd, length, offset)
    header = parse_header(data)
    if header.record_bytes != length:
        raise CorruptRecord("record length does not match its index entry")
    check_payload(header, memoryview(data)[header.payload_offset :])
    return header, data


# ---------------------------------------------------------------- files


def segment_path(directory: Path, number: int) -> Path:
    return directory / f"seg-{number:06d}.log"


def list_segments(directory: Path) -> dict[int, Path]:
    """Segment files in `directory` by number (other files are ignored)."""
    found: dict[int, Path] = {}
    for path in directory.iterdir():
        match = _SEGMENT_NAME.match(path.name)
        if match:
            found[int(match.group(1))] = path
    return dict(sorted(found.items()))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


class SegmentWriter:
    """The active segment: records are appended, never rewritten.

    `size` is always the end of the last whole record: a failed write is cut back off, so
    the next record starts where the index will say it does.
    """

    def __init__(self, path: Path, number: int) -> None:
        self.path = path
        self.number = number
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.size = os.fstat(self.fd).st_size

    def append(self, record: bytes) -> int:
        """Write `record`; returns its offset."""
        offset = self.size
        try:
            _write_all(self.fd, record)
        except OSError:
            os.ftruncate(self.fd, offset)
            raise
        self.size += len(record)
        return offset

    def sync(self) -> None:
        os.fsync(self.fd)

    def close(self) -> None:
        os.close(self.fd)


# ---------------------------------------------------------------- recovery


@dataclass
class ScanResult:
    records: list[tuple[int, RecordHeader]]  # (offset, header) of each intact record
    good_end: int  # end of the last intact record
    size: int  # file size before any truncation
    num_skipped: int  # damaged records or regions passed over


def _scan(mm: mmap.mmap, size: int, verify_payload: bool, result: ScanResult) -> None:
    offset = 0
    while offset + HEADER_BYTES <= size:
        try:
            header: RecordHeader | None = parse_header(mm, offset)
        except CorruptRecord:
            header = None
        if header is not None and offset + header.record_bytes <= size:
            end = offset + header.record_bytes
            try:
                if verify_payload:
                    check_payload(header, mm[offset + header.payload_offset : end])
                result.records.append((offset, header))
                result.good_end = end
            except CorruptRecord:
                result.num_skipped += 1
            offset = end  # the header is intact, so its length is trustworthy
            continue
        # a damaged header or a torn tail: resynchronise on the next magic
        result.num_skipped += 1
        offset = mm.find(MAGIC, offset + 1)
        if offset < 0:
            return


def scan_segment(path: Path, *, verify_payload: bool, truncate: bool) -> ScanResult:
    """Every intact record of a segment, in order. A damaged record is skipped (its
    header's length, or the next magic, says where the next one starts). With `truncate`,
    bytes after the last intact record (a torn write) are cut off the file."""
    size = path.stat().st_size
    result = ScanResult([], 0, size, 0)
    if size:
        with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            _scan(mm, size, verify_payload, result)
    if truncate and result.good_end < size:
        os.truncate(path, result.good_end)
    return result
