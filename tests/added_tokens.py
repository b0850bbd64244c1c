"""Tokens added to a copied SmolLM2 tokenizer, for tiny test models that need a family's
special tokens (call openers, image tokens) as tokens of their own."""

from __future__ import annotations

import json
from pathlib import Path

SMOLLM2_VOCAB = 49152  # SmolLM2's vocabulary: added tokens take the ids after it


def add_tokens(target: Path, tokens: list[str], special: bool) -> None:
    """Append `tokens` (ids from SMOLLM2_VOCAB on) to the tokenizer files in `target`."""
    tokenizer = json.loads((target / "tokenizer.json").read_text())
    config = json.loads((target / "tokenizer_config.json").read_text())
    for i, content in enumerate(tokens):
        entry = {"id": SMOLLM2_VOCAB + i, "content": content, "single_word": False, "lstrip": False,
                 "rstrip": False, "normalized": False, "special": special}
        tokenizer["added_tokens"].append(entry)
        config.setdefault("added_tokens_decoder", {})[str(SMOLLM2_VOCAB + i)] = {k: v for k, v in entry.items()
                                                                                if k != "id"}
    (target / "tokenizer.json").write_text(json.dumps(tokenizer))
    (target / "tokenizer_config.json").write_text(json.dumps(config))
