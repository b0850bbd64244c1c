"""The HTTP API: one module per dialect (its body in, its wire format out) over the one
request path in `router.requests`, plus the model list and health routes."""
