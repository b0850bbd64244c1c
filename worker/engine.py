"""The worker's generation engine: requests in, events out, one batched step at a time.

Built on mlx-lm's `BatchGenerator`, which does continuous batching: sequences join the
running batch between decode steps and leave it when done, and long prompts are
prefilled in chunks interleaved with decode steps of the running sequences.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
from mlx_lm.generate import BatchGenerator
from mlx_lm.sample_utils import LogitsProcessor, Sampler

from protocol.errors import RequestError
from protocol.prompt_bounds import check_prompt_fits, context_error
from protocol.messages import (
    AddRequest,
    ErrorEvent,
    FinishEvent,
    Message,
    ProgressEvent,
    PromptEvent,
    Timings,
    TokenEvent,
    Usage,
    WorkerConfig,
)
from worker.detokenizer import IncrementalDetokenizer
from worker.model_loader import LoadedModel
from worker.prefix_cache import PrefixCache, PrefixPlan
from worker.prompt_preparer import PreparedPrompt
from worker.prompts import longest_token_chars, render_chat, render_completion
from worker.sampling import make_request_processors, make_request_sampler
from worker.stop_strings import StopStringFilter

log = logging.getLogger(__name__)

Emit = Callable[[Message], None]


@dataclass
class Sequence:
    """One request's life inside the engine."""

    request_id: str
    uid: int
    prompt_ids: list[int]
    max_tokens: int
    detokenizer: IncrementalDetokenizer
    stop_filter: StopStringFilter
    want_progress: bool
    plan: PrefixPlan
    cached_tokens: int = 0
    created_at: float = field(default_factory=time.perf_counter)
    prefill_started_at: float | None = None
    first_token_at: float | None = None
    early_token: int | None = None  # sent before BatchGenerator reported it
    generator_max_tokens: int = 0  # what BatchGenerator still generates for it
    num_generated: int = 0


class Engine:
    """Owns the model's BatchGenerator and every sequence in it.

    Invariant: `_by_uid` and `_by_request` hold exactly the sequences that the
    BatchGenerator still holds (waiting, prefilling or decoding); every request that
    leaves them gets exactly one terminal event (FinishEvent or ErrorEvent).
    """

    def __init__(self, loaded: LoadedModel, config: WorkerConfig, emit: Emit, prefix_cache: PrefixCache,
                 flush: Callable[[], None] | None = None) -> None:
        """`flush`, if given, sends what `emit` has buffered so far (the worker batches a
        step's events into one message)."""
        self._loaded = loaded
        self._flush = flush
        self.prefix_cache = prefix_cache
        self._segment_tokens = prefix_cache.segment_tokens(config.prefill_chunk_tokens)
        self._config = config
        self._emit = emit
        self._tokenizer = loaded.tokenizer
        self._vocab_size = int(loaded.config.get("vocab_size") or len(self._tokenizer))
        self.context_length = (
            min(loaded.context_length, config.max_context_tokens)
            if config.max_context_tokens > 0
            else loaded.context_length
        )
        self.eos_token_ids = sorted(int(t) for t in self._tokenizer.eos_token_ids)
        self.vocab_size = self._vocab_size
        self.max_token_chars = longest_token_chars(self._tokenizer)
        self._early_first_token = mx.default_device().type == mx.DeviceType.cpu
        self._fast_prefill_since_step = False
        self._by_uid: dict[int, Sequence] = {}
        self._by_request: dict[str, Sequence] = {}
        self._generator = self._make_generator()

    def _make_generator(self) -> BatchGenerator:
        return BatchGenerator(
            self._loaded.model,
            stop_tokens=[[t] for t in self.eos_token_ids],
            completion_batch_size=self._config.max_num_seqs,
            prefill_batch_size=self._config.max_num_seqs,
            prefill_step_size=self._config.prefill_chunk_tokens,
        )

    # ------------------------------------------------------------ admission

    @property
    def num_active(self) -> int:
        return len(self._by_request)

    def has_work(self) -> bool:
        return bool(self._by_request)

    def gathering_batch(self) -> bool:
        """True while requests wait to be prefilled, none has started, and slots are free.

        Then nothing is streaming, so holding the first step back a few milliseconds
        stalls nobody, and requests of one burst that are still on their way can join
        its prefill: prefilling them one step apart would make all but the first wait a
        whole prefill for their first token.
        """
        return (
            0 < self.num_active < self._config.max_num_seqs
            and all(seq.prefill_started_at is None for seq in self._by_request.values())
        )

    def stats(self) -> dict[str, int | float]:
        """Memory and cache counters, sent with every pong for the status route."""
        return {
            "mlx_active_bytes": mx.get_active_memory(),
            "mlx_peak_bytes": mx.get_peak_memory(),
            "num_active": self.num_active,
            **self.prefix_cache.stats(),
        }

    def add(self, request: AddRequest, prepared: PreparedPrompt | None = None, arrived: float | None = None) -> None:
        """Validate and enqueue. `prepared` is the worker's tokenizer thread's work (token
        ids and SSD blocks read ahead); without it the prompt is tokenized and its blocks
        read here. `arrived` is when the request reached the worker, so TTFT counts
        tokenizing and the cache lookup too.

        Never raises: a bad request gets an ErrorEvent, and so does one that trips over
        anything unforeseen (a bug, MLX refusing an argument), so one request can never
        take the worker and everyone else's streams down with it.
        """
        arrived = time.perf_counter() if arrived is None else arrived
        try:
            self._admit(request, prepared, arrived)
        except RequestError as exc:
            self._discard(request.request_id)
            self._emit_error(request.request_id, exc)
        except Exception as exc:
            log.exception("request %s failed on admission", request.request_id)
            self._discard(request.request_id)
            self._emit_error(request.request_id, RequestError(
                f"the worker could not take this request ({type(exc).__name__}: {exc})",
                status=500, error_type="server_error"))

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
        if request_id in self._by_request:
            raise RequestError(f"duplicate request id {request_id}")
        limit = self._config.max_num_seqs + self._config.max_queue
        if self.num_active + num_pending >= limit:
            raise RequestError(
                f"server busy: {self.num_active + num_pending} requests running or queued "
                f"(max_num_seqs + max_queue = {limit}); retry shortly",
                status=503, error_type="server_busy", code="queue_full",
            )

    def prepare(self, request: AddRequest) -> PreparedPrompt:
        """Tokenize and read the prompt's cached blocks from SSD; thread-safe, run on the
        worker's tokenizer thread (see `PromptPreparer`)."""
        prompt_ids = self.prompt_ids(request)
        return PreparedPrompt(prompt_ids, self.prefix_cache.read_ahead(prompt_ids, request.cache_salt))

    def _admit(self, request: AddRequest, prepared: PreparedPrompt | None, arrived: float) -> None:
        self.check_admissible(request.request_id)
        prompt_ids = prepared.prompt_ids if prepared is not None else self.prompt_ids(request)
        max_tokens = self._max_tokens(request, len(prompt_ids))
        self._check_token_ids(request)
        sampler = make_request_sampler(request.sampling, self._vocab_size)
        processors = make_request_processors(request.sampling)
        if prepared is None:
            plan = self.prefix_cache.plan(prompt_ids, request.cache_salt)
        else:  # what was not read ahead is not read now: the engine loop never waits for the disk
            plan = self.prefix_cache.plan(prompt_ids, request.cache_salt, prepared.read_ahead, fetch=False)
        cached = plan.cached_tokens
        if plan.ssd_blocks:
            log.info("request %s: restored %d blocks (%.1f MB) from SSD in %.0f ms (%.0f MB/s)",
                     request.request_id, plan.ssd_blocks, plan.ssd_bytes / 1e6, plan.ssd_fetch_s * 1e3,
                     plan.ssd_bytes / 1e6 / plan.ssd_fetch_s if plan.ssd_fetch_s else 0.0)
        if self.prefix_cache.enabled:
            log.info(
                "request %s: prefix hit %d/%d tokens: %d hot + %d ssd blocks + %d tail tokens, %d recomputed",
                request.request_id, cached, len(prompt_ids), plan.hot_blocks, plan.ssd_blocks,
                plan.tail_tokens, len(prompt_ids) - cached,
            )
        seq = Sequence(
            request_id=request.request_id,
            uid=-1,
            prompt_ids=prompt_ids,
            max_tokens=max_tokens,
            detokenizer=IncrementalDetokenizer(self._tokenizer, prompt_ids[-4:]),
            stop_filter=StopStringFilter(request.sampling.stop),
            want_progress=request.want_progress,
            plan=plan,
            cached_tokens=cached,
            created_at=arrived,
        )
        first_token = None
        if self._hit_fast_path_open(seq):
            try:
                first_token = self._prefill_hit(seq, sampler, processors)
            except Exception as exc:  # e.g. out of memory inside MLX: this request only
                log.exception("request %s: prefill failed", request.request_id)
                plan.caches = None
                mx.clear_cache()
                raise RequestError(f"generation failed: {exc}", status=500, error_type="server_error") from exc
        if first_token is not None and (first_token in self.eos_token_ids or max_tokens == 1):
            # the request ends with its first token: it never joins the batch
            self.prefix_cache.capture_final(plan, plan.caches, prompt_ids)
            plan.caches = None
            self._by_request[request.request_id] = seq
            self._emit(PromptEvent(request.request_id, len(prompt_ids), cached))
            self._on_token(seq, first_token, "stop" if first_token in self.eos_token_ids else "length",
                           time.perf_counter())
            return
        if first_token is not None:
            # the prompt is all in the cache now; the batch continues from the first token
            # a copy: the generator appends to the list it is given
            segments, all_tokens, seq.generator_max_tokens = [[first_token]], list(prompt_ids), max_tokens - 1
        else:
            segments, all_tokens = self._segments(prompt_ids[cached:], cached), prompt_ids[:cached]
            seq.generator_max_tokens = max_tokens
        seq.uid = self._generator.insert_segments(
            [segments],
            max_tokens=[seq.generator_max_tokens],
            caches=[plan.caches] if plan.caches is not None else None,
            all_tokens=[all_tokens],
            samplers=[sampler],
            logits_processors=[processors],
        )[0]
        plan.caches = None  # the generator owns the working copy now
        self._by_uid[seq.uid] = seq
        self._by_request[request.request_id] = seq
        self._emit(PromptEvent(request.request_id, len(prompt_ids), seq.cached_tokens))
        if first_token is not None:
            self._on_token(seq, first_token, None, time.perf_counter())

    def _hit_fast_path_open(self, seq: Sequence) -> bool:
        """A prefix hit with a short remainder may skip the queue when nothing waits and a
        decode slot is free: it is the common agent turn, and nobody is overtaken."""
        remainder = len(seq.prompt_ids) - seq.cached_tokens
        return (
            seq.plan.caches is not None
            and not self._fast_prefill_since_step  # at most one chunk between decode steps
            and 1 <= remainder <= self._config.prefill_chunk_tokens
            and self.num_active < self._config.max_num_seqs
            and all(other.first_token_at is not None for other in self._by_request.values())
        )

    def _prefill_hit(self, seq: Sequence, sampler: Sampler, processors: list[LogitsProcessor]) -> int:
        """Prefill the uncached rest of the prompt, last token included, in one forward
        pass, and sample the first token from its logits.

        BatchGenerator prefills all but the last prompt token, then runs that token alone
        as the first decode step: a second forward pass, which on this hardware costs as
        much as the whole ~60-token rest of an agent's turn. Logits processors see the
        prompt as context, as they would in the batch.
        """
        self._fast_prefill_since_step = True
        seq.prefill_started_at = time.perf_counter()
        remainder = mx.array([seq.prompt_ids[seq.cached_tokens :]])
        logits = self._loaded.model(remainder, cache=seq.plan.caches)[:, -1, :]
        context = mx.array(seq.prompt_ids)
        for processor in processors:
            logits = processor(context, logits)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        token = sampler(logprobs)
        mx.eval(token, [c.state for c in seq.plan.caches])
        return int(token.item())

    def _segments(self, remainder: list[int], start: int) -> list[list[int]]:
        """Prefill pieces ending on block boundaries, so each block can be captured as it
        completes; `start` (the cached length) may sit inside a block after a tail hit."""
        n = self._segment_tokens
        if len(remainder) <= n and not self.prefix_cache.snapshots:
            # one step is enough; its whole blocks are captured when the request ends
            return [remainder]
        first = (-start) % self.prefix_cache.block_tokens
        pieces = [remainder[:first]] if first else []
        pieces += [remainder[i : i + n] for i in range(first, len(remainder), n)]
        return [p for p in pieces if p]

    def _check_token_ids(self, request: AddRequest) -> None:
        """logit_bias ids index the logits: MLX does no bounds check there (an id past
        the vocabulary writes out of bounds or crashes the process)."""
        for token_id in request.sampling.logit_bias:
            if not 0 <= int(token_id) < self._vocab_size:
                raise RequestError(f"'logit_bias' token id {token_id} is not in this model's vocabulary "
                                   f"[0, {self._vocab_size})", param="logit_bias")

    def prompt_ids(self, request: AddRequest) -> list[int]:
        """The request's prompt as token ids. Thread-safe (the worker calls it from its
        tokenizer thread); a prompt whose text alone is too long for the context window
        is refused before it is tokenized, since tokenizing megabytes takes seconds."""
        check_prompt_fits(request, self._window(request), self.max_token_chars)
        if request.messages is not None:
            ids = render_chat(self._tokenizer, request.messages, request.tools)
        elif request.prompt is not None:
            ids = render_completion(self._tokenizer, request.prompt, self._vocab_size)
        else:
            raise RequestError("either messages or prompt is required", param="messages")
        if not ids:
            raise RequestError("the prompt is empty", param="prompt")
        return ids

    def _window(self, request: AddRequest) -> int:
        if request.context_limit:  # a profile's own cap, never above the model's
            return min(self.context_length, request.context_limit)
        return self.context_length

    def _max_tokens(self, request: AddRequest, num_prompt: int) -> int:
        window = self._window(request)
        room = window - num_prompt
        if room <= 0:
            raise context_error(request, num_prompt, window)
        wanted = request.sampling.max_tokens
        if wanted is None:
            wanted = self._config.default_max_tokens
        return max(1, min(wanted, room))

    def abort(self, request_id: str) -> None:
        """Free the slot of a request whose client went away; it gets no more events."""
        seq = self._by_request.get(request_id)
        if seq is None:
            return
        self._generator.remove([seq.uid])
        self._forget(seq)
        log.info("request %s aborted after %d tokens", request_id, seq.num_generated)

    def abort_all(self, error: RequestError) -> None:
        """End every request with `error` and start over with an empty batch."""
        for seq in list(self._by_request.values()):
            self._emit_error(seq.request_id, error)
            self._forget(seq)
        self._generator = self._make_generator()

    # ------------------------------------------------------------ the loop body

    def step(self) -> None:
        """One BatchGenerator step: a decode step for running sequences plus one prefill
        chunk for waiting ones. A failure here fails the affected requests, not the worker."""
        self._fast_prefill_since_step = False
        began = time.perf_counter()
        try:
            prompt_responses, generation_responses = self._generator.next()
        except Exception as exc:  # e.g. out of memory inside MLX
            log.exception("generation step failed; failing %d requests", self.num_active)
            self.abort_all(RequestError(f"generation failed: {exc}", status=500, error_type="server_error"))
            mx.clear_cache()
            return
        now = time.perf_counter()
        for response in prompt_responses:
            seq = self._by_uid.get(response.uid)
            if seq is not None:
                self._guarded(seq, self._on_prompt_progress, seq, response, began, now)
        finished: list[tuple[PrefixPlan, list[Any], list[int]]] = []
        for response in generation_responses:
            seq = self._by_uid.get(response.uid)
            if seq is not None:
                self._guarded(seq, self._on_generated, seq, response, finished, now)
        # Capturing a finished cache first waits for the decode step already dispatched,
        # then slices its blocks (~20 ms each). A lone finisher is captured before its last
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

    def _guarded(self, seq: Sequence, handle: Callable[..., None], *args: Any) -> None:
        """Run one sequence's share of a step; if it fails, that request fails (a 500)
        and leaves the batch, and every other sequence goes on."""
        try:
            handle(*args)
        except Exception as exc:
            log.exception("request %s failed during a step", seq.request_id)
            self._discard(seq.request_id)
            self._emit_error(seq.request_id, RequestError(
                f"generation failed for this request ({type(exc).__name__}: {exc})",
                status=500, error_type="server_error"))

    def _on_prompt_progress(self, seq: Sequence, response: Any, began: float, now: float) -> None:
        """A prefill chunk of `seq` ran: timing, block capture, progress, first token."""
        if seq.prefill_started_at is None:
            # the step that reports a prompt's first chunk is the step that ran it
            seq.prefill_started_at = began
        if response.end_of_segment and not response.end_of_prompt:
            self._capture_prefill(seq, int(response.progress[0]))
        if seq.want_progress:
            done, total = response.progress
            self._emit(ProgressEvent(seq.request_id, int(done), int(total)))
        if response.end_of_prompt:
            self._emit_first_token(seq, now)

    def _on_generated(self, seq: Sequence, response: Any, finished: list[tuple[PrefixPlan, list[Any], list[int]]],
                      now: float) -> None:
        """`seq` got a token; a finished one's cache is queued in `finished` for capture."""
        if seq.early_token is not None:
            early, seq.early_token = seq.early_token, None
            if response.token == early and response.finish_reason is None:
                return  # sent a step ago by _emit_first_token
            log.warning("request %s: first token %d reported as %d (%s)", seq.request_id, early,
                        response.token, response.finish_reason)
        if response.finish_reason is not None and response.prompt_cache is not None:
            # prompt + completion: the next turn of this conversation resends both
            finished.append((seq.plan, response.prompt_cache, response.all_tokens or []))
        self._on_token(seq, response.token, response.finish_reason, now)

    def _emit_first_token(self, seq: Sequence, now: float) -> None:
        """Send a sequence's first token as soon as it is sampled.

        BatchGenerator samples it while the prompt's last token goes through the model, but
        reports it only a step later, after dispatching the forward pass for the second
        token; on MLX's CPU stream that dispatch runs most of the pass before returning,
        so waiting would add a whole decode step to every request's TTFT. The token is
        read from the generation batch (private to mlx-lm: any change there just turns
        this off); a token that could end the request (EOS, max_tokens 1) waits for its
        regular report, which carries the finish reason. On a GPU the dispatch returns at
        once and reading the token early would stall the running batch instead: off there.
        """
        if seq.generator_max_tokens <= 1 or not self._early_first_token:
            return
        batch = getattr(self._generator, "_generation_batch", None)
        try:
            index = batch.uids.index(seq.uid)  # type: ignore[union-attr]
            token = int(batch._next_tokens[index].item())  # type: ignore[union-attr]
        except (AttributeError, ValueError, IndexError, TypeError):
            return
        if token in self.eos_token_ids:
            return
        seq.early_token = token
        self._on_token(seq, token, None, now)

    def _capture_prefill(self, seq: Sequence, processed: int) -> None:
        if not self.prefix_cache.enabled:
            return
        num_tokens = seq.cached_tokens + processed
        if num_tokens // self.prefix_cache.block_tokens <= seq.plan.captured_blocks:
            return
        extracted = self._generator.extract_cache([seq.uid]).get(seq.uid)
        if extracted is not None:
            caches, _ = extracted
            self.prefix_cache.capture(seq.plan, caches, seq.prompt_ids, num_tokens)

    def _on_token(self, seq: Sequence, token: int, finish_reason: str | None, now: float) -> None:
        if seq.first_token_at is None:
            seq.first_token_at = now
            if seq.prefill_started_at is None:
                seq.prefill_started_at = seq.created_at
        is_eos = finish_reason == "stop" and token in self.eos_token_ids
        text = ""
        if not is_eos:
            seq.num_generated += 1
            text = seq.stop_filter.push(seq.detokenizer.add(token))
        if seq.stop_filter.stopped:
            if finish_reason is None:  # still in the batch: take it out now
                removed = self._generator.remove([seq.uid], return_prompt_caches=True)
                if seq.uid in removed:
                    caches, tokens = removed[seq.uid]
                    self.prefix_cache.capture_final(seq.plan, caches, tokens)
            finish_reason = "stop"
        if finish_reason is not None and not seq.stop_filter.stopped:
            text += seq.stop_filter.push(seq.detokenizer.flush())
            text += seq.stop_filter.flush()
        if text or not is_eos:
            self._emit(TokenEvent(seq.request_id, text, [] if is_eos else [token], now))
        if finish_reason is not None:
            self._finish(seq, finish_reason, now)

    def _finish(self, seq: Sequence, finish_reason: str, now: float) -> None:
        first = seq.first_token_at or now
        started = seq.prefill_started_at or seq.created_at
        decode_s = now - first
        timings = Timings(
            queue_s=started - seq.created_at,
            prefill_s=first - started,
            ttft_s=first - seq.created_at,
            decode_s=decode_s,
            decode_tokens_per_s=(seq.num_generated - 1) / decode_s if decode_s > 0 else 0.0,
            prompt_tokens_per_s=(
                (len(seq.prompt_ids) - seq.cached_tokens) / (first - started)
                if first > started else 0.0
            ),
            ssd_fetch_s=seq.plan.ssd_fetch_s,
        )
        usage = Usage(len(seq.prompt_ids), seq.num_generated, seq.cached_tokens,
                      seq.plan.ssd_blocks * self.prefix_cache.block_tokens, seq.plan.ssd_bytes)
        self._emit(FinishEvent(seq.request_id, finish_reason, usage, timings))
        self._forget(seq)
        log.info(
            "request %s done (%s): prompt %d tokens (%d cached), %d generated, "
            "queue %.2fs, ttft %.2fs, prefill %.0f tok/s, decode %.1f tok/s",
            seq.request_id, finish_reason, usage.prompt_tokens, usage.cached_tokens,
            usage.completion_tokens, timings.queue_s, timings.ttft_s,
            timings.prompt_tokens_per_s, timings.decode_tokens_per_s,
        )

    def _discard(self, request_id: str) -> None:
        """Undo whatever part of an admission happened before it failed."""
        seq = self._by_request.get(request_id)
        if seq is None:
            return
        if seq.uid >= 0:
            try:
                self._generator.remove([seq.uid])
            except Exception:  # it may never have made it into the generator
                log.debug("request %s was not in the batch", request_id)
        self._forget(seq)

    def _forget(self, seq: Sequence) -> None:
        self._by_uid.pop(seq.uid, None)
        self._by_request.pop(seq.request_id, None)

    def _emit_error(self, request_id: str, exc: RequestError) -> None:
        self._emit(
            ErrorEvent(
                request_id=request_id,
                message=exc.message,
                status=exc.status,
                error_type=exc.error_type,
                param=exc.param,
                code=exc.code,
            )
        )
