"""The base of every wire message: its `type` tag registry and the protocol version."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

PROTOCOL_VERSION = 1

MESSAGE_TYPES: dict[str, type["Message"]] = {}


@dataclass
class Message:
    """Base of all wire messages; subclasses register themselves under their tag."""

    type: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        tag = cls.__dict__.get("type")
        if tag:
            if tag in MESSAGE_TYPES:
                raise TypeError(f"duplicate message type tag {tag!r}")
            MESSAGE_TYPES[tag] = cls
