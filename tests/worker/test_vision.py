"""A vision model in the engine (the test VLM of tests/worker/tiny_vlm.py: SmolLM2's real
text weights, a random vision tower): an image's tokens carry its content hash, so the same
image asked again is served from the prefix cache with the answer computed from scratch,
and a different image never hits past the text before it and changes the answer."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from protocol.messages import AddRequest, ErrorEvent, SamplingParams
from tests.worker.test_prefix_cache import BLOCK, Harness
from tests.worker.tiny_vlm import IMAGE_TOKENS, make_tiny_vlm
from worker.image_tokens import image_ids
from worker.model_loader import load_for_serving
from worker.prompts import render_chat_text

pytestmark = pytest.mark.timeout(600)


SYSTEM = "You describe pictures. " + " ".join(f"Rule {i}: be brief about topic {i}." for i in range(8))


def png(seed: int, size: tuple[int, int] = (40, 52)) -> bytes:
    from PIL import Image

    pixels = (np.random.default_rng(seed).random((*size, 3)) * 255).astype("uint8")
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def looking(question: str = "What is in this picture?") -> list[dict]:
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]


@pytest.fixture(scope="module")
def vlm_dir(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_vlm(tmp_path_factory.mktemp("vlm") / "tiny-vlm", default_model_dir)


@pytest.fixture(scope="module")
def loaded(vlm_dir: Path):
    return load_for_serving(vlm_dir)


def ask(h: Harness, image: bytes, **kw):
    h._next += 1
    rid = f"v{h._next}"
    h.engine.add(AddRequest(rid, messages=looking(**kw), images=[image],
                            sampling=SamplingParams(max_tokens=6, temperature=0.0)))
    h.run()
    return h.result(rid)


def test_the_same_image_hits_the_cache_with_the_answer_from_scratch(loaded) -> None:
    assert loaded.images is not None
    scratch = Harness(loaded, cache=False)
    h = Harness(loaded)
    first, finish1 = ask(h, png(1))
    again, finish2 = ask(h, png(1))
    assert finish1.usage.cached_tokens == 0
    assert finish2.usage.cached_tokens >= finish1.usage.prompt_tokens // BLOCK * BLOCK  # past the image
    assert first == again == ask(scratch, png(1))[0]


def test_a_different_image_misses_from_the_image_and_changes_the_answer(loaded) -> None:
    h = Harness(loaded)
    first, finish1 = ask(h, png(1))
    other, finish2 = ask(h, png(2))
    prompt = loaded.images.prompt_ids(render_chat_text(loaded.tokenizer, looking(), None), [png(2)])
    vocab = loaded.config["text_config"]["vocab_size"]
    before_image = next(k for k, t in enumerate(prompt) if t >= vocab)
    assert finish2.usage.prompt_tokens == len(prompt) and before_image > BLOCK
    assert 0 < finish2.usage.cached_tokens <= before_image  # the text before the image only
    assert other != first  # the control: the image reaches the model
    assert ask(Harness(loaded, cache=False), png(2))[0] == other


def test_image_ids_follow_the_content(loaded) -> None:
    vocab = loaded.config["text_config"]["vocab_size"]
    a, b = image_ids(b"a" * 32, IMAGE_TOKENS, vocab), image_ids(b"b" * 32, IMAGE_TOKENS, vocab)
    assert a == image_ids(b"a" * 32, IMAGE_TOKENS, vocab) and not set(a) & set(b)
    assert all(vocab <= t < 2**31 for t in a + b)


def test_text_requests_and_bad_images(loaded) -> None:
    h = Harness(loaded)
    ids, finish = h.ask([{"role": "user", "content": "Hello"}])
    assert ids and finish.usage.prompt_tokens > 0
    h.engine.add(AddRequest("bad", messages=looking(), images=[b"not an image"],
                            sampling=SamplingParams(max_tokens=4)))
    h.run()
    (error,) = [e for e in h.events if isinstance(e, ErrorEvent) and e.request_id == "bad"]
    assert "not an image" in error.message
    assert ask(h, png(3))[0]  # the engine serves on


def test_a_text_model_refuses_images(default_model_dir: Path) -> None:
    text = Harness(load_for_serving(default_model_dir))
    text.engine.add(AddRequest("img", messages=looking(), images=[png(1)], sampling=SamplingParams(max_tokens=4)))
    text.run()
    (error,) = [e for e in text.events if isinstance(e, ErrorEvent) and e.request_id == "img"]
    assert "reads text only" in error.message
