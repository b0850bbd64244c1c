"""Chat templates of real model families, for tests that need no model files: Qwen2.5's
(tools in the Hermes dialect) as it ships in its tokenizer_config.json, and the tool parts
of Llama 3.1's and Mistral's, enough to tell their dialects apart."""

QWEN25 = r'''{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
'''

SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

LLAMA31_TOOL_PART = (
    "{%- if tools is not none %}{{- '<|start_header_id|>ipython<|end_header_id|>' }}{%- endif %}"
    "{%- if builtin_tools is defined %}{{- '<|python_tag|>' }}{%- endif %}"
)

MISTRAL_TOOL_PART = "{%- if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{%- endif %}[TOOL_CALLS]"


def thinking(opens_in_prompt: bool) -> str:
    """QWEN25 as a reasoning model's template (the shape of Qwen3's): an assistant turn
    after the last user message shows its `reasoning_content` in a `<think>` span, earlier
    ones drop it; the generation prompt opens the span itself when `opens_in_prompt`."""
    template = QWEN25.replace(
        '(message.role == "assistant" and not message.tool_calls)', 'false').replace(
        "{{- '<|im_start|>' + message.role }}\n        {%- if message.content %}",
        "{{- '<|im_start|>' + message.role }}\n        {%- if message.reasoning_content and loop.index0 > ns.last_query %}"
        "{{- '\\n<think>\\n' + message.reasoning_content.strip('\\n') + '\\n</think>\\n' }}{%- endif %}"
        "\n        {%- if message.content %}").replace(
        "{%- for tool_call in message.tool_calls %}", "{%- for tool_call in message.tool_calls or [] %}").replace(
        "{{- '<|im_start|>assistant\\n' }}", "{{- '<|im_start|>assistant\\n" + ("<think>\\n" if opens_in_prompt else "")
        + "' }}")
    last_query = ("{%- set ns = namespace(last_query=-1) %}{%- for message in messages %}"
                  "{%- if message.role == 'user' %}{%- set ns.last_query = loop.index0 %}{%- endif %}{%- endfor %}\n")
    assert template.count("<think>") == 1 + opens_in_prompt
    return last_query + template
