"""POST /v1/completions: a raw prompt (text or token ids) in, OpenAI text completions out."""

from __future__ import annotations

import uuid
from typing import Any

from protocol.messages import AddRequest
from router.api import openai_answers, schemas
from router.api.dialect_entry import DialectEntry, Endpoint
from router.api.logprobs import with_completion_logprobs
from router.api.openai_common import OPENAI_SAMPLING_NAMES, cache_salt, stream_flags, wants_progress
from router.api.response_format import parse_response_format
from router.api.unknown_fields import OPENAI_COMPLETION_FIELDS, note_unknown_fields
from router.profiles import Profile, sent_parameters, with_profile
from router.requests import Dialect, model_name, stream
from router.validation import MAX_TOKEN_ID, ParsedRequest, bad, is_int, parse_sampling, short
from starlette.requests import Request
from starlette.responses import Response


def _prompt(body: dict[str, Any]) -> str | list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(is_int(t) for t in prompt):
        if not all(0 <= t <= MAX_TOKEN_ID for t in prompt):
            raise bad("prompt", "'prompt' token ids must be non-negative")
        return prompt
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
        raise bad("prompt", "only one prompt per request is supported")
    raise bad("prompt", "'prompt' is required: a string, a list of one string, or a list of token ids")


def parse(body: dict[str, Any], profile: Profile | None = None) -> ParsedRequest:
    """The completions body -> what to send the worker.

    A `profile` works as for chat, except that its system prompt is ignored: a raw prompt
    has no roles to put it in.
    """
    note_unknown_fields("completions", body, OPENAI_COMPLETION_FIELDS)
    stream, include_usage = stream_flags(body)
    if body.get("echo"):
        raise bad("echo", "'echo' is not supported yet")
    best_of = body.get("best_of")
    if best_of is not None and best_of != 1:
        raise bad("best_of", f"'best_of' must be 1, got {short(best_of)}")
    add = AddRequest(
        request_id=f"cmpl-{uuid.uuid4().hex}",
        prompt=_prompt(body),
        sampling=with_completion_logprobs(parse_sampling(body), body),
        cache_salt=cache_salt(body),
        want_progress=wants_progress(body),
        constraint=parse_response_format(body),  # vLLM's extension of this API
    )
    parsed = ParsedRequest("text", model_name(body), add, stream, include_usage,
                           sent=sent_parameters(body, OPENAI_SAMPLING_NAMES))
    return with_profile(parsed, profile)


DIALECT = Dialect(parse=parse, respond=openai_answers.respond)


async def completions(request: Request) -> Response:
    return await stream(request, DIALECT)


def _probe_prompt(request: Request, body: dict[str, Any], profile: Profile | None) -> AddRequest:
    return parse(body, profile).add


ENTRY = DialectEntry(
    "completions", (Endpoint("/v1/completions", "POST", completions, "OpenAI text completions", schemas.COMPLETION),),
    prompt=_probe_prompt, claims=lambda body, headers: "prompt" in body)
