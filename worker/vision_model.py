"""A vision-language model served as a text model that reads image tokens.

The checkpoint is one directory (mlx-vlm's layout: `text_config`, `vision_config`, the
processor's configs). Its language model loads as the mlx-lm architecture its text
config names, so the engine, the prefix cache and every kernel serve it like any text
model; mlx-vlm loads the vision tower and the processor, which turn each image into a
run of image tokens and their features (worker/image_tokens.py puts them in the prompt).

Only families whose language model sees image features as ordinary token positions are
served (1-D positions: SmolVLM / Idefics3). Families with multimodal positions (Qwen2-VL's
M-RoPE) would need their own position ids per image and are refused at load with the
reason.
"""

from __future__ import annotations

import io
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import BaseModelArgs
from mlx_lm.utils import _get_classes

from protocol.errors import RequestError
from worker.image_tokens import ImageTable, content_digest

log = logging.getLogger(__name__)

FAMILIES = ("smolvlm", "idefics3")  # vision models whose image tokens take 1-D positions


def is_vision_dir(path: str | Path) -> bool:
    """Whether the directory holds a vision-language checkpoint (a `vision_config`)."""
    config_path = Path(path) / "config.json"
    return config_path.exists() and "vision_config" in json.loads(config_path.read_text())


@dataclass
class TextArgs(BaseModelArgs):
    model_type: str
    text_config: dict


class TextOfVision(nn.Module):
    """The language model of a vision checkpoint, as mlx-lm's `pixtral` does for Pixtral."""

    def __init__(self, args: TextArgs) -> None:
        super().__init__()
        self.args = args
        self.model_type = args.model_type
        model_class, args_class = _get_classes(args.text_config)
        self.language_model = model_class(args_class.from_dict(args.text_config))

    def __call__(self, inputs: mx.array, cache: Any = None, input_embeddings: mx.array | None = None) -> mx.array:
        return self.language_model(inputs, cache=cache, input_embeddings=input_embeddings)

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """The language model's weights, named as its mlx-lm class names them."""
        out = {}
        for name, value in weights.items():
            if not name.startswith("language_model."):
                continue  # the vision tower and the connector: mlx-vlm's
            rest = name.removeprefix("language_model.")
            if not rest.startswith(("model.", "lm_head.")):
                rest = "model." + rest
            out["language_model." + rest] = value
        if getattr(self.language_model.args, "tie_word_embeddings", False):
            out = {k: v for k, v in out.items() if not k.startswith("language_model.lm_head.")}
        return out

    @property
    def layers(self) -> list[nn.Module]:
        return self.language_model.layers


def text_classes(config: dict[str, Any]) -> tuple[type, type]:
    """mlx-lm's `get_model_classes` for a vision checkpoint (refuses other families)."""
    family = config.get("model_type")
    if family not in FAMILIES:
        raise ValueError(f"vision model family {family!r} is not served: mlxd serves {', '.join(FAMILIES)} "
                         "(their image tokens take ordinary positions)")
    text = dict(config["text_config"])
    text.setdefault("tie_word_embeddings", config.get("tie_word_embeddings", False))
    config["text_config"] = text
    return TextOfVision, TextArgs


class _EmbedOnly(nn.Module):
    """What mlx-vlm's model keeps of its language model: the token embedding, shared."""

    def __init__(self, embed_tokens: nn.Module) -> None:
        super().__init__()
        self.embed_tokens = embed_tokens


class ImageEncoder:
    """The processor and the vision tower: images -> prompt token ids and features."""

    def __init__(self, path: str | Path, text_model: TextOfVision, table: ImageTable) -> None:
        from mlx_vlm.utils import load_model, load_processor

        self._vlm = load_model(Path(path))
        self._vlm.language_model = _EmbedOnly(text_model.language_model.model.embed_tokens)
        self._processor = load_processor(Path(path), add_detokenizer=False)
        config = json.loads((Path(path) / "config.json").read_text())
        self.image_token_id = int(config.get("image_token_id", config.get("image_token_index", -1)))
        self._table = table
        mx.eval(self._vlm.parameters())

    def prompt_ids(self, text: str, images: list[bytes]) -> list[int]:
        """`text` (the rendered chat, one image placeholder per image) as token ids whose
        image runs carry each image's own ids (worker/image_tokens.py)."""
        pictures = [_open(data, k) for k, data in enumerate(images)]
        try:
            whole = self._processor(text=[text], images=[pictures] if pictures else None, return_tensors="np")
        except Exception as exc:  # a placeholder count that does not match the images, a bad size
            raise RequestError(f"the model's processor refused this prompt and its images: {exc}",
                               param="messages") from exc
        ids = [int(t) for t in whole["input_ids"][0]]
        runs = []
        for picture, data in zip(pictures, images):
            alone = self._processor(text=[self._image_placeholder()], images=[[picture]], return_tensors="np")
            count = int((alone["input_ids"][0] == self.image_token_id).sum())
            runs.append(self._table.add(content_digest(data), count, self._encoder(alone)))
        positions = [k for k, t in enumerate(ids) if t == self.image_token_id]
        if len(positions) != sum(len(run) for run in runs):
            raise RequestError(f"the prompt holds {len(positions)} image tokens for {len(images)} images: "
                               "the chat template must write one image placeholder per image part",
                               param="messages")
        flat = [token for run in runs for token in run]
        for k, token in zip(positions, flat):
            ids[k] = token
        return ids

    def _image_placeholder(self) -> str:
        return getattr(self._processor, "image_token", "<image>")

    def _encoder(self, alone: Any) -> Any:
        vlm, image_token_id = self._vlm, self.image_token_id

        def encode() -> mx.array:
            ids = mx.array(alone["input_ids"])
            extra = {k: mx.array(v) for k, v in alone.items() if k not in ("input_ids", "attention_mask",
                                                                             "pixel_values")}
            embedded = vlm.get_input_embeddings(ids, mx.array(alone["pixel_values"]), **extra).inputs_embeds
            keep = mx.array([k for k, t in enumerate(alone["input_ids"][0].tolist()) if t == image_token_id])
            return embedded[0][keep]
        return encode


def _open(data: bytes, index: int) -> Any:
    from PIL import Image, UnidentifiedImageError

    try:
        picture = Image.open(io.BytesIO(data))
        picture.load()
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise RequestError(f"image {index} is not an image this server can read (PNG, JPEG, GIF, WebP): {exc}",
                           param="messages") from exc
    return picture.convert("RGB")
