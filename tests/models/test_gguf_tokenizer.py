"""The tokenizer rebuilt from the real SmolLM2 GGUF: exact round trips, special tokens,
the GGUF's chat template, ids equal to an independent byte-level BPE, and the
converted model's greedy answer through mlx-lm."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.models.test_gguf import byte_alphabet
from models.gguf import read_metadata
from models.provision import default_gguf

TEXTS = {
    "ascii": "Hello, world! The quick brown fox jumps over the lazy dog.",
    "accents": "Café naïve résumé — déjà vu, Ångström, Zürich, São Paulo.",
    "cjk": "你好，世界。日本語のテキストと한국어 문장.",
    "emoji": "emoji 🤖🎉 and a family 👨‍👩‍👧 plus skin tone 👍🏽!",
    "code": "def f(x):\n    return x  +  1\n\n\tif x:\r\n        pass   \n# end  ",
    "digits": "In 2024, 3.14159 and 1,000,000 items.",
    "edges": "  leading spaces and trailing  \n\n",
}
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


@pytest.fixture(scope="module")
def metadata(default_model_dir: Path) -> dict[str, Any]:
    from gguf import GGUFReader

    return read_metadata(GGUFReader(default_gguf(default_model_dir.parents[1])))


@pytest.fixture(scope="module")
def loaded(default_model_dir: Path) -> tuple[Any, Any]:
    from mlx_lm import load

    return load(str(default_model_dir))


@pytest.fixture(scope="module")
def tokenizer(loaded: tuple[Any, Any]) -> Any:
    return loaded[1]


def reference_bpe_ids(text: str, metadata: dict[str, Any]) -> list[int]:
    """llama.cpp's "smollm" tokenization, written independently of `tokenizers`: split
    digits, then GPT-2's regex, map bytes to GPT-2's alphabet, merge lowest rank first."""
    regex = pytest.importorskip("regex")
    tokens: list[str] = metadata["tokenizer.ggml.tokens"]
    vocab = {t: i for i, t in enumerate(tokens)}
    ranks = {tuple(m.split(" ", 1)): r for r, m in enumerate(metadata["tokenizer.ggml.merges"])}
    alphabet = byte_alphabet()
    gpt2 = regex.compile(
        r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
    )
    ids: list[int] = []
    for piece in regex.split(r"(\p{N})", text):
        for word in gpt2.findall(piece):
            parts = [alphabet[b] for b in word.encode()]
            while len(parts) > 1:
                pairs = [
                    (ranks.get(p, 1 << 30), i)
                    for i, p in enumerate(zip(parts, parts[1:], strict=False))
                ]
                rank, i = min(pairs)
                if rank == 1 << 30:
                    break
                parts[i : i + 2] = [parts[i] + parts[i + 1]]
            ids.extend(vocab[p] for p in parts)
    return ids


@pytest.mark.parametrize("name", TEXTS)
def test_round_trip_is_exact(tokenizer: Any, name: str) -> None:
    text = TEXTS[name]
    assert tokenizer.decode(tokenizer.encode(text)) == text


@pytest.mark.parametrize("name", TEXTS)
def test_ids_match_an_independent_bpe(tokenizer: Any, metadata: dict, name: str) -> None:
    assert tokenizer.encode(TEXTS[name]) == reference_bpe_ids(TEXTS[name], metadata)


def test_whole_word_tokens_are_their_vocab_index(tokenizer: Any, metadata: dict) -> None:
    tokens: list[str] = metadata["tokenizer.ggml.tokens"]
    words = [" the", " capital", " of", " France", " is", " Paris"]
    assert tokenizer.encode("".join(words)) == [tokens.index("Ġ" + w[1:]) for w in words]
    assert tokenizer.encode("2024") == [tokens.index(d) for d in "2024"]


def test_special_tokens_are_single_ids(tokenizer: Any, metadata: dict) -> None:
    tokens: list[str] = metadata["tokenizer.ggml.tokens"]
    for special in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"):
        assert tokenizer.encode(special) == [tokens.index(special)]
    ids = tokenizer.encode("<|im_start|>user\nhi<|im_end|>")
    assert (ids[0], ids[-1]) == (1, 2)
    assert tokenizer.bos_token == "<|im_start|>" and tokenizer.eos_token == "<|im_end|>"
    assert {2, 0} <= set(tokenizer.eos_token_ids)


def test_chat_template_is_the_ggufs(
    tokenizer: Any, metadata: dict, default_model_dir: Path
) -> None:
    config = json.loads((default_model_dir / "tokenizer_config.json").read_text())
    assert config["chat_template"] == metadata["tokenizer.chat_template"]
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2+2?"}], add_generation_prompt=True, tokenize=False
    )
    assert rendered == (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_greedy_answer_names_paris(loaded: tuple[Any, Any]) -> None:
    from mlx_lm import generate

    model, tokenizer = loaded
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    answer = generate(model, tokenizer, prompt, max_tokens=20, verbose=False)
    assert "Paris" in answer
