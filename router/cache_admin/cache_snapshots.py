"""Named snapshots of the prefix cache: `POST /admin/cache/snapshots` pins the whole blocks
of a prompt under a name, in both tiers, against eviction; `GET` lists them with their
sizes; `DELETE /admin/cache/snapshots/{name}` unpins one.

The kvstore owns the snapshots: it keeps the pin set in its directory (`pins.json`,
rewritten atomically), so a snapshot outlives workers and the service, and a worker pins
its model's snapshots in its hot tier when it starts. A snapshot is reused like any
cached prefix: a request that starts with its prompt finds its blocks (hot, or restored
from SSD after a restart). Creating one:

1. probe the prompt (its block keys, and where each is);
2. pin the keys in the kvstore, then in the worker's hot tier: from here on neither
   tier evicts them, and blocks that arrive later are pinned as they arrive;
3. if a block is in neither tier, run the prompt (one greedy token) so that prefill
   computes and captures them;
4. have the worker write to SSD what the kvstore lacks and wait for its fsync;
5. check that the kvstore holds every block, and answer. A failure after step 2 unpins.

The shapes are in the README ("Cache probe and snapshots"); keep the two in step.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from protocol.errors import RequestError
from protocol.messages import FinishEvent, PinPrefix, PrefixPinned, SamplingParams
from router import old_names
from router.cache_admin.cache_probe import WORKER_ANSWER_TIMEOUT_S, probe_body, probe_prompt, prompt_request
from router.json_body import parse_json_body
from router.children.pool import WorkerPool
from router.requests import ask
from router.validation import bad, short

logger = logging.getLogger(__name__)

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
COMPUTE_TIMEOUT_S = 1800.0  # prefill of a long prompt on a slow CPU


def _kvstore(pool: WorkerPool) -> Any:
    if pool.kvstore is None:
        raise RequestError("named snapshots are kept by the cold tier, and this service runs without it "
                           "(--no-cold-tier or --no-prefix-cache)", status=409, code="cold_tier_off")
    return pool.kvstore


def _unavailable(what: str, pool: WorkerPool) -> RequestError:
    state = pool.kvstore.state if pool.kvstore is not None else "off"
    return RequestError(f"the kvstore ({state}) did not answer {what}; retry", status=503,
                        error_type="server_error", code="kvstore_unavailable")


def _name(body: dict[str, Any]) -> str:
    name = body.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise bad("name", "'name' is required: 1 to 128 letters, digits, '.', '_' or '-', starting with a letter "
                  f"or digit; got {short(name)}")
    return name


def _view(snapshot: dict[str, Any], pool: WorkerPool) -> dict[str, Any]:
    """A snapshot as the routes show it: its sizes in the cold tier as the kvstore says
    now, in the hot tier as the worker's last pong said (at most heartbeat_s old; null: not
    loaded); with the old names of renamed fields (`router.old_names`)."""
    info = snapshot.get("info") or {}
    model_id = snapshot["namespace"]
    hot: dict[str, int] | None = None
    supervisor = pool.waits.ready_now(model_id)
    if supervisor is not None and supervisor.last_pong is not None:
        blocks, num_bytes = (supervisor.last_pong.stats.get("snapshots") or {}).get(snapshot["name"], (0, 0))
        hot = {"blocks": blocks, "bytes": num_bytes}
    return old_names.with_old_keys({
        "object": "cache.snapshot",
        "name": snapshot["name"],
        "model": model_id,
        "api": info.get("api"),
        "tokens": info.get("tokens", 0),
        "prompt_tokens": info.get("prompt_tokens", 0),
        "block_tokens": info.get("block_tokens", 0),
        "blocks": snapshot["blocks"],
        "bytes": snapshot["bytes"],
        "cold": {"blocks": snapshot["stored_blocks"], "bytes": snapshot["bytes"]},
        "hot": hot,
        "created": int(snapshot.get("created") or 0),
        "keys": [bytes(k).hex() for k in snapshot["keys"]],
    }, old_names.SNAPSHOT)


async def list_snapshots(request: Request) -> Response:
    """GET /admin/cache/snapshots[?model=NAME]."""
    pool: WorkerPool = request.app.state.pool
    name = request.query_params.get("model")
    model_id = pool.resolve(name)[0] if name is not None else None
    if pool.kvstore is None:
        return JSONResponse({"object": "list", "data": []})
    snapshots = await pool.kvstore.snapshots(model_id)
    if snapshots is None:
        raise _unavailable("the list of snapshots", pool)
    return JSONResponse({"object": "list", "data": [_view(s, pool) for s in snapshots]})


async def _compute(request: Request, model_id: str, add: Any) -> FinishEvent:
    """Run the prompt for one greedy token: prefill computes its blocks, and the worker
    captures them (hot, and written behind to SSD) as for any request."""
    run = dataclasses.replace(add, request_id=f"snapshot-{uuid.uuid4().hex[:24]}",
                              sampling=SamplingParams(max_tokens=1, temperature=0.0), constraint=None,
                              want_progress=False)
    finished = await ask(request, model_id, run, FinishEvent, timeout_s=COMPUTE_TIMEOUT_S)
    assert finished is not None  # asked with load: a model that cannot answer raises
    return finished


async def _pin_in_worker(request: Request, model_id: str, name: str, keys: list[bytes], store: bool
                         ) -> PrefixPinned:
    pinned = await ask(request, model_id, PinPrefix(f"pin-{uuid.uuid4().hex[:24]}", name, keys, store=store),
                       PrefixPinned, timeout_s=WORKER_ANSWER_TIMEOUT_S)
    assert pinned is not None  # asked with load: a model that cannot answer raises
    return pinned


async def _unpin_in_worker(request: Request, model_id: str, name: str) -> None:
    """Drop the snapshot from the worker's hot tier, if the model is loaded; a worker
    that is not (or dies meanwhile) pins only what the kvstore lists when it starts."""
    try:
        await ask(request, model_id, PinPrefix(f"unpin-{uuid.uuid4().hex[:24]}", name, pin=False), PrefixPinned,
                  load=False, timeout_s=30.0)
    except Exception as exc:  # noqa: BLE001  (best effort: the kvstore's pin set is what counts)
        logger.warning("snapshot %r: the worker of %s did not unpin it (%s)", name, model_id, exc)


async def create_snapshot(request: Request) -> Response:
    """POST /admin/cache/snapshots {name, model, messages | input | prompt, ...}."""
    pool: WorkerPool = request.app.state.pool
    body = parse_json_body(await request.body())
    name = _name(body)
    kvstore = _kvstore(pool)
    model_id, api, add = prompt_request(request, pool, body, extra_fields=("name",))
    existing = await kvstore.snapshots()
    if existing is None:
        raise _unavailable("the list of snapshots", pool)
    if any(s["name"] == name for s in existing):
        raise _exists(name)
    probed = await probe_prompt(request, model_id, add)
    if not probed.prefix_cache:
        raise RequestError(f"model '{model_id}' is served without a prefix cache: it has nothing to pin",
                           status=409, code="prefix_cache_off")
    keys = list(probed.keys)
    if not keys:
        raise bad("prompt" if api == "completions" else "messages",
                  f"the prompt is {probed.prompt_tokens} tokens, less than one block ({probed.block_tokens} "
                  "tokens): only whole blocks are cached, so there is nothing to pin")
    tokens = len(keys) * probed.block_tokens
    info = {"model": model_id, "api": api, "tokens": tokens, "prompt_tokens": probed.prompt_tokens,
            "block_tokens": probed.block_tokens}
    pinned = await kvstore.pin(name, model_id, keys, info)
    if pinned is None:
        raise _unavailable("the pin", pool)
    if pinned.error == "exists":
        raise _exists(name)
    if pinned.error:
        raise RequestError(f"snapshot '{name}' was not pinned: {pinned.error}", status=500, error_type="server_error")
    try:
        await _pin_in_worker(request, model_id, name, keys, False)
        computed = None
        if "missing" in probed.tiers:
            computed = await _compute(request, model_id, add)
        stored = await _pin_in_worker(request, model_id, name, keys, True)
        listed = await kvstore.snapshots(model_id)
        snapshot = next((s for s in listed or () if s["name"] == name), None)
        if snapshot is None:
            raise _unavailable("after the pin", pool)
        if snapshot["stored_blocks"] < len(keys):
            raise RequestError(
                f"snapshot '{name}': only {snapshot['stored_blocks']} of its {len(keys)} blocks reached the SSD "
                f"(the kvstore {'did not confirm its writes' if not stored.flushed else 'lacks the rest'}; "
                f"{stored.missing_blocks} were in neither tier); it was not kept, retry",
                status=503, error_type="server_error", code="snapshot_incomplete")
    except BaseException:
        logger.warning("snapshot %r of %s failed; unpinning it", name, model_id)
        await _rollback(request, model_id, name)
        raise
    logger.info("snapshot %r of %s: %d tokens in %d blocks pinned (%s)", name, model_id, tokens, len(keys),
                "computed" if computed is not None else "already cached")
    view = _view(snapshot, pool)
    view["hot"] = {"blocks": stored.hot_blocks, "bytes": stored.hot_bytes}  # fresher than the last pong
    view["computed_tokens"] = (computed.usage.prompt_tokens - computed.usage.cached_tokens) if computed else 0
    view["probe"] = probe_body(model_id, api, probed)
    return JSONResponse(view, status_code=201)


async def _rollback(request: Request, model_id: str, name: str) -> None:
    pool: WorkerPool = request.app.state.pool
    try:
        if pool.kvstore is not None:
            await pool.kvstore.unpin(name)
        await _unpin_in_worker(request, model_id, name)
    except BaseException as exc:  # noqa: BLE001  (the original failure is what the client hears of)
        logger.error("snapshot %r: unpinning after a failure failed too (%r)", name, exc)


def _exists(name: str) -> RequestError:
    return RequestError(f"a snapshot named '{name}' already exists; DELETE /admin/cache/snapshots/{name} first "
                        "or choose another name", status=409, param="name", code="snapshot_exists")


async def delete_snapshot(request: Request) -> Response:
    """DELETE /admin/cache/snapshots/{name}: unpin it in both tiers; its blocks stay cached,
    evictable again like any others."""
    pool: WorkerPool = request.app.state.pool
    name = request.path_params["name"]
    if pool.kvstore is None:
        raise _not_found(name)
    answer = await pool.kvstore.unpin(name)
    if answer is None:
        raise _unavailable("the unpin", pool)
    if answer.error:
        raise RequestError(f"snapshot '{name}' was not unpinned: {answer.error}", status=500,
                           error_type="server_error")
    if answer.snapshot is None:
        raise _not_found(name)
    model_id = answer.snapshot["namespace"]
    await _unpin_in_worker(request, model_id, name)
    logger.info("snapshot %r of %s deleted", name, model_id)
    return JSONResponse({"object": "cache.snapshot.deleted", "name": name, "model": model_id, "deleted": True})


def _not_found(name: str) -> RequestError:
    return RequestError(f"no snapshot named '{name}'", status=404, error_type="not_found_error", param="name",
                        code="snapshot_not_found")
