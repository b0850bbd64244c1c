"""Fixtures that run the real service on the real default model, once per module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.service import Service


@pytest.fixture(scope="module")
def service(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    home = tmp_path_factory.mktemp("home")
    svc = Service(["--model", str(default_model_dir)], home=home)
    try:
        svc.wait_ready()
        yield svc
    finally:
        svc.stop()


@pytest.fixture(scope="module")
def model_id(service: Service) -> str:
    import httpx

    return httpx.get(f"{service.base_url}/v1/models").json()["data"][0]["id"]
