"""Supervision of one model's worker process, on the shared child lifecycle
(`router.children.child_supervisor`): what to start, what to send after Hello, what READY means.

A worker that dies or stops answering pings for `ping_timeout_s` fails its in-flight
requests at once and is restarted with exponential backoff.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from protocol.errors import WorkerDead
from protocol.messages import (
    PROTOCOL_VERSION,
    WORKER_ROLE,
    Message,
    Pong,
    Ready,
    WorkerConfig,
)
from protocol.settings import layout_in_effect
from router.children.child_supervisor import ChildStartupError, ChildSupervisor
from router.config import RouterConfig
from router.children.worker_client import RequestStream, StreamRequest, WorkerClient
from router.reasoning_split import reasoning_info

logger = logging.getLogger(__name__)

DEFAULT_WORKER_COMMAND = (sys.executable, "-m", "worker")


class WorkerStartupError(ChildStartupError):
    """A worker failed before READY: it exited, reported StartupFailed, or timed out."""


class WorkerSupervisor(ChildSupervisor):
    """Keeps one worker for `model_id` running and says whether it can take requests.

    States as in `ChildSupervisor`, starting in `loading`. Requests are only sent in
    `ready`; leaving `ready` fails the worker's in-flight requests in the same step.
    """

    role = WORKER_ROLE
    ready_type = Ready
    startup_error = WorkerStartupError
    starting_state = "loading"

    def __init__(self, model_id: str, model_path: Path, config: RouterConfig, client: WorkerClient,
                 worker_command: Sequence[str] = DEFAULT_WORKER_COMMAND, kind: str = "chat") -> None:
        super().__init__(model_id, f"worker for '{model_id}'", config, client)
        self.model_id = model_id
        self.kind = kind  # chat | embedding | reranker: sent in the handshake, picks the worker's loop
        self.draft_model_path = ""  # its draft model's directory (loaded in the same worker), if any
        self.model_path = model_path
        self.worker_command = tuple(worker_command)
        self.ready: Ready | None = None
        self.last_pong: Pong | None = None
        # called with (child_key, stats) on every pong: the pool's metrics accumulate them
        self.on_stats: Callable[[str, dict[str, Any]], None] | None = None
        self.kvstore_address = ""  # set by the pool when the cold tier runs
        self.hot_tier_bytes = config.hot_tier_bytes  # set by the pool from the memory budget

    # ---------------------------------------------------------------- public

    def open_request(self, add: StreamRequest) -> RequestStream:
        """Send `add` to the worker; raises `WorkerDead` (a 503) unless it is ready."""
        if self.state != "ready" or self.identity is None:
            raise WorkerDead(self.unavailable_reason())
        return self.client.open_request(self.identity, add)

    def unavailable_reason(self) -> str:
        if self.state == "loading":
            return f"model '{self.model_id}' is still loading; retry shortly"
        if self.state == "restarting":
            return (f"the worker for model '{self.model_id}' is restarting "
                    f"(last error: {self.last_error}); retry shortly")
        return f"model '{self.model_id}' is unavailable: {self.last_error or 'its worker is stopped'}"

    def health(self) -> dict[str, Any]:
        info = super().health()
        if self.ready is not None:
            info["context_length"] = self.ready.context_length
            info["device"] = self.ready.device
            info["blas"] = self.ready.blas
            info["attention"] = self.ready.attention
            info["dtype"] = self.ready.dtype
            info["quantization"] = self.ready.quantization
            info["weights_bytes"] = self.ready.weights_bytes
            info["kind"] = self.ready.kind
            if self.ready.kind == "chat":
                info["tool_dialect"] = self.ready.tool_dialect
                info["reasoning"] = reasoning_info(self.ready)
                info["vision"] = self.ready.vision
                info["prompt_layout"] = layout_in_effect(self.config.worker.prompt_layout, self.ready.tools_first)
            if self.ready.dimensions:
                info["dimensions"] = self.ready.dimensions
        if self.identity is not None:
            info["num_requests"] = self.client.num_open_requests(self.identity)
        if self.last_pong is not None and self.state == "ready":
            info["worker_active"] = self.last_pong.num_running
            info["worker_tokenizing"] = self.last_pong.num_tokenizing
        return info

    # ---------------------------------------------------------------- the lifecycle's hooks

    def _argv(self, identity: str) -> list[str]:
        return [*self.worker_command, "--connect", self.client.address, "--identity", identity]

    def _config_message(self) -> Message:
        return self._worker_config()

    def _ping_timeout(self) -> tuple[float, str]:
        return self.config.ping_timeout_s, "--ping-timeout-s"

    @property
    def startup_timeout_hint(self) -> str:
        return "raise --load-timeout-s if the model is just slow to load"

    def _on_ready(self, ready: Message) -> None:
        assert isinstance(ready, Ready) and self.child is not None
        self.ready = ready
        logger.info("worker for %s ready (pid %d, %s, context %d, %.1f s to load)",
                    self.model_id, self.child.pid, ready.device, ready.context_length, ready.load_time_s)

    def _on_other_message(self, message: Message) -> None:
        if isinstance(message, Pong):  # a pong also says how busy the worker is, as it counts it
            self.last_pong = message
            if self.on_stats is not None and message.stats:
                self.on_stats(self.child_key, message.stats)

    def _fail_in_flight(self, reason: str, *, shutting_down: bool = False) -> None:
        assert self.identity is not None
        error = WorkerDead(reason if shutting_down else (
            f"the worker for model '{self.model_id}' {reason}; the request could not finish. "
            "It is being restarted; retry shortly."))
        num_failed = self.client.fail_requests(self.identity, error)
        if num_failed:
            logger.warning("failed %d in-flight request(s) of %s", num_failed, self.model_id)

    def _worker_config(self) -> WorkerConfig:
        return WorkerConfig(protocol_version=PROTOCOL_VERSION, model_id=self.model_id, model_path=str(self.model_path),
                            settings=self.config.worker, hot_tier_bytes=self.hot_tier_bytes,
                            kvstore_address=self.kvstore_address, kind=self.kind,
                            draft_model_path=self.draft_model_path)
