"""Every message that crosses a process boundary in mlxd, as typed dataclasses.

Each message class carries a `type` tag; `protocol.codec` turns them into msgpack maps
and back. Three families live in modules of their own and are re-exported here: the
kvstore's (`protocol.kv_messages`), the encoder workers' (`protocol.encoder_messages`) and
the prefix cache's (`protocol.cache_messages`). Tensor payloads never live in these classes'
msgpack body: they travel as extra ZeroMQ frames, referenced by index (see `protocol.codec`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from protocol.cache_misses import CacheMisses, Divergence  # noqa: F401  (Divergence: nested in CacheMisses)
from protocol.cache_breakpoints import CacheBreakpoint
from protocol.cache_messages import (  # noqa: F401  (the prefix cache's messages, re-exported)
    CacheCleared, CacheProbed, ClearCache, PinPrefix, PrefixPinned,
)
from protocol.errors import RequestError
from protocol.output_constraint import Constraint  # noqa: F401  (nested in AddRequest; importers find it here too)
from protocol.kv_messages import (  # noqa: F401  (the kvstore's messages: importers find them here too)
    KVClear, KVClearResult, KVFlush, KVFlushResult, KVGet, KVGetResult,
    KVLookup, KVLookupResult, KVPin, KVPinResult, KVProbe, KVProbeResult, KVPut,
    KVSnapshots, KVSnapshotsResult, KVStats, KVStatsResult, KVUnpin, KVUnpinResult,
)
from protocol.encoder_messages import (  # noqa: F401  (the encoder workers' messages, re-exported)
    EmbeddingsEvent, EmbedRequest, RerankEvent, RerankRequest,
)
from protocol.message_base import MESSAGE_TYPES, PROTOCOL_VERSION, Message  # noqa: F401  (re-exported)
from protocol.settings import KVStoreSettings, WorkerSettings
from protocol.tool_dialects import MLXD

# ---------------------------------------------------------------- handshake


WORKER_ROLE = "worker"  # the Hello.role a worker sends and its supervisor expects


@dataclass
class Hello(Message):
    """Child -> parent, first message: who I am and which protocol I speak."""

    type: ClassVar[str] = "hello"
    protocol_version: int
    role: str
    pid: int


@dataclass
class WorkerConfig(Message):
    """Parent -> worker, in answer to Hello: everything the worker needs to load."""

    type: ClassVar[str] = "worker_config"
    protocol_version: int
    model_id: str
    model_path: str
    settings: WorkerSettings = field(default_factory=WorkerSettings)
    hot_tier_bytes: int = 0  # this worker's hot-tier budget, sized by the pool from the memory budget
    kvstore_address: str = ""  # the cold tier (on SSD); empty: hot tier only
    kind: str = "chat"  # chat | embedding | reranker: which loop the worker runs
    draft_model_path: str = ""  # a chat model's draft model (speculation "draft_model"); empty: none


@dataclass
class Ready(Message):
    """Worker -> parent once the model is loaded: the effective settings it runs with."""

    type: ClassVar[str] = "ready"
    protocol_version: int
    model_id: str
    context_length: int
    max_num_seqs: int
    prefill_chunk_tokens: int
    block_tokens: int
    dtype: str
    device: str
    blas: str
    load_time_s: float
    weights_bytes: int
    eos_token_ids: list[int] = field(default_factory=list)
    hot_tier_bytes: int = 0
    attention: str = "mlx"  # what runs attention: "mlx" or mlxd's CPU kernels
    quantization: str = "none"  # layers served quantized ("4-bit g32: 210 layers"), or none
    vocab_size: int = 0  # token ids must be below it (logit_bias, prompt ids): checked in the router
    max_token_chars: int = 0  # longest token's text: prompts over context_length * this cannot fit
    # how the model calls tools (protocol.tool_dialects), detected from its chat template:
    # the router parses answers and builds forced-call grammars in it
    tool_dialect: str = MLXD
    # the chat template (or mlxd's fallback dialect) writes tools after the system text in
    # the system turn, so the stable_first layout moves them first (protocol.settings.layout_in_effect)
    tools_first: bool = False
    # the reasoning span its chat template writes (worker.reasoning_template); "" if none
    reasoning_open: str = ""
    reasoning_close: str = ""
    reasoning_opens_in_prompt: bool = False  # the generation prompt opens it: answers start inside
    vision: bool = False  # its chat requests may carry images (a vision model: worker/vision_model.py)
    kind: str = "chat"  # chat | embedding | reranker
    dimensions: int = 0  # an embedding model's vector size


KVSTORE_ROLE = "kvstore"  # the Hello.role a kvstore sends and its supervisor expects


@dataclass
class KVStoreConfig(Message):
    """Parent -> kvstore, in answer to Hello: the store to open and the address to serve
    workers on (the kvstore binds it; workers connect to it directly)."""

    type: ClassVar[str] = "kvstore_config"
    protocol_version: int
    root: str
    bind: str
    settings: KVStoreSettings = field(default_factory=KVStoreSettings)
    namespace_caps: dict[str, int] = field(default_factory=dict)  # per-model disk caps, bytes


@dataclass
class KVStoreReady(Message):
    """Kvstore -> parent once the store is open and `bind` is bound: workers may connect."""

    type: ClassVar[str] = "kvstore_ready"
    protocol_version: int
    root: str
    bind: str
    num_blocks: int = 0  # blocks found in the store at startup
    disk_bytes: int = 0  # bytes they use


@dataclass
class StartupFailed(Message):
    """Child (worker or kvstore) -> parent: starting failed; the message says what to change."""

    type: ClassVar[str] = "startup_failed"
    message: str


# ---------------------------------------------------------------- health


@dataclass
class Ping(Message):
    type: ClassVar[str] = "ping"
    nonce: int
    sent_at: float


@dataclass
class Pong(Message):
    type: ClassVar[str] = "pong"
    nonce: int
    sent_at: float
    num_running: int = 0  # sequences in the engine (queued, prefilling or decoding)
    num_tokenizing: int = 0  # prompts on the worker's tokenizer thread, not yet in the engine
    stats: dict[str, Any] = field(default_factory=dict)  # memory and cache counters for /admin/status


@dataclass
class Shutdown(Message):
    """Parent -> child: drain in-flight work until the deadline, then exit."""

    type: ClassVar[str] = "shutdown"
    drain_s: float = 5.0


# ---------------------------------------------------------------- requests


@dataclass
class SamplingParams:
    """Per-request sampling; one batch may mix any of these (not a message itself)."""

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    logprobs: bool = False  # report each sampled token's log-probability
    top_logprobs: int = 0  # and this many most likely alternatives (0-20)


@dataclass
class AddRequest(Message):
    """Router -> worker: start a generation.

    Exactly one of `messages` (chat: the worker applies the chat template) and `prompt`
    (completion: raw text, or token ids) is set.
    """

    type: ClassVar[str] = "add_request"
    request_id: str
    messages: list[dict[str, Any]] | None = None
    prompt: str | list[int] | None = None
    tools: list[dict[str, Any]] | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    cache_salt: str | None = None
    want_progress: bool = False
    context_limit: int | None = None  # prompt + output cap from the model's profile; None: the worker's window
    constraint: Constraint | None = None  # structured output / forced tool calls
    max_output_tokens: int | None = None  # the model's or profile's output cap, when tighter than the worker's
    # the last message is the start of the assistant's answer (a prefill such as "{"): the
    # template renders it open, and the answer is its continuation
    continue_final_message: bool = False
    # prefixes the client asked to keep cached (Anthropic `cache_control`), at most 4
    cache_breakpoints: list[CacheBreakpoint] = field(default_factory=list)
    # the profile's prompt layout (protocol.settings.PROMPT_LAYOUTS); None: the worker's setting
    prompt_layout: str | None = None
    # the model's or profile's speculation (protocol.settings.SPECULATIONS); None: the worker's setting
    speculation: str | None = None
    reasoning_budget: int | None = None  # most reasoning tokens before the worker closes the span; None: any
    images: list[bytes] | None = None  # the images of `messages`' {"type": "image"} parts, in order


@dataclass
class CountTokens(Message):
    """Router -> worker: how many tokens would `request`'s prompt be? Rendered and
    tokenized exactly as if `request` were sent (whatever of it shapes the prompt), on the
    worker's tokenizer thread, so it never waits behind generation; answered by a
    TokenCount or an ErrorEvent. A prompt too long for the context window is counted, not
    refused. Nothing is generated."""

    type: ClassVar[str] = "count_tokens"
    request: AddRequest

    @property
    def request_id(self) -> str:
        return self.request.request_id


@dataclass
class TokenCount(Message):
    """Worker -> router: the answer to a CountTokens, the last event for its id."""

    type: ClassVar[str] = "token_count"
    request_id: str
    num_tokens: int


@dataclass
class ProbeCache(Message):
    """Router -> worker: where is `request`'s prompt cached? Rendered and tokenized as if
    `request` were sent (on the tokenizer thread, like CountTokens), then looked up in the
    hot tier and the kvstore without using anything: no block's recency changes in
    either tier, no hit or miss is counted, nothing is computed or read. Answered by a
    CacheProbed (`protocol.cache_messages`) or an ErrorEvent."""

    type: ClassVar[str] = "probe_cache"
    request: AddRequest

    @property
    def request_id(self) -> str:
        return self.request.request_id


@dataclass
class AbortRequest(Message):
    """Router -> worker: the client went away; free the slot now."""

    type: ClassVar[str] = "abort_request"
    request_id: str


# ---------------------------------------------------------------- events


@dataclass
class PromptEvent(Message):
    """Worker -> router: the prompt was accepted (tokenized, fits) and prefill began."""

    type: ClassVar[str] = "prompt"
    request_id: str
    prompt_tokens: int
    cached_tokens: int = 0
    cache_creation_tokens: int = 0  # as in Usage, known once the prompt is planned
    cache_creation_1h_tokens: int = 0


@dataclass
class ProgressEvent(Message):
    """Worker -> router: prefill progress, for clients that asked to see it."""

    type: ClassVar[str] = "progress"
    request_id: str
    processed_tokens: int
    total_tokens: int


@dataclass
class TokenLogprobs:
    """Log-probabilities of a TokenEvent's tokens (one entry per token id), from the
    distribution the sampler drew from. Tokens travel as their bytes: the router has no
    tokenizer, and a token may hold part of a UTF-8 character."""

    token_bytes: list[bytes]
    logprobs: list[float]
    top_bytes: list[list[bytes]] = field(default_factory=list)  # per token: the most likely, best first
    top_logprobs: list[list[float]] = field(default_factory=list)


@dataclass
class TokenEvent(Message):
    """Worker -> router: newly decoded text (stop strings already withheld)."""

    type: ClassVar[str] = "token"
    request_id: str
    text: str
    token_ids: list[int]
    time: float = 0.0
    logprobs: TokenLogprobs | None = None  # only for requests that asked (SamplingParams.logprobs)


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # prompt tokens served from the prefix cache (hot or SSD)
    cold_tokens: int = 0  # the part of cached_tokens restored from the SSD cold tier
    cold_bytes: int = 0  # KV bytes those blocks carried (as stored by the worker)
    misses: CacheMisses | None = None  # why the uncached prompt tokens were uncached (None: no prefix cache)
    # prompt tokens up to the request's last cache breakpoint that it computed and stored
    # (not cached_tokens); 0 without a breakpoint (AddRequest.cache_breakpoints)
    cache_creation_tokens: int = 0
    cache_creation_1h_tokens: int = 0  # the part of them under a 1-hour breakpoint
    reasoning_tokens: int = 0  # of completion_tokens, those inside the answer's reasoning span


@dataclass
class Timings:
    queue_s: float = 0.0
    prefill_s: float = 0.0
    ttft_s: float = 0.0
    decode_s: float = 0.0
    decode_tokens_per_s: float = 0.0
    prompt_tokens_per_s: float = 0.0
    cold_fetch_s: float = 0.0  # lookup + read + decode of the blocks restored from SSD
    grammar_s: float = 0.0  # host time in the grammar engine (constrained requests)
    draft_tokens: int = 0  # tokens speculation proposed for this request
    draft_accepted: int = 0  # of them, the ones the model itself produced (kept)


@dataclass
class FinishEvent(Message):
    """Worker -> router: the request is over; the last event for its id."""

    type: ClassVar[str] = "finish"
    request_id: str
    finish_reason: str
    usage: Usage
    timings: Timings = field(default_factory=Timings)
    stop_sequence: str | None = None  # the stop string that ended it (finish_reason "stop"), if one did


@dataclass
class ErrorEvent(Message):
    """Worker -> router: the request failed; the worker lives on.

    `status` and `code` map straight onto the HTTP error the client sees.
    """

    type: ClassVar[str] = "error"
    request_id: str
    message: str
    status: int = 400
    error_type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None
    num_prompt_tokens: int | None = None  # a prompt too long for the context window: its size
    context_window: int | None = None  # and the window it did not fit

    @classmethod
    def from_error(cls, request_id: str, error: RequestError) -> ErrorEvent:
        """The event that carries `error` for `request_id` to the router."""
        return cls(request_id, error.message, error.status, error.error_type, error.param, error.code,
                   error.num_prompt_tokens, error.context_window)

    def to_error(self) -> RequestError:
        """The error again, as the router raises it into the HTTP layer."""
        return RequestError(self.message, status=self.status, error_type=self.error_type, param=self.param,
                            code=self.code, num_prompt_tokens=self.num_prompt_tokens,
                            context_window=self.context_window)


@dataclass
class EventBatch(Message):
    """Worker -> router: every event of one engine step, in order, as one message.

    A step at 8 streams makes 8 or more events; sent one by one, every send wakes ZMQ's
    I/O thread on a CPU the model is using. The router delivers them as if they had come
    singly.
    """

    type: ClassVar[str] = "events"
    events: list[Message] = field(default_factory=list)
