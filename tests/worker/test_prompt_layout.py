"""worker.prompt_layout and the `layout` of worker.prompts.render_chat: with the stable_first
layout, two sessions with the same tools and different system texts share a token prefix
that holds every tool; the template layout is the template's own text, byte for byte;
requests without tools and templates whose layout is not recognised render as the
template does."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import transformers

from protocol.settings import TEMPLATE_LAYOUT
from protocol.tool_dialects import LLAMA3_JSON
from tests.worker import chat_templates
from worker.common_prefix import common_prefix
from worker.prompt_layout import ToolsBlock, find_tools_block, special_token_texts, tools_first
from worker.prompts import render_chat, tools_go_first
from worker.tool_prompt import detect_tool_dialect, fallback_tools_text

CLIENTS = Path(__file__).resolve().parents[1] / "clients"
# two projects of one user: Claude Code's system text names the project's directory early
SYSTEM_A = "You are an agent for software engineering.\nPrimary working directory: /home/ana/projects/alpha\n" * 3
SYSTEM_B = "You are an agent for software engineering.\nPrimary working directory: /home/ana/projects/beta\n" * 3
ASK = {"role": "user", "content": "List the files here."}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
# a layout in the style of Llama 3.1's template (written for this test): with tools, the
# system turn changes and the tools go into the first user turn
TOOLS_IN_USER_TURN = (
    "{%- if messages[0]['role'] == 'system' %}{%- set system = messages[0]['content'] %}{%- set messages = "
    "messages[1:] %}{%- else %}{%- set system = '' %}{%- endif %}"
    "<|start_header_id|>system<|end_header_id|>\n\n{% if tools %}Environment: ipython\n{% endif %}{{ system }}"
    "<|eot_id|>{%- for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{%- if loop.first and tools %}Functions:\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}{% endif %}"
    "{{ message['content'] }}<|eot_id|>{%- endfor %}"
    "{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def claude_code_tools() -> list[dict[str, Any]]:
    """The 12 tools of a captured Claude Code turn, in OpenAI's shape (~8K tokens on Qwen)."""
    body = json.loads((CLIENTS / "claude-code-messages-main-turn-default-model.json").read_text())["body"]
    return [{"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                              "parameters": t["input_schema"]}} for t in body["tools"]]


@pytest.fixture(scope="module")
def qwen(qwen_model_dir: Path) -> Any:
    """Qwen2.5-Coder's real tokenizer and template (tools in the system turn, after the system text)."""
    return transformers.AutoTokenizer.from_pretrained(qwen_model_dir)


@pytest.fixture(scope="module")
def smollm2(default_model_dir: Path) -> Any:
    """SmolLM2's real tokenizer: its template has no tools, so they go in mlxd's fallback dialect."""
    return transformers.AutoTokenizer.from_pretrained(default_model_dir)


def template_text(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    return tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)


def test_qwen_sessions_with_other_system_texts_share_every_tool(qwen: Any) -> None:
    """The issue's case: another project, the same tools. Stable first, the shared prefix
    holds every tool; laid out as the template does, it ends inside the system text."""
    tools = claude_code_tools()
    tools_tokens = len(qwen.encode("\n".join(json.dumps(t) for t in tools), add_special_tokens=False))
    assert tools_tokens > 4000
    a, b = ([{"role": "system", "content": system}, ASK] for system in (SYSTEM_A, SYSTEM_B))
    shared = common_prefix(render_chat(qwen, a, tools), render_chat(qwen, b, tools))
    assert shared > tools_tokens
    as_template = common_prefix(render_chat(qwen, a, tools, layout=TEMPLATE_LAYOUT),
                                render_chat(qwen, b, tools, layout=TEMPLATE_LAYOUT))
    assert as_template < len(qwen.encode(SYSTEM_A, add_special_tokens=False))


def test_qwen_stable_first_is_the_template_with_the_tools_block_moved(qwen: Any) -> None:
    messages = [{"role": "system", "content": SYSTEM_A}, ASK]
    ours = qwen.decode(render_chat(qwen, messages, [WEATHER]))
    theirs = template_text(qwen, messages, [WEATHER])
    start, rest = "<|im_start|>system\n", "<|im_end|>\n<|im_start|>user\nList the files here.<|im_end|>\n"
    block = theirs[len(start) + len(SYSTEM_A) + 2: theirs.index(rest)]
    assert block.startswith("# Tools\n\n") and block.endswith("</tool_call>")
    assert theirs.startswith(start + SYSTEM_A + "\n\n" + block + rest)
    assert ours == start + block + "\n\n" + SYSTEM_A + rest + "<|im_start|>assistant\n"


@pytest.mark.parametrize("name", ["qwen", "smollm2"])
def test_both_layouts_hold_the_same_special_tokens(name: str, request: pytest.FixtureRequest) -> None:
    """The move stays inside the system turn: the special tokens (turn markers) are the
    same, in the same order, and every other token is only rearranged."""
    tokenizer = request.getfixturevalue(name)
    special = set(tokenizer.all_special_ids)
    messages = [{"role": "system", "content": SYSTEM_A}, ASK]
    ours = render_chat(tokenizer, messages, [WEATHER])
    theirs = render_chat(tokenizer, messages, [WEATHER], layout=TEMPLATE_LAYOUT)
    assert ours != theirs
    assert [t for t in ours if t in special] == [t for t in theirs if t in special]
    assert abs(len(ours) - len(theirs)) <= 2  # only the seams between the moved texts may tokenize otherwise


def test_the_template_layout_is_apply_chat_template_byte_for_byte(qwen: Any) -> None:
    tools = claude_code_tools()
    for messages in ([{"role": "system", "content": SYSTEM_A}, ASK], [ASK]):
        text = template_text(qwen, messages, tools)
        ids = render_chat(qwen, messages, tools, layout=TEMPLATE_LAYOUT)
        assert qwen.decode(ids) == text
        expected = qwen.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True)
        assert ids == list(expected["input_ids"] if "input_ids" in expected else expected)


@pytest.mark.parametrize("name", ["qwen", "smollm2"])
def test_without_tools_both_layouts_render_as_today(name: str, request: pytest.FixtureRequest) -> None:
    tokenizer = request.getfixturevalue(name)
    messages = [{"role": "system", "content": SYSTEM_A}, ASK]
    ids = render_chat(tokenizer, messages, None)
    assert ids == render_chat(tokenizer, messages, None, layout=TEMPLATE_LAYOUT)
    assert tokenizer.decode(ids) == template_text(tokenizer, messages, None)


def test_without_a_system_text_qwen_renders_as_the_template(qwen: Any) -> None:
    """Qwen's template writes its own default system text then: as stable as the tools."""
    assert render_chat(qwen, [ASK], [WEATHER]) == render_chat(qwen, [ASK], [WEATHER], layout=TEMPLATE_LAYOUT)


def test_fallback_sessions_with_other_system_texts_share_every_tool(smollm2: Any) -> None:
    tools = claude_code_tools()
    block_tokens = len(smollm2.encode(fallback_tools_text(tools), add_special_tokens=False))
    a, b = ([{"role": "system", "content": system}, ASK] for system in (SYSTEM_A, SYSTEM_B))
    assert common_prefix(render_chat(smollm2, a, tools), render_chat(smollm2, b, tools)) > block_tokens
    assert common_prefix(render_chat(smollm2, a, tools, layout=TEMPLATE_LAYOUT),
                         render_chat(smollm2, b, tools, layout=TEMPLATE_LAYOUT)) < block_tokens
    text = smollm2.decode(render_chat(smollm2, a, [WEATHER]))
    assert text.startswith("<|im_start|>system\n# Tools\n")
    assert text.endswith("When no function is needed, answer normally.\n\n" + SYSTEM_A
                         + "<|im_end|>\n<|im_start|>user\nList the files here.<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("name", ["qwen", "smollm2"])
def test_stable_first_is_deterministic_and_turn_two_extends_turn_one(name: str, request: pytest.FixtureRequest) -> None:
    tokenizer = request.getfixturevalue(name)
    one = [{"role": "system", "content": SYSTEM_A}, {"role": "user", "content": "Weather in Paris?"}]
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
    two = [*one, {"role": "assistant", "content": "", "tool_calls": [call]},
           {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]
    first = render_chat(tokenizer, one, [WEATHER])
    assert render_chat(tokenizer, [dict(m) for m in one], [dict(WEATHER)]) == first
    assert render_chat(tokenizer, two, [WEATHER])[: len(first)] == first


def test_a_late_system_message_stays_after_the_tools(qwen: Any) -> None:
    """Claude Code's system entries inside `messages` render in place (Qwen's template takes
    them); only the leading system text moves."""
    messages = [{"role": "system", "content": SYSTEM_A}, ASK, {"role": "assistant", "content": "Sure."},
                {"role": "system", "content": "Note: be brief."}, {"role": "user", "content": "Go on."}]
    text = qwen.decode(render_chat(qwen, messages, [WEATHER]))
    assert text.index("</tools>") < text.index(SYSTEM_A) < text.index("Note: be brief.")
    assert text.count("<|im_start|>system\n") == 2


def test_a_template_with_tools_in_the_user_turn_renders_as_the_template(smollm2: Any) -> None:
    """Llama 3.x style: tools in the first user turn, and the system turn changes with
    tools: not the layout stable_first moves, so the template's own text."""
    original = smollm2.chat_template
    smollm2.chat_template = TOOLS_IN_USER_TURN
    try:
        messages = [{"role": "system", "content": SYSTEM_A}, ASK]
        ours = render_chat(smollm2, messages, [WEATHER])
        assert ours == render_chat(smollm2, messages, [WEATHER], layout=TEMPLATE_LAYOUT)
        assert smollm2.decode(ours) == template_text(smollm2, messages, [WEATHER])
        assert not tools_go_first(smollm2)
        assert detect_tool_dialect(TOOLS_IN_USER_TURN) == LLAMA3_JSON
    finally:
        smollm2.chat_template = original


def test_which_models_get_tools_first(qwen: Any, smollm2: Any) -> None:
    assert tools_go_first(qwen)  # Hermes template, tools after the system text
    assert tools_go_first(smollm2)  # mlxd's fallback dialect


def test_the_turn_markers_are_special_and_the_call_markup_is_not(qwen: Any) -> None:
    """The tools block holds `<tool_call>` (an added token, not a special one): it may move;
    a block holding `<|im_end|>` may not."""
    texts = special_token_texts(qwen)
    assert {"<|im_start|>", "<|im_end|>"} <= set(texts)
    assert "<tool_call>" not in texts


def test_the_qwen_template_of_the_tests_is_recognised(smollm2: Any) -> None:
    original = smollm2.chat_template
    smollm2.chat_template = chat_templates.QWEN25
    try:
        assert tools_go_first(smollm2)
    finally:
        smollm2.chat_template = original


# ---------------------------------------------------------------- pure: fake renderers


def chatml(tools_after_system: str | None, turn_end: str = "<|im_end|>\n") -> Callable[..., str]:
    """A renderer writing `tools_after_system` (with the tool names) after the system text."""
    def render(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        out = ""
        for i, message in enumerate(messages):
            out += f"<|im_start|>{message['role']}\n{message['content']}"
            if i == 0 and tools and tools_after_system is not None:
                out += tools_after_system.format(names=",".join(t["function"]["name"] for t in tools))
            out += turn_end
        return out + "<|im_start|>assistant\n"
    return render


SPECIAL = ["<|im_start|>", "<|im_end|>"]


@pytest.mark.parametrize("inserted, found", [
    ("\n\n# Tools: {names}", ToolsBlock("<|im_start|>system\n", "\n\n", "# Tools: {names}")),
    ("\n# Tools: {names}\n", ToolsBlock("<|im_start|>system\n", "\n", "# Tools: {names}\n")),
    ("# Tools: {names}", None),  # no separator: the texts would run together
    ("\n\n", None),  # nothing but whitespace
    ("\n\n# Tools: {names}<|im_end|>\n<|im_start|>system\nmore", None),  # a block that ends the turn
    (None, None),  # tools not rendered after the system text
])
def test_find_tools_block(inserted: str | None, found: ToolsBlock | None) -> None:
    result = find_tools_block(chatml(inserted), "system", [WEATHER], SPECIAL)
    if found is None:
        assert result is None
    else:
        assert result == ToolsBlock(found.head, found.separator, found.block.format(names="get_weather"))


def test_a_template_that_fails_on_the_probe_is_not_moved() -> None:
    def refuses(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        raise ValueError("no")

    assert find_tools_block(refuses, "system", [WEATHER], SPECIAL) is None
    assert tools_first(refuses, [{"role": "system", "content": "S"}, ASK], [WEATHER], "as is", SPECIAL) == "as is"


@pytest.mark.parametrize("messages", [
    [ASK],  # no system text
    [{"role": "system", "content": "  "}, ASK],  # an empty one
], ids=["no-system", "blank-system"])
def test_tools_first_leaves_what_it_cannot_move(messages: list[dict[str, Any]]) -> None:
    render = chatml("\n\n# Tools: {names}")
    text = render(messages, [WEATHER])
    assert tools_first(render, messages, [WEATHER], text, SPECIAL) == text


def test_tools_first_moves_the_block_before_the_system_text() -> None:
    render = chatml("\n\n# Tools: {names}")
    messages = [{"role": "system", "content": "Be terse."}, ASK]
    moved = tools_first(render, messages, [WEATHER], render(messages, [WEATHER]), SPECIAL)
    assert moved == ("<|im_start|>system\n# Tools: get_weather\n\nBe terse.<|im_end|>\n"
                     "<|im_start|>user\nList the files here.<|im_end|>\n<|im_start|>assistant\n")
    # text the template rendered otherwise than the probe showed is left as it is
    assert tools_first(render, messages, [WEATHER], "<|im_start|>system\nBe terse!", SPECIAL) == \
        "<|im_start|>system\nBe terse!"
