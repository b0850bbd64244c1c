"""The engine run both speculation-equality scenarios share (tests/worker/
test_speculation_exact.py, test_draft_model_exact.py): a list of asks through a real
Engine, alone or together, and per request its tokens, logprobs, finish and drafts.
Imported inside their fresh interpreters, after the fast BLAS is bound."""

from __future__ import annotations

from typing import Any

from protocol.messages import AddRequest, ErrorEvent, FinishEvent, SamplingParams, TokenEvent
from protocol.settings import WorkerSettings
from router.tool_calls.lazy_grammar import lazy_call_constraint
from router.tool_calls.request import ToolRequest, ToolSpec
from worker.call_budget import ZONE  # the lazy row's last ZONE tokens draft nothing (a call there needs its budget)
from worker.engine import Engine
from worker.model_loader import LoadedModel
from worker.prefix_cache import PrefixCache

LAZY = "lazy"  # an ask's extra that holds it by the lazy call grammar (its prompt shows no tools)
LAZY_CONSTRAINT = lazy_call_constraint("hermes", ToolRequest((ToolSpec("get_weather", {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),)))


def run_asks(loaded: LoadedModel, asks: list[tuple[str, Any]], speculation: str, together: bool,
             block_tokens: int = 64, cache: bool = False, max_tokens: int = 40) -> tuple[dict[str, Any], PrefixCache]:
    """Each ask (user text, sampling extras or LAZY) greedy unless its extras say otherwise;
    request `r{i}` -> its ids, text, logprobs (repr), finish and drafts proposed / kept."""
    events: list[Any] = []
    settings = WorkerSettings(block_tokens=block_tokens, prefill_chunk_tokens=256, max_num_seqs=8,
                              speculation=speculation)
    prefix = PrefixCache(loaded.model, loaded.fingerprint, block_tokens, 1 << 30, enabled=cache, cold=None)
    engine = Engine(loaded, settings, events.append, prefix)
    waves = [list(enumerate(asks))] if together else [[a] for a in enumerate(asks)]
    for wave in waves:
        for i, (text, extra) in wave:
            lazy = extra == LAZY
            engine.add(AddRequest(f"r{i}", messages=[{"role": "user", "content": text}],
                                  constraint=LAZY_CONSTRAINT if lazy else None,
                                  sampling=SamplingParams(**{"max_tokens": max_tokens + (ZONE if lazy else 0),
                                                             "temperature": 0.0, **({} if lazy else extra)})))
        while engine.has_work():
            engine.step()
    out = {}
    for i in range(len(asks)):
        rid = f"r{i}"
        tokens = [e for e in events if isinstance(e, TokenEvent) and e.request_id == rid]
        (finish,) = [e for e in events if isinstance(e, (FinishEvent, ErrorEvent)) and e.request_id == rid]
        assert isinstance(finish, FinishEvent), finish
        out[rid] = {"ids": [t for e in tokens for t in e.token_ids], "text": "".join(e.text for e in tokens),
                    "logprobs": [repr(e.logprobs) for e in tokens if e.logprobs is not None],
                    "finish": finish.finish_reason, "drafted": finish.timings.draft_tokens,
                    "kept": finish.timings.draft_accepted}
    return out, prefix
