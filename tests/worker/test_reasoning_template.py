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


def test_the_budget_turns_a_templates_thinking_switch(qwen_model_dir: Any) -> None:
    """A budget of 0 renders the template's `enable_thinking` off (Qwen3's shape: an empty
    span in the generation prompt), any other budget on; no budget leaves mlx-lm's default
    (on where the vocabulary has a `<think>` token: not Qwen2.5's). A template without the
    switch is rendered as it is."""
    from mlx_lm.utils import load_tokenizer

    from worker.prompts import render_chat_text
    from worker.reasoning_template import thinking_switch

    real = load_tokenizer(qwen_model_dir)
    ask = [{"role": "user", "content": "2+2?"}]
    assert thinking_switch(real, 0) == {}  # Qwen2.5's template has no switch
    real._tokenizer.chat_template = QWEN3_LIKE.replace(
        "assistant\n{% endif %}", "assistant\n{% if enable_thinking is defined and not enable_thinking %}"
        "<think>\n\n</think>\n\n{% endif %}{% endif %}")
    assert [thinking_switch(real, b) for b in (None, 0, 512)] == [{}, {"enable_thinking": False},
                                                                 {"enable_thinking": True}]
    off, on, default = (render_chat_text(real, ask, None, switches=thinking_switch(real, b)) for b in (0, 512, None))
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n") and on.endswith("assistant\n")
    assert default == (on if real.has_thinking else off) and not real.has_thinking
