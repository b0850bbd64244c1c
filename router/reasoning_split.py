"""An answer's reasoning span split from its answer, as the text streams in.

A reasoning model writes `<think>` ... `</think>` (its template's markers) before it
answers; some templates open the span in the prompt itself, so the answer starts inside
it. Each API carries the span in a field of its own (chat `reasoning_content`, Messages
`thinking` blocks, Responses `reasoning` items); the answer text, and the tool-call parser
that reads it, never see it.

Only a span at the start of the answer (after whitespace) is reasoning: the same markers
later on are the answer's own text. Text that could still turn out to be a marker is held
back until it is decided, so a marker split across deltas never leaks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from protocol.messages import Ready

REASONING = "reasoning"
ANSWER = "answer"


@dataclass(frozen=True)
class ReasoningMarkers:
    """A template's reasoning span: its markers, and whether the prompt opens it."""

    open: str = "<think>"
    close: str = "</think>"
    opens_in_prompt: bool = False


def markers_of(ready: Ready) -> ReasoningMarkers | None:
    """The reasoning span of the model a worker serves, or None for one that does not reason."""
    if not ready.reasoning_open:
        return None
    return ReasoningMarkers(ready.reasoning_open, ready.reasoning_close, ready.reasoning_opens_in_prompt)


def reasoning_info(ready: Ready) -> dict[str, Any] | None:
    """The span as /v1/models and /health report it (null: the model does not reason)."""
    markers = markers_of(ready)
    if markers is None:
        return None
    return {"open": markers.open, "close": markers.close, "opens_in_prompt": markers.opens_in_prompt}


class ReasoningSplitter:
    """Feed the answer's text deltas; get (REASONING | ANSWER, text) pieces, in order."""

    def __init__(self, markers: ReasoningMarkers) -> None:
        self._markers = markers
        self._state = "opened" if markers.opens_in_prompt else "start"
        self._held = ""

    def feed(self, text: str) -> list[tuple[str, str]]:
        self._held += text
        return self._drain(final=False)

    def finish(self) -> list[tuple[str, str]]:
        """What was held back: the answer ended, so nothing is a marker any more."""
        return self._drain(final=True)

    def _drain(self, final: bool) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        while self._held:
            before = (self._held, self._state)
            if self._state == "start":
                self._start(final)
            elif self._state == "opened":  # the newline after the opener is the marker's, not reasoning
                self._held = self._held.lstrip("\n")
                if self._held:
                    self._state = "inside"
            elif self._state == "inside":
                self._inside(out, final)
            elif self._state == "after_close":
                stripped = self._held.lstrip()
                if stripped or final:
                    self._state, self._held = "answer", stripped
                else:
                    self._held = ""
            else:
                out.append((ANSWER, self._held))
                self._held = ""
            if (self._held, self._state) == before:
                break  # waiting for more text
        return [(kind, piece) for kind, piece in out if piece]

    def _start(self, final: bool) -> None:
        stripped = self._held.lstrip()
        opener = self._markers.open
        if stripped.startswith(opener):
            self._state, self._held = "opened", stripped[len(opener):]
        elif (not stripped or opener.startswith(stripped)) and not final:
            return  # still could open the span
        else:
            self._state = "answer"

    def _inside(self, out: list[tuple[str, str]], final: bool) -> None:
        closer = self._markers.close
        at = self._held.find(closer)
        if at >= 0:
            self._emit_reasoning(out, self._held[:at])
            self._state, self._held = "after_close", self._held[at + len(closer):]
            return
        keep = 0 if final else _partial_suffix(self._held, closer)
        self._emit_reasoning(out, self._held[:len(self._held) - keep])
        self._held = self._held[len(self._held) - keep:]

    def _emit_reasoning(self, out: list[tuple[str, str]], text: str) -> None:
        if text:
            out.append((REASONING, text))


class AnswerSplit:
    """An answer's splitter, made at its first text from the request as its worker bound
    it (`stream.request.reasoning`, None: nothing is reasoning); a request that waited for
    its model started its answer before that worker was known."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._splitter: ReasoningSplitter | None = None
        self._made = False

    def feed(self, text: str) -> list[tuple[str, str]]:
        splitter = self._made_splitter()
        return splitter.feed(text) if splitter is not None else [(ANSWER, text)]

    def finish(self) -> list[tuple[str, str]]:
        splitter = self._made_splitter()
        return splitter.finish() if splitter is not None else []

    def _made_splitter(self) -> ReasoningSplitter | None:
        if not self._made:
            markers = getattr(getattr(self._stream, "request", None), "reasoning", None)
            self._splitter = ReasoningSplitter(markers) if markers is not None else None
            self._made = True
        return self._splitter


def joined(pieces: list[tuple[str, str]]) -> tuple[str, str]:
    """(reasoning, answer) text of a whole answer's pieces."""
    return ("".join(t for kind, t in pieces if kind == REASONING), "".join(t for kind, t in pieces if kind == ANSWER))


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of `text` that begins `marker`."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
