"""What the tool-call parser emits, in no API's shape: each API (OpenAI chat here,
Anthropic Messages and Responses later) formats these events its own way."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TextDelta:
    """Answer text that is not a tool call."""

    text: str


@dataclass(frozen=True)
class CallStart:
    """A tool call begins: `index` counts the answer's calls from 0."""

    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ArgumentsDelta:
    """A piece of call `index`'s arguments, a JSON object's text; the pieces of one call
    concatenate to its whole arguments."""

    index: int
    fragment: str


@dataclass(frozen=True)
class CallEnd:
    """Call `index` is complete."""

    index: int


Event = TextDelta | CallStart | ArgumentsDelta | CallEnd


@dataclass
class ToolCall:
    """One whole call, as a non-streamed answer carries it."""

    id: str
    name: str
    arguments: str  # a JSON object's text


def gather(events: list[Event]) -> tuple[str, list[ToolCall]]:
    """The text and the calls a run of events adds up to (what a non-streamed answer
    carries), so that both modes come from one parser and cannot disagree."""
    texts: list[str] = []
    calls: list[ToolCall] = []
    for event in events:
        if isinstance(event, TextDelta):
            texts.append(event.text)
        elif isinstance(event, CallStart):
            calls.append(ToolCall(event.id, event.name, ""))
        elif isinstance(event, ArgumentsDelta):
            calls[event.index].arguments += event.fragment
    return "".join(texts), calls
