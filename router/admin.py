"""Routes for operators: `POST /admin/workers/{model}/restart` (more in the admin issue)."""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from router.pool import WorkerPool


async def restart_worker(request: Request) -> Response:
    """Restart one model's worker: in-flight requests drain, pending SSD writes are
    flushed, and the new worker restores prefixes from the SSD tier. Answers when the
    new worker is ready."""
    pool: WorkerPool = request.app.state.pool
    model_id = request.path_params["model_id"]
    supervisor = pool.get(model_id)  # 404 in OpenAI's shape if unknown
    old_pid = supervisor.child.pid if supervisor.child is not None else None
    started = time.monotonic()
    await supervisor.restart()
    return JSONResponse({
        "model": model_id,
        "old_pid": old_pid,
        "pid": supervisor.child.pid if supervisor.child is not None else None,
        "state": supervisor.state,
        "restart_s": round(time.monotonic() - started, 3),
    })
