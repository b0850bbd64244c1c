"""What a dialect registers (`router.api.registry`): its routes with their OpenAPI schemas,
the prompt a body of it would send (the cache probe and snapshots take a body of any
dialect), and how it answers a request refused before its route runs. Everything outside
`router/api/` reads dialects through these records, never a dialect module itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response

from protocol.messages import AddRequest
from router.http_errors import ErrorShape
from router.profiles import Profile

Schema = dict[str, Any]


@dataclass(frozen=True)
class Endpoint:
    """One route of a dialect, as the app mounts it and /openapi.json describes it."""

    path: str
    method: str
    handler: Callable[[Request], Awaitable[Response]]
    summary: str
    schema: Schema | None = None  # its JSON body


@dataclass(frozen=True)
class DialectEntry:
    """One dialect, as the rest of the router sees it.

    `prompt` renders nothing: it parses a body as the dialect's own route would (profile,
    tools, salt, billing-line rule) into the request whose prompt the worker would render,
    so a probe or a snapshot sees exactly the prompt a real request would. `claims` says
    whether a probe body that does not name its `api` is this dialect's; the registry asks
    in its order, the most specific first."""

    name: str
    endpoints: tuple[Endpoint, ...]
    prompt: Callable[[Request, dict[str, Any], Profile | None], AddRequest] | None = None
    claims: Callable[[dict[str, Any], Headers], bool] | None = None
    error_shape: ErrorShape | None = None
