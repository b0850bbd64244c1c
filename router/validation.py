"""OpenAI request JSON -> `protocol.AddRequest`, or a `RequestError` naming the bad parameter.

Types and ranges are checked here, once, so the worker only ever sees well-formed
requests. Unknown fields are ignored: clients send many we have no use for.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from protocol.errors import RequestError
from protocol.messages import AddRequest, Ready, SamplingParams
from protocol.prompt_bounds import check_prompt_fits
from router.json_body import WIRE_INT_MAX, WIRE_INT_MIN, parse_json_body
from router.profiles import apply_profile

if TYPE_CHECKING:  # config validates profiles with this module's parse_sampling
    from router.config import Profile

MESSAGE_ROLES = ("system", "developer", "user", "assistant", "tool", "function")
MAX_STOP_STRINGS = 16  # OpenAI allows 4; more is harmless for us, unbounded is not
MAX_TOKEN_ID = 2**31 - 1
# No context window comes near it; a bound keeps every integer the worker sees in range.
MAX_TOKENS_LIMIT = 2**31 - 1

__all__ = ["ParsedRequest", "bad", "parse_chat_request", "parse_completion_request", "parse_json_body",
           "parse_sampling"]


@dataclass(frozen=True)
class ParsedRequest:
    """A validated completion request: what to send the worker, and how to answer."""

    kind: str  # "chat" | "text"
    model: str
    add: AddRequest
    stream: bool
    include_usage: bool
    context_limit: int | None = None  # the profile's prompt + output cap, also in `add`


def bad(param: str | None, message: str, code: str | None = None) -> RequestError:
    """A 400 whose `param` is the top-level request field; the message names the exact spot."""
    return RequestError(message, status=400, param=param, code=code)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(body: dict[str, Any], name: str, default: float, low: float, high: float,
            *, low_open: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, (int, float)) or isinstance(value, bool) or (
            isinstance(value, float) and not math.isfinite(value)):
        raise bad(name, f"'{name}' must be a number, got {_short(value)}")
    if value < low or (low_open and value == low) or value > high:
        lower = f"> {low}" if low_open else f">= {low}"
        upper = "" if high == math.inf else f" and <= {high}"
        raise bad(name, f"'{name}' must be {lower}{upper}, got {_short(value)}")
    return float(value)


def _integer(body: dict[str, Any], name: str, low: int, high: int) -> int | None:
    """An optional integer field in [low, high]: every integer gets both bounds, so none
    can overflow a fixed-width field further on."""
    value = body.get(name)
    if value is None:
        return None
    if not _is_int(value):
        raise bad(name, f"'{name}' must be an integer, got {_short(value)}")
    if not low <= value <= high:
        raise bad(name, f"'{name}' must be >= {low} and <= {high}, got {_short(value)}")
    return value


def _short(value: Any) -> str:
    """A value for an error message, cut short: the message must stay readable."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _optional_str(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise bad(name, f"'{name}' must be a string, got {type(value).__name__}")
    return value


def _flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad(name, f"'{name}' must be true or false, got {_short(value)}")
    return value


def _stop(body: dict[str, Any]) -> list[str]:
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


def _logit_bias(body: dict[str, Any]) -> dict[int, float]:
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
            raise bad("logit_bias", f"'logit_bias' keys must be token ids, got {_short(key)}") from None
        if not 0 <= token_id <= MAX_TOKEN_ID:
            raise bad("logit_bias", f"'logit_bias' token id out of range: {_short(key)}")
        if not isinstance(amount, (int, float)) or isinstance(amount, bool) or not -100 <= amount <= 100:
            raise bad("logit_bias", f"'logit_bias' values must be numbers in [-100, 100], got {_short(amount)}")
        bias[token_id] = float(amount)
    return bias


def parse_sampling(body: dict[str, Any]) -> SamplingParams:
    """The sampling fields shared by chat and text completions."""
    max_tokens = _integer(body, "max_tokens", 1, MAX_TOKENS_LIMIT)
    max_completion_tokens = _integer(body, "max_completion_tokens", 1, MAX_TOKENS_LIMIT)
    top_k = _integer(body, "top_k", -1, MAX_TOKEN_ID)
    return SamplingParams(
        max_tokens=max_completion_tokens if max_completion_tokens is not None else max_tokens,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, low_open=True),
        top_k=max(top_k or 0, 0),  # -1 (vLLM's "off") and 0 both disable it
        min_p=_number(body, "min_p", 0.0, 0.0, 1.0),
        seed=_integer(body, "seed", WIRE_INT_MIN, WIRE_INT_MAX),
        stop=_stop(body),
        repetition_penalty=_number(body, "repetition_penalty", 1.0, 0.0, math.inf, low_open=True),
        presence_penalty=_number(body, "presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        logit_bias=_logit_bias(body),
    )


def _common(body: dict[str, Any]) -> tuple[str, bool, bool]:
    """model, stream, include_usage; and the parameters we accept but cannot honour."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("model", "'model' is required and must be a string")
    n = body.get("n")
    if n is not None and (not _is_int(n) or n != 1):
        raise bad("n", f"'n' must be 1 (one choice per request is supported), got {_short(n)}")
    if body.get("logprobs") not in (None, False, 0):
        raise bad("logprobs", "'logprobs' is not supported yet")
    _optional_str(body, "user")
    stream = _flag(body, "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise bad("stream_options", "'stream_options' must be an object")
    include_usage = (options or {}).get("include_usage")
    if include_usage is not None and not isinstance(include_usage, bool):
        raise bad("stream_options", "'stream_options.include_usage' must be true or false")
    return model, stream, bool(include_usage)


def _content_text(content: Any, where: str) -> str:
    """Message content (a string or a list of text parts) as one string."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad("messages", f"'{where}' must be a string or a list of content parts")
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict):
            raise bad("messages", f"'{where}[{j}]' must be an object")
        if part.get("type") != "text":
            raise bad("messages", f"'{where}[{j}].type' is {part.get('type')!r}: only 'text' content "
                      "parts are supported")
        if not isinstance(part.get("text"), str):
            raise bad("messages", f"'{where}[{j}].text' must be a string")
        texts.append(part["text"])
    return "\n".join(texts)


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages", "'messages' is required and must be a non-empty list")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise bad("messages", f"'messages[{i}]' must be an object")
        role = message.get("role")
        if role not in MESSAGE_ROLES:
            raise bad("messages", f"'messages[{i}].role' must be one of {', '.join(MESSAGE_ROLES)}, "
                      f"got {_short(role)}")
        out.append(_template_message(message, i))
    return out


def _template_message(message: dict[str, Any], i: int) -> dict[str, Any]:
    """The keys of one message that chat templates read (role, content, name, tool_calls,
    tool_call_id, reasoning_content, thinking), type-checked; whatever else a client sends
    stays in the router, so nothing unchecked reaches the worker."""
    out: dict[str, Any] = {"role": message["role"],
                           "content": _content_text(message.get("content"), f"messages[{i}].content")}
    for key in ("name", "tool_call_id", "reasoning_content", "thinking"):
        value = message.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise bad("messages", f"'messages[{i}].{key}' must be a string, got {type(value).__name__}")
        out[key] = value
    tool_calls = message.get("tool_calls")
    if tool_calls is not None:
        if not isinstance(tool_calls, list) or not all(isinstance(c, dict) for c in tool_calls):
            raise bad("messages", f"'messages[{i}].tool_calls' must be a list of objects")
        out["tool_calls"] = tool_calls
    return out


def _tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    choice = body.get("tool_choice")
    if choice is not None and not isinstance(choice, (str, dict)):
        raise bad("tool_choice", "'tool_choice' must be a string or an object")
    tools = body.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise bad("tools", "'tools' must be a list")
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise bad("tools", f"'tools[{i}]' must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}")
    return tools or None


def _prompt(body: dict[str, Any]) -> str | list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        if not all(0 <= t <= MAX_TOKEN_ID for t in prompt):
            raise bad("prompt", "'prompt' token ids must be non-negative")
        return prompt
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
        raise bad("prompt", "only one prompt per request is supported")
    raise bad("prompt", "'prompt' is required: a string, a list of one string, or a list of token ids")


def _cache_salt(body: dict[str, Any]) -> str | None:
    return _optional_str(body, "cache_salt")


def _wants_progress(body: dict[str, Any]) -> bool:
    """mlxd's extension: `"mlxd": {"progress": true}` streams prefill progress chunks."""
    extension = body.get("mlxd")
    if extension is None:
        return False
    if not isinstance(extension, dict):
        raise bad("mlxd", "'mlxd' must be an object, e.g. {\"progress\": true}")
    return _flag(extension, "progress")


def parse_chat_request(body: dict[str, Any], profile: Profile | None = None) -> ParsedRequest:
    """POST /v1/chat/completions body -> what to send the worker.

    With the `profile` the request's model name selected, its defaults fill what the body
    left out (see `router.profiles.apply_profile`) and its context limit goes to the worker.
    """
    if profile is not None:
        body = apply_profile(body, profile, "chat")
    limit = profile.context_limit if profile is not None else None
    model, stream, include_usage = _common(body)
    add = AddRequest(
        request_id=f"chatcmpl-{uuid.uuid4().hex}",
        messages=_messages(body),
        tools=_tools(body),
        sampling=parse_sampling(body),
        cache_salt=_cache_salt(body),
        want_progress=_wants_progress(body),
        context_limit=limit,
    )
    return ParsedRequest("chat", model, add, stream, include_usage, limit)


def parse_completion_request(body: dict[str, Any], profile: Profile | None = None) -> ParsedRequest:
    """POST /v1/completions body -> what to send the worker.

    A `profile` works as for chat, except that its system prompt is ignored: a raw prompt
    has no roles to put it in.
    """
    if profile is not None:
        body = apply_profile(body, profile, "text")
    limit = profile.context_limit if profile is not None else None
    model, stream, include_usage = _common(body)
    if body.get("echo"):
        raise bad("echo", "'echo' is not supported yet")
    best_of = body.get("best_of")
    if best_of is not None and best_of != 1:
        raise bad("best_of", f"'best_of' must be 1, got {_short(best_of)}")
    add = AddRequest(
        request_id=f"cmpl-{uuid.uuid4().hex}",
        prompt=_prompt(body),
        sampling=parse_sampling(body),
        cache_salt=_cache_salt(body),
        want_progress=_wants_progress(body),
        context_limit=limit,
    )
    return ParsedRequest("text", model, add, stream, include_usage, limit)


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
