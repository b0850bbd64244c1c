"""`/openapi.json` is true: every route of the app is in it, with its methods, and every
operation in it is a route. A route added without its document entry fails here."""

from __future__ import annotations

import re
from pathlib import Path

from starlette.routing import Mount, Route
from starlette.testclient import TestClient

from router.app import make_app
from router.config import make_config
from router.openapi import openapi_document
from router.children.pool import WorkerPool


def _app(tmp_path: Path):
    config = make_config({"home": tmp_path / "home"})
    return make_app(config, WorkerPool(config, {}))


def _operations_of_app(app) -> set[tuple[str, str]]:
    operations = set()
    for route in app.routes:
        if isinstance(route, Mount):  # static files: any path below the mount, GET
            operations.add((route.path + "/{path}", "get"))
            continue
        assert isinstance(route, Route), route
        path = re.sub(r"\{(\w+):\w+\}", r"{\1}", route.path)  # {model_id:path} -> {model_id}
        operations |= {(path, method.lower()) for method in route.methods if method != "HEAD"}
    return operations


def test_every_route_is_documented_and_every_documented_path_is_a_route(tmp_path: Path) -> None:
    document = openapi_document([])
    documented = {(path, method) for path, methods in document["paths"].items() for method in methods}
    assert documented == _operations_of_app(_app(tmp_path))


def test_the_route_serves_the_document_with_the_models_as_examples(tmp_path: Path) -> None:
    config = make_config({"home": tmp_path / "home"})
    (tmp_path / "m1").mkdir()
    (tmp_path / "m1" / "config.json").write_text("{}")
    pool = WorkerPool(config, {"m1": tmp_path / "m1"})
    answer = TestClient(make_app(config, pool), base_url="http://127.0.0.1").get("/openapi.json")
    assert answer.status_code == 200
    document = answer.json()
    assert document["openapi"].startswith("3.") and document["info"]["title"] == "mlxd"
    chat = document["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert "m1" in chat["properties"]["model"]["examples"]
    assert set(chat["required"]) == {"model", "messages"}
