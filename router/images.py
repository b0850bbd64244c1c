"""Images in a request: each API's image part read into one shape, checked, and fetched.

Every dialect turns its image parts (chat `image_url`, Messages `image` blocks, Responses
`input_image`) into a `{"type": "image"}` part of the message's content, which the vision
model's chat template renders as its placeholder, and an `ImageRef` (where the part was,
and its bytes or its URL) in the order the parts come. A `data:` URL or base64 source is
decoded while parsing; an http(s) URL is fetched only when the config allows it
(`allow_image_urls`, off by default: a local server fetching what a prompt names is a
way out of the machine), after the parse. The worker gets the bytes (`AddRequest.images`)
and hashes them into the prompt's image tokens, so the cache tells images apart by content.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from protocol.errors import RequestError
from protocol.messages import Ready
from router.validation import bad

IMAGE_PART: dict[str, str] = {"type": "image"}
FETCH_TIMEOUT_S = 10.0
_REF = "mlxd_image"  # a parsed image part's key for its ImageRef, until `pull_images` takes it out


@dataclass(frozen=True)
class ImageRef:
    """One image part: `where` it was (e.g. `messages[1].content[0]`), and its bytes or URL."""

    where: str
    data: bytes | None = None
    url: str | None = None


def from_url(url: Any, where: str, param: str) -> ImageRef:
    """An image given by URL: a `data:` URL decoded now, an http(s) one kept to fetch."""
    if not isinstance(url, str) or not url:
        raise bad(param, f"'{where}' must be an image URL (https: or data:)")
    if url.startswith("data:"):
        head, comma, payload = url.partition(",")
        if not comma or not head.endswith(";base64"):
            raise bad(param, f"'{where}' is a data: URL that is not base64 (data:image/png;base64,...)")
        return ImageRef(where, data=_decoded(payload, where, param))
    if url.startswith(("http://", "https://")):
        return ImageRef(where, url=url)
    raise bad(param, f"'{where}' must be an https: or data: URL, got {url[:40]!r}")


def from_base64(data: Any, where: str, param: str) -> ImageRef:
    if not isinstance(data, str):
        raise bad(param, f"'{where}.data' must be a base64 string")
    return ImageRef(where, data=_decoded(data, where, param))


def _decoded(payload: str, where: str, param: str) -> bytes:
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise bad(param, f"'{where}' is not valid base64") from None


def _param(image: ImageRef) -> str:
    """The top-level field an image part came in (`messages`, or a Responses `input`)."""
    return image.where.partition("[")[0].partition(".")[0]


def image_part(ref: ImageRef) -> dict[str, Any]:
    """A content part for `ref`, carrying it until `pull_images` takes it out."""
    return {**IMAGE_PART, _REF: ref}


def pull_images(messages: list[dict[str, Any]] | None) -> tuple[list[dict[str, Any]] | None, tuple[ImageRef, ...]]:
    """The messages with each image part bare (`IMAGE_PART`), and the images, in order."""
    if not messages:
        return messages, ()
    refs: list[ImageRef] = []
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list) and any(isinstance(p, dict) and _REF in p for p in content):
            parts = []
            for part in content:
                if isinstance(part, dict) and _REF in part:
                    refs.append(part[_REF])
                    part = IMAGE_PART
                parts.append(part)
            message = {**message, "content": parts}
        out.append(message)
    return out, tuple(refs)


def check_model_sees(images: tuple[ImageRef, ...], ready: Ready, model: str) -> None:
    """The 400 for images sent to a model that reads text only, naming the first part."""
    if images and not ready.vision:
        raise bad(_param(images[0]), f"'{images[0].where}' is an image, and model '{model}' reads text only: send it to a "
                  "vision model, or leave the image out", code="images_not_supported")


async def resolved(images: tuple[ImageRef, ...], *, max_images: int, max_bytes: int,
                   allow_urls: bool) -> list[bytes]:
    """Every image's bytes, in order: counted, URLs fetched where allowed, sizes checked."""
    if len(images) > max_images:
        raise bad(_param(images[0]), f"the request holds {len(images)} images, more than the {max_images} this server accepts "
                  "(max_images)", code="too_many_images")
    out = []
    for image in images:
        data = image.data
        if data is None:
            if not allow_urls:
                raise bad(_param(image), f"'{image.where}' is an image URL, and this server fetches none "
                          "(allow_image_urls = false): send the image as a data: URL or base64",
                          code="image_urls_disabled")
            data = await asyncio.to_thread(_fetch, image, max_bytes)
        if len(data) > max_bytes:
            raise bad(_param(image), f"'{image.where}' is {len(data)} bytes, more than the {max_bytes} this server accepts "
                      "(max_image_bytes)", code="image_too_large")
        out.append(data)
    return out


def _fetch(image: ImageRef, max_bytes: int) -> bytes:
    try:
        with urllib.request.urlopen(image.url or "", timeout=FETCH_TIMEOUT_S) as response:  # noqa: S310
            return bytes(response.read(max_bytes + 1))
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise RequestError(f"'{image.where}': could not fetch {image.url!r}: {exc}", status=400,
                           param=_param(image), code="image_fetch_failed") from exc


def anthropic_image(block: dict[str, Any], where: str) -> ImageRef:
    """A Messages `image` block: `source` base64 (`data`) or `url`."""
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64":
        return from_base64(source.get("data"), f"{where}.source", "messages")  # type: ignore[union-attr]
    if kind == "url":
        return from_url(source.get("url"), f"{where}.source.url", "messages")  # type: ignore[union-attr]
    raise bad("messages", f"'{where}.source' must be {{\"type\": \"base64\", \"media_type\": ..., \"data\": ...}} "
              "or {\"type\": \"url\", \"url\": ...}")


def user_content(items: list[str | ImageRef]) -> str | list[dict[str, Any]]:
    """A turn's texts and images in order: one string (texts joined by newlines) when it
    holds no image, else text and image parts."""
    if not any(isinstance(item, ImageRef) for item in items):
        return "\n".join(item for item in items if isinstance(item, str))
    parts: list[dict[str, Any]] = []
    for item in items:
        if isinstance(item, ImageRef):
            parts.append(image_part(item))
        elif parts and parts[-1]["type"] == "text":
            parts[-1] = {"type": "text", "text": parts[-1]["text"] + "\n" + item}
        else:
            parts.append({"type": "text", "text": item})
    return parts


def content_chars(items: list[str | ImageRef]) -> int:
    """Characters of a turn's text so far (a cache breakpoint's place in it); -1 (the whole
    message) once it holds an image, whose content is parts, not one text."""
    if any(isinstance(item, ImageRef) for item in items):
        return -1
    return len("\n".join(item for item in items if isinstance(item, str)))


def joined_turns(before: str | list[dict[str, Any]], after: str | list[dict[str, Any]]
                 ) -> tuple[str | list[dict[str, Any]], int]:
    """Two user turns' contents as one (a blank line between, as Anthropic joins them), and
    where `after`'s text starts in it: -1 (the whole message) once either holds images."""
    if isinstance(before, str) and isinstance(after, str):
        return "\n\n".join(t for t in (before, after) if t), (len(before) + 2 if before else 0)

    def parts(content: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
        return ([{"type": "text", "text": content}] if content else []) if isinstance(content, str) else content
    return [*parts(before), *([{"type": "text", "text": "\n\n"}] if before and after else []), *parts(after)], -1


def inline_images(add: Any) -> None:
    """For a route that renders a prompt without generating (token counts, cache probes):
    the request's images moved from its parts to `add.images`, as a generation sends them.
    URLs are not fetched for a count: such an image is a 400."""
    add.messages, refs = pull_images(add.messages)
    for ref in refs:
        if ref.data is None:
            raise bad(_param(ref), f"'{ref.where}' is an image URL: send it as a data: URL or base64 to count it")
    add.images = [ref.data for ref in refs] or None
