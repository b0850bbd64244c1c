"""Sending a request's first token the moment it is sampled, not a step later.

BatchGenerator samples a sequence's first token while the prompt's last token goes
through the model, but reports it only a step later, after dispatching the forward pass
for the second token; on MLX's CPU stream that dispatch runs most of the pass before
returning, so waiting would add a whole decode step to every request's TTFT. On a GPU the
dispatch returns at once and reading the token early would stall the running batch
instead: off there.
"""

from __future__ import annotations

import logging
import mlx.core as mx
from mlx_lm.generate import BatchGenerator

from worker.active_request import ActiveRequest
from worker.batch_adapter import peek_sampled_token

log = logging.getLogger(__name__)


class EarlyFirstToken:
    """Reads first tokens from the generation batch and drops their regular report.

    The token is read through `worker.batch_adapter` (private to mlx-lm: any change there
    just turns this off). A token that could end the request (EOS, max_tokens 1) is not
    taken: it waits for its regular report, which carries the finish reason.
    """

    def __init__(self, eos_token_ids: list[int]) -> None:
        self.enabled = mx.default_device().type == mx.DeviceType.cpu
        self._eos_token_ids = eos_token_ids

    def take(self, generator: BatchGenerator, active: ActiveRequest) -> tuple[int, mx.array | None] | None:
        """`active`'s first token to send now (its prompt just finished), with the
        distribution it was drawn from if the request reports logprobs; or None."""
        if active.generator_max_tokens <= 1 or not self.enabled:
            return None
        sampled = peek_sampled_token(generator, active.uid, with_logprobs=active.logprobs is not None)
        if sampled is None or sampled[0] in self._eos_token_ids:
            return None
        active.early_token = sampled[0]
        return sampled

    @staticmethod
    def is_repeat(active: ActiveRequest, token: int, finish_reason: str | None) -> bool:
        """True for the regular report of the token `take` sent: it is not sent again."""
        if active.early_token is None:
            return False
        early, active.early_token = active.early_token, None
        if token == early and finish_reason is None:
            return True
        log.warning("request %s: first token %d reported as %d (%s)", active.request_id, early, token,
                    finish_reason)
        return False
