"""Fixtures that run the real service on the real default model.

Every module that asks for `service` shares one service, started once per session with the
default flags: starting it costs a worker load and a kvstore, and ten modules need nothing
else. A module that needs other flags, or that breaks what others rely on (stops the
router, wipes the cache tiers, counts from zero), starts its own. Modules that assert on
cache hits salt their requests with their own name (`SALT = __name__`), so blocks another
module cached never decide a result, and a test that looks for a log line looks only at
the lines written since it began (`Service.log_mark`, `log_since`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.service import Service, running_service


@pytest.fixture(scope="session")
def shared_service(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with running_service(["--model", str(default_model_dir)], tmp_path_factory.mktemp("shared-home")) as svc:
        yield svc


@pytest.fixture(scope="module")
def service(shared_service: Service) -> Service:
    """The shared service, ready: a module before may have restarted its worker or
    unloaded its model, and a router that died there fails here with its log."""
    shared_service.wait_ready()
    return shared_service


@pytest.fixture(scope="module")
def model_id(service: Service) -> str:
    import httpx

    return httpx.get(f"{service.base_url}/v1/models").json()["data"][0]["id"]
