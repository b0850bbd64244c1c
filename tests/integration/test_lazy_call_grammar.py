"""The lazy call grammar of `tool_choice: "auto"` end to end, in every dialect: a model
pulled toward arguments its tool forbids still returns only schema-valid calls, streamed
and not, and no call is ever cut into the text; with the grammar switched off (a profile)
the same request returns broken calls, so the test can fail.

The models are tiny random llamas with SmolLM2's tokenizer and each family's real chat
template (Qwen2.5's for hermes, none for mlxd's fallback); each tokenizer gets its family's
call opener as a token of its own (`<tool_call>`, `<|python_tag|>`, `[TOOL_CALLS]`), so a
`logit_bias` makes even a random model open calls, and a second bias pulls it toward
values the schema does not allow."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest

from tests.added_tokens import SMOLLM2_VOCAB, add_tokens
from tests.integration.service import Service, running_service
from tests.integration.test_template_tool_calls import TEMPLATES
from tests.integration.test_pool import make_tiny_dir

pytestmark = pytest.mark.timeout(900)

WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]},
                   "unit": {"type": "string", "enum": ["c", "f"]}},
    "required": ["city", "unit"], "additionalProperties": False,
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
                                           "parameters": WEATHER_PARAMETERS}}]
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
OPENERS = {"hermes": ["<tool_call>", "</tool_call>"], "llama3_json": ["<|python_tag|>"],
           "mistral": ["[TOOL_CALLS]"], "mlxd": ["<tool_call>", "</tool_call>"]}
VOCAB = SMOLLM2_VOCAB  # the openers are added after it


@pytest.fixture(scope="module")
def models(default_model_dir: Path, qwen_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    models = tmp_path_factory.mktemp("models")
    base = make_tiny_dir(tmp_path_factory.mktemp("base") / "tiny", default_model_dir, vocab_size=VOCAB + 8)
    templates = {"hermes": json.loads((qwen_model_dir / "tokenizer_config.json").read_text())["chat_template"],
                 "llama3_json": (TEMPLATES / "llama-3.1-instruct.jinja").read_text(),
                 "mistral": (TEMPLATES / "mistral-7b-instruct-v0.3.jinja").read_text(), "mlxd": None}
    for dialect, template in templates.items():
        target = models / f"tiny-{dialect}"
        shutil.copytree(base, target)
        config_path = target / "tokenizer_config.json"
        config = json.loads(config_path.read_text())
        if template is not None:  # else SmolLM2's own, which renders no tools: mlxd's fallback
            config["chat_template"] = template
        config_path.write_text(json.dumps(config))
        add_tokens(target, OPENERS[dialect], special=dialect in ("llama3_json", "mistral"))
    return models


@pytest.fixture(scope="module")
def service(models: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    home = tmp_path_factory.mktemp("home")
    profiles = "".join(f'[profiles."tiny-{d}:free"]\ntool_call_grammar = false\n' for d in OPENERS)
    (home / "config.toml").write_text(profiles)
    with running_service(["--model-dir", str(models), "--model", "tiny-hermes", "--no-cold-tier"], home) as svc:
        yield svc


@pytest.fixture(scope="module")
def client(service: Service) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{service.base_url}/v1", api_key="unused", max_retries=0, timeout=300)


def pulled(dialect: str) -> dict[str, int]:
    """Toward the family's opener, and toward values the tool does not allow."""
    bias = {str(VOCAB): 100}
    for word in ("kelvin", "Berlin", "celsius"):
        bias[str(SMOL_IDS[word])] = 60
    return bias


# the first token of each word in SmolLM2's vocabulary (no leading space)
SMOL_IDS: dict[str, int] = {}


@pytest.fixture(scope="module", autouse=True)
def smol_ids(default_model_dir: Path) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(default_model_dir / "tokenizer.json"))
    for word in ("kelvin", "Berlin", "celsius"):
        SMOL_IDS[word] = tokenizer.encode(word, add_special_tokens=False).ids[0]


def ask(client: openai.OpenAI, model: str, dialect: str, stream: bool) -> tuple[str | None, list[tuple[str, str]]]:
    body: dict[str, Any] = dict(model=model, messages=MESSAGES, tools=TOOLS, max_tokens=80, temperature=0,
                                logit_bias=pulled(dialect))
    if not stream:
        message = client.chat.completions.create(**body).choices[0].message
        return message.content, [(c.function.name, c.function.arguments) for c in message.tool_calls or []]
    text, calls = "", {}
    for chunk in client.chat.completions.create(**body, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        text += delta.content or ""
        for call in delta.tool_calls or []:
            name, arguments = calls.get(call.index, ("", ""))
            calls[call.index] = (name + (call.function.name or ""), arguments + (call.function.arguments or ""))
    return text or None, [calls[i] for i in sorted(calls)]


def valid(calls: list[tuple[str, str]]) -> bool:
    for name, arguments in calls:
        if name != "get_weather":
            return False
        try:
            jsonschema.validate(json.loads(arguments), WEATHER_PARAMETERS)
        except (ValueError, jsonschema.ValidationError):
            return False
    return bool(calls)


@pytest.mark.parametrize("dialect", list(OPENERS))
def test_a_pulled_model_returns_only_valid_calls_and_none_is_cut(client: openai.OpenAI, dialect: str) -> None:
    model = f"tiny-{dialect}"
    content, calls = ask(client, model, dialect, stream=False)
    assert valid(calls), (content, calls)
    for opener in OPENERS[dialect]:  # no call, whole or cut, is left in the text
        assert opener not in (content or "")
    assert ask(client, model, dialect, stream=True) == (content, calls)
    free_content, free_calls = ask(client, f"{model}:free", dialect, stream=False)  # the control
    assert not valid(free_calls), (free_content, free_calls)


@pytest.mark.parametrize("dialect", list(OPENERS))
def test_no_budget_cuts_a_call_into_the_text(client: openai.OpenAI, dialect: str) -> None:
    """Budgets around a call's length: every answer is whole calls, or text without any
    call markup; with the grammar off some budget cuts a call into the text (the control,
    where the opener is text: Llama's and Mistral's are special tokens the detokenizer
    drops, and a free random model writes no call object after them to cut)."""
    def cut(model: str, max_tokens: int) -> bool:
        message = client.chat.completions.create(model=model, messages=MESSAGES, tools=TOOLS, max_tokens=max_tokens,
                                                 temperature=0, logit_bias=pulled(dialect)).choices[0].message
        calls = [(c.function.name, c.function.arguments) for c in message.tool_calls or []]
        leaked = any(mark in (message.content or "") for mark in (*OPENERS[dialect], '"name"'))
        return leaked or (bool(calls) and not valid(calls))
    budgets = range(4, 40, 5)
    assert not [n for n in budgets if cut(f"tiny-{dialect}", n)]
    if dialect in ("hermes", "mlxd"):
        assert [n for n in budgets if cut(f"tiny-{dialect}:free", n)]
