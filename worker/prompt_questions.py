"""What the worker's tokenizer thread asks of a request's prompt, apart from the engine
(which owns the batch): its token ids and cached blocks read ahead, its size for a token
count, and where it is cached for a probe. All thread-safe: they render, tokenize and look
the cache up without changing it (`worker.admission.Admitter`, `PrefixCache.probe`)."""

from __future__ import annotations

from protocol.cache_messages import CacheProbed
from protocol.messages import AddRequest, CountTokens, ProbeCache
from worker.admission import Admitter
from worker.prefix_cache import PrefixCache
from worker.prompt_preparer import PreparedPrompt


class PromptQuestions:
    """The tokenizer thread's door into the admitter and the prefix cache."""

    def __init__(self, admitter: Admitter, prefix_cache: PrefixCache) -> None:
        self._admitter = admitter
        self._prefix_cache = prefix_cache

    def prepare(self, request: AddRequest) -> PreparedPrompt:
        """Tokenize and read the prompt's cached blocks from the cold tier, ahead of the
        engine's admission (see `PromptPreparer`)."""
        return self._admitter.prepare(request)

    def prompt_ids(self, request: AddRequest) -> list[int]:
        """The request's prompt as token ids, or the RequestError refusing it."""
        return self._admitter.prompt_ids(request)

    def count_tokens(self, request: CountTokens) -> int:
        """How many tokens the prompt of `request` renders to, even one too long for the
        context window."""
        return len(self._admitter.rendered_ids(request.request))

    def probe_cache(self, request: ProbeCache) -> CacheProbed:
        """Where the prompt of `request` is cached (`PrefixCache.probe`), rendered and
        tokenized as for a count and looked up without using anything, with why its
        missing tokens are missing."""
        add = request.request
        prompt_ids = self._admitter.rendered_ids(add)
        probed = self._prefix_cache.probe(prompt_ids, add.cache_salt, request.request_id)
        probed.misses = self._admitter.misses(add, prompt_ids, probed.hot_tokens + probed.cold_tokens,
                                              probed.cold_tokens, self._admitter.divergence(add, prompt_ids),
                                              refresh=False)
        return probed
