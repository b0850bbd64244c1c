"""The tool-call formats ("dialects") a model may speak, named once: the worker detects a
model's from its chat template and renders prompts in it, the router parses answers in it
and builds the grammar that forces a call in it.
"""

from __future__ import annotations

HERMES = "hermes"  # <tool_call>\n{"name", "arguments"}\n</tool_call> (Qwen2.5 / Qwen3, Hermes)
LLAMA3_JSON = "llama3_json"  # {"name", "parameters"}, bare or after <|python_tag|> (Llama 3.x)
MISTRAL = "mistral"  # [TOOL_CALLS][{"name", "arguments"}, ...] (Mistral, Mixtral)
# mlxd's own, for templates without tool support: the Hermes markup, described to the
# model by mlxd in the system prompt (worker/tool_prompt.py)
MLXD = "mlxd"

TOOL_DIALECTS = (HERMES, LLAMA3_JSON, MISTRAL, MLXD)

# the markup of the Hermes and mlxd dialects, which the worker writes into prompts and
# the router parses out of answers
CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
RESULT_OPEN = "<tool_response>"
RESULT_CLOSE = "</tool_response>"
