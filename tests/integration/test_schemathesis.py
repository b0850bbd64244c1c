"""schemathesis against the live service, from its own `/openapi.json`: bodies valid and
invalid by the document, on every route, get an answer (no hang) that is never a 5xx, and
the service still answers its probe afterwards.

Bounded: a few examples per operation, a 4-token output cap, no embedding model (it would
be fetched from the package index on first use)."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.integration.service import Service

pytestmark = pytest.mark.timeout(900)
EXAMPLES_PER_OPERATION = 10


@pytest.fixture(scope="module")
def svc(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    service = Service(["--model", str(default_model_dir), "--max-output-tokens", "4", "--embedding-model", "",
                       "--shutdown-drain-s", "1"], home=tmp_path_factory.mktemp("home"))
    try:
        service.wait_ready()
        yield service
    finally:
        service.stop()


def operations(svc: Service) -> list:
    loaded = schemathesis.openapi.from_url(f"{svc.base_url}/openapi.json")
    return [result.ok() for result in loaded.get_all_operations()]


def test_no_route_answers_5xx_or_hangs(svc: Service) -> None:
    """Each operation in turn (schemathesis's own pytest plugin does not load with this
    pytest), its cases drawn by hypothesis from the operation's strategy."""
    found = operations(svc)
    model = httpx.get(f"{svc.base_url}/v1/models", timeout=10).json()["data"][0]["id"]
    assert len(found) >= 20
    failures: list[str] = []
    statuses: list[int] = []
    for operation in found:
        @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, derandomize=True, database=None,
                  phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy(), served=st.sampled_from([True, True, True, False]))
        def run(case, served: bool) -> None:
            if served and isinstance(case.body, dict) and "model" in case.body:
                case.body["model"] = model  # most bodies name the served model, so they reach its worker
            response = case.call(base_url=svc.base_url, timeout=120)  # a hang fails here
            statuses.append(response.status_code)
            if response.status_code >= 500:
                failures.append(f"{case.method} {case.formatted_path} -> {response.status_code}: "
                                f"{response.text[:300]} body: {case.body!r}"[:1000])

        run()
    assert not failures, "\n".join(failures)
    # it fuzzed: several cases per operation, and some reached the model (200s) as well as the checks (4xx)
    assert len(statuses) >= 3 * len(found), len(statuses)
    assert statuses.count(200) >= len(found) and any(400 <= s < 500 for s in statuses), collections.Counter(statuses)
    print(f"schemathesis: {len(statuses)} requests on {len(found)} operations, statuses "
          f"{dict(sorted(collections.Counter(statuses).items()))}")


def test_the_service_survived(svc: Service) -> None:
    health = svc.health()
    assert health["status"] == "ok"
    (worker,) = health["workers"].values()
    assert worker["restarts"] == 0, "a fuzzed request crashed the worker"
    model = httpx.get(f"{svc.base_url}/v1/models", timeout=10).json()["data"][0]["id"]
    answer = httpx.post(f"{svc.base_url}/v1/chat/completions", timeout=60, json={
        "model": model, "temperature": 0, "messages": [{"role": "user", "content": "What is the capital of France?"}]})
    assert answer.json()["choices"][0]["message"]["content"].startswith("The capital of France")  # 4 tokens
    assert "Traceback" not in svc.log_text()
