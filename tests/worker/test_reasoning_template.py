"""A template's reasoning span is read at load: its markers, and whether the generation
prompt opens it (then every answer starts inside it)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import jinja2
import pytest

from worker.reasoning_template import detect_reasoning

CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# a Qwen3-like template: past reasoning rendered back, the span left to the model
QWEN3_LIKE = CHATML.replace("{{ m.content }}", "{% if m.reasoning_content %}<think>\n{{ m.reasoning_content }}\n"
                            "</think>\n\n{% endif %}{{ m.content }}")
# a DeepSeek-R1-like template: the generation prompt opens the span
R1_LIKE = CHATML.replace("assistant\n{% endif %}", "assistant\n<think>\n{% endif %}") + "{# </think> #}"


def tokenizer(template: Any) -> Any:
    def apply(messages: list[dict[str, Any]], tokenize: bool, add_generation_prompt: bool) -> str:
        source = template["default"] if isinstance(template, dict) else template  # as HF picks by name
        return jinja2.Template(source).render(messages=messages, add_generation_prompt=add_generation_prompt)
    return SimpleNamespace(chat_template=template, apply_chat_template=apply)


@pytest.mark.parametrize(("template", "expected"), [
    (CHATML, None),
    (None, None),
    (QWEN3_LIKE, ("<think>", "</think>", False)),
    (R1_LIKE, ("<think>", "</think>", True)),
    ({"default": R1_LIKE, "tool_use": R1_LIKE}, ("<think>", "</think>", True)),
])
def test_the_span_and_who_opens_it(template: Any, expected: Any) -> None:
    assert detect_reasoning(tokenizer(template)) == expected
