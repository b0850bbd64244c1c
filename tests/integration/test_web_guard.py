"""The web guard on the real service (no API key, loopback): what a foreign web page would
send is refused, and the official SDK is not affected."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.integration.probes import probe, survives

pytestmark = pytest.mark.timeout(300)

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def _error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


def test_dns_rebinding_is_refused(service, model_id) -> None:
    """A page on evil.example whose name now resolves to 127.0.0.1 sends Host: evil.example."""
    response = httpx.post(f"{service.base_url}/v1/chat/completions", headers={"host": "evil.example"},
                          json={"model": model_id, "messages": QUESTION, "max_tokens": 5}, timeout=30)
    assert _error(response, 403)["code"] == "host_not_allowed"


def test_a_text_plain_post_is_refused(service, model_id) -> None:
    """A page may POST text/plain with no preflight; the body would still parse as JSON."""
    response = httpx.post(f"{service.base_url}/v1/chat/completions", headers={"content-type": "text/plain"},
                          content=json.dumps({"model": model_id, "messages": QUESTION, "max_tokens": 5}), timeout=30)
    assert _error(response, 415)["message"].startswith("send Content-Type: application/json")


def test_an_admin_post_from_a_foreign_origin_is_refused(service, model_id) -> None:
    assert service.health()["workers"][model_id]["state"] == "ready"
    response = httpx.post(f"{service.base_url}/admin/models/{model_id}/unload",
                          headers={"origin": "http://evil.example"}, timeout=30)
    assert _error(response, 403)["code"] == "origin_not_allowed"
    assert service.health()["workers"][model_id]["state"] == "ready"
    models = httpx.get(f"{service.base_url}/v1/models", timeout=30).json()["data"]
    assert [m["state"] for m in models if m["id"] == model_id] in (["ready"], ["idle"])


def test_the_openai_sdk_gets_the_same_greedy_answer(service, model_id) -> None:
    """The SDK (JSON body, Host 127.0.0.1:PORT, no Origin) answers exactly as a plain JSON POST."""
    client = openai.OpenAI(base_url=f"{service.base_url}/v1", api_key="x", max_retries=0, timeout=120)
    sdk = client.chat.completions.create(model=model_id, messages=QUESTION, temperature=0, max_tokens=20)
    raw = httpx.post(f"{service.base_url}/v1/chat/completions", timeout=120,
                     json={"model": model_id, "messages": QUESTION, "temperature": 0, "max_tokens": 20})
    assert raw.status_code == 200, raw.text
    assert sdk.choices[0].message.content == raw.json()["choices"][0]["message"]["content"]
    assert "Paris" in sdk.choices[0].message.content


def test_refused_pages_leave_streams_and_answers_alone(service, model_id) -> None:
    """Each refusal above, sent while a stream runs: the stream ends normally and the
    greedy probe answers as before."""
    client = openai.OpenAI(base_url=f"{service.base_url}/v1", api_key="x", max_retries=0, timeout=120)
    before = probe(client, model_id)
    body = json.dumps({"model": model_id, "messages": QUESTION, "max_tokens": 5})
    with survives(client, model_id, before):
        for headers, path, status in [({"host": "evil.example", "content-type": "application/json"},
                                       "/v1/chat/completions", 403),
                                      ({"content-type": "text/plain"}, "/v1/chat/completions", 415),
                                      ({"origin": "http://evil.example"}, f"/admin/workers/{model_id}/restart", 403)]:
            response = httpx.post(f"{service.base_url}{path}", headers=headers, content=body, timeout=30)
            assert response.status_code == status, response.text
