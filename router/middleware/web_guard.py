"""What a web page may make the router do: the Host / Origin / Content-Type guard, CORS for
the origins the user lists, and the part of /health a caller without the API key sees.

A browser lets any page send requests to 127.0.0.1; these rules make sure such requests
are refused, so a keyless service on loopback is not an open door to every site visited.
"""

from __future__ import annotations

import ipaddress
import logging
from typing import Any

from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from router.api_keys import KeyRing, KeyState
from router.middleware.auth import supplied_key
from router.config import RouterConfig
from router.http_errors import error_response

logger = logging.getLogger(__name__)

ANY = "*"
CORS_METHODS = ("GET", "POST")
# the openai SDK honours Retry-After on a 503; a page's script can only read it if exposed
CORS_EXPOSED_HEADERS = ("Retry-After",)


def split_authority(value: str) -> tuple[str, int | None] | None:
    """`name[:port]` or `[ipv6][:port]` (a Host header, or an origin after `scheme://`) as
    (lowercase name without brackets or trailing dot, port); None if malformed."""
    value = value.strip().lower()
    if value.startswith("["):
        name, bracket, rest = value[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            return None
        port = rest[1:] if rest else None
    else:
        name, colon, port_text = value.partition(":")
        port = port_text if colon else None
    if port is not None and not port.isdigit():
        return None
    name = name.removesuffix(".")
    return (name, int(port) if port is not None else None) if name else None


def is_loopback_name(name: str) -> bool:
    """localhost, *.localhost (RFC 6761: always loopback), 127.0.0.0/8 and ::1."""
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def is_json(content_type: str | None) -> bool:
    """`application/json`, in any case, with or without parameters such as charset."""
    return content_type is not None and content_type.partition(";")[0].strip().lower() == "application/json"


def has_body(headers: Headers) -> bool:
    """True unless the request declares an empty body (no Content-Length or 0, not chunked)."""
    if "transfer-encoding" in headers:
        return True
    try:
        return int(headers.get("content-length", "0")) != 0
    except ValueError:
        return True


class WebGuard:
    """Refuses what only a foreign web page would send, before the API-key check.

    Without an API key: the Host must name this machine (loopback, --host or
    `allowed_hosts`), else DNS rebinding would let a site read the answers; and a POST with
    a body must be application/json, since only a CORS preflight (which the Origin rule
    refuses) lets a page send that. With or without a key: an `Origin` other than the
    service's own or one in `cors_origins` is refused, so admin routes (POSTs with no body)
    cannot be triggered from any page. A request with no Host header (HTTP/1.0) passes:
    browsers always send one, so it cannot come from a page.

    A pure ASGI middleware: accepted requests, streams and disconnects pass untouched.
    """

    def __init__(self, app: ASGIApp, config: RouterConfig, keys: KeyState) -> None:
        self.app = app
        self.keys = keys  # read per request: a reload may add or drop keys
        self.port = config.port
        hosts = {name.lower().strip("[]") for name in (config.host, *config.allowed_hosts)}
        self.any_host = ANY in hosts
        self.hosts = frozenset(hosts - {ANY})
        origins = {origin.lower() for origin in config.cors_origins}
        self.any_origin = ANY in origins
        self.cors_origins = frozenset(origins - {ANY})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        refusal = self.refusal(scope["method"], headers)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        origin = headers.get("origin")
        if origin is not None and self.is_cors_origin(origin):
            # a listed page's script may read why it was refused
            refusal.headers["Access-Control-Allow-Origin"] = origin
            refusal.headers["Vary"] = "Origin"
        logger.info("refused %s %s: %s", scope["method"], scope["path"], refusal.body.decode())
        await refusal(scope, receive, send)

    def refusal(self, method: str, headers: Headers) -> JSONResponse | None:
        """The error answering this request, or None to let it through."""
        host = headers.get("host")
        keyless = not self.keys.ring.required
        if keyless and host is not None and not self.is_allowed_host(host):
            return error_response(
                403, f"Host {host!r} is not allowed without an API key (this guards against DNS rebinding); "
                "add its name to allowed_hosts (--allowed-hosts) or set api_key",
                "permission_error", None, "host_not_allowed")
        origin = headers.get("origin")
        if origin is not None and not (self.is_own_origin(origin) or self.is_cors_origin(origin)):
            return error_response(
                403, f"Origin {origin!r} is not allowed: web pages may call mlxd only from an origin "
                "listed in cors_origins (--cors-origins)", "permission_error", None, "origin_not_allowed")
        content_type = headers.get("content-type")
        if keyless and method == "POST" and has_body(headers) and not is_json(content_type):
            return error_response(
                415, f"send Content-Type: application/json (got {content_type!r})",
                "invalid_request_error", None, "unsupported_media_type")
        return None

    def is_allowed_host(self, host: str) -> bool:
        """A Host header value naming this machine, or one the user allowed."""
        parts = split_authority(host)
        if parts is None:
            return False
        return self.any_host or parts[0] in self.hosts or is_loopback_name(parts[0])

    def is_own_origin(self, origin: str) -> bool:
        """http://NAME:PORT where NAME names this machine and PORT is the bound one. A "*"
        in allowed_hosts does not count: it would make every site's origin our own."""
        scheme, separator, authority = origin.lower().partition("://")
        parts = split_authority(authority) if separator and scheme == "http" else None
        if parts is None:
            return False
        name, port = parts
        return (port or 80) == self.port and (name in self.hosts or is_loopback_name(name))

    def is_cors_origin(self, origin: str) -> bool:
        """An origin the user listed in cors_origins ("null", a sandboxed page, only via "*")."""
        return self.any_origin or origin.lower() in self.cors_origins


def web_middleware(config: RouterConfig, keys: KeyState) -> list[Middleware]:
    """The guard, then (if origins are listed) Starlette's CORS answers for them, both
    outside the API-key check so that a preflight, which never carries the key, is answered.

    Any request header a listed origin asks for is allowed: the origin is the trust
    decision, and SDKs add headers of their own (x-stainless-*, anthropic-*) over time.
    """
    stack = [Middleware(WebGuard, config=config, keys=keys)]
    if config.cors_origins:
        stack.append(Middleware(
            CORSMiddleware,
            allow_origins=[origin.lower() for origin in config.cors_origins],
            allow_methods=CORS_METHODS,
            allow_headers=[ANY],
            expose_headers=CORS_EXPOSED_HEADERS,
            allow_private_network=True,  # Chrome asks before a public page may reach loopback
        ))
    return stack


def holds_key(headers: Headers, ring: KeyRing) -> bool:
    """True if the caller may see everything: no key is configured, or it sent one."""
    return not ring.required or ring.match(supplied_key(headers)) is not None


def states_only(health: dict[str, Any]) -> dict[str, Any]:
    """/health for a caller without the key: enough for a probe, no pids, paths or error text."""
    body: dict[str, Any] = {
        "status": health["status"],
        "workers": {model: {"state": worker["state"]} for model, worker in health["workers"].items()},
    }
    if "kvstore" in health:
        body["kvstore"] = {"state": health["kvstore"]["state"]}
    return body
