"""A test vision-language model built offline: SmolLM2-135M's real text weights and
tokenizer under a SmolVLM (Idefics3) config, with a small random SigLIP vision tower and
connector, the image tokens added to the tokenizer, and the processor's configs.

No VLM weights ship here. This one cannot see (its vision tower is random), but it runs
the whole image path the way a real SmolVLM does: mlx-vlm loads it, its processor expands
each image into image tokens and pixels, and the tower's features replace those tokens'
embeddings. The tower's weights are scaled so different images give clearly different
features (a test that swaps an image must change the answer).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.added_tokens import SMOLLM2_VOCAB, add_tokens

IMAGE_SIZE = 64  # pixels a side: the processor resizes every image to this
PATCH = 16
SCALE = 2  # the connector's pixel shuffle
IMAGE_TOKENS = (IMAGE_SIZE // PATCH) ** 2 // SCALE**2  # image tokens per image
ADDED = ["<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>"]
VOCAB = SMOLLM2_VOCAB  # the added tokens follow
TEMPLATE = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
            "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
            "{% for part in message['content'] %}{% if part['type'] == 'image' %}<image>"
            "{% else %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def make_tiny_vlm(target: Path, smollm2_dir: Path) -> Path:
    """The test VLM in `target` (made once: an existing directory is kept)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    if (target / "model.safetensors").exists():
        return target
    target.mkdir(parents=True, exist_ok=True)
    text_config = json.loads((smollm2_dir / "config.json").read_text())
    text_config.update(vocab_size=VOCAB + 8, model_type="llama")
    text_config.pop("quantization", None)
    text_config.pop("quantization_config", None)
    vision = {"model_type": "siglip_vision_model", "hidden_size": 64, "intermediate_size": 128,
              "num_attention_heads": 4, "num_hidden_layers": 2, "patch_size": PATCH, "image_size": IMAGE_SIZE,
              "num_channels": 3, "layer_norm_eps": 1e-6}
    config = {"model_type": "smolvlm", "architectures": ["SmolVLMForConditionalGeneration"],
              "text_config": text_config, "vision_config": vision, "scale_factor": SCALE,
              "image_token_id": VOCAB + ADDED.index("<image>"), "vocab_size": VOCAB + 8,
              "tie_word_embeddings": text_config.get("tie_word_embeddings", True)}
    (target / "config.json").write_text(json.dumps(config, indent=1))

    from mlx_vlm.models import smolvlm

    model = smolvlm.Model(smolvlm.ModelConfig.from_dict({
        **config, "text_config": smolvlm.TextConfig.from_dict(text_config),
        "vision_config": smolvlm.VisionConfig.from_dict(vision)}))
    mx.random.seed(0)
    weights = dict(tree_flatten(model.parameters()))
    for name, value in weights.items():
        if not name.startswith("language_model."):
            scale = 1.0 if name.endswith(("norm.weight", "layernorm.weight")) else 0.5
            weights[name] = (mx.random.normal(value.shape) * scale).astype(mx.float32) \
                if not name.endswith("bias") else mx.zeros(value.shape)
    from mlx_lm.utils import dequantize_model, load_model

    text_model, _ = load_model(smollm2_dir)  # the shipped SmolLM2 is quantized: its weights in full
    text = dict(tree_flatten(dequantize_model(text_model).parameters()))
    for name, value in text.items():
        value = value.astype(mx.float32)
        key = "language_model." + name.removeprefix("model.")
        if key == "language_model.embed_tokens.weight":
            extra = mx.random.normal((8, value.shape[1])) * value.std()
            value = mx.concatenate([value, extra.astype(value.dtype)])
        if key in weights:
            weights[key] = value
    mx.save_safetensors(str(target / "model.safetensors"), weights)

    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        if (smollm2_dir / name).exists():
            shutil.copy(smollm2_dir / name, target / name)
    add_tokens(target, ADDED, special=True)
    tok_config = json.loads((target / "tokenizer_config.json").read_text())
    tok_config["chat_template"] = TEMPLATE
    (target / "tokenizer_config.json").write_text(json.dumps(tok_config))
    (target / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Idefics3ImageProcessor", "processor_class": "SmolVLMProcessor",
        "do_convert_rgb": True, "do_resize": True, "size": {"longest_edge": IMAGE_SIZE}, "resample": 1,
        "do_image_splitting": False, "max_image_size": {"longest_edge": IMAGE_SIZE}, "do_rescale": True,
        "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5], "do_pad": True}, indent=1))
    (target / "processor_config.json").write_text(json.dumps({"image_seq_len": IMAGE_TOKENS,
                                                              "processor_class": "SmolVLMProcessor"}))
    return target
