"""An assistant turn of the history that this model generated, marked by the router so the
worker renders it back as the very tokens it generated (the prefix cache holds those).

The router remembers, per tool call id it handed out, the answer's token ids
(`router.call_memory`); when a later request's history holds that answer unchanged (same
text, same calls, same arguments) its chat message carries the ids under
`GENERATED_TOKENS`. The worker (`worker.generated_turns`) splices them in where the
template renders that turn, and renders the message as usual when it cannot.
"""

from __future__ import annotations

GENERATED_TOKENS = "mlxd_generated_tokens"  # chat message key: the answer's token ids, eos excluded
