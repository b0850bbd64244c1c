"""The two ways things fail across processes: a dead peer, or one failed request."""

from __future__ import annotations


class ProtocolError(Exception):
    """Bytes on a socket that are not a message this version understands."""


class WorkerDead(Exception):
    """The worker process died or stopped answering; its requests cannot finish."""


class RequestError(Exception):
    """One request failed; the process that raised it lives on.

    Carries what the HTTP layer needs to answer in OpenAI's / Anthropic's error shape.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        error_type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        num_prompt_tokens: int | None = None,
        context_window: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.error_type = error_type
        self.param = param
        self.code = code
        # a prompt too long for the window: both numbers, so each dialect can word its own
        # message (Anthropic clients look for "prompt is too long: N tokens > W maximum")
        self.num_prompt_tokens = num_prompt_tokens
        self.context_window = context_window
