"""Rebuild a Hugging Face tokenizer (tokenizer.json and its configs) from GGUF metadata.

Owns the byte-level BPE vocab ("gpt2" tokenizer model) and the pre-tokenizer regexes,
chosen from `tokenizer.ggml.pre` the way llama.cpp's llama-vocab.cpp chooses them.
"""

from __future__ import annotations

import json
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

# llama.cpp token types (llama_token_type).
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _family(names: str, regexes: list[str], *, ignore_merges: bool = False,
            add_bos: bool = False) -> dict[str, tuple[list[str], bool, bool]]:
    return {name: (regexes, ignore_merges, add_bos) for name in names.split()}


# tokenizer.ggml.pre -> (split regexes applied in order, ignore_merges, default add_bos).
# Each regex splits every piece left by the previous one, keeping matches and gaps
# alike (llama.cpp's unicode_regex_split), which is a tokenizers Split "isolated".
PRE_TOKENIZERS: dict[str, tuple[list[str], bool, bool]] = {
    **_family("default", [r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]"]),
    **_family(
        "llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2",
        [_LLAMA3],
        ignore_merges=True,
        add_bos=True,
    ),
    **_family("dbrx smaug-bpe", [_LLAMA3]),
    **_family("qwen2 deepseek-r1-qwen kormo megrez stablelm2 hunyuan", [_QWEN2]),
    **_family(
        "smollm starcoder refact command-r codeshell exaone minerva-7b", [r"\p{N}", _GPT2]
    ),
    **_family(
        "gpt-2 phi-2 mpt olmo jais trillion granite-docling jina-es jina-de gigachat "
        "jina-v2-es jina-v2-de a.x-4.0 mellum exaone4",
        [_GPT2],
    ),
}

# Texts llama.cpp treats as end-of-generation when they are control tokens.
_END_OF_GENERATION_TEXTS = frozenset(
    {
        "<|eot_id|>",
        "<|eom_id|>",
        "<|im_end|>",
        "<|end|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "<|end_of_text|>",
        "<EOT>",
        "<｜end▁of▁sentence｜>",
    }
)


# Short role -> the GGUF metadata key holding its token id.
_ID_KEYS = {
    "bos": "tokenizer.ggml.bos_token_id",
    "eos": "tokenizer.ggml.eos_token_id",
    "eot": "tokenizer.ggml.eot_token_id",
    "eom": "tokenizer.ggml.eom_token_id",
    "unk": "tokenizer.ggml.unknown_token_id",
    "pad": "tokenizer.ggml.padding_token_id",
}


def _token_id(metadata: dict[str, Any], key: str, num_tokens: int) -> int | None:
    value = metadata.get(_ID_KEYS[key])
    if value is None or not 0 <= int(value) < num_tokens:
        return None
    return int(value)


def _tokens(metadata: dict[str, Any]) -> list[str]:
    # llama.cpp names empty vocab entries the same way, so ids keep their text.
    tokens: list[str] = metadata["tokenizer.ggml.tokens"]
    return [text or f"[EMPTY_{index}]" for index, text in enumerate(tokens)]


def _token_types(metadata: dict[str, Any], num_tokens: int) -> list[int]:
    """One llama.cpp token type per token; NORMAL (1) where the GGUF has none."""
    types = list(metadata.get("tokenizer.ggml.token_type") or [])[:num_tokens]
    return types + [1] * (num_tokens - len(types))


def _pre_tokenizer(pre: str) -> tuple[list[str], bool, bool]:
    if pre not in PRE_TOKENIZERS:
        known = ", ".join(sorted(PRE_TOKENIZERS))
        raise ValueError(
            f"GGUF tokenizer.ggml.pre {pre!r} is not supported (known: {known})"
        )
    return PRE_TOKENIZERS[pre]


def _split_merge(merge: str) -> tuple[str, str]:
    # llama.cpp splits at the first space after the first character.
    cut = merge.find(" ", 1)
    if cut < 0:
        raise ValueError(f"GGUF merge {merge!r} has no separating space")
    return merge[:cut], merge[cut + 1 :]


def build_tokenizer(metadata: dict[str, Any]) -> Tokenizer:
    """A `tokenizers.Tokenizer` equivalent to llama.cpp's view of this GGUF vocab."""
    model = metadata.get("tokenizer.ggml.model")
    if model != "gpt2":
        kind = "SentencePiece" if model == "llama" else "unknown"
        raise ValueError(
            f"GGUF tokenizer.ggml.model {model!r} ({kind}) is not supported: only 'gpt2' "
            "(byte-level BPE) vocabularies can be converted"
        )
    tokens = _tokens(metadata)
    token_types = _token_types(metadata, len(tokens))
    regexes, ignore_merges, default_add_bos = _pre_tokenizer(
        metadata.get("tokenizer.ggml.pre", "default")
    )
    merges = [_split_merge(m) for m in metadata.get("tokenizer.ggml.merges", [])]
    vocab = {text: index for index, text in enumerate(tokens)}

    tokenizer = Tokenizer(
        models.BPE(vocab=vocab, merges=merges, ignore_merges=ignore_merges, fuse_unk=False)
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()

    # Control tokens are HF "special" (skipped by skip_special_tokens); user-defined
    # ones are plain added tokens: matched whole, but kept when decoding (tool tags).
    added = [
        AddedToken(text, special=kind == TOKEN_TYPE_CONTROL, normalized=False)
        for text, kind in zip(tokens, token_types, strict=True)
        if kind in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED)
    ]
    tokenizer.add_tokens(added)

    add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", default_add_bos))
    add_eos = bool(metadata.get("tokenizer.ggml.add_eos_token", False))
    steps = [processors.ByteLevel(trim_offsets=False)]
    bos = _token_id(metadata, "bos", len(tokens))
    eos = _token_id(metadata, "eos", len(tokens))
    prefix = [(tokens[bos], bos)] if add_bos and bos is not None else []
    suffix = [(tokens[eos], eos)] if add_eos and eos is not None else []
    if prefix or suffix:
        before, after = [t for t, _ in prefix], [t for t, _ in suffix]
        single = " ".join([*before, "$A", *after])
        pair = " ".join([*before, "$A", *after, *before, "$B:1", *after])
        steps.append(
            processors.TemplateProcessing(
                single=single, pair=pair, special_tokens=sorted(set(prefix + suffix))
            )
        )
    tokenizer.post_processor = processors.Sequence(steps)
    return tokenizer


def end_of_generation_ids(metadata: dict[str, Any]) -> list[int]:
    """Token ids that end a generation: eos/eot/eom plus control tokens llama.cpp
    recognises by text (e.g. SmolLM2 also stops on <|endoftext|>), eos first."""
    tokens = _tokens(metadata)
    token_types = _token_types(metadata, len(tokens))
    ids: list[int] = []
    for key in ("eos", "eot", "eom"):
        token = _token_id(metadata, key, len(tokens))
        if token is not None and token not in ids:
            ids.append(token)
    for index, kind in enumerate(token_types):
        if kind == TOKEN_TYPE_CONTROL and tokens[index] in _END_OF_GENERATION_TEXTS:
            if index not in ids:
                ids.append(index)
    return ids


def tokenizer_files(metadata: dict[str, Any], *, context_length: int) -> dict[str, str]:
    """File name -> text for tokenizer.json, tokenizer_config.json and
    special_tokens_map.json, as transformers' PreTrainedTokenizerFast reads them."""
    tokenizer = build_tokenizer(metadata)
    tokens = _tokens(metadata)
    token_types = _token_types(metadata, len(tokens))
    _, _, default_add_bos = _pre_tokenizer(metadata.get("tokenizer.ggml.pre", "default"))

    named: dict[str, str] = {}
    for key in ("bos", "eos", "unk", "pad"):
        token = _token_id(metadata, key, len(tokens))
        if token is not None:
            named[f"{key}_token"] = tokens[token]
    controls = [
        t for t, kind in zip(tokens, token_types, strict=True) if kind == TOKEN_TYPE_CONTROL
    ]

    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **named,
        "add_bos_token": bool(metadata.get("tokenizer.ggml.add_bos_token", default_add_bos)),
        "add_eos_token": bool(metadata.get("tokenizer.ggml.add_eos_token", False)),
        # Exact round trips: never rewrite " ." to "." and the like when decoding.
        "clean_up_tokenization_spaces": False,
        "model_max_length": context_length,
    }
    if (template := metadata.get("tokenizer.chat_template")) is not None:
        config["chat_template"] = template
    special_map: dict[str, Any] = {**named}
    extra = [t for t in controls if t not in named.values()]
    if extra:
        special_map["additional_special_tokens"] = extra
    return {
        "tokenizer.json": tokenizer.to_str(pretty=False),
        "tokenizer_config.json": json.dumps(config, indent=2, ensure_ascii=False),
        "special_tokens_map.json": json.dumps(special_map, indent=2, ensure_ascii=False),
    }
