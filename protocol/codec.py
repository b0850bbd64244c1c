"""msgpack encoding of `protocol.messages`, with tensor payloads as extra ZMQ frames.

A message goes on the wire as `[body, *frames]`: `body` is a msgpack map holding the
dataclass fields plus its `type` tag; `frames` are raw buffers (tensor bytes) that ZMQ
sends without copying. A message that owns tensors describes them in its fields (shape,
dtype, frame index); the codec only carries the bytes.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Sequence
from typing import Any

import msgpack

from protocol.encoder_messages import FRAME
from protocol.errors import ProtocolError
from protocol.messages import MESSAGE_TYPES, EventBatch, Message

Buffer = bytes | bytearray | memoryview
WIRE_INT_MIN, WIRE_INT_MAX = -(2**63), 2**64 - 1  # the integers msgpack can encode


def _to_plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        plain = {f.name: _to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, Message):  # tagged, so a message nested in another can be rebuilt
            plain["type"] = value.type
        return plain
    if isinstance(value, (list, tuple)):
        return [_to_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_plain(v) for k, v in value.items()}
    return value


@functools.cache
def _nested_fields(cls: type) -> dict[str, type]:
    """Fields of `cls` whose type is itself a dataclass (possibly `X | None`)."""
    nested: dict[str, type] = {}
    for name, hint in typing.get_type_hints(cls).items():
        if typing.get_origin(hint) is list:
            continue  # a list of dataclasses: `_nested_lists`
        candidates = typing.get_args(hint) or (hint,)
        for candidate in candidates:
            if dataclasses.is_dataclass(candidate):
                nested[name] = candidate
    return nested


@functools.cache
def _nested_lists(cls: type) -> dict[str, type]:
    """Fields of `cls` that are a list of a dataclass (`list[X]`), by their item type."""
    nested: dict[str, type] = {}
    for name, hint in typing.get_type_hints(cls).items():
        if typing.get_origin(hint) is list:
            (item,) = typing.get_args(hint)
            if dataclasses.is_dataclass(item) and not issubclass(item, Message):
                nested[name] = item
    return nested


@functools.cache
def _field_hints(cls: type) -> dict[str, Any]:
    """The type of each wire field of `cls` (frame fields travel as an index, checked later)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if not f.metadata.get(FRAME)}


def _fits(value: Any, hint: Any) -> bool:
    """Whether a decoded msgpack value has the shape of the field type `hint`: a peer's
    message with a list where a string belongs must fail here, as a ProtocolError, not
    later in whatever code first uses the value (the kvstore's writer thread did)."""
    if hint is Any:
        return True
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, option) for option in typing.get_args(hint))
    if origin is list:
        (item,) = typing.get_args(hint)
        return isinstance(value, list) and all(_fits(v, item) for v in value)
    if origin is dict:
        key_hint, value_hint = typing.get_args(hint)
        return isinstance(value, dict) and all(_fits(k, key_hint) and _fits(v, value_hint) for k, v in value.items())
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float))
    if dataclasses.is_dataclass(hint):
        return isinstance(value, hint)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True  # a type this check does not know: the message class's own concern


def _from_plain(cls: type, data: dict[str, Any]) -> Any:
    known = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: v for k, v in data.items() if k in known}
    for name, sub in _nested_fields(cls).items():
        if isinstance(kwargs.get(name), dict):
            kwargs[name] = _from_plain(sub, kwargs[name])
    for name, item in _nested_lists(cls).items():
        value = kwargs.get(name)
        if isinstance(value, list) and all(isinstance(v, dict) for v in value):
            kwargs[name] = [_from_plain(item, v) for v in value]
    for name, hint in _field_hints(cls).items():
        if name in kwargs and not _fits(kwargs[name], hint):
            raise TypeError(f"{name} is {type(kwargs[name]).__name__}, not {getattr(hint, '__name__', hint)}")
    return cls(**kwargs)


@functools.cache
def _frame_fields(cls: type) -> tuple[str, ...]:
    """Fields of message class `cls` that travel as extra frames (metadata FRAME)."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get(FRAME))


def encode(message: Message, frames: Sequence[Buffer] = ()) -> list[Buffer]:
    """Message (+ tensor buffers) -> the list of ZMQ frames to send. A field marked FRAME
    goes after `frames` as a frame of its own; the body holds its frame index."""
    body = _to_plain(message)  # carries its `type` tag
    frames = list(frames)
    for name in _frame_fields(type(message)):
        frames.append(body[name])
        body[name] = len(frames) - 1
    body["num_frames"] = len(frames)
    return [msgpack.packb(body, use_bin_type=True), *frames]


def decode(parts: Sequence[Buffer]) -> tuple[Message, list[Buffer]]:
    """ZMQ frames -> (message, tensor buffers). Unknown or malformed input raises
    `ProtocolError`, never a half-built message."""
    if not parts:
        raise ProtocolError("empty multipart message")
    try:
        body = msgpack.unpackb(parts[0], raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types
        raise ProtocolError(f"undecodable message body: {exc}") from exc
    if not isinstance(body, dict):
        raise ProtocolError("message body is not a map")
    num_frames = body.pop("num_frames", 0)
    tag = body.get("type")
    if not isinstance(tag, str) or tag not in MESSAGE_TYPES:
        raise ProtocolError(f"unknown message type {tag!r}")
    frames = list(parts[1:])
    if len(frames) != num_frames:
        raise ProtocolError(f"{tag}: expected {num_frames} extra frames, got {len(frames)}")
    message = _build(body)
    for name in _frame_fields(type(message)):
        index = getattr(message, name)
        if not isinstance(index, int) or not 0 <= index < len(frames):
            raise ProtocolError(f"{tag}: {name} names no extra frame")
        frame = frames[index]
        setattr(message, name, frame.bytes if hasattr(frame, "bytes") else frame)
    return message, frames


def _build(body: Any) -> Message:
    """A message from its plain body, `type` tag included; an `EventBatch` from the
    bodies of the events it carries (never another batch)."""
    if not isinstance(body, dict):
        raise ProtocolError("message body is not a map")
    tag = body.pop("type", None)
    cls = MESSAGE_TYPES.get(tag) if isinstance(tag, str) else None
    if cls is None:
        raise ProtocolError(f"unknown message type {tag!r}")
    if cls is EventBatch:
        events = body.get("events")
        if not isinstance(events, list):
            raise ProtocolError(f"{tag}: bad fields: events is not a list")
        built = [_build(event) for event in events]
        if any(isinstance(event, EventBatch) for event in built):
            raise ProtocolError(f"{tag}: a batch inside a batch")
        return EventBatch(built)
    try:
        return _from_plain(cls, body)
    except TypeError as exc:
        raise ProtocolError(f"{tag}: bad fields: {exc}") from exc
