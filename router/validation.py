"""The field checks every API dialect builds its request from, and what they build.

Each check reads one field of a request body and either returns it typed and in range or
raises a 400 naming the field, so the worker only ever sees well-formed requests. The
dialects (`router.api`) combine them; this module knows no dialect and imports nothing
from the router. Unknown fields are ignored: clients send many we have no use for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from protocol.codec import WIRE_INT_MAX, WIRE_INT_MIN
from protocol.errors import RequestError
from protocol.messages import AddRequest, Ready, SamplingParams
from protocol.prompt_bounds import check_prompt_fits

MAX_STOP_STRINGS = 16  # OpenAI allows 4; more is harmless for us, unbounded is not
MAX_TOKEN_ID = 2**31 - 1
# No context window comes near it; a bound keeps every integer the worker sees in range.
MAX_TOKENS_LIMIT = 2**31 - 1


@dataclass(frozen=True)
class ParsedRequest:
    """A validated completion request: what to send the worker, and how to answer."""

    kind: str  # "chat" | "text"
    model: str
    add: AddRequest
    stream: bool
    include_usage: bool
    context_limit: int | None = None  # the profile's prompt + output cap, also in `add`
    # the sampling parameters the client set, by their SamplingParams names: a profile fills the rest
    sent: frozenset[str] = frozenset()
    # the reasoning span of the model its worker serves (router.reasoning_split), bound with the worker
    reasoning: Any = None
    images: tuple[Any, ...] = ()  # its image parts (router.images.ImageRef), in order; their bytes go in `add`


def bad(param: str | None, message: str, code: str | None = None) -> RequestError:
    """A 400 whose `param` is the top-level request field; the message names the exact spot."""
    return RequestError(message, status=400, param=param, code=code)


def is_int(value: Any) -> bool:
    """An integer that is not a bool (JSON's true is not 1 here)."""
    return isinstance(value, int) and not isinstance(value, bool)


def number(body: dict[str, Any], name: str, default: float, low: float, high: float,
           *, low_open: bool = False) -> float:
    """An optional finite number field in [low, high] (or (low, high] with `low_open`)."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, (int, float)) or isinstance(value, bool) or (
            isinstance(value, float) and not math.isfinite(value)):
        raise bad(name, f"'{name}' must be a number, got {short(value)}")
    if value < low or (low_open and value == low) or value > high:
        lower = f"> {low}" if low_open else f">= {low}"
        upper = "" if high == math.inf else f" and <= {high}"
        raise bad(name, f"'{name}' must be {lower}{upper}, got {short(value)}")
    return float(value)


def integer(body: dict[str, Any], name: str, low: int, high: int) -> int | None:
    """An optional integer field in [low, high]: every integer gets both bounds, so none
    can overflow a fixed-width field further on."""
    value = body.get(name)
    if value is None:
        return None
    if not is_int(value):
        raise bad(name, f"'{name}' must be an integer, got {short(value)}")
    if not low <= value <= high:
        raise bad(name, f"'{name}' must be >= {low} and <= {high}, got {short(value)}")
    return value


def short(value: Any) -> str:
    """A value for an error message, cut short: the message must stay readable."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def optional_str(body: dict[str, Any], name: str) -> str | None:
    """An optional string field."""
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise bad(name, f"'{name}' must be a string, got {type(value).__name__}")
    return value


def flag(body: dict[str, Any], name: str) -> bool:
    """An optional true/false field (absent: false)."""
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad(name, f"'{name}' must be true or false, got {short(value)}")
    return value


def parse_stop(body: dict[str, Any]) -> list[str]:
    """`stop`: a string or a list of them; empty strings dropped."""
    value = body.get("stop")
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise bad("stop", "'stop' must be a string or a list of strings")
    if len(value) > MAX_STOP_STRINGS:
        raise bad("stop", f"'stop' may hold at most {MAX_STOP_STRINGS} strings, got {len(value)}")
    return [s for s in value if s]  # an empty stop string would end every request at once


def parse_logit_bias(body: dict[str, Any]) -> dict[int, float]:
    """`logit_bias`: token id (as a string key) -> bias in [-100, 100]."""
    value = body.get("logit_bias")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad("logit_bias", "'logit_bias' must be an object mapping token ids to biases")
    bias: dict[int, float] = {}
    for key, amount in value.items():
        try:
            token_id = int(key)
        except (TypeError, ValueError):
            raise bad("logit_bias", f"'logit_bias' keys must be token ids, got {short(key)}") from None
        if not 0 <= token_id <= MAX_TOKEN_ID:
            raise bad("logit_bias", f"'logit_bias' token id out of range: {short(key)}")
        if not isinstance(amount, (int, float)) or isinstance(amount, bool) or not -100 <= amount <= 100:
            raise bad("logit_bias", f"'logit_bias' values must be numbers in [-100, 100], got {short(amount)}")
        bias[token_id] = float(amount)
    return bias


def parse_sampling(body: dict[str, Any]) -> SamplingParams:
    """The sampling fields shared by chat and text completions."""
    max_tokens = integer(body, "max_tokens", 1, MAX_TOKENS_LIMIT)
    max_completion_tokens = integer(body, "max_completion_tokens", 1, MAX_TOKENS_LIMIT)
    top_k = integer(body, "top_k", -1, MAX_TOKEN_ID)
    return SamplingParams(
        max_tokens=max_completion_tokens if max_completion_tokens is not None else max_tokens,
        temperature=number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=number(body, "top_p", 1.0, 0.0, 1.0, low_open=True),
        top_k=max(top_k or 0, 0),  # -1 (vLLM's "off") and 0 both disable it
        min_p=number(body, "min_p", 0.0, 0.0, 1.0),
        seed=integer(body, "seed", WIRE_INT_MIN, WIRE_INT_MAX),
        stop=parse_stop(body),
        repetition_penalty=number(body, "repetition_penalty", 1.0, 0.0, math.inf, low_open=True),
        presence_penalty=number(body, "presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        logit_bias=parse_logit_bias(body),
    )


def check_against_model(parsed: ParsedRequest, ready: Ready) -> None:
    """What only the loaded model can judge, checked before the request is forwarded:
    token ids within its vocabulary (MLX indexes logits unchecked) and a prompt that can
    fit its context window (tokenizing a prompt that cannot fit would waste seconds)."""
    add = parsed.add
    vocab = ready.vocab_size
    if vocab:
        for token_id in add.sampling.logit_bias:
            if token_id >= vocab:
                raise bad("logit_bias", f"'logit_bias' token id {token_id} is not in this model's vocabulary "
                          f"[0, {vocab})")
        if isinstance(add.prompt, list) and max(add.prompt) >= vocab:
            raise bad("prompt", f"'prompt' token ids must be in [0, {vocab}); got {max(add.prompt)}")
    window = ready.context_length
    if add.context_limit:
        window = min(window, add.context_limit)
    check_prompt_fits(add, window, ready.max_token_chars)
