"""One admitted request's life inside the engine: its prompt, its stream state, and the
timestamps its finish reports (`Timings`, `Usage`) are computed from."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import mlx.core as mx

from protocol.messages import PromptEvent, Timings, TokenLogprobs, Usage
from worker.cache_breakpoints import CacheCreation
from worker.detokenizer import IncrementalDetokenizer
from worker.grammar import GrammarProcessor
from worker.logprobs import LogprobsReporter
from worker.prefix_cache import PrefixPlan
from worker.prompt_lookup import DraftLength
from worker.reasoning_span import ReasoningSpan
from worker.stop_strings import StopStringFilter


@dataclass
class ActiveRequest:
    """A request from admission to its terminal event.

    `uid` is the BatchGenerator's id for it, -1 while the generator does not hold it (a
    prefix hit that ends with its first token never joins the batch). Timestamps are
    `time.perf_counter()` values; `created_at` is when the request reached the worker,
    so the TTFT it reports counts tokenizing and the cache lookup too.
    """

    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    detokenizer: IncrementalDetokenizer
    stop_filter: StopStringFilter
    want_progress: bool
    plan: PrefixPlan
    uid: int = -1
    cached_tokens: int = 0
    created_at: float = field(default_factory=time.perf_counter)
    prefill_started_at: float | None = None
    first_token_at: float | None = None
    early_token: int | None = None  # sent before BatchGenerator reported it
    generator_max_tokens: int = 0  # what BatchGenerator still generates for it
    num_generated: int = 0
    grammar: GrammarProcessor | None = None  # its output constraint, if any
    logprobs: LogprobsReporter | None = None  # set when the client asked for logprobs
    creation: CacheCreation = field(default_factory=CacheCreation)  # what its cache breakpoints write
    drafting: DraftLength | None = None  # its speculation's proposal length and record, if it speculates
    drafts_from_model: bool = False  # its speculation may use the worker's draft model
    span: ReasoningSpan | None = None  # its answer's reasoning span (a model that reasons), followed
    reasoning_tokens: int = 0  # generated tokens inside the span, its close included

    def mark_prefill_started(self, at: float) -> None:
        """Record the first prefill step that ran this prompt (later ones change nothing)."""
        if self.prefill_started_at is None:
            self.prefill_started_at = at

    def mark_first_token(self, at: float) -> None:
        """Record the first token; a request that never prefilled (its whole prompt was
        cached) counts no queue time and no prefill time."""
        if self.first_token_at is None:
            self.first_token_at = at
            self.mark_prefill_started(self.created_at)

    def push_token(self, token: int) -> str:
        """Count a generated token; the text it lets the client see now (the detokenizer
        and the stop-string filter may hold some back)."""
        self.num_generated += 1
        text = self.detokenizer.add(token)
        if self.span is not None and not self.span.past:
            thinking = self.span.inside
            if self.span.see(text.encode()) or thinking:
                self.reasoning_tokens += 1
        return self.stop_filter.push(text)

    def check_grammar(self) -> None:
        """Raise `GrammarError` if the grammar engine failed on this request."""
        if self.grammar is not None:
            self.grammar.check()

    def token_logprobs(self, token: int, distribution: mx.array | None) -> TokenLogprobs | None:
        """`token`'s logprobs for its TokenEvent, if the client asked for them."""
        if self.logprobs is None or distribution is None:
            return None
        return self.logprobs.entry(token, distribution)

    def flush_text(self) -> str:
        """At the finish: whatever text was held back."""
        text = self.stop_filter.push(self.detokenizer.flush())
        return text + self.stop_filter.flush()

    def timings(self, now: float) -> Timings:
        """Where the request's time went, as of its finish at `now`."""
        first = self.first_token_at or now
        started = self.prefill_started_at or self.created_at
        decode_s = now - first
        return Timings(
            queue_s=started - self.created_at,
            prefill_s=first - started,
            ttft_s=first - self.created_at,
            decode_s=decode_s,
            decode_tokens_per_s=(self.num_generated - 1) / decode_s if decode_s > 0 else 0.0,
            prompt_tokens_per_s=(
                (len(self.prompt_ids) - self.cached_tokens) / (first - started)
                if first > started else 0.0
            ),
            cold_fetch_s=self.plan.cold_fetch_s,
            grammar_s=self.grammar.seconds if self.grammar is not None else 0.0,
            draft_tokens=self.drafting.proposed if self.drafting is not None else 0,
            draft_accepted=self.drafting.accepted if self.drafting is not None else 0,
        )

    def prompt_event(self) -> PromptEvent:
        """The event that tells the client its prompt is taken, with the cache figures."""
        return PromptEvent(self.request_id, len(self.prompt_ids), self.cached_tokens, self.creation.tokens,
                           self.creation.tokens_1h)

    def usage(self, block_tokens: int) -> Usage:
        """Token counts for the finish; SSD tokens are whole blocks of `block_tokens`."""
        return Usage(len(self.prompt_ids), self.num_generated, self.cached_tokens,
                     self.plan.cold_blocks * block_tokens, self.plan.cold_bytes, self.plan.misses,
                     self.creation.tokens, self.creation.tokens_1h, self.reasoning_tokens)
