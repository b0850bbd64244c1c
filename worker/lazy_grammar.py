"""The lazy call grammar of `tool_choice: auto` (router/tool_calls/lazy_grammar.py builds
it): the answer decodes free until its text shows a trigger (the dialect's call opener),
then every token is held to the call grammar until the call closes; then the answer is
free again (more calls may follow) or may only end.

Why it costs a free answer next to nothing: until a trigger, a step only looks up the
new token's bytes and searches a few dozen bytes of text for the triggers; no mask is
computed and the logits pass through untouched (`FREE`). The matcher runs only inside
calls, where its masks are computed with the rest of the batch's (`GrammarBatch`).

The trigger may end inside a token (`<tool_call>` spelled by a vocabulary without it, or
`{"name":` ending in `":`): the matcher is fed the text from the trigger's start (or, for
a marker such as Mistral's special [TOOL_CALLS], from its end) as tokens of its own, which
leaves it in the same state, since llguidance matches bytes.
"""

from __future__ import annotations

import copy
import hashlib
import logging
from collections import OrderedDict

import llguidance
import numpy as np

from protocol.messages import Constraint
from worker.call_budget import MARGIN, RECHECK, ZONE, JsonQuotes, opening_tokens, shortest_completion, token_shapes
from worker.grammar import FREE, GrammarProcessor, StepMasks
from worker.reasoning_span import ReasoningSpan
from worker.vocabulary import TokenVocabulary

log = logging.getLogger(__name__)

_SPACE = b" \t\r\n"
_START_COSTS_KEPT = 1024  # (grammar, trigger) pairs whose shortest call is kept: a few dozen integers each


def _squeezed(text: bytes) -> bytes:
    return text.translate(None, _SPACE)


class TriggerWatch:
    """Finds a constraint's triggers in an answer's text as it grows, token by token."""

    def __init__(self, constraint: Constraint) -> None:
        self.anywhere = [(t.encode(), True) for t in constraint.triggers] + [
            (m.encode(), False) for m in constraint.markers]
        # start triggers match whatever space the model puts inside them (`{\n  "name"`)
        self.start = [_squeezed(t.encode()) for t in constraint.start_triggers]
        self.at_start = bool(self.start)  # nothing but space written yet (or a start trigger's beginning)
        self._head = b""
        self._tail = b""
        self._keep = max((len(t) for t, _ in self.anywhere), default=1) - 1

    def see(self, data: bytes) -> bytes | None:
        """The text the matcher must consume now that `data` was written, or None while
        no trigger has been completed."""
        if self.at_start:
            self._head += data
            head = self._head.lstrip(_SPACE)
            squeezed = _squeezed(head)
            for trigger in self.start:
                if squeezed.startswith(trigger):
                    self.rearm()
                    return head
            self.at_start = any(trigger.startswith(squeezed) for trigger in self.start)
        tail = self._tail + data
        for trigger, fed in self.anywhere:
            found = tail.find(trigger)
            if found >= 0:
                self.rearm()
                return tail[found:] if fed else tail[found + len(trigger):]
        self._tail = tail[-self._keep:] if self._keep else b""
        return None

    def rearm(self) -> None:
        """Watch again from here, for the triggers allowed anywhere."""
        self.at_start = False
        self._head = self._tail = b""

    def partial_next(self) -> set[int]:
        """The bytes that would continue a trigger the text now ends partway into."""
        nexts = set()
        candidates = [t for t, _ in self.anywhere] + (self.start if self.at_start else [])
        text = _squeezed(self._head) if self.at_start else self._tail
        for trigger in candidates:
            for k in range(min(len(text), len(trigger) - 1), 0, -1):
                if text.endswith(trigger[:k]):
                    nexts.add(trigger[k])
                    break
        return nexts

    def live_triggers(self) -> list[tuple[bytes, bool]]:
        """The triggers that may still begin: anywhere ones, and start ones at the start."""
        return self.anywhere + ([(t, True) for t in self.start] if self.at_start else [])


class LazyCallProcessor(GrammarProcessor):
    """A `GrammarProcessor` that holds nothing until a trigger (see the module docstring),
    and keeps a call inside `max_tokens` (worker/call_budget.py): near the budget's end
    a call in progress is closed by its shortest completion, and a trigger that could
    no longer be followed by a whole call cannot be written.

    `matcher` is the call grammar at its start; it is reset after each call."""

    def __init__(self, matcher: object, constraint: Constraint, prompt_length: int, max_tokens: int,
                 vocabulary: TokenVocabulary, batch: StepMasks | None = None, label: str = "",
                 span: ReasoningSpan | None = None) -> None:
        super().__init__(matcher, prompt_length, vocabulary, batch)  # type: ignore[arg-type]
        self._constraint = constraint
        self._span = span  # the answer's reasoning span: no call is taken inside it
        self._vocabulary = vocabulary
        self._watch = TriggerWatch(constraint)
        self._end = prompt_length + max_tokens  # the context length at which the answer is cut
        self._label = label
        self._active = False  # inside a call: the grammar holds every token
        self._done = False  # a call completed and no other may follow: only EOS
        self._quotes = JsonQuotes()
        self._start_costs: dict[bytes, int] = {}  # trigger -> tokens a whole call from it needs at least
        self._start_paths: dict[bytes, list[int]] = {}  # the matcher's first input -> the shortest call after it
        self.calls = 0  # calls the grammar held
        self.forced = 0  # tokens forced to close a call inside the budget
        self._guarded = False  # the budget has begun to mask openers
        self._need: int | None = None  # the last shortest completion's length, in tokens
        self._checked_at = 0  # the tokens left when it was found
        self._path: list[int] | None = None  # that completion's tokens not yet written, while the answer follows it
        self._blocked: dict[tuple[bytes, ...], np.ndarray] = {}  # the guard's masks, by the triggers they block

    @staticmethod
    def warm(vocabulary: TokenVocabulary, constraint: Constraint, matcher: llguidance.LLMatcher) -> None:
        """Build what a budget guard may need, on the tokenizer thread rather than mid-step:
        the vocabulary tables (a walk of the whole vocabulary per trigger) and the cost of
        a whole call from each trigger (a walk of the grammar)."""
        watch = TriggerWatch(constraint)
        for trigger, fed in watch.anywhere + [(t, True) for t in watch.start]:
            opening_tokens(vocabulary, trigger.decode())
            call_start(vocabulary, constraint, matcher, trigger, fed)

    @property
    def needs_mask(self) -> bool:
        return self._active and super().needs_mask

    def free_ahead(self, tokens: list[int]) -> int:
        """How many of `tokens` (the next ones of the answer) this grammar would consume
        staying free, each leaving the next token's mask FREE: no trigger completed and
        the budget's zone not reached. Speculation drafts only that far, so a draft never
        needs a mask (the matcher's state is not touched)."""
        if self.error is not None or self._done or self._active:
            return 0
        watch = copy.copy(self._watch)
        span = self._span.copy() if self._span is not None else None
        for i, token in enumerate(tokens):
            if self._end - (self.next_position + i + 1) <= ZONE:
                return i
            data = self._vocabulary.token_bytes(token)
            if span is not None and self._thinking(span, data):
                if span.past:
                    watch = TriggerWatch(self._constraint)
                continue
            if watch.see(data) is not None:
                return i
        return len(tokens)

    @staticmethod
    def _thinking(span: ReasoningSpan, data: bytes) -> bool:
        """Follow `span` over a token; True if the token is part of the span (or closes it),
        so it cannot begin a call."""
        if span.past:
            return False
        return span.see(data) or span.inside

    def consume(self, new_tokens: list[int]) -> None:
        for token in new_tokens:
            self.next_position += 1
            if self.error is not None or self._done:
                continue
            data = self._vocabulary.token_bytes(token)
            if self._active:
                if not self.matcher.consume_token(token):
                    self.fail(self.matcher.get_error() or f"the call grammar refused token {token}")
                    continue
                self._path = self._path[1:] if self._path and self._path[0] == token else None
                self._quotes.feed(data)
                if self.matcher.is_stopped():
                    self._close()
            elif self._span is not None and self._thinking(self._span, data):
                if self._span.past:  # the span closed: the answer starts here
                    self._watch = TriggerWatch(self._constraint)
            else:
                fed = self._watch.see(data)
                if fed is not None:
                    self._open(fed)

    def _open(self, text: bytes) -> None:
        ids = self._vocabulary.llg.tokenize_bytes(text)
        if not self.matcher.consume_tokens(ids):
            log.warning("%s: a tool call began as %r, which its grammar cannot continue; left free",
                        self._label, text[:60])
            self.matcher.reset()
            return
        self._active, self._quotes, self._path = True, JsonQuotes(), None
        self._quotes.feed(text)
        start = self._start_paths.get(text)
        if start is not None:  # the walk the budget guard made from this very state
            self._path, self._need, self._checked_at = list(start), len(start), self._end - self.next_position
        self.calls += 1
        log.info("%s: tool call %d began (%r); held to the tools from here", self._label, self.calls,
                 text[:24].decode(errors="replace"))
        if self.matcher.is_stopped():
            self._close()

    def _close(self) -> None:
        self._active, self._need, self._path = False, None, None
        if self.forced:
            log.info("%s: tool call %d closed inside max_tokens (%d tokens forced)", self._label, self.calls,
                     self.forced)
        if self._constraint.rearm:
            self.matcher.reset()
            self._watch.rearm()
        else:
            self._done = True

    def allowed(self, words: np.ndarray | None) -> np.ndarray:
        if self.error is not None or self._done:
            return self._eos_only
        left = self._end - self.next_position  # tokens the answer may still take, this one included
        if not self._active:
            return self._guard(left) if left <= ZONE else FREE
        mask = super().allowed(words)
        if left > ZONE:
            return mask
        path = self._path
        if path is None:
            if not self._due(left):
                return mask
            path = self._path = shortest_completion(self.matcher, self._quotes, self._vocabulary, limit=ZONE)
            self._need, self._checked_at = (len(path) if path is not None else ZONE), left
        if path == []:  # the grammar may end here (Llama's `;`-joined calls): another only if it fits
            return self._eos_only if self._start_cost(b"", True) + MARGIN >= left else mask
        if path is not None and len(path) + MARGIN >= left:
            self.forced += 1
            only = np.zeros_like(mask)
            only[path[0]] = True
            return only
        return mask

    def _due(self, left: int) -> bool:
        """Whether to walk the shortest completion this step (the answer has left the last
        one found): always once the budget comes near it, else every RECHECK steps (a
        walk costs a mask per token of it; a token the model writes rarely lengthens the
        way out by more than a few). While the answer follows the last one (the walk is
        greedy, so from the state its first token leads to, the rest is the walk again),
        and whenever it is forced, no walk is needed at all."""
        if self._need is None or left <= self._need + MARGIN + RECHECK:
            return True
        return self._checked_at - left >= RECHECK

    def _guard(self, left: int) -> np.ndarray:
        """FREE, or every token but those that would begin a call there is no budget left
        to finish."""
        too_long = tuple(trigger for trigger, fed in self._watch.live_triggers()
                         if self._start_cost(trigger, fed) + MARGIN >= left)
        if not too_long:
            return FREE
        if not self._guarded:
            self._guarded = True
            log.info("%s: %d tokens left, too few for a whole tool call: no call is opened", self._label, left)
        partial = self._watch.partial_next()  # a trigger begun: its next byte may not follow
        key = too_long + tuple(bytes([b]) for b in sorted(partial))
        allowed = self._blocked.get(key)
        if allowed is None:  # the same few masks step after step: each is built once
            blocked = np.zeros(self._vocab_size, dtype=np.bool_)
            for trigger in too_long:
                blocked |= opening_tokens(self._vocabulary, trigger.decode())[: self._vocab_size]
            for byte in partial:
                blocked |= token_shapes(self._vocabulary).first[: self._vocab_size] == byte
            allowed = self._blocked[key] = ~blocked
        return allowed

    def _start_cost(self, trigger: bytes, fed: bool) -> int:
        cost = self._start_costs.get(trigger)
        if cost is None:
            cost, path = call_start(self._vocabulary, self._constraint, self.matcher, trigger, fed)
            self._start_costs[trigger] = cost
            if path is not None:
                self._start_paths[trigger if fed else b""] = path
        return cost


def call_start(vocabulary: TokenVocabulary, constraint: Constraint, matcher: llguidance.LLMatcher, trigger: bytes,
               fed: bool) -> tuple[int, list[int] | None]:
    """The fewest tokens a whole call begun by `trigger` takes (the trigger's own and the
    shortest completion after it), and that completion (None: none within ZONE); walked
    on a copy of `matcher`, once per grammar and trigger: agents send the same tools
    request after request."""
    # shared by the tokenizer thread (warm) and the engine loop: OrderedDict.popitem is one
    # atomic call, where evicting from a dict through an iterator could race an insertion
    costs = vocabulary.derived("lazy_grammar.start_costs", lambda tokens: OrderedDict())
    key = (hashlib.blake2b(constraint.source.encode(), digest_size=16).digest(), trigger, fed)
    cost = costs.get(key)
    if cost is None:
        walk = matcher.deep_copy()
        walk.reset()
        trigger_ids = vocabulary.llg.tokenize_bytes(trigger)
        if fed:
            walk.consume_tokens(trigger_ids)
        quotes = JsonQuotes()
        quotes.feed(trigger if fed else b"")
        path = shortest_completion(walk, quotes, vocabulary, limit=ZONE)
        cost = (len(trigger_ids) + (len(path) if path is not None else ZONE), path)
        if len(costs) >= _START_COSTS_KEPT:
            costs.popitem(last=False)
        costs[key] = cost
    return cost[0], (list(cost[1]) if cost[1] is not None else None)
