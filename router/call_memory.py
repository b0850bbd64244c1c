"""What the model generated for each tool call it made, so the next turn's prompt repeats
those tokens and not the chat template's rendering of the call.

The prefix cache keeps an answer's generated tokens. The client sends the call back as a
name and arguments, which the template renders its own way (tags the model left out, other
spacing, keys in another order): today the turn after every call would recompute from the
call on. So each answer with calls is remembered under its call ids (the ids are derived
from the request id, `router.tool_calls.request_call_ids`, so parsing the answer here
names its calls as the client saw them), and a later request whose history holds that
answer unchanged gets its token ids marked on the message (`GENERATED_TOKENS`) for the
worker to render. Unchanged means: same model, same calls in the same order with equal
names and arguments (as JSON values: a client may reorder keys), same text around them,
same reasoning (`reasoning_content`: what the answer's span said, or none for none);
anything else renders from the calls as before, so the memory never changes what a
prompt says, only which of its equal spellings it takes. By default (`generated_calls =
"markup"`) only answers that wrote their calls in the template's own markup (`<tool_call>`)
are remembered: one that wrote a bare JSON object or a code block is rendered back in the
right form, which is what the model should see in its history (the cache then recomputes
that turn from the call on); `"always"` remembers those too.
"""

from __future__ import annotations

import collections
import json
import logging
from dataclasses import dataclass
from typing import Any

from protocol.generated_turns import GENERATED_TOKENS
from protocol.tool_dialects import CALL_OPEN
from router.reasoning_split import ReasoningMarkers, ReasoningSplitter, joined
from router.tool_calls import ToolRequest, gather, make_parser

logger = logging.getLogger(__name__)

DEFAULT_CAPACITY = 4096  # remembered answers; an answer costs its token ids (~100 ints)
_ID_PREFIXES = ("call_", "toolu_")  # Anthropic's answers rename call_X to toolu_X


def call_key(call_id: str) -> str:
    """A call id without the prefix the API it went out through gave it."""
    for prefix in _ID_PREFIXES:
        if call_id.startswith(prefix):
            return call_id[len(prefix):]
    return call_id


@dataclass(frozen=True)
class GeneratedTurn:
    """One answer with calls: what the parser made of it, and its token ids (eos excluded)."""

    model: str
    content: str
    calls: tuple[tuple[str, str, Any], ...]  # (call key, name, arguments object)
    token_ids: tuple[int, ...]
    reasoning: str = ""  # the answer's reasoning span, as the client got it


class GeneratedAnswer:
    """The text and token ids of one answer, as the worker streams them."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.token_ids: list[int] = []

    def add(self, text: str, token_ids: list[int]) -> None:
        self.texts.append(text)
        self.token_ids.extend(token_ids)

    @property
    def text(self) -> str:
        return "".join(self.texts)


class CallMemory:
    """A bounded LRU of generated answers with calls, by call key.

    Invariant: an entry is found only under the keys of its own calls, and is marked on a
    history message only when that message says exactly what the entry's answer said.
    """

    def __init__(self, capacity: int = DEFAULT_CAPACITY, markup_only: bool = True) -> None:
        self.capacity = capacity
        self.markup_only = markup_only  # remember only answers that wrote the template's call markup
        self._turns: collections.OrderedDict[str, GeneratedTurn] = collections.OrderedDict()
        self.num_marked = 0  # history turns rendered back as their generated tokens

    def __len__(self) -> int:
        return len(self._turns)

    def follow(self, parsed: Any) -> GeneratedAnswer | None:
        """A collector for `parsed`'s answer if it is one to remember: a chat answer that
        may call tools, from the start of the assistant's turn (not continuing a prefill,
        whose text the generated tokens do not hold alone), with no stop strings (which
        cut the text the client sees short of the tokens)."""
        add = parsed.add
        if (self.capacity <= 0 or getattr(parsed, "tools", None) is None or add.messages is None
                or add.continue_final_message or add.sampling.stop):
            return None
        return GeneratedAnswer()

    def remember(self, model: str, request_id: str, tools: ToolRequest, dialect: str, answer: GeneratedAnswer,
                 reasoning: ReasoningMarkers | None = None) -> None:
        """Keep `answer` if it made calls: split and parsed again as its answer was (same
        span markers, same parser, same call ids), so the calls are found under the ids
        the client got, beside the reasoning it got."""
        if not answer.token_ids or self.capacity <= 0:
            return
        thought, text = "", answer.text
        if reasoning is not None:
            splitter = ReasoningSplitter(reasoning)
            thought, text = joined(splitter.feed(text) + splitter.finish())
        if self.markup_only and CALL_OPEN not in text:
            # calls written outside the template's markup (a bare JSON object, a code block):
            # rendered back as written, the history would teach the model that form (seen on
            # Qwen2.5-Coder-1.5B: its answer after the result came as a ```json call). The
            # template's rendering shows the right form; that turn recomputes from the call.
            return
        parser = make_parser(tools, dialect, request_id)
        content, calls = gather(parser.feed(text) + parser.finish())
        if not calls:
            return
        turn = GeneratedTurn(model, content, tuple((call_key(c.id), c.name, json.loads(c.arguments)) for c in calls),
                             tuple(answer.token_ids), thought)
        for key, _, _ in turn.calls:
            self._turns[key] = turn
            self._turns.move_to_end(key)
        while len(self._turns) > self.capacity:
            self._turns.popitem(last=False)

    def mark(self, model: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """`messages` with each assistant turn that repeats a remembered answer of `model`
        marked with that answer's token ids."""
        out = []
        for message in messages:
            if GENERATED_TOKENS in message:  # only this memory marks (a stored history may hold old marks)
                message = {k: v for k, v in message.items() if k != GENERATED_TOKENS}
            turn = self._match(model, message)
            if turn is not None:
                message = {**message, GENERATED_TOKENS: list(turn.token_ids)}
                self.num_marked += 1
            out.append(message)
        return out

    def _match(self, model: str, message: dict[str, Any]) -> GeneratedTurn | None:
        calls = message.get("tool_calls")
        if message.get("role") != "assistant" or not isinstance(calls, list) or not calls:
            return None
        first = calls[0].get("id") if isinstance(calls[0], dict) else None
        turn = self._turns.get(call_key(first)) if isinstance(first, str) else None
        if turn is None or turn.model != model or len(calls) != len(turn.calls):
            return None
        for call, (key, name, arguments) in zip(calls, turn.calls):
            function = call.get("function") or {}
            if call_key(call.get("id") or "") != key or function.get("name") != name:
                return None
            if _arguments(function.get("arguments")) != arguments:
                return None
        content = message.get("content")
        if not isinstance(content, str) or content.strip() != turn.content.strip():
            return None
        thought = message.get("reasoning_content") or ""
        if not isinstance(thought, str) or thought.strip() != turn.reasoning.strip():
            return None  # a client that leaves the reasoning out asks for the turn without it
        self._turns.move_to_end(call_key(first))
        return turn


def _arguments(value: Any) -> Any:
    """A history call's arguments as a JSON value (OpenAI sends them as JSON text)."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value


def mark_history(state: Any, model: str, add: Any) -> None:
    """Mark `add`'s history with the app's call memory (`state.call_memory`, if there is
    one): every route that renders a chat prompt (generations, token counts, cache probes
    and snapshots) must render it the same way, or a count or a probe would not be exact."""
    memory: CallMemory | None = getattr(state, "call_memory", None)
    if memory is not None and add.messages is not None:
        add.messages = memory.mark(model, add.messages)
