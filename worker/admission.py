"""Admitting a request: its prompt as token ids, its limits and sampler checked, and the
prefix cache's plan for it. Nothing here depends on the running batch; the engine then
starts the admitted request in the batch (`Engine.add`: admit -> plan -> start)."""

from __future__ import annotations

import logging
from collections.abc import Container
from dataclasses import dataclass, field
from typing import Any

import llguidance
from mlx_lm.sample_utils import LogitsProcessor, Sampler

from protocol.cache_misses import CacheMisses, Divergence
from protocol.errors import RequestError
from protocol.messages import AddRequest
from protocol.settings import DRAFT_MODEL, PROMPT_LOOKUP, WorkerSettings
from protocol.prompt_bounds import check_prompt_fits
from worker.cache_breakpoints import BreakpointPosition, CacheCreation, breakpoint_positions, cache_creation
from worker.grammar import GrammarCompiler, GrammarProcessor
from worker.grammar_batch import GrammarBatch
from worker.lazy_grammar import LazyCallProcessor
from worker.logprobs import LogprobsReporter
from worker.message_at_token import locate
from worker.miss_reasons import explain
from worker.prefix_cache import PrefixCache, PrefixPlan
from worker.prompt_preparer import PreparedPrompt
from worker.prompts import render_chat, render_chat_text, render_completion
from worker.reasoning_budget import ReasoningBudget
from worker.reasoning_span import ReasoningSpan
from worker.reasoning_template import detect_reasoning, thinking_switch
from worker.vision_model import ImageEncoder
from worker.request_limits import check_logit_bias, check_prompt_cap, context_window, max_new_tokens
from worker.sampling import RequestSampler, greedy, make_request_processors, make_request_sampler
from worker.vocabulary import TokenVocabulary

log = logging.getLogger(__name__)


@dataclass
class Admission:
    """A request checked and ready to start: its prompt, its answer's length, and how
    its tokens are drawn."""

    prompt_ids: list[int]
    max_tokens: int
    sampler: Sampler
    processors: list[LogitsProcessor]  # the grammar's last, if it has one
    grammar: GrammarProcessor | None = None
    logprobs: LogprobsReporter | None = None
    breakpoints: list[BreakpointPosition] = field(default_factory=list)  # the client's, as token positions
    creation: CacheCreation = field(default_factory=CacheCreation)  # what it writes to the cache (once planned)
    speculate: bool = False  # greedy, unconstrained, and its speculation is on
    draft_model: bool = False  # it speculates with the draft model too (where the worker has one)
    span: ReasoningSpan | None = None  # its answer's reasoning span, followed to count its tokens


class Admitter:
    """Turns an AddRequest into token ids, checked limits, a sampler and a prefix plan.

    Holds no per-request state, so `prompt_ids` and `prepare` may run on the worker's
    tokenizer thread while the engine loop admits other requests. Every refusal is a
    RequestError naming what the client must change.
    """

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: list[int], context_length: int,
                 max_token_chars: int, settings: WorkerSettings, prefix_cache: PrefixCache,
                 grammar_batch: GrammarBatch | None = None, images: ImageEncoder | None = None) -> None:
        """`grammar_batch`, if given, prepares the masks of every constrained sequence a
        decode step runs (the engine's; see `GrammarBatch`); `images`: a vision model's
        processor and tower, which turn a chat's images into prompt tokens."""
        self._tokenizer = tokenizer
        self._images = images
        self._grammar_batch = grammar_batch
        self._vocabulary = TokenVocabulary(tokenizer, vocab_size, eos_token_ids)
        self._grammars = GrammarCompiler(self._vocabulary)
        self._reasoning = detect_reasoning(tokenizer)  # (open, close, opens in prompt), or None
        self._vocab_size = vocab_size
        self._context_length = context_length
        self._max_token_chars = max_token_chars
        self._config = settings
        self._prefix_cache = prefix_cache

    def check_room(self, request_id: str, running: Container[str], num_taken: int) -> None:
        """Raise the 400 for an id already `running`, or the 503 when `num_taken` requests
        (running, queued, or still being tokenized) fill every slot and the queue."""
        if request_id in running:
            raise RequestError(f"duplicate request id {request_id}")
        limit = self._config.max_num_seqs + self._config.max_queue
        if num_taken >= limit:
            raise RequestError(
                f"server busy: {num_taken} requests running or queued "
                f"(max_num_seqs + max_queue = {limit}); retry shortly",
                status=503, error_type="server_busy", code="queue_full",
            )

    def prompt_ids(self, request: AddRequest) -> list[int]:
        """The request's prompt as token ids; a prompt whose text alone is too long for
        the context window is refused before it is tokenized, since tokenizing megabytes
        takes seconds."""
        check_prompt_fits(request, context_window(request, self._context_length), self._max_token_chars)
        ids = self.rendered_ids(request)
        check_prompt_cap(request, len(ids), self._config.max_prompt_tokens)
        return ids

    def layout(self, request: AddRequest) -> str:
        """The prompt layout this request renders in: its profile's, else the worker's.
        Every rendering of one request (its prompt, the start of its conversation for a
        breakpoint or a miss reason) must use the same, or their tokens disagree."""
        return request.prompt_layout or self._config.prompt_layout

    def rendered_ids(self, request: AddRequest) -> list[int]:
        """The request's prompt as token ids, however long: what `prompt_ids` admits, and
        what a token count reports (a count never refuses a prompt for its length)."""
        if request.images:
            ids = self._image_prompt(request)
        elif request.messages is not None:
            ids = render_chat(self._tokenizer, request.messages, request.tools, request.continue_final_message,
                              layout=self.layout(request), vocab_size=self._vocab_size,
                              switches=thinking_switch(self._tokenizer, request.reasoning_budget))
        elif request.prompt is not None:
            ids = render_completion(self._tokenizer, request.prompt, self._vocab_size)
        else:
            raise RequestError("either messages or prompt is required", param="messages")
        if not ids:
            raise RequestError("the prompt is empty", param="prompt")
        return ids

    def _image_prompt(self, request: AddRequest) -> list[int]:
        """A chat with images: rendered to text, then tokenized by the model's processor, each
        image's run of tokens carrying that image's own ids (worker/image_tokens.py)."""
        if self._images is None:
            raise RequestError("this model reads text only: send the request without images, or to a vision "
                               "model", param="messages", code="images_not_supported")
        if request.messages is None:
            raise RequestError("images go in chat messages", param="prompt")
        text = render_chat_text(self._tokenizer, request.messages, request.tools, request.continue_final_message,
                                layout=self.layout(request),
                                switches=thinking_switch(self._tokenizer, request.reasoning_budget))
        return self._images.prompt_ids(text, request.images or [])

    def prepare(self, request: AddRequest) -> PreparedPrompt:
        """Tokenize, compile the output constraint and read the prompt's cached blocks
        from SSD (the slow, thread-safe part of admission, run ahead on the tokenizer
        thread; so is building the grammar vocabulary, on its first use)."""
        prompt_ids = self.prompt_ids(request)
        matcher = self._compile(request)
        if request.sampling.logprobs:
            self._vocabulary.llg  # noqa: B018  (built here, not on the engine loop)
        read_ahead = self._prefix_cache.read_ahead(prompt_ids, request.cache_salt)
        return PreparedPrompt(prompt_ids, read_ahead, matcher, self.divergence(request, prompt_ids),
                              self.breakpoints(request, prompt_ids))

    def divergence(self, request: AddRequest, prompt_ids: list[int], refresh: bool = False) -> Divergence | None:
        """Where this prompt leaves the way an earlier one went, with the message there
        (renders and tokenizes: the tokenizer thread's work), or None if it does not.
        Reads the first block's shadow from SSD first if the record lacks it."""
        if not self._prefix_cache.enabled:
            return None
        cold = self._prefix_cache.cold
        if cold is not None:  # a first block this worker never saw may be on SSD under another model or salt
            self._prefix_cache.seen.recall_shadow(prompt_ids, request.cache_salt, cold.fetch_raw_run)
        trace = self._prefix_cache.seen.trace(prompt_ids, request.cache_salt, refresh=refresh)
        if trace.divergence is None:
            return None
        return locate(self._tokenizer, request, prompt_ids, trace.divergence.token, self.layout(request))

    def misses(self, request: AddRequest, prompt_ids: list[int], cached_tokens: int, cold_tokens: int,
               located: Divergence | None, refresh: bool = True) -> CacheMisses | None:
        """Why the prompt's uncached tokens are uncached, traced now (cheap: no rendering);
        the message of a divergence is `located`'s, found ahead on the tokenizer thread,
        if it is the same token."""
        if not self._prefix_cache.enabled:
            return None
        trace = self._prefix_cache.seen.trace(prompt_ids, request.cache_salt, refresh=refresh)
        misses = explain(trace, len(prompt_ids), cached_tokens, cold_tokens)
        if misses.divergence is not None and located is not None and located.token == misses.divergence.token:
            misses.divergence = located
        return misses

    def breakpoints(self, request: AddRequest, prompt_ids: list[int]) -> list[BreakpointPosition]:
        """The request's cache breakpoints as token positions of its prompt (each costs a
        render and a tokenization of the prompt up to it: tokenizer thread)."""
        if not request.cache_breakpoints or request.messages is None or not self._prefix_cache.enabled:
            return []

        def render(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
            return render_chat(self._tokenizer, messages, tools, generation_prompt=False, layout=self.layout(request),
                               switches=thinking_switch(self._tokenizer, request.reasoning_budget))

        return breakpoint_positions(render, request.messages, request.tools, request.cache_breakpoints, prompt_ids,
                                    request.request_id)

    def _compile(self, request: AddRequest) -> llguidance.LLMatcher | None:
        if request.constraint is None:
            return None
        matcher = self._grammars.compile(request.constraint)
        if request.constraint.lazy:
            LazyCallProcessor.warm(self._vocabulary, request.constraint, matcher)
        return matcher

    def _grammar(self, request: AddRequest, matcher: llguidance.LLMatcher | None, prompt_length: int,
                 max_tokens: int) -> GrammarProcessor | None:
        if matcher is None or request.constraint is None:
            return None
        if request.constraint.lazy:
            return LazyCallProcessor(matcher, request.constraint, prompt_length, max_tokens, self._vocabulary,
                                     self._grammar_batch, label=request.request_id, span=self._span(request))
        return GrammarProcessor(matcher, prompt_length, self._vocabulary, self._grammar_batch)

    def _span(self, request: AddRequest) -> ReasoningSpan | None:
        """A new follower of the request's reasoning span: a chat answer of a model that
        reasons (a continued message is not the answer's start)."""
        if self._reasoning is None or not request.messages or request.continue_final_message:
            return None
        return ReasoningSpan(*self._reasoning)

    def admit(self, request: AddRequest, prepared: PreparedPrompt | None) -> Admission:
        """Check everything the client controls; raises the RequestError to send back."""
        prompt_ids = prepared.prompt_ids if prepared is not None else self.prompt_ids(request)
        window = context_window(request, self._context_length)
        max_tokens = max_new_tokens(request, len(prompt_ids), window, self._config.max_output_tokens)
        check_logit_bias(request, self._vocab_size)
        sampler = make_request_sampler(request.sampling, self._vocab_size)
        processors = make_request_processors(request.sampling, len(prompt_ids))
        if request.reasoning_budget is not None and self._reasoning is not None:
            processors.append(ReasoningBudget(self._tokenizer, *self._reasoning, budget=request.reasoning_budget))
        matcher = prepared.matcher if prepared is not None else self._compile(request)
        grammar = self._grammar(request, matcher, len(prompt_ids), max_tokens)
        if grammar is not None:
            processors.append(grammar)
        sampling = request.sampling
        logprobs = LogprobsReporter(sampling.top_logprobs, self._vocabulary) if sampling.logprobs else None
        breakpoints = prepared.breakpoints if prepared is not None else self.breakpoints(request, prompt_ids)
        speculation = request.speculation or self._config.speculation
        speculate = (speculation in (PROMPT_LOOKUP, DRAFT_MODEL) and (sampler is greedy or isinstance(sampler, RequestSampler))
                     and all(p is grammar for p in processors) and not request.images)  # image ids are not text  # a grammar drafts as far as its free_ahead
        return Admission(prompt_ids, max_tokens, sampler, processors, grammar, logprobs, breakpoints,
                         speculate=speculate, draft_model=speculate and speculation == DRAFT_MODEL,
                         span=self._span(request))

    def plan(self, request: AddRequest, prompt_ids: list[int], prepared: PreparedPrompt | None) -> PrefixPlan:
        """Look the prompt up in the prefix cache: how much of it is cached, and where."""
        if prepared is None:
            plan = self._prefix_cache.plan(prompt_ids, request.cache_salt)
        else:  # what was not read ahead is not read now: the engine loop never waits for the disk
            plan = self._prefix_cache.plan(prompt_ids, request.cache_salt, prepared.read_ahead, fetch=False)
        if plan.cold_blocks:
            log.info("request %s: restored %d blocks (%.1f MB) from SSD in %.0f ms (%.0f MB/s)",
                     request.request_id, plan.cold_blocks, plan.cold_bytes / 1e6, plan.cold_fetch_s * 1e3,
                     plan.cold_bytes / 1e6 / plan.cold_fetch_s if plan.cold_fetch_s else 0.0)
        plan.misses = self.misses(request, prompt_ids, plan.cached_tokens,
                                  plan.cold_blocks * self._prefix_cache.block_tokens,
                                  prepared.divergence if prepared is not None else None)
        if plan.misses is not None:
            log.info("request %s: prefix hit %d/%d tokens (%d hot + %d cold blocks + %d tail tokens); %s",
                     request.request_id, plan.cached_tokens, len(prompt_ids), plan.hot_blocks, plan.cold_blocks,
                     plan.tail_tokens, plan.misses.describe())
        return plan

    def hold_breakpoints(self, request_id: str, breakpoints: list[BreakpointPosition],
                         plan: PrefixPlan) -> CacheCreation:
        """Keep each breakpoint's whole blocks in the hot tier for its TTL (or refresh
        them), pinned from now on, so the blocks this request computes are protected as they
        arrive; returns what the request writes to the cache."""
        if not breakpoints or not plan.keys:
            return CacheCreation()
        pins = self._prefix_cache.breakpoint_pins
        block = self._prefix_cache.block_tokens
        for point in breakpoints:
            pins.hold(plan.keys[: point.tokens // block], point.ttl_s)
        creation = cache_creation(breakpoints, plan.cached_tokens)
        log.info("request %s: cache breakpoints at prompt tokens %s (ttl %s s): up to %d whole blocks held, "
                 "%d tokens written to the cache (%d for 1h)", request_id, [p.tokens for p in breakpoints],
                 "/".join(str(p.ttl_s) for p in breakpoints), max(p.tokens for p in breakpoints) // block,
                 creation.tokens, creation.tokens_1h)
        return creation
