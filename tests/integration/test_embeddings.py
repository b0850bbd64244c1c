"""/v1/embeddings and /v1/rerank on the real service (router + a chat worker + an
embedding worker, all real processes) with the real all-MiniLM-L6-v2: the openai SDK
unchanged, the captured SDK body replayed, base64 == float, dimensions, batching across
clients, the errors, rerank on a small labelled set, and the pool's view of the model."""

from __future__ import annotations

import base64
import json
import math
import struct
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from tests.integration.service import Service, running_service

pytestmark = pytest.mark.timeout(300)

MODEL = "all-MiniLM-L6-v2"
CAPTURE = Path(__file__).resolve().parents[1] / "clients" / "openai-python-embeddings-default-base64.json"
SENTENCES = ["The cat sits on the mat.", "A kitten is resting on a rug.", "Quarterly revenue grew by twelve percent."]


@pytest.fixture(scope="module")
def service(default_model_dir: Path, embedding_model_dir: Path,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """The default chat model from the command line; the embedding model in the model
    dir (linked from the test cache, so nothing is fetched twice), loaded on first use."""
    home = tmp_path_factory.mktemp("home")
    (home / "models").mkdir()
    (home / "models" / MODEL).symlink_to(embedding_model_dir)
    with running_service(["--model", str(default_model_dir), "--batch-window-ms", "20"], home) as svc:
        yield svc


def post(service: Service, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{service.base_url}{path}", json=body, timeout=120)


def vectors(answer: dict) -> np.ndarray:
    return np.array([item["embedding"] for item in sorted(answer["data"], key=lambda d: d["index"])])


def test_listed_as_an_embedding_model(service: Service) -> None:
    listed = {m["id"]: m for m in httpx.get(f"{service.base_url}/v1/models").json()["data"]}
    assert listed[MODEL]["kind"] == "embedding" and listed[MODEL]["rerank_method"] == "cosine"
    assert next(iter(listed.values()))["kind"] == "chat"  # clients that take the first model can chat with it


def test_the_openai_sdk_works_unchanged(service: Service) -> None:
    client = openai.OpenAI(base_url=f"{service.base_url}/v1", api_key="unused")
    answer = client.embeddings.create(model=MODEL, input=SENTENCES)  # base64 on the wire, decoded by the SDK
    got = np.array([d.embedding for d in answer.data])
    assert got.shape == (3, 384) and answer.usage.prompt_tokens > 10
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert got[0] @ got[1] > got[0] @ got[2] + 0.3  # the cat and the kitten, not the revenue
    single = client.embeddings.create(model=MODEL, input=SENTENCES[2], encoding_format="float")
    np.testing.assert_allclose(single.data[0].embedding, got[2], atol=1e-5)  # alone == in a batch
    four = client.embeddings.create(model=MODEL, input="a single string", dimensions=4, encoding_format="float")
    assert len(four.data[0].embedding) == 4 and math.isclose(np.linalg.norm(four.data[0].embedding), 1, abs_tol=1e-6)
    whole = client.embeddings.create(model=MODEL, input="a single string", encoding_format="float").data[0].embedding
    expected = np.array(whole[:4]) / np.linalg.norm(whole[:4])
    np.testing.assert_allclose(four.data[0].embedding, expected, atol=1e-6)


def test_the_captured_sdk_body_replays_and_base64_is_the_floats(service: Service) -> None:
    capture = json.loads(CAPTURE.read_text())
    body = {**capture["body"], "model": MODEL}
    assert body["encoding_format"] == "base64"
    encoded = post(service, capture["path"], body)
    assert encoded.status_code == 200, encoded.text
    plain = post(service, capture["path"], {**body, "encoding_format": "float"}).json()
    for item, floats in zip(encoded.json()["data"], plain["data"], strict=True):
        raw = base64.b64decode(item["embedding"])
        decoded = struct.unpack(f"<{len(raw) // 4}f", raw)  # little-endian float32, as the SDK reads it
        assert list(decoded) == floats["embedding"]
    assert encoded.json()["usage"] == plain["usage"] and plain["object"] == "list"


def test_token_id_inputs_equal_their_text(service: Service) -> None:
    ids = [7592, 2088]  # "hello world" in BERT's uncased vocabulary
    by_ids = post(service, "/v1/embeddings", {"model": MODEL, "input": ids}).json()
    by_lists = post(service, "/v1/embeddings", {"model": MODEL, "input": [ids, ids[:1]]}).json()
    by_text = post(service, "/v1/embeddings", {"model": MODEL, "input": ["hello world", "hello"]}).json()
    np.testing.assert_allclose(vectors(by_ids)[0], vectors(by_text)[0], atol=1e-6)
    np.testing.assert_allclose(vectors(by_lists), vectors(by_text), atol=1e-6)
    assert by_ids["usage"]["prompt_tokens"] == 4  # [CLS] hello world [SEP]


def test_requests_from_several_clients_are_answered_alike(service: Service) -> None:
    texts = [f"note number {i} about {'cats' if i % 2 else 'markets'} " * (1 + i % 5) for i in range(16)]
    alone = vectors(post(service, "/v1/embeddings", {"model": MODEL, "input": texts}).json())
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda t: post(service, "/v1/embeddings", {"model": MODEL, "input": t}), texts))
    together = np.array([vectors(a.json())[0] for a in answers])
    np.testing.assert_allclose(together, alone, atol=1e-5)


@pytest.mark.parametrize("body, status, param, words", [
    ({"input": ""}, 400, "input", "empty string"),
    ({"input": []}, 400, "input", "required"),
    ({"input": ["ok", 3.5]}, 400, "input", "input[1]"),
    ({"input": "x", "encoding_format": "int8"}, 400, "encoding_format", "'float' or 'base64'"),
    ({"input": "x", "dimensions": 385}, 400, "dimensions", "between 1 and 384"),
    ({"input": [[30522]]}, 400, "input", "outside the vocabulary"),
    ({"input": "word " * 300}, 400, "input", "302 tokens, more than the 256 tokens"),
    ({"model": "SmolLM2-135M-Instruct", "input": "x"}, 400, "model", "not an embedding model"),
    ({"model": "nope", "input": "x"}, 404, "model", "does not exist"),
])
def test_errors(service: Service, body: dict, status: int, param: str, words: str) -> None:
    answer = post(service, "/v1/embeddings", {"model": MODEL, **body})
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and words in error["message"] and error["type"]
    # and the worker lives on: the next request is answered
    assert post(service, "/v1/embeddings", {"model": MODEL, "input": "still here"}).status_code == 200


def test_too_long_input_is_cut_with_truncate(service: Service) -> None:
    answer = post(service, "/v1/embeddings", {"model": MODEL, "input": "word " * 300, "truncate": True})
    assert answer.status_code == 200 and answer.json()["usage"]["prompt_tokens"] == 256


QUERY = "How do I reset my router's password?"
DOCUMENTS = [
    "Bananas are rich in potassium and make a quick snack.",
    "To reset the router password, hold the reset button for ten seconds and log in with the default admin "
    "credentials printed on the label.",
    {"text": "The stock market closed higher on Friday after strong earnings reports."},
    "Paris is the capital of France.",
]


def test_rerank_ranks_the_relevant_document_first(service: Service) -> None:
    answer = post(service, "/v1/rerank", {"model": MODEL, "query": QUERY, "documents": DOCUMENTS})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["method"] == "cosine" and len(body["results"]) == 4
    assert body["results"][0]["index"] == 1
    scores = [r["relevance_score"] for r in body["results"]]
    assert scores == sorted(scores, reverse=True) and "document" not in body["results"][0]
    top = post(service, "/v1/rerank", {"model": MODEL, "query": QUERY, "documents": DOCUMENTS, "top_n": 2,
                                       "return_documents": True}).json()
    assert [r["index"] for r in top["results"]] == [r["index"] for r in body["results"][:2]]
    assert top["results"][0]["document"] == {"text": DOCUMENTS[1]}
    assert top["results"][1]["document"]["text"] in (DOCUMENTS[0], DOCUMENTS[2]["text"], DOCUMENTS[3])


@pytest.mark.parametrize("body, param", [
    ({"query": "", "documents": ["a"]}, "query"),
    ({"query": "q", "documents": []}, "documents"),
    ({"query": "q", "documents": [{"txt": "a"}]}, "documents"),
    ({"query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
    ({"model": "SmolLM2-135M-Instruct", "query": "q", "documents": ["a"]}, "model"),
])
def test_rerank_errors(service: Service, body: dict, param: str) -> None:
    answer = post(service, "/v1/rerank", {"model": MODEL, **body})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == param, answer.text


def test_in_the_pool_and_the_status(service: Service) -> None:
    post(service, "/v1/embeddings", {"model": MODEL, "input": "load it"})
    status = httpx.get(f"{service.base_url}/admin/status", timeout=10).json()
    entry = next(m for m in status["models"] if m["id"] == MODEL)
    assert entry["kind"] == "embedding" and entry["state"] in ("idle", "ready") and entry["pid"]
    health = service.health()["workers"][MODEL]
    assert health["kind"] == "embedding" and health["dimensions"] == 384
    assert httpx.post(f"{service.base_url}/admin/models/{MODEL}/unload", timeout=60).status_code == 200
    assert next(m for m in httpx.get(f"{service.base_url}/admin/status").json()["models"]
                if m["id"] == MODEL)["state"] == "unloaded"
    assert post(service, "/v1/embeddings", {"model": MODEL, "input": "and back"}).status_code == 200
