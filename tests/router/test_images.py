"""router.images: each API's image parts read into one shape (a bare image part in the
content, the bytes or URL beside it, in order), and every refusal a 400 naming the part."""

from __future__ import annotations

import asyncio
import base64
from types import SimpleNamespace
from typing import Any

import pytest

from protocol.errors import RequestError
from router.api import anthropic_messages, openai_chat
from router.api.openai_responses import parse as parse_responses
from router.api.response_store import ResponseStore
from router.images import check_model_sees, pull_images, resolved

PNG = b"\x89PNG\r\n\x1a\n-not-a-real-picture"
DATA_URL = "data:image/png;base64," + base64.b64encode(PNG).decode()


def chat(content: Any) -> Any:
    return openai_chat.parse({"model": "m", "messages": [{"role": "user", "content": content}]})


def test_each_api_gives_the_same_parts_and_bytes() -> None:
    asked = [{"type": "text", "text": "What is it?"}, {"type": "image_url", "image_url": {"url": DATA_URL}}]
    messages, images = pull_images(chat(asked).add.messages)
    assert messages == [{"role": "user", "content": [{"type": "text", "text": "What is it?"}, {"type": "image"}]}]
    assert [(i.where, i.data) for i in images] == [("messages[0].content[1]", PNG)]

    claude = anthropic_messages.parse({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is it?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": base64.b64encode(PNG).decode()}}]}]})
    assert pull_images(claude.add.messages)[0] == messages and pull_images(claude.add.messages)[1][0].data == PNG

    codex = parse_responses({"model": "m", "input": [{"role": "user", "content": [
        {"type": "input_text", "text": "What is it?"}, {"type": "input_image", "image_url": DATA_URL}]}]},
        store=ResponseStore())
    codex_messages, codex_images = pull_images(codex.add.messages)
    assert codex_messages[-1] == messages[0] and codex_images[0].where == "input[0].content[1].image_url"


def test_a_text_only_turn_stays_a_string_and_urls_wait_to_be_fetched() -> None:
    assert chat([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]).add.messages[0]["content"] == "a\nb"
    _, (image,) = pull_images(chat([{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}])
                              .add.messages)
    assert image.data is None and image.url == "https://example.com/a.png"


@pytest.mark.parametrize("url", ["data:image/png,raw", "data:image/png;base64,@@@", "ftp://x/a.png", 7])
def test_bad_image_urls_are_400s_naming_the_part(url: Any) -> None:
    with pytest.raises(RequestError) as raised:
        chat([{"type": "image_url", "image_url": {"url": url}}])
    assert raised.value.status == 400 and "messages[0].content[0]" in raised.value.message


def refs(n: int, url: bool = False) -> tuple[Any, ...]:
    content = [{"type": "image_url", "image_url": {"url": "https://example.com/a.png" if url else DATA_URL}}] * n
    return pull_images(chat(content).add.messages)[1]


@pytest.mark.parametrize("images, limits, code", [
    (refs(3), {"max_images": 2, "max_bytes": 1 << 20, "allow_urls": False}, "too_many_images"),
    (refs(1), {"max_images": 8, "max_bytes": 10, "allow_urls": False}, "image_too_large"),
    (refs(1, url=True), {"max_images": 8, "max_bytes": 1 << 20, "allow_urls": False}, "image_urls_disabled"),
])
def test_limits_and_urls_are_clear_400s(images: Any, limits: dict[str, Any], code: str) -> None:
    with pytest.raises(RequestError) as raised:
        asyncio.run(resolved(images, **limits))
    assert raised.value.status == 400 and raised.value.code == code and raised.value.param == "messages"
    assert asyncio.run(resolved(refs(2), max_images=2, max_bytes=1 << 20, allow_urls=False)) == [PNG, PNG]


def test_a_text_model_refuses_images_naming_the_first_part() -> None:
    ready = SimpleNamespace(vision=False)  # Ready's one field this reads
    with pytest.raises(RequestError) as raised:
        check_model_sees(refs(2), ready, "smollm2")
    assert "'messages[0].content[0]' is an image" in raised.value.message and raised.value.param == "messages"
    check_model_sees(refs(2), SimpleNamespace(vision=True), "vlm")
    check_model_sees((), ready, "smollm2")


def test_an_allowed_url_is_fetched_and_a_dead_one_is_a_400() -> None:
    import http.server
    import threading

    class Picture(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802  (http.server's name)
            self.send_response(200 if self.path == "/a.png" else 404)
            self.end_headers()
            self.wfile.write(PNG if self.path == "/a.png" else b"")

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Picture)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        content = [{"type": "image_url", "image_url": {"url": f"{base}/a.png"}}]
        images = pull_images(chat(content).add.messages)[1]
        assert asyncio.run(resolved(images, max_images=8, max_bytes=1 << 20, allow_urls=True)) == [PNG]
        with pytest.raises(RequestError) as too_big:
            asyncio.run(resolved(images, max_images=8, max_bytes=8, allow_urls=True))
        assert too_big.value.code == "image_too_large"
        dead = pull_images(chat([{"type": "image_url", "image_url": {"url": f"{base}/gone.png"}}]).add.messages)[1]
        with pytest.raises(RequestError) as missing:
            asyncio.run(resolved(dead, max_images=8, max_bytes=1 << 20, allow_urls=True))
        assert missing.value.status == 400 and missing.value.code == "image_fetch_failed"
    finally:
        server.shutdown()
