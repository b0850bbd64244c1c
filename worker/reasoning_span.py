"""Where an answer stands against its reasoning span, followed token by token: not yet
open, inside, or past it.

Two processors need it: the thinking budget (worker/reasoning_budget.py) counts the
tokens inside and closes the span, and the lazy call grammar (worker/lazy_grammar.py)
must not take a call opener the model writes while it thinks for a call (the router reads
calls only from the text after the span). Both follow the same rule the router's split
does (router/reasoning_split.py): a span counts only at the start of the answer.
"""

from __future__ import annotations

TAIL_BYTES = 64  # the generated text kept to spot a marker that spans tokens
OPEN_WITHIN = 16  # a span the model opens must open within its first tokens (later, it is answer text)


class ReasoningSpan:
    """The span's state from the bytes of each generated token (`see`)."""

    def __init__(self, open_marker: str, close_marker: str, opens_in_prompt: bool) -> None:
        self._open, self._close = open_marker.encode(), close_marker.encode()
        self.inside = opens_in_prompt  # the token being generated is reasoning
        self.past = False  # the span closed, or the answer began without one: no span from here
        self._seen = 0
        self._tail = b""

    @property
    def pending(self) -> bool:
        """Not open yet, and it still may open."""
        return not self.inside and not self.past

    def see(self, data: bytes) -> bool:
        """Follow one generated token; True when it closed the span."""
        if self.past:
            return False
        self._seen += 1
        self._tail = (self._tail + data)[-TAIL_BYTES:]
        if not self.inside:
            if self._open in self._tail:
                self.inside, self._tail = True, self._tail.split(self._open, 1)[1]
            elif self._seen >= OPEN_WITHIN:
                self.past = True  # it answered without reasoning
            return False
        if self._close in self._tail:
            self.inside, self.past = False, True
            return True
        return False

    def copy(self) -> ReasoningSpan:
        twin = ReasoningSpan.__new__(ReasoningSpan)
        twin.__dict__.update(self.__dict__)
        return twin
