"""Every message that crosses a process boundary in mlxd, as typed dataclasses.

Each message class carries a `type` tag; `protocol.codec` turns them into msgpack maps
and back. Tensor payloads never live in these classes' msgpack body: they travel as
extra ZeroMQ frames, referenced by index (see `protocol.codec`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from protocol.errors import RequestError

PROTOCOL_VERSION = 1

MESSAGE_TYPES: dict[str, type["Message"]] = {}


@dataclass
class Message:
    """Base of all wire messages; subclasses register themselves under their tag."""

    type: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        tag = cls.__dict__.get("type")
        if tag:
            if tag in MESSAGE_TYPES:
                raise TypeError(f"duplicate message type tag {tag!r}")
            MESSAGE_TYPES[tag] = cls


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
    max_num_seqs: int = 8
    max_queue: int = 64
    prefill_chunk_tokens: int = 512
    batch_window_ms: int = 10
    block_tokens: int = 256
    hot_cache_bytes: int = 0
    prefix_cache: bool = True
    max_context_tokens: int = 0
    default_max_tokens: int = 512
    dtype: str = "auto"
    heartbeat_s: float = 2.0
    kvstore_address: str = ""  # the SSD cold tier; empty: hot tier only


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
    hot_cache_bytes: int = 0
    attention: str = "mlx"  # what runs attention: "mlx" or mlxd's CPU kernels
    vocab_size: int = 0  # token ids must be below it (logit_bias, prompt ids): checked in the router
    max_token_chars: int = 0  # longest token's text: prompts over context_length * this cannot fit


@dataclass
class StartupFailed(Message):
    """Worker -> parent: loading failed; the message says what to change."""

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
    # prompt + output cap from the model's profile; None: the worker's own context length
    context_limit: int | None = None


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


@dataclass
class ProgressEvent(Message):
    """Worker -> router: prefill progress, for clients that asked to see it."""

    type: ClassVar[str] = "progress"
    request_id: str
    processed_tokens: int
    total_tokens: int


@dataclass
class TokenEvent(Message):
    """Worker -> router: newly decoded text (stop strings already withheld)."""

    type: ClassVar[str] = "token"
    request_id: str
    text: str
    token_ids: list[int]
    time: float = 0.0


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # prompt tokens served from the prefix cache (hot or SSD)
    ssd_tokens: int = 0  # the part of cached_tokens restored from the SSD cold tier
    ssd_bytes: int = 0  # KV bytes those blocks carried (as stored by the worker)


@dataclass
class Timings:
    queue_s: float = 0.0
    prefill_s: float = 0.0
    ttft_s: float = 0.0
    decode_s: float = 0.0
    decode_tokens_per_s: float = 0.0
    prompt_tokens_per_s: float = 0.0
    ssd_fetch_s: float = 0.0  # lookup + read + decode of the blocks restored from SSD


@dataclass
class FinishEvent(Message):
    """Worker -> router: the request is over; the last event for its id."""

    type: ClassVar[str] = "finish"
    request_id: str
    finish_reason: str
    usage: Usage
    timings: Timings = field(default_factory=Timings)


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

    @classmethod
    def from_error(cls, request_id: str, error: RequestError) -> ErrorEvent:
        """The event that carries `error` for `request_id` to the router."""
        return cls(request_id, error.message, error.status, error.error_type, error.param, error.code)

    def to_error(self) -> RequestError:
        """The error again, as the router raises it into the HTTP layer."""
        return RequestError(self.message, status=self.status, error_type=self.error_type, param=self.param,
                            code=self.code)


@dataclass
class EventBatch(Message):
    """Worker -> router: every event of one engine step, in order, as one message.

    A step at 8 streams makes 8 or more events; sent one by one, every send wakes ZMQ's
    I/O thread on a CPU the model is using. The router delivers them as if they had come
    singly.
    """

    type: ClassVar[str] = "events"
    events: list[Message] = field(default_factory=list)


# ---------------------------------------------------------------- kvstore (SSD cold tier)
# Any DEALER peer -> kvstore ROUTER. Keys are 16-byte block keys (`protocol.block_keys`),
# scoped by `namespace` (one per model fingerprint). Block payloads are opaque bytes and
# travel as extra frames, one per key, in key order.


@dataclass
class KVLookup(Message):
    """How many of `keys`, in order from the first, the store holds (stops at a miss)."""

    type: ClassVar[str] = "kv_lookup"
    request_id: int
    namespace: str
    keys: list[bytes]


@dataclass
class KVLookupResult(Message):
    type: ClassVar[str] = "kv_lookup_result"
    request_id: int
    num_found: int


@dataclass
class KVGet(Message):
    """Fetch the payloads of `keys`; one round trip for a whole run of blocks."""

    type: ClassVar[str] = "kv_get"
    request_id: int
    namespace: str
    keys: list[bytes]
    # one KVGetResult per block, sent as each is read, ending at the first miss: the
    # asker decodes block i while block i+1 is read and sent
    stream: bool = False


@dataclass
class KVGetResult(Message):
    """`found[i]` per asked key; one extra frame per found key, in key order. A corrupt
    record is reported as not found, never as wrong bytes."""

    type: ClassVar[str] = "kv_get_result"
    request_id: int
    found: list[bool]
    seq: int = 0  # streamed gets: position of this block among the asked keys
    done: bool = True  # streamed gets: the last message for this request


@dataclass
class KVPut(Message):
    """Store one extra frame per key; write-behind, no reply. A key already stored is a
    no-op that refreshes its last use."""

    type: ClassVar[str] = "kv_put"
    namespace: str
    keys: list[bytes]


@dataclass
class KVFlush(Message):
    """Answered once every put received before it is written and fsynced."""

    type: ClassVar[str] = "kv_flush"
    request_id: int


@dataclass
class KVFlushResult(Message):
    type: ClassVar[str] = "kv_flush_result"
    request_id: int


@dataclass
class KVStats(Message):
    """Counters and sizes; also the kvstore's liveness ping."""

    type: ClassVar[str] = "kv_stats"
    request_id: int


@dataclass
class KVStatsResult(Message):
    type: ClassVar[str] = "kv_stats_result"
    request_id: int
    stats: dict[str, Any]


@dataclass
class KVClear(Message):
    """Drop every block (`namespace` None) or one namespace's blocks."""

    type: ClassVar[str] = "kv_clear"
    request_id: int
    namespace: str | None = None


@dataclass
class KVClearResult(Message):
    type: ClassVar[str] = "kv_clear_result"
    request_id: int
    num_removed: int
