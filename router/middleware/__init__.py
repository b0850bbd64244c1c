"""The HTTP middlewares in front of every route: API keys (`auth`), the browser guard
(`web_guard`), the body cap (`body_limit`), the startup and drain gates, the send timeout
and the request id. Pure ASGI, and dialect-blind: a refusal is shaped for its client by
`router.http_errors.error_response_for`."""
