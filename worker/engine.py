"""The worker's generation engine: requests in, events out, one batched step at a time.

Built on mlx-lm's `BatchGenerator`, which does continuous batching: sequences join the
running batch between decode steps and leave it when done, and long prompts are
prefilled in chunks interleaved with decode steps of the running sequences.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx
from mlx_lm.generate import BatchGenerator

from protocol.context_window import served_context_length
from protocol.errors import RequestError
from protocol.settings import WorkerSettings
from protocol.messages import AddRequest, ErrorEvent, FinishEvent, Message, ProgressEvent, TokenEvent
from worker.active_request import ActiveRequest
from worker.admission import Admission, Admitter
from worker.batch_adapter import make_batch_generator, want_drafts
from worker.model_drafts import drafter_for
from worker.detokenizer import IncrementalDetokenizer
from worker.early_first_token import EarlyFirstToken
from worker.grammar_batch import GrammarBatch, MaskedModel
from worker.model_loader import LoadedModel
from worker.prefill import prefill_rest, prefill_segments
from worker.prefill_pacing import PrefillPacer
from worker.prefix_cache import PrefixCache, PrefixPlan
from worker.prompt_lookup import DraftLength
from worker.prompt_preparer import PreparedPrompt
from worker.prompt_questions import PromptQuestions
from worker.prompts import longest_token_chars
from worker.step_clock import StepClock
from worker.stop_strings import StopStringFilter

log = logging.getLogger(__name__)

Emit = Callable[[Message], None]
# (plan, caches, prompt + completion) of the requests a step finished, captured at its end
Finished = list[tuple[PrefixPlan, list[Any], list[int]]]


class Engine:
    """Owns the model's BatchGenerator and every request in it.

    Invariant: `_by_uid` and `_by_request` hold exactly the requests that the
    BatchGenerator still holds (waiting, prefilling or decoding); every request that
    leaves them gets exactly one terminal event (FinishEvent or ErrorEvent).
    """

    def __init__(self, loaded: LoadedModel, settings: WorkerSettings, emit: Emit, prefix_cache: PrefixCache,
                 flush: Callable[[], None] | None = None) -> None:
        """`flush`, if given, sends what `emit` has buffered so far (the worker batches a
        step's events into one message)."""
        self._loaded = loaded
        self._flush = flush
        self.prefix_cache = prefix_cache
        self._segment_tokens = prefix_cache.segment_tokens(settings.prefill_chunk_tokens)
        self._config = settings
        self._emit = emit
        self._tokenizer = loaded.tokenizer
        self._vocab_size = int(loaded.config.get("vocab_size") or len(self._tokenizer))
        self.context_length = served_context_length(loaded.context_length, settings.max_context_tokens)
        self.eos_token_ids = sorted(int(t) for t in self._tokenizer.eos_token_ids)
        self.vocab_size = self._vocab_size
        self.max_token_chars = longest_token_chars(self._tokenizer)
        self._grammar_batch = GrammarBatch(self._vocab_size)
        self.clock = StepClock()
        self._pacer = PrefillPacer(settings.prefill_chunk_tokens)
        self._admitter = Admitter(self._tokenizer, self._vocab_size, self.eos_token_ids, self.context_length,
                                  self.max_token_chars, settings, prefix_cache, self._grammar_batch, loaded.images)
        self.questions = PromptQuestions(self._admitter, prefix_cache)  # the tokenizer thread's, not the batch's
        self._early_first_token = EarlyFirstToken(self.eos_token_ids)
        self._fast_prefill_since_step = False
        self._by_uid: dict[int, ActiveRequest] = {}
        self._by_request: dict[str, ActiveRequest] = {}
        self._generator = self._make_generator()

    def _make_generator(self) -> BatchGenerator:
        model = MaskedModel(self._loaded.model, self._grammar_batch)  # grammar masks applied in its forward
        return make_batch_generator(model, self.eos_token_ids, self._config.max_num_seqs,
                                    self._config.prefill_chunk_tokens, held=self._grammar_batch.held,
                                    drafter=drafter_for(self._loaded.model))

    # ------------------------------------------------------------ admission

    @property
    def num_active(self) -> int:
        return len(self._by_request)

    def has_work(self) -> bool:
        return bool(self._by_request)

    def gathering_batch(self) -> bool:
        """True while requests wait to be prefilled, none has started, and slots are free.

        Then nothing streams, so holding the first step back a few milliseconds stalls
        nobody, and requests of one burst still on their way join its prefill (one step
        apart, all but the first would wait a whole prefill for their first token)."""
        return (
            0 < self.num_active < self._config.max_num_seqs
            and all(active.prefill_started_at is None for active in self._by_request.values())
        )

    def release_idle_memory(self) -> None:
        """Idle: MLX's freed buffers go back to the system (RSS follows what is held)."""
        mx.clear_cache()

    def stats(self) -> dict[str, int | float]:
        """Memory and cache counters, sent with every pong for the status route."""
        return {"mlx_active_bytes": mx.get_active_memory(), "mlx_peak_bytes": mx.get_peak_memory(),
                "mlx_cache_bytes": mx.get_cache_memory(), "num_active": self.num_active, **self.prefix_cache.stats(),
                **self.clock.stats(self._grammar_batch.wait_s, self._grammar_batch.mask_s)}

    def add(self, request: AddRequest, prepared: PreparedPrompt | None = None, arrived: float | None = None) -> None:
        """Admit, plan and start a request. `prepared` is the worker's tokenizer thread's
        work (token ids and cold-tier blocks read ahead, `questions.prepare`); without it the prompt is tokenized and
        its blocks read here. `arrived` is when the request reached the worker, so TTFT
        counts tokenizing and the cache lookup too.

        Never raises: a bad request gets an ErrorEvent, and so does one that trips over
        anything unforeseen (a bug, MLX refusing an argument), so one request can never
        take the worker and everyone else's streams down with it.
        """
        arrived = time.perf_counter() if arrived is None else arrived
        try:
            self.check_admissible(request.request_id)
            admission = self._admitter.admit(request, prepared)
            plan = self._admitter.plan(request, admission.prompt_ids, prepared)
            admission.creation = self._admitter.hold_breakpoints(request.request_id, admission.breakpoints, plan)
            self._start(request, admission, plan, arrived)
        except RequestError as exc:
            self._discard(request.request_id)
            self._emit_error(request.request_id, exc)
        except Exception as exc:
            self._fail_alone(request.request_id, "on admission", exc)

    def reject(self, request_id: str, exc: BaseException) -> None:
        """End a request that failed before `add` (its prompt could not be prepared)."""
        if not isinstance(exc, RequestError):
            log.error("request %s: preparing the prompt failed: %r", request_id, exc)
            exc = RequestError(f"the worker could not prepare this prompt ({type(exc).__name__}: {exc})",
                               status=500, error_type="server_error")
        self._emit_error(request_id, exc)

    def check_admissible(self, request_id: str, num_pending: int = 0) -> None:
        """Raise the 400/503 for a duplicate id or a full queue (`num_pending` requests
        are on their way in, still being tokenized)."""
        self._admitter.check_room(request_id, self._by_request, self.num_active + num_pending)

    def _start(self, request: AddRequest, admission: Admission, plan: PrefixPlan, arrived: float) -> None:
        """Put the request to work: a prefix hit may prefill its rest at once (`_start_hit`),
        any other request queues in the batch for chunked prefill."""
        prompt_ids = admission.prompt_ids
        active = ActiveRequest(
            request_id=request.request_id,
            prompt_ids=prompt_ids,
            max_tokens=admission.max_tokens,
            detokenizer=IncrementalDetokenizer(self._tokenizer, prompt_ids[-4:]),
            stop_filter=StopStringFilter(request.sampling.stop),
            want_progress=request.want_progress,
            plan=plan,
            cached_tokens=plan.cached_tokens,
            created_at=arrived,
            grammar=admission.grammar, logprobs=admission.logprobs, creation=admission.creation, span=admission.span,
            drafting=DraftLength() if admission.speculate else None, drafts_from_model=admission.draft_model)
        if self._hit_fast_path_open(active):
            self._start_hit(active, admission)
            return
        cached = active.cached_tokens
        segments = prefill_segments(prompt_ids[cached:], cached, self._segment_tokens,
                                    self.prefix_cache.block_tokens, self.prefix_cache.snapshots)
        self._enqueue(active, admission, segments, prompt_ids[:cached], admission.max_tokens)

    def _hit_fast_path_open(self, active: ActiveRequest) -> bool:
        """A prefix hit with a short remainder may skip the queue when nothing waits and a
        decode slot is free: it is the common agent turn, and nobody is overtaken."""
        remainder = len(active.prompt_ids) - active.cached_tokens
        return (
            active.plan.caches is not None
            and not self._fast_prefill_since_step  # at most one chunk between decode steps
            and 1 <= remainder <= self._config.prefill_chunk_tokens
            and self.num_active < self._config.max_num_seqs
            and all(other.first_token_at is not None for other in self._by_request.values())
        )

    def _start_hit(self, active: ActiveRequest, admission: Admission) -> None:
        """Prefill a hit's rest in one pass (`prefill_rest`) and send its first token; the
        batch continues from that token, unless it already ends the request."""
        plan = active.plan
        self._fast_prefill_since_step = True
        active.mark_prefill_started(time.perf_counter())
        try:
            first_token, distribution = prefill_rest(self._loaded.model, active.prompt_ids, active.cached_tokens,
                                                     plan.caches, admission.sampler, admission.processors)
        except Exception as exc:  # e.g. out of memory inside MLX: this request only
            log.exception("request %s: prefill failed", active.request_id)
            plan.caches = None
            mx.clear_cache()
            raise RequestError(f"generation failed: {exc}", status=500, error_type="server_error") from exc
        is_eos = first_token in self.eos_token_ids
        if is_eos or active.max_tokens == 1:
            # the request ends with its first token: it never joins the batch
            self.prefix_cache.capture_final(plan, plan.caches, active.prompt_ids)
            plan.caches = None
            self._by_request[active.request_id] = active
            self._emit(active.prompt_event())
            self._on_token(active, first_token, "stop" if is_eos else "length", time.perf_counter(), distribution)
            return
        # the prompt is all in the cache now; the batch continues from the first token
        # (a copy of the prompt: the generator appends to the list it is given)
        self._enqueue(active, admission, [[first_token]], list(active.prompt_ids), active.max_tokens - 1)
        self._on_token(active, first_token, None, time.perf_counter(), distribution)

    def _enqueue(self, active: ActiveRequest, admission: Admission, segments: list[list[int]],
                 all_tokens: list[int], generator_max_tokens: int) -> None:
        """Hand the request to the BatchGenerator, which owns the plan's cache copy from
        now on, and tell the client its prompt is taken."""
        plan = active.plan
        active.generator_max_tokens = generator_max_tokens
        active.uid = self._generator.insert_segments(
            [segments],
            max_tokens=[generator_max_tokens],
            caches=[plan.caches] if plan.caches is not None else None,
            all_tokens=[all_tokens],
            samplers=[admission.sampler],
            logits_processors=[admission.processors],
        )[0]
        plan.caches = None  # the generator owns the working copy now
        if active.drafting is not None:
            want_drafts(self._generator, active.uid, active.drafting, active.drafts_from_model)
        self._by_uid[active.uid] = active
        self._by_request[active.request_id] = active
        self._emit(active.prompt_event())

    def abort(self, request_id: str) -> None:
        """Free the slot of a request whose client went away; it gets no more events."""
        active = self._by_request.get(request_id)
        if active is None:
            return
        self._generator.remove([active.uid])
        self._forget(active)
        log.info("request %s aborted after %d tokens", request_id, active.num_generated)

    def abort_all(self, error: RequestError) -> None:
        """End every request with `error` and start over with an empty batch."""
        for active in list(self._by_request.values()):
            self._emit_error(active.request_id, error)
            self._forget(active)
        self._generator = self._make_generator()

    # ------------------------------------------------------------ the loop body

    def step(self) -> None:
        """One BatchGenerator step: a decode step for running sequences plus one prefill
        chunk for waiting ones. A failure here fails the affected requests, not the worker."""
        self._fast_prefill_since_step = False
        began = time.perf_counter()
        try:
            self._grammar_batch.begin(self._generator)
            prefilling = sum(1 for active in self._by_request.values() if active.first_token_at is None)
            self._generator.prefill_step_size = self._pacer.chunk_tokens(min(prefilling, self._config.max_num_seqs))
            prompt_responses, generation_responses = self._generator.next()
        except Exception as exc:  # e.g. out of memory inside MLX
            log.exception("generation step failed; failing %d requests", self.num_active)
            self.abort_all(RequestError(f"generation failed: {exc}", status=500, error_type="server_error"))
            mx.clear_cache()
            return
        now = time.perf_counter()
        self._pacer.record([(r.uid, int(r.progress[0]), int(r.progress[1])) for r in prompt_responses], now - began)
        for response in prompt_responses:
            active = self._by_uid.get(response.uid)
            if active is not None:
                self._guarded(active, self._on_prompt_progress, active, response, began, now)
        finished: Finished = []
        for response in generation_responses:
            active = self._by_uid.get(response.uid)
            if active is not None:
                self._guarded(active, self._on_generated, active, response, finished, now)
        # Capturing a finished cache first waits for the decode step already dispatched,
        # then slices every block of it. A lone finisher is captured before its last
        # token leaves, so a client that answers at once finds its prefix already cached;
        # when several finish together their tokens go out first, none waiting for the
        # others' captures.
        if len(finished) > 1 and self._flush is not None:
            self._flush()
        for plan, caches, tokens in finished:
            try:
                self.prefix_cache.capture_final(plan, caches, tokens)
            except Exception:  # the answer is out; only the cache misses this prefix
                log.exception("capturing a finished request's cache failed")
        self.clock.record(len({r.uid for r in generation_responses}), began, now, time.perf_counter())

    def _guarded(self, active: ActiveRequest, handle: Callable[..., None], *args: Any) -> None:
        """Run one sequence's share of a step; if it fails, that request fails (a 500)
        and leaves the batch, and every other sequence goes on."""
        try:
            handle(*args)
        except Exception as exc:
            self._fail_alone(active.request_id, "during a step", exc)

    def _fail_alone(self, request_id: str, when: str, exc: Exception) -> None:
        """A request tripped over something unforeseen (a bug, MLX refusing an argument):
        it alone ends, with a 500, and leaves the batch; the worker and every other
        request go on."""
        log.exception("request %s failed %s", request_id, when)
        self._discard(request_id)
        self._emit_error(request_id, RequestError(
            f"the worker failed {when} for this request ({type(exc).__name__}: {exc})",
            status=500, error_type="server_error"))

    def _on_prompt_progress(self, active: ActiveRequest, response: Any, began: float, now: float) -> None:
        """A prefill chunk of `active` ran: timing, block capture, progress, first token."""
        # the step that reports a prompt's first chunk is the step that ran it
        active.mark_prefill_started(began)
        if response.end_of_segment and not response.end_of_prompt:
            self._capture_prefill(active, int(response.progress[0]))
        if active.want_progress:
            done, total = response.progress
            self._emit(ProgressEvent(active.request_id, int(done), int(total)))
        first = self._early_first_token.take(self._generator, active) if response.end_of_prompt else None
        if first is not None:
            self._on_token(active, first[0], None, now, first[1])

    def _on_generated(self, active: ActiveRequest, response: Any, finished: Finished, now: float) -> None:
        """`active` got a token; a finished one's cache is queued in `finished` for capture."""
        if self._early_first_token.is_repeat(active, response.token, response.finish_reason):
            return  # sent a step ago, when its prompt finished
        if response.finish_reason is not None and response.prompt_cache is not None:
            # prompt + completion: the next turn of this conversation resends both
            finished.append((active.plan, response.prompt_cache, response.all_tokens or []))
        self._on_token(active, response.token, response.finish_reason, now, response.logprobs)

    def _capture_prefill(self, active: ActiveRequest, processed: int) -> None:
        if not self.prefix_cache.enabled:
            return
        num_tokens = active.cached_tokens + processed
        if num_tokens // self.prefix_cache.block_tokens <= active.plan.captured_blocks:
            return
        extracted = self._generator.extract_cache([active.uid]).get(active.uid)
        if extracted is not None:
            caches, _ = extracted
            self.prefix_cache.capture(active.plan, caches, active.prompt_ids, num_tokens)

    def _on_token(self, active: ActiveRequest, token: int, finish_reason: str | None, now: float,
                  distribution: mx.array | None = None) -> None:
        """Send `token` (drawn from `distribution`); a request whose grammar failed fails."""
        active.check_grammar()
        active.mark_first_token(now)
        is_eos = finish_reason == "stop" and token in self.eos_token_ids
        text = "" if is_eos else active.push_token(token)
        if active.stop_filter.stopped:
            if finish_reason is None:  # still in the batch: take it out now
                removed = self._generator.remove([active.uid], return_prompt_caches=True)
                if active.uid in removed:
                    caches, tokens = removed[active.uid]
                    self.prefix_cache.capture_final(active.plan, caches, tokens)
            finish_reason = "stop"
        if finish_reason is not None and not active.stop_filter.stopped:
            text += active.flush_text()
        if text or not is_eos:
            self._emit(TokenEvent(active.request_id, text, [] if is_eos else [token], now,
                                  None if is_eos else active.token_logprobs(token, distribution)))
        if finish_reason is not None:
            self._finish(active, finish_reason, now)

    def _finish(self, active: ActiveRequest, finish_reason: str, now: float) -> None:
        timings = active.timings(now)
        usage = active.usage(self.prefix_cache.block_tokens)
        self._emit(FinishEvent(active.request_id, finish_reason, usage, timings, active.stop_filter.matched))
        self._forget(active)
        log.info(
            "request %s done (%s): prompt %d tokens (%d cached), %d generated, "
            "queue %.2fs, ttft %.2fs, prefill %.0f tok/s, decode %.1f tok/s",
            active.request_id, finish_reason, usage.prompt_tokens, usage.cached_tokens,
            usage.completion_tokens, timings.queue_s, timings.ttft_s,
            timings.prompt_tokens_per_s, timings.decode_tokens_per_s,
        )

    def _discard(self, request_id: str) -> None:  # undo what part of an admission happened before it failed
        if (active := self._by_request.get(request_id)) is None:
            return
        if active.uid >= 0:
            try:
                self._generator.remove([active.uid])
            except Exception:  # it may never have made it into the generator
                log.debug("request %s was not in the batch", request_id)
        self._forget(active)

    def _forget(self, active: ActiveRequest) -> None:
        self._pacer.forget(active.uid)
        self._by_uid.pop(active.uid, None)
        self._by_request.pop(active.request_id, None)

    def _emit_error(self, request_id: str, exc: RequestError) -> None:
        self._emit(ErrorEvent.from_error(request_id, exc))
