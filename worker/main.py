"""The worker process: handshake with the router, load one model, run the engine loop.

One worker serves one model. It talks to the router over a DEALER socket only, exits
when the router goes away, and on SIGTERM drains in-flight requests to a deadline.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING

from protocol import log_format
from protocol.child import Lifecycle, exit_code_without_config
from protocol.errors import RequestError
from protocol.messages import (
    PROTOCOL_VERSION,
    WORKER_ROLE,
    AbortRequest,
    AddRequest,
    CacheCleared,
    ClearCache,
    CountTokens,
    Message,
    PinPrefix,
    Pong,
    PrefixPinned,
    ProbeCache,
    Ready,
    StartupFailed,
    WorkerConfig,
)
from protocol.settings import layout_in_effect
from worker.prompts import tools_go_first
from worker.router_channel import RouterChannel
from worker.reasoning_template import detect_reasoning
from worker.tool_prompt import detect_tool_dialect, template_source

if TYPE_CHECKING:
    from worker.engine import Engine
    from worker.prefix_cache import PrefixCache
    from worker.prompt_preparer import PromptPreparer

log = logging.getLogger("worker")

_IDLE_POLL_MS = 50
_PREPARING_POLL_MS = 1  # idle but a prompt is being tokenized: admit it the moment it is ready
_GATHER_CAP_WINDOWS = 10  # a burst delays its prefill by at most this many windows
_SIGNAL_DRAIN_S = 5.0  # in-flight work gets this long after a SIGTERM (a Shutdown says its own)


def _shutting_down() -> RequestError:
    """What requests cut by a shutdown or restart get: a 503 that says to retry."""
    return RequestError("the worker is shutting down (restart or unload); retry shortly", status=503,
                        error_type="server_error", code="worker_unavailable")


def run_worker(address: str, identity: str, blas: str) -> int:
    """Entry point of `python -m worker`; returns the process exit code."""
    log_format.configure_child_logging(f"worker[{identity}]")
    os.umask(0o077)  # whatever it writes may quote prompts: private, like the router's files
    lifecycle = Lifecycle()
    lifecycle.install_signal_handlers()
    # a short linger: an orphaned worker must not wait on a router that is gone
    channel = RouterChannel(address, identity, lifecycle, linger_ms=200)
    try:
        config = channel.handshake(WORKER_ROLE, WorkerConfig)
        if config is None:
            return exit_code_without_config(lifecycle)
        return _serve(channel, config, blas, lifecycle)
    finally:
        channel.close()


def _serve(channel: RouterChannel, config: WorkerConfig, blas: str, lifecycle: Lifecycle) -> int:
    if config.kind != "chat":  # an embedding model or a reranker: a loop of its own
        from worker.encoder_loop import serve_encoder

        return serve_encoder(channel, config, blas, lifecycle)
    settings = config.settings
    # Imported here so the BLAS binding in __main__ happens before MLX loads.
    from worker.engine import Engine
    from worker.drafted_model import with_draft
    from worker.model_loader import load_for_serving
    from worker.cold_tier import ColdTier
    from worker.prefix_cache import PrefixCache
    from worker.prompt_preparer import PromptPreparer

    import mlx.core as mx

    # MLX keeps every freed buffer for reuse and, uncapped, its cache grows with each new
    # batch shape: the soak saw a worker's RSS grow 38% under steady load while its hot
    # tier stayed flat.
    mx.set_cache_limit(settings.mlx_cache_mb * 2**20)
    try:
        loaded = load_for_serving(config.model_path, settings.dtype)
    except Exception as exc:
        log.exception("failed to load %s", config.model_path)
        channel.send(StartupFailed(f"cannot load model {config.model_path}: {exc}"))
        return 3
    if config.draft_model_path:
        try:
            loaded = with_draft(loaded, load_for_serving(config.draft_model_path, settings.dtype))
        except Exception as exc:
            log.exception("failed to load the draft model %s", config.draft_model_path)
            channel.send(StartupFailed(f"cannot load the draft model {config.draft_model_path} for "
                                       f"{config.model_id}: {exc}"))
            return 3
        log.info("draft model %s loaded beside it: the prefix cache keeps both models' KV",
                 os.path.basename(config.draft_model_path.rstrip("/")))
    if blas == "reference":
        from worker.blas import missing_blas_hint

        log.warning("no optimised BLAS found: CPU inference will be slow. Fix: %s", missing_blas_hint())
    log.info(
        "loaded %s in %.1fs: %s on %s (quantized: %s), BLAS %s, kernels %s, %.0f MB of weights, context %d",
        config.model_id, loaded.load_time_s, loaded.dtype, loaded.device, loaded.quantization, blas,
        loaded.attention, loaded.weights_bytes / 1e6, loaded.context_length,
    )
    budget = config.hot_tier_bytes  # sized by the router's pool from the memory budget
    cold = ColdTier(config.kvstore_address, config.model_id) if config.kvstore_address and settings.prefix_cache else None
    prefix_cache = PrefixCache(
        loaded.model, loaded.fingerprint, settings.block_tokens, budget, enabled=settings.prefix_cache, cold=cold,
        breakpoint_pin_share=settings.breakpoint_pin_share,
    )
    log.info(
        "prefix cache %s: blocks of %d tokens, hot tier %.0f MB, cold tier %s",
        "on" if prefix_cache.enabled else "off", settings.block_tokens, prefix_cache.hot.budget_bytes / 1e6,
        config.kvstore_address or "off",
    )
    _pin_snapshots(prefix_cache)
    engine = Engine(loaded, settings, channel.send, prefix_cache, flush=channel.flush)
    tool_dialect = detect_tool_dialect(template_source(loaded.tokenizer))
    tools_first = tools_go_first(loaded.tokenizer)
    reasoning = detect_reasoning(loaded.tokenizer) or ("", "", False)
    if reasoning[0]:
        log.info("the model reasons in %s ... %s (from the chat template)%s", reasoning[0], reasoning[1],
                 "; the generation prompt opens the span" if reasoning[2] else "")
    log.info("tool calls in the %s dialect (from the chat template); prompts with tools laid out %s", tool_dialect,
             layout_in_effect(settings.prompt_layout, tools_first))
    channel.send(Ready(
        protocol_version=PROTOCOL_VERSION,
        model_id=config.model_id,
        context_length=engine.context_length,
        max_num_seqs=settings.max_num_seqs,
        prefill_chunk_tokens=settings.prefill_chunk_tokens,
        block_tokens=settings.block_tokens,
        dtype=loaded.dtype,
        device=loaded.device,
        blas=blas,
        load_time_s=loaded.load_time_s,
        weights_bytes=loaded.weights_bytes,
        eos_token_ids=engine.eos_token_ids,
        hot_tier_bytes=prefix_cache.hot.budget_bytes,
        attention=loaded.attention,
        quantization=loaded.quantization,
        vocab_size=engine.vocab_size,
        max_token_chars=engine.max_token_chars,
        tool_dialect=tool_dialect,
        tools_first=tools_first,
        reasoning_open=reasoning[0],
        reasoning_close=reasoning[1],
        reasoning_opens_in_prompt=reasoning[2],
        vision=loaded.images is not None,
    ))
    preparer = PromptPreparer(engine.questions.prepare, count=engine.questions.count_tokens)
    try:
        return _loop(channel, engine, preparer, lifecycle, settings.batch_window_ms)
    finally:
        preparer.close()
        if cold is not None and lifecycle.orphaned:
            # the router's kvstore is exiting too: a flush would wait for an answer
            # that never comes, and keep this process alive meanwhile
            log.info("dropping %d pending SSD writes", cold.queue_depth())
            cold.abandon()
        elif cold is not None:
            # graceful shutdown: blocks handed to the cold tier reach the disk
            log.info("flushing %d pending SSD writes", cold.queue_depth())
            cold.flush()
            cold.close()


def _pin_snapshots(prefix_cache: PrefixCache) -> None:
    """Pin in the hot tier the blocks of this model's named snapshots, as the kvstore
    keeps them (they outlive workers there): each is protected from the moment a request
    brings it back from SSD."""
    if prefix_cache.cold is None or not prefix_cache.enabled:
        return
    snapshots = prefix_cache.cold.snapshots()
    if snapshots is None:
        log.warning("the kvstore did not list this model's snapshots: they are pinned on SSD only until the "
                    "next restart of this worker")
        return
    for snapshot in snapshots:
        prefix_cache.pin(snapshot["name"], snapshot["keys"])
    if snapshots:
        log.info("pinned %d snapshot(s) in the hot tier: %s", len(snapshots),
                 ", ".join(s["name"] for s in snapshots))


def _pin_prefix(message: PinPrefix, channel: RouterChannel, engine: Engine, preparer: PromptPreparer) -> None:
    """Pin (or unpin) a snapshot's blocks in the hot tier now, between steps; with
    `store`, the writes to SSD and the wait for the kvstore's fsync go to the tokenizer
    thread, and its answer comes from there."""
    cache = engine.prefix_cache
    if not message.pin:
        cache.unpin(message.name)
        channel.send(PrefixPinned(message.request_id, message.name))
        return
    pinned = cache.pin(message.name, message.keys)
    if not message.store:
        channel.send(PrefixPinned(message.request_id, message.name, pinned.hot_blocks, pinned.hot_bytes))
        return

    def store() -> PrefixPinned:
        done = cache.store_pinned(message.keys)
        return PrefixPinned(message.request_id, message.name, done.hot_blocks, done.hot_bytes, done.written_blocks,
                            done.missing_blocks, done.flushed)

    preparer.submit_answer(message.request_id, store, "write this snapshot's blocks to SSD")


def _receive_requests(channel: RouterChannel, engine: Engine, preparer: PromptPreparer, lifecycle: Lifecycle,
                      window_ms: int) -> None:
    """Act on every message waiting, blocking only when idle, and admit the requests whose
    prompts the tokenizer thread has finished.

    When the next step would start a prefill that nobody else waits on, requests still
    on their way get `window_ms` of quiet to arrive (`_GATHER_CAP_WINDOWS` windows at
    most), and the burst's prompts get tokenized, so that it shares that prefill instead
    of queueing behind its first request (`Engine.gathering_batch`).
    """
    if engine.has_work():
        timeout = 0
    else:
        timeout = _PREPARING_POLL_MS if preparer.num_pending or preparer.num_counting else _IDLE_POLL_MS
    while (message := channel.receive(timeout)) is not None:
        timeout = 0
        _handle(message, channel, engine, preparer, lifecycle)
    _admit_prepared(engine, preparer)
    for answer in preparer.take_counted():  # counts go out between steps, never queued behind them
        channel.send(answer)
    give_up_at = time.monotonic() + _GATHER_CAP_WINDOWS * window_ms / 1000
    while window_ms > 0 and _gathering(engine, preparer) and not lifecycle.stop_requested:
        left_s = give_up_at - time.monotonic()
        if left_s <= 0:
            return
        if preparer.num_pending:
            # nothing runs yet, so waiting for the tokenizer stalls nobody; admitted now,
            # the burst's admission work stays out of its prefill step
            preparer.wait(left_s)
            _admit_prepared(engine, preparer)
            continue
        message = channel.receive(min(window_ms, int(left_s * 1000)))
        if message is None:
            return  # a whole window of quiet: the burst is in
        _handle(message, channel, engine, preparer, lifecycle)


def _gathering(engine: Engine, preparer: PromptPreparer) -> bool:
    """Nothing runs yet and requests are coming in (arriving or being tokenized)."""
    return engine.gathering_batch() or (preparer.num_pending > 0 and not engine.has_work())


def _admit_prepared(engine: Engine, preparer: PromptPreparer) -> None:
    for prepared in preparer.take_done():
        if prepared.error is not None:
            engine.reject(prepared.request.request_id, prepared.error)
        else:
            engine.add(prepared.request, prepared.prompt, prepared.arrived)


def _handle(message: Message, channel: RouterChannel, engine: Engine, preparer: PromptPreparer,
            lifecycle: Lifecycle) -> None:
    if isinstance(message, AddRequest):
        log.debug("request %s received (%d waiting to be tokenized)", message.request_id, preparer.num_pending)
        if lifecycle.drain_deadline is not None:
            engine.reject(message.request_id, _shutting_down())
            return
        try:
            engine.check_admissible(message.request_id, preparer.num_pending)
        except RequestError as exc:
            engine.reject(message.request_id, exc)
            return
        preparer.submit(message)
    elif isinstance(message, CountTokens):
        preparer.submit_count(message)
    elif isinstance(message, ProbeCache):
        preparer.submit_answer(message.request_id, lambda: engine.questions.probe_cache(message),
                               "probe the cache for this prompt")
    elif isinstance(message, PinPrefix):
        _pin_prefix(message, channel, engine, preparer)
    elif isinstance(message, AbortRequest):
        if not preparer.cancel(message.request_id):
            engine.abort(message.request_id)
    elif isinstance(message, ClearCache):  # between steps: no sequence is mid-forward
        channel.send(CacheCleared(message.request_id, *engine.prefix_cache.clear()))
    elif not lifecycle.obey(message, channel.send, lambda ping: Pong(
            ping.nonce, ping.sent_at, engine.num_active, preparer.num_pending, engine.stats())):
        log.warning("unexpected %s message; ignored", message.type)


def _loop(channel: RouterChannel, engine: Engine, preparer: PromptPreparer, lifecycle: Lifecycle,
          batch_window_ms: int) -> int:
    """Requests in, steps, events out, until told to stop or orphaned."""
    busy = False
    while True:
        if lifecycle.parent_gone():
            log.warning("router went away; exiting")
            return 0
        if lifecycle.stop_requested and lifecycle.drain_deadline is None:
            lifecycle.drain_deadline = time.monotonic() + _SIGNAL_DRAIN_S
        if lifecycle.drain_deadline is not None:
            if not engine.has_work() and not preparer.num_pending and not preparer.num_counting:
                log.info("shut down cleanly")
                return 0
            if time.monotonic() > lifecycle.drain_deadline:
                for request in preparer.take_all():
                    engine.reject(request.request_id, _shutting_down())
                engine.abort_all(_shutting_down())
                return 0
        _receive_requests(channel, engine, preparer, lifecycle, batch_window_ms)
        if engine.has_work():
            with channel.batched():  # one message per step, however many streams
                engine.step()
            busy = True
        elif busy:
            engine.release_idle_memory()
            busy = False
